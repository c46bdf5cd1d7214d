-- The path segments of a consumer's provider URLs that a message's values fill, as a JSON
-- array (as on PostgreSQL, migration 0018): a producer's enqueue refuses a message whose
-- values make one '.', '..' (also percent-encoded) or empty, as HTTP intake does.
ALTER TABLE claimd_consumers ADD COLUMN url_segments TEXT NOT NULL DEFAULT '[]';
