#!/usr/bin/env python3
"""Plot throughput against provider latency from the CSV `cargo bench --features full --bench throughput` writes.

Usage: python3 scripts/plot_throughput.py [target/bench/throughput.csv] [docs/throughput.png]
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {
    "direct": "direct call in the handler (no claim; unsafe ceiling)",
    "txn": "single-transaction inbox (connection held during the call)",
    "claimd-sqlite": "claimd, SQLite",
    "claimd-pg": "claimd, PostgreSQL (batched writes, claims ahead)",
    "claimd-pg-park": "claimd, PostgreSQL, on_unknown = park (slot before claim)",
    "claimd-pg-unbatched": "claimd, PostgreSQL (batch_writes = false)",
    "claimd-pg-wide": "claimd, PostgreSQL, consumer concurrency {wide}",
    "underway": "underway 0.2 (job queue peer)",
    "apalis": "apalis 1.0 (job queue peer)",
}
STYLE = {
    "direct": ("tab:gray", "o", "--"),
    "txn": ("tab:red", "s", "-"),
    "claimd-sqlite": ("tab:blue", "^", "-"),
    "claimd-pg": ("tab:green", "D", "-"),
    "claimd-pg-park": ("tab:cyan", "<", ":"),
    "claimd-pg-unbatched": ("tab:olive", "v", ":"),
    "claimd-pg-wide": ("tab:purple", "P", "-."),
    "underway": ("tab:brown", "x", "--"),
    "apalis": ("tab:orange", "x", "--"),
}


def main() -> None:
    src = sys.argv[1] if len(sys.argv) > 1 else "target/bench/throughput.csv"
    dst = sys.argv[2] if len(sys.argv) > 2 else "docs/throughput.png"
    series = defaultdict(list)
    wide = {}
    meta = None
    with open(src, newline="") as f:
        for row in csv.DictReader(f):
            # The memory run (many effects in flight, long latency) is not part of the sweep.
            if "-memory" in row["design"]:
                continue
            if meta is None or row["design"] == "claimd-pg":
                meta = row
            wide[row["design"]] = row["consumer_concurrency"]
            series[row["design"]].append((int(row["latency_ms"]), float(row["msgs_per_s"])))
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    for design, points in series.items():
        points.sort()
        color, marker, line = STYLE.get(design, (None, "x", "-"))
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker=marker,
            linestyle=line,
            color=color,
            label=LABELS.get(design, design).format(wide=wide.get(design, "")),
        )
        for x, y in points:
            ax.annotate(f"{y:,.0f}", (x, y), textcoords="offset points", xytext=(4, 5), fontsize=8)
    ax.set_xlabel("provider latency (ms)")
    ax.set_ylabel("messages / s (log scale)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(
        "claimd vs alternatives: throughput against provider latency\n"
        f"{meta['n']} posts (10% duplicates), {meta['client_concurrency']} client connections, "
        f"pool {meta['pool']}, claimd consumer concurrency {meta['consumer_concurrency']}",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(dst)
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
