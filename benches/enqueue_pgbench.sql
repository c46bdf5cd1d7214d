-- One producer's transaction: an order row and its enqueue, as benches/producers.rs writes
-- them, for pgbench against a database claimd migrated (a worker configured with consumer
-- `payments` started once, so it is registered; a table
-- `bench_orders (id text PRIMARY KEY, amount_cents bigint)` created):
--   pgbench -n -M prepared -c 8 -j 2 -T 12 -f benches/enqueue_pgbench.sql DB
-- and against the function before 0029: sh benches/enqueue_bytes_0025.sh | psql -d DB (back:
-- psql -d DB -f migrations/postgres/0029_enqueue_inline_checks.sql). TRUNCATE bench_orders
-- between runs: ids are random, and a repeated one stops its client.
\set r random(1, 9000000000000000000)
BEGIN;
INSERT INTO bench_orders (id, amount_cents) VALUES (:client_id || '-' || :r, 100);
SELECT * FROM claimd.enqueue_bytes('payments', :client_id || '-' || :r, convert_to('{"amount_cents":100,"currency":"EUR","customer":"c1"}', 'UTF8'));
COMMIT;
