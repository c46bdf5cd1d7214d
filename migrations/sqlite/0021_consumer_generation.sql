-- Rolling upgrades (docs/operations.md, "Upgrading"): each consumer's configuration
-- generation and effect kind, as the newest instance registered them. Expand-only.
ALTER TABLE claimd_consumers ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
ALTER TABLE claimd_consumers ADD COLUMN effect_kind TEXT NOT NULL DEFAULT '';
