-- The intake call that inserts a claim writes a random token with it. When the connection is
-- cut after the commit and before its reply (or a batched insert fails as a whole after it
-- committed), the call's retry finds the row, sees its own token and performs the claim,
-- instead of taking it for another delivery's duplicate and leaving it to wait a lease.
-- Nullable, no default: adding it rewrites nothing.
ALTER TABLE claims ADD COLUMN IF NOT EXISTS claim_token text;
