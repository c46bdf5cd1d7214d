#!/bin/sh
# Prints `claimd.enqueue_bytes` as migration 0025 made it (before 0029 put the helpers' fast
# paths in it), read from that migration, as SQL to run on a database claimd migrated:
#   BENCH_EXTRA_SQL="$(sh benches/enqueue_bytes_0025.sh)" cargo bench --features full --bench producers
#   sh benches/enqueue_bytes_0025.sh | psql -d DB
# (docs/performance.md). Back to 0029's: psql -d DB -f migrations/postgres/0029_enqueue_inline_checks.sql
set -eu
migration="$(dirname "$0")/../migrations/postgres/0025_priorities.sql"
sed -n '/^CREATE FUNCTION claimd.enqueue_bytes(/,/^\$fn\$;$/p' "$migration" |
    sed '1s/^CREATE FUNCTION/CREATE OR REPLACE FUNCTION/'
# CREATE OR REPLACE resets the search_path pin: set again as migration 0029 sets it.
sed -n '/^DO \$do\$$/,/^\$do\$;$/p' "$(dirname "$0")/../migrations/postgres/0029_enqueue_inline_checks.sql"
