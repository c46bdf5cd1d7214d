-- `claimd reconcile --ledger` reads a consumer's claims of a window in key order (keyset
-- paging on idem_key, id; SQLite's BINARY collation is byte order).
CREATE INDEX IF NOT EXISTS claims_consumer_key ON claims (consumer, idem_key, id);

-- The last ledger reconciliation of each consumer (see migrations/postgres/0008_ledger.sql).
CREATE TABLE IF NOT EXISTS ledger_runs (
    consumer TEXT    PRIMARY KEY,
    at_utc   INTEGER NOT NULL,
    summary  TEXT    NOT NULL
);
