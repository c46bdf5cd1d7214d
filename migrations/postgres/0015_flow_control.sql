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

-- Whether a consumer orders its claims by an order key: an enqueued claim, which carries none,
-- is refused for such a consumer (claimd::enqueue, and on PostgreSQL claimd.enqueue: CD010).
ALTER TABLE claimd_consumers ADD COLUMN IF NOT EXISTS ordered BOOLEAN NOT NULL DEFAULT false;

-- The SQL function inserts enqueued claims with no lease owner and no order key: refuse them
-- for an ordered consumer. Only such rows run the check (intake's rows have a lease owner).
CREATE OR REPLACE FUNCTION claimd.refuse_unordered() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF EXISTS (SELECT 1 FROM claimd_consumers c WHERE c.name = NEW.consumer AND c.ordered) THEN
        RAISE EXCEPTION 'consumer % orders its claims by order_key, which an enqueued claim cannot carry: send the message through HTTP or AMQP intake',
            quote_literal(NEW.consumer) USING ERRCODE = 'CD010';
    END IF;
    RETURN NEW;
END
$fn$;

DROP TRIGGER IF EXISTS claims_enqueue_ordered ON claims;
CREATE TRIGGER claims_enqueue_ordered BEFORE INSERT ON claims
    FOR EACH ROW WHEN (NEW.lease_owner IS NULL AND NEW.order_key IS NULL)
    EXECUTE FUNCTION claimd.refuse_unordered();
