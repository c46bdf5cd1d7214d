-- Receive-to-complete percentiles leave out claims an operator resolved (see the PostgreSQL
-- migration of the same name); a redrive clears the mark.
ALTER TABLE claims ADD COLUMN operator_resolved INTEGER NOT NULL DEFAULT 0;
UPDATE claims SET operator_resolved = 1
    WHERE state IN ('completed', 'failed')
      AND EXISTS (SELECT 1 FROM claim_events e
                  WHERE e.claim_id = claims.id AND e.attempt = claims.attempt
                    AND e.action = 'resolve');
