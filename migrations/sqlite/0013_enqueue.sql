-- Transactional enqueue (docs/producers.md): a producer inserts a claim in its own
-- transaction through claimd::enqueue; the claim exists if and only if that transaction
-- commits, and a worker's poll takes it after the commit.

-- What a producer's transaction needs to know of each consumer to refuse what HTTP intake
-- refuses. Every worker upserts its configured consumers at start and never deletes one.
CREATE TABLE IF NOT EXISTS claimd_consumers (
    name              TEXT    PRIMARY KEY,
    key_template      TEXT    NOT NULL,
    max_key_length    INTEGER NOT NULL,
    keys_tenant       INTEGER NOT NULL,
    max_payload_bytes INTEGER NOT NULL,
    updated_utc       INTEGER NOT NULL
);

-- Enqueued claims no worker has taken yet (no lease owner): the poll's one indexed read.
CREATE INDEX IF NOT EXISTS claims_enqueued ON claims (consumer, id)
    WHERE state = 'started' AND lease_owner IS NULL;
