-- `claimd reconcile --ledger` reads a consumer's claims of a window in key order, a page at a
-- time (keyset paging on idem_key, id). Byte order ("C"), the order the provider's side is
-- sorted in, whatever the database's collation.
CREATE INDEX IF NOT EXISTS claims_consumer_key ON claims (consumer, idem_key COLLATE "C", id);

-- The last ledger reconciliation of each consumer: when it ran and its summary (JSON), for
-- `claimd report`, the page and /metrics.
CREATE TABLE IF NOT EXISTS ledger_runs (
    consumer TEXT        PRIMARY KEY,
    at_utc   TIMESTAMPTZ NOT NULL DEFAULT now(),
    summary  TEXT        NOT NULL
);
