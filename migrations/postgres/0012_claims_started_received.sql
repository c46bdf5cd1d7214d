-- The stuck-claims listing (`claims list --stuck`, `GET /v1/claims?stuck=true`, the page's
-- stuck table) newest first: a walk backwards over the started claims only, their lease in the
-- index, instead of sorting every started claim (345 ms for 50,000 stuck at 10 million claims).
-- Not CONCURRENTLY (see 0003): on a large table, build it by hand first (docs/operations.md).
CREATE INDEX IF NOT EXISTS claims_started_received ON claims (received_utc, id, lease_until)
    WHERE state = 'started';
