#!/usr/bin/env bash
# What a producer's own transaction costs PostgreSQL with no worker running: the floor under
# the enqueue rows of the producers bench (docs/performance.md, "What a producer's own
# transaction costs"). pgbench, FLOOR_CLIENTS clients (default 32, the producers bench's),
# each transaction as benches/producers.rs writes it, statements unnamed (`-M extended`, as
# `claimd::enqueue` sends them); PostgreSQL's CPU (the postmaster and its children, from /proc,
# so run it on the database's machine as a user that can read its data directory) per
# transaction. Prints a Markdown table.
#
#   cargo build --release --bin claimd && bash benches/producer_floor.sh
#
# FLOOR_PG: the server (default postgres://postgres@127.0.0.1:5432/postgres), on which a
# database of its own is created and dropped; FLOOR_TXNS: transactions per client (default
# 300); FLOOR_ROUNDS: rounds, each row once per round (default 2); CLAIMD: the binary that
# registers consumer `payments` (default target/release/claimd, else target/debug/claimd).
set -euo pipefail
cd "$(dirname "$0")/.."
server="${FLOOR_PG:-postgres://postgres@127.0.0.1:5432/postgres}"
clients="${FLOOR_CLIENTS:-32}"
txns="${FLOOR_TXNS:-300}"
rounds="${FLOOR_ROUNDS:-2}"
claimd="${CLAIMD:-target/release/claimd}"
[ -x "$claimd" ] || claimd=target/debug/claimd
name="claimd_floor_$$"
db="${server%/*}/$name"
work="$(mktemp -d)"
trap 'psql -q "$server" -c "DROP DATABASE IF EXISTS $name WITH (FORCE)" >/dev/null; rm -rf "$work"' EXIT
psql -q "$server" -c "CREATE DATABASE $name"

# A worker started once registers the consumer (claimd_consumers), then stops: nothing takes
# the claims the rows below write.
cat >"$work/claimd.toml" <<EOF
[store]
url = "$db"
max_connections = 2
[http]
listen = "127.0.0.1:0"
[[consumers]]
name = "payments"
source = "http"
concurrency = 64
lease = "60s"
key = "{message_id}"
[consumers.effect]
kind = "http"
url = "http://127.0.0.1:9/v1/payments"
timeout = "10s"
EOF
"$claimd" run --config "$work/claimd.toml" >"$work/claimd.log" 2>&1 &
worker=$!
for _ in $(seq 100); do
  [ "$(psql -At "$db" -c "SELECT count(*) FROM claimd_consumers" 2>/dev/null || echo 0)" = 1 ] && break
  sleep 0.1
done
kill "$worker"
wait "$worker" || true
psql -q "$db" -c "CREATE TABLE bench_orders (id text PRIMARY KEY, amount_cents bigint)"
postmaster="$(head -n1 "$(psql -At "$db" -c 'SHOW data_directory')/postmaster.pid")"

# The CPU seconds of the postmaster and its children (the reaped ones in its own counters).
pg_cpu() {
  python3 - "$postmaster" <<'PY'
import os, sys
def stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        s = f.read()
    r = s[s.rfind(")") + 2:].split()
    return int(r[1]), int(r[11]) + int(r[12]), int(r[13]) + int(r[14])
root = int(sys.argv[1])
_, own, reaped = stat(root)
total = own + reaped
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            parent, own, _ = stat(p)
        except OSError:
            continue
        if parent == root:
            total += own
print(total / os.sysconf("SC_CLK_TCK"))
PY
}

order="INSERT INTO bench_orders (id, amount_cents) VALUES (:client_id || '-' || :r, 100);"
payload="convert_to('{\"order_id\":\"order-1234\",\"amount_cents\":1234}', 'UTF8')"
registry="SELECT key_template, max_key_length, max_payload_bytes::bigint AS max_payload_bytes, ordered FROM claimd_consumers WHERE name = 'payments';"
function="SELECT id, created FROM claimd.enqueue_bytes('payments', :client_id || '-' || :r, $payload, '', 'application/json', 0);"
insert="INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, content_type, lease_owner, lease_until, handoff, handoff_attempt, priority) VALUES ('payments', '', :client_id || '-' || :r, :client_id || '-' || :r, 'f', $payload, 'application/json', NULL, now() + interval '60 seconds', 'not_called', 1, 0) ON CONFLICT ON CONSTRAINT claims_identity DO NOTHING RETURNING id;"
rand='\set r random(1, 9000000000000000000)'
printf '%s\n%s\n' "$rand" "$order" >"$work/1.sql"
printf '%s\nBEGIN;\n%s\nCOMMIT;\n' "$rand" "$order" >"$work/2.sql"
printf '%s\nBEGIN;\n%s\n%s\nCOMMIT;\n' "$rand" "$order" "$insert" >"$work/3.sql"
printf '%s\nBEGIN;\n%s\n%s\nCOMMIT;\n' "$rand" "$order" "$function" >"$work/4.sql"
printf '%s\nBEGIN;\n%s\n%s\n%s\nCOMMIT;\n' "$rand" "$order" "$registry" "$function" >"$work/5.sql"
rows=(
  "the order row alone, autocommit (an HTTP producer's own write)"
  "the order row in BEGIN … COMMIT"
  "… and a claim by a plain INSERT into claims (its triggers on)"
  "… and the claim by claimd.enqueue_bytes instead"
  "… and the registry read claimd::enqueue makes first (what the producers bench runs)"
)

echo
echo "pgbench -M extended, $clients clients × $txns transactions, $rounds rounds, load $(cut -d' ' -f1 /proc/loadavg)"
echo
echo "| producer's transaction | transactions/s | PostgreSQL CPU ms/transaction |"
echo "|---|---|---|"
declare -A tps cpu
for round in $(seq "$rounds"); do
  for i in 1 2 3 4 5; do
    psql -q "$db" -c "TRUNCATE bench_orders" -c "DELETE FROM claims" -c "VACUUM ANALYZE claims, bench_orders" >/dev/null
    before="$(pg_cpu)"
    out="$(pgbench -n -M extended -c "$clients" -j 2 -t "$txns" -f "$work/$i.sql" "$db" 2>&1)"
    after="$(pg_cpu)"
    t="$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -n1)"
    c="$(python3 -c "print(f'{($after - $before) * 1000 / ($clients * $txns):.2f}')")"
    tps[$i]="${tps[$i]:+${tps[$i]} / }$(printf '%.0f' "$t")"
    cpu[$i]="${cpu[$i]:+${cpu[$i]} / }$c"
  done
done
for i in 1 2 3 4 5; do
  echo "| ${rows[$((i - 1))]} | ${tps[$i]} | ${cpu[$i]} |"
done
