#!/usr/bin/env bash
# A private PostgreSQL cluster for profiling the throughput bench (issue 16 §2): the same
# server version as the machine's, on port 5433, with pg_stat_statements loaded (the shared
# server on 5432 is not restarted for it). Trust auth on loopback, data in $PGPRIV (default
# /tmp/claimd-pg-private). `scripts/pg_private.sh stop` stops it.
#
#   scripts/pg_private.sh
#   BENCH_PG=postgres://postgres@127.0.0.1:5433/postgres BENCH_PG_STATEMENTS=1 \
#     BENCH_DESIGNS=claimd-pg BENCH_LATENCIES=0 cargo bench --features full --bench throughput
set -euo pipefail
dir="${PGPRIV:-/tmp/claimd-pg-private}"
bin="/usr/lib/postgresql/$(ls /usr/lib/postgresql | sort -n | tail -n1)/bin"
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if [ "${1:-}" = "stop" ]; then
  as_pg "$bin/pg_ctl" -D "$dir" stop -m fast
  exit 0
fi
if [ ! -f "$dir/PG_VERSION" ]; then
  mkdir -p "$dir"
  [ "$(id -u)" -eq 0 ] && chown postgres "$dir"
  as_pg "$bin/initdb" -D "$dir" -U postgres --auth=trust >/dev/null
fi
as_pg "$bin/pg_ctl" -D "$dir" -l "$dir/log" -w start -o \
  "-p 5433 -k /tmp -c listen_addresses=127.0.0.1 -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all -c max_connections=200"
echo "private PostgreSQL on postgres://postgres@127.0.0.1:5433/postgres (data $dir)"
