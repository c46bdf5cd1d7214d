-- Claim search (`claims list --search`, `GET /v1/claims?q=`, the page's search box): a text
-- matches a claim whose message id, idempotency key or provider id is that text or starts
-- with it, or whose tenant is that text. Each is a range on a byte-ordered ("C") index, so a
-- search reads the matching rows only, whatever the table's size, and `%` or `_` in the text
-- mean nothing special. Tenants and provider ids are indexed only where there is one.
-- Not CONCURRENTLY (see 0003): on a large table, build them by hand with CONCURRENTLY before
-- upgrading (docs/operations.md).
CREATE INDEX IF NOT EXISTS claims_search_message_id ON claims ((message_id COLLATE "C"));
CREATE INDEX IF NOT EXISTS claims_search_idem_key ON claims ((idem_key COLLATE "C"));
CREATE INDEX IF NOT EXISTS claims_search_provider_id ON claims ((provider_id COLLATE "C"))
    WHERE provider_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS claims_search_tenant ON claims (tenant, received_utc)
    WHERE tenant <> '';
