-- Flow control (docs/flow-control.md): order keys and scheduled sends.
--
-- order_key: claims of one consumer, tenant and order key run one at a time, in the order
-- they joined the line; NULL when the consumer orders nothing. A claim waiting for its line
-- is `started` with no lease owner and the "not called yet" marker; the pickup takes it.
-- not_before: a scheduled claim is sent no earlier than this; NULL when sent at once. Until
-- then it is `started` at attempt 0, held by the lease owner 'schedule' with its lease ending
-- at not_before, so the sweeper's takeover (one indexed read per pass, as for any expired
-- lease) sends it as attempt 1.
ALTER TABLE claims ADD COLUMN IF NOT EXISTS order_key TEXT;
ALTER TABLE claims ADD COLUMN IF NOT EXISTS not_before TIMESTAMPTZ;

-- The line of an order key: its unfinished claims, in id order.
CREATE INDEX IF NOT EXISTS claims_order_line ON claims (consumer, tenant, order_key, id)
    WHERE order_key IS NOT NULL AND state IN ('started', 'pending', 'needs_attention');

-- Claims waiting to be taken (no lease owner), by tenant: the fair pickup's walk over the
-- tenants that have some, and each one's oldest.
CREATE INDEX IF NOT EXISTS claims_waiting_tenant ON claims (consumer, tenant, id)
    WHERE state = 'started' AND lease_owner IS NULL;
