-- Priorities (docs/flow-control.md, "Priorities"): a claim's priority, -100 to 100, 0 when the
-- message names none.
ALTER TABLE claims ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;

-- The pickup's read by priority: a consumer's waiting claims, higher priority first, then
-- oldest.
CREATE INDEX IF NOT EXISTS claims_waiting_priority ON claims (consumer, priority DESC, id)
    WHERE state = 'started' AND lease_owner IS NULL;

-- The fair pickup's read of each tenant's waiting claims, higher priority first, then oldest
-- (claims_waiting_tenant still serves its walk over the tenants).
CREATE INDEX IF NOT EXISTS claims_waiting_tenant_priority
    ON claims (consumer, tenant, priority DESC, id)
    WHERE state = 'started' AND lease_owner IS NULL;
