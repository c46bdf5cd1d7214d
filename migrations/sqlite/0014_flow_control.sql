-- Flow control (docs/flow-control.md): order keys and scheduled sends (see the PostgreSQL
-- migration of the same name). not_before is milliseconds since the epoch, as every time here.
ALTER TABLE claims ADD COLUMN order_key TEXT;
ALTER TABLE claims ADD COLUMN not_before INTEGER;

CREATE INDEX IF NOT EXISTS claims_order_line ON claims (consumer, tenant, order_key, id)
    WHERE order_key IS NOT NULL AND state IN ('started', 'pending', 'needs_attention');

-- Claims waiting to be taken (no lease owner), by tenant: the fair pickup's walk over the
-- tenants that have some, and each one's oldest.
CREATE INDEX IF NOT EXISTS claims_waiting_tenant ON claims (consumer, tenant, id)
    WHERE state = 'started' AND lease_owner IS NULL;

-- Whether a consumer orders its claims by an order key: an enqueued claim, which carries none,
-- is refused for such a consumer (claimd::enqueue, and on PostgreSQL claimd.enqueue: CD010).
ALTER TABLE claimd_consumers ADD COLUMN ordered INTEGER NOT NULL DEFAULT 0;
