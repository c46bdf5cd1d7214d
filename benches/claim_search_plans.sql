-- Claim search plans at 10 million claims (docs/performance.md, "Claim search").
-- Run against an EMPTY database of your own, migrated (claimd migrate), niced:
--   createdb claims_10m && claimd migrate --config <config naming it>
--   nice -n 19 psql postgres://.../claims_10m -f benches/claim_search_plans.sql
-- Drop the database afterwards. Fill: indexes dropped, rows inserted, indexes rebuilt.

CREATE TEMP TABLE idx AS SELECT indexname, indexdef FROM pg_indexes
  WHERE tablename = 'claims' AND indexname NOT IN ('claims_pkey', 'claims_identity');
DO $$ DECLARE r record; BEGIN FOR r IN SELECT indexname FROM idx LOOP EXECUTE 'DROP INDEX ' || r.indexname; END LOOP; END $$;
SET synchronous_commit = off;
INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, content_type,
  state, attempt, lease_owner, lease_until, received_utc, started_utc, processed_utc, updated_utc,
  last_error, provider_status, provider_response, provider_id)
SELECT c.consumer, c.tenant, c.mid, c.consumer || ':' || c.tenant || ':' || c.mid, md5(c.mid),
  convert_to('{"amount":' || (i % 100000) || ',"currency":"EUR"}', 'UTF8'), 'application/json',
  c.state, 1, CASE WHEN c.state = 'started' THEN 'w1' END,
  CASE WHEN c.state = 'started' THEN c.received + interval '60 s' END,
  c.received, c.received, CASE WHEN c.state IN ('completed', 'failed') THEN c.received + interval '2 s' END,
  c.received + interval '2 s',
  CASE c.state WHEN 'failed' THEN 'provider rejected the request with 400' WHEN 'needs_attention' THEN 'outcome unknown (timeout after 10s, request sent); on_unknown = "park"' END,
  CASE WHEN c.state IN ('completed', 'failed') THEN CASE c.state WHEN 'failed' THEN 400 ELSE 200 END END,
  CASE WHEN c.state IN ('completed', 'failed') THEN '{"id":"pi_' || md5(c.mid) || '"}' END,
  CASE WHEN i % 2 = 0 THEN 'pi_' || md5(c.mid) END
FROM generate_series(1, 10000000) AS i,
LATERAL (SELECT
  (ARRAY['payments','payments','payments','emails','refunds'])[1 + i % 5] AS consumer,
  CASE WHEN i % 10 < 3 THEN 'tenant-' || (i % 1000) ELSE '' END AS tenant,
  'order-' || lpad(i::text, 9, '0') AS mid,
  CASE WHEN i % 200 = 7 THEN 'needs_attention' WHEN i % 200 = 11 THEN 'started'
       WHEN i % 50 = 3 THEN 'failed' ELSE 'completed' END AS state,
  now() - interval '30 days' + (i * interval '259 ms') AS received) AS c;
DO $$ DECLARE r record; BEGIN FOR r IN SELECT indexdef FROM idx LOOP EXECUTE r.indexdef; END LOOP; END $$;
VACUUM ANALYZE claims;

\set cols 'id, consumer, tenant, message_id, idem_key, fingerprint, content_type, state, attempt, lease_owner, lease_until, received_utc, started_utc, processed_utc, last_error, provider_status, provider_response, duplicate_count, mismatch_count, reconciled, resent_count, handoff, handoff_attempt, claim_token, waits, provider_id, pending_utc'
\set where '($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR consumer = $2) AND (NOT $3 OR (state = ''started'' AND lease_until < now())) AND ($4::timestamptz IS NULL OR received_utc >= $4) AND ($6::timestamptz IS NULL OR received_utc < $6) AND ($7::text IS NULL OR tenant = $7) AND ($8::timestamptz IS NULL OR (received_utc, id) < ($8, $9::bigint))'
\set order ' ORDER BY received_utc DESC, id DESC LIMIT $5'
PREPARE search_claims AS SELECT :cols FROM claims WHERE id IN (
 SELECT id FROM (SELECT id FROM claims WHERE message_id COLLATE "C" >= $10 AND message_id COLLATE "C" < $11 AND :where :order) AS by_id
 UNION ALL SELECT id FROM (SELECT id FROM claims WHERE idem_key COLLATE "C" >= $10 AND idem_key COLLATE "C" < $11 AND :where :order) AS by_key
 UNION ALL SELECT id FROM (SELECT id FROM claims WHERE provider_id IS NOT NULL AND provider_id COLLATE "C" >= $10 AND provider_id COLLATE "C" < $11 AND :where :order) AS by_provider_id
 UNION ALL SELECT id FROM (SELECT id FROM claims WHERE tenant <> '' AND tenant = $10 AND :where :order) AS by_tenant)
 :order;
PREPARE list_claims AS SELECT :cols FROM claims WHERE :where :order;
PREPARE list_stuck_claims AS SELECT :cols FROM claims WHERE state = 'started' AND lease_until < now() AND $3 AND :where :order;
\timing on
\echo '--- search: an exact message id'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE search_claims(NULL, NULL, false, NULL, 25, NULL, NULL, NULL, NULL, 'order-004200007', 'order-004200007' || chr(1114111));
\echo '--- search: a prefix of ids (10 matches)'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE search_claims(NULL, NULL, false, NULL, 25, NULL, NULL, NULL, NULL, 'order-00420001', 'order-00420001' || chr(1114111));
\echo '--- search: a whole key'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE search_claims(NULL, NULL, false, NULL, 25, NULL, NULL, NULL, NULL, 'payments::order-004200005', 'payments::order-004200005' || chr(1114111));
\echo '--- search: a provider id'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE search_claims(NULL, NULL, false, NULL, 25, NULL, NULL, NULL, NULL, 'pi_55aa53d595fe6bcd56c42b0f90c20281', 'pi_55aa53d595fe6bcd56c42b0f90c20281' || chr(1114111));
\echo '--- search: a tenant (10,000 claims), newest 25'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE search_claims(NULL, NULL, false, NULL, 25, NULL, NULL, NULL, NULL, 'tenant-10', 'tenant-10' || chr(1114111));
\echo '--- search + filters: a prefix matching 100,000 ids, consumer, state, last 7 days'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE search_claims('completed', 'payments', false, now() - interval '7 days', 25, NULL, NULL, NULL, NULL, 'order-0098', 'order-0098' || chr(1114111));
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE search_claims(NULL, NULL, false, NULL, 25, NULL, NULL, NULL, NULL, 'order-004200008', 'order-004200008' || chr(1114111));
\echo '--- search: a prefix every claim has (order-0), newest 25'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE search_claims(NULL, NULL, false, NULL, 25, NULL, NULL, NULL, NULL, 'order-0', 'order-0' || chr(1114111));
\echo '--- search: a prefix of 100,000 ids, only the parked ones (500)'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE search_claims('needs_attention', NULL, false, NULL, 25, NULL, NULL, NULL, NULL, 'order-0098', 'order-0098' || chr(1114111));
\echo '--- search: next page of the tenant (cursor)'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE search_claims(NULL, NULL, false, NULL, 25, NULL, NULL, now() - interval '15 days', 99999999, 'tenant-10', 'tenant-10' || chr(1114111));
\echo '--- list: failed claims of emails, page 1'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE list_claims('failed', 'emails', false, NULL, 25, NULL, NULL, NULL, NULL);
\echo '--- list: failed claims of emails, a page deep in (cursor 20 days back)'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE list_claims('failed', 'emails', false, NULL, 25, NULL, NULL, now() - interval '20 days', 0);
\echo '--- list: parked claims (any consumer)'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE list_claims('needs_attention', NULL, false, NULL, 25, NULL, NULL, NULL, NULL);
\echo '--- list: stuck claims (50,000), through the general statement'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE list_claims('started', NULL, true, NULL, 25, NULL, NULL, NULL, NULL);
\echo '--- list: stuck claims, first page'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE list_stuck_claims(NULL, NULL, true, NULL, 25, NULL, NULL, NULL, NULL);
\echo '--- list: stuck claims of payments, a page 20 days deep (cursor)'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE list_stuck_claims(NULL, 'payments', true, NULL, 25, NULL, NULL, now() - interval '20 days', 0);
\echo '--- list: stuck claims, after the fifth run (the generic plan)'
EXECUTE list_stuck_claims(NULL, NULL, true, NULL, 25, NULL, NULL, NULL, NULL) \g /dev/null
EXECUTE list_stuck_claims(NULL, NULL, true, NULL, 25, NULL, NULL, NULL, NULL) \g /dev/null
EXECUTE list_stuck_claims(NULL, NULL, true, NULL, 25, NULL, NULL, NULL, NULL) \g /dev/null
EXECUTE list_stuck_claims(NULL, NULL, true, NULL, 25, NULL, NULL, NULL, NULL) \g /dev/null
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE list_stuck_claims(NULL, NULL, true, NULL, 25, NULL, NULL, NULL, NULL);
\echo '--- list: a tenant'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE list_claims(NULL, NULL, false, NULL, 25, NULL, 'tenant-10', NULL, NULL);
\echo '--- list: everything, a time range (a day, 10 days ago)'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE list_claims(NULL, NULL, false, now() - interval '11 days', 25, now() - interval '10 days', NULL, NULL, NULL);
