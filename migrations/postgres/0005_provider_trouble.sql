-- Attempts that ended waiting rather than deciding: a hand-off after answers that prove
-- nothing was applied (connection refused, 429, 503), a call the destination's breaker or
-- rate limit held back, a status lookup that got no answer. `max_attempts` counts
-- `attempt - waits`: a provider's bad hour never brings a claim closer to needs_attention.
-- A constant default: adding it rewrites nothing.
ALTER TABLE claims ADD COLUMN IF NOT EXISTS waits integer NOT NULL DEFAULT 0;

-- Each instance's view of each consumer's provider (circuit breaker state, pace, next probe),
-- as JSON, written when it changes and every 30 s: rows named 'destination:<consumer>:<instance>'
-- beside the sweeper's heartbeat, read by `claimd report` and the operator page.
ALTER TABLE claimd_heartbeats ADD COLUMN IF NOT EXISTS detail text;
