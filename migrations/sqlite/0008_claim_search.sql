-- Claim search (see migrations/postgres/0009_claim_search.sql). SQLite compares text byte by
-- byte (BINARY), so a prefix is a range on a plain index.
CREATE INDEX IF NOT EXISTS claims_search_message_id ON claims (message_id);
CREATE INDEX IF NOT EXISTS claims_search_idem_key ON claims (idem_key);
CREATE INDEX IF NOT EXISTS claims_search_provider_id ON claims (provider_id)
    WHERE provider_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS claims_search_tenant ON claims (tenant, received_utc)
    WHERE tenant <> '';
