-- Receive-to-complete percentiles (report, page, /metrics) measure the provider and claimd,
-- not how long a claim waited for a person: a claim an operator resolved is marked and left
-- out of them. A redrive clears the mark (the next outcome is claimd's again).
ALTER TABLE claims ADD COLUMN IF NOT EXISTS operator_resolved BOOLEAN NOT NULL DEFAULT false;
-- Claims resolved before this column existed, from their history: the resolve at the claim's
-- current attempt (reads claim_events once).
UPDATE claims c SET operator_resolved = true
    FROM claim_events e
    WHERE e.claim_id = c.id AND e.attempt = c.attempt AND e.action = 'resolve'
      AND c.state IN ('completed', 'failed') AND NOT c.operator_resolved;
