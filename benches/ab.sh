#!/usr/bin/env bash
# Alternating A/B runs of the throughput bench: builds compared on the same machine, in turn
# (each round starting with the next build), so that drift in the machine's load falls on every
# build alike.
#
#   benches/ab.sh ROUNDS NAME=BENCH_BINARY [NAME=BENCH_BINARY ...]
#
# Each bench binary is a `cargo bench --features full --bench throughput --no-run` build of the commit to
# compare (its path is printed by cargo: target/release/deps/throughput-<hash>). The designs,
# latencies and sizes come from the environment as for the bench itself; the defaults here
# are claimd-pg and claimd-sqlite at 0 ms and 50 ms, 20,000 posts, no database-only or
# memory section. Prints, per build, design and latency, the median msgs/s and server CPU
# ms/msg over the rounds and their difference from the first build.
set -euo pipefail
rounds="$1"
shift
export BENCH_DESIGNS="${BENCH_DESIGNS:-claimd-pg,claimd-sqlite}"
export BENCH_LATENCIES="${BENCH_LATENCIES:-0,50}"
export BENCH_N="${BENCH_N:-20000}"
export BENCH_DB_N="${BENCH_DB_N:-0}"
export BENCH_INFLIGHT="${BENCH_INFLIGHT:-}"
out="${AB_DIR:-target/bench/ab}"
mkdir -p "$out"
builds=("$@")
for round in $(seq 1 "$rounds"); do
  # Each round starts with the next build, so that whatever drifts within a round (a
  # checkpoint, the page cache) falls on every build alike; and each run starts after a
  # checkpoint, so that no run pays for the previous run's writes.
  for i in $(seq 0 $((${#builds[@]} - 1))); do
    pair="${builds[$(( (i + round - 1) % ${#builds[@]} ))]}"
    name="${pair%%=*}"
    bin="${pair#*=}"
    echo "== round $round: $name" >&2
    psql -q "${BENCH_PG:-postgres://postgres@127.0.0.1:5432/postgres}" -c CHECKPOINT >/dev/null 2>&1 || true
    BENCH_CSV="$out/$name-$round.csv" "$bin" --bench >"$out/$name-$round.log" 2>&1 \
      || { echo "$name round $round failed; see $out/$name-$round.log" >&2; exit 1; }
  done
done
python3 - "$out" "$rounds" "$@" <<'PY'
import csv, statistics, sys
out, rounds, builds = sys.argv[1], int(sys.argv[2]), [a.split("=", 1)[0] for a in sys.argv[3:]]
rows = {}
for b in builds:
    for r in range(1, rounds + 1):
        for row in csv.DictReader(open(f"{out}/{b}-{r}.csv")):
            key = (row["design"], int(row["latency_ms"]))
            rows.setdefault((b, key), []).append(
                (float(row["msgs_per_s"]), float(row["server_cpu_ms_per_msg"])))
keys = sorted({k for (_, k) in rows})
print(f"| design | latency ms | build | msgs/s (median of {rounds}) | vs {builds[0]} | server CPU ms/msg | vs {builds[0]} |")
print("|---|---|---|---|---|---|---|")
for k in keys:
    base = rows.get((builds[0], k))
    for b in builds:
        v = rows.get((b, k))
        if not v:
            continue
        rate = statistics.median(x for x, _ in v)
        cpu = statistics.median(y for _, y in v)
        brate = statistics.median(x for x, _ in base)
        bcpu = statistics.median(y for _, y in base)
        print(f"| {k[0]} | {k[1]} | {b} | {rate:.0f} | {100*(rate/brate-1):+.1f} % | {cpu:.3f} | {100*(cpu/bcpu-1):+.1f} % |")
PY
