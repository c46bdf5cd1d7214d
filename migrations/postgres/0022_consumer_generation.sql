-- Rolling upgrades (docs/operations.md, "Upgrading"): each consumer's configuration
-- generation and effect kind, as the newest instance registered them. An instance whose
-- configuration is behind takes no claim of the consumer and stops. Expand-only: older builds
-- neither read nor write these columns, and their registration leaves them as they are.
ALTER TABLE claimd_consumers ADD COLUMN IF NOT EXISTS generation BIGINT NOT NULL DEFAULT 0;
ALTER TABLE claimd_consumers ADD COLUMN IF NOT EXISTS effect_kind TEXT NOT NULL DEFAULT '';
