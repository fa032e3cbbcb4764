#!/usr/bin/env python3
"""tools/ncu_table.py — one line per kernel (and grid size) from Nsight Compute's raw CSV
(`ncu --csv --page raw --metrics ...`, what scripts/gpu_run.sh's `ncuall` phase writes):
how many launches, their median duration, DRAM throughput (% of the card's peak), bytes read,
SM throughput, issue-slot use and warps resident — sorted by the kernel's total time.

Why: a launch that moves its bytes at most of the DRAM's rate on an H100 is bandwidth-bound
there and speeds up on an H200; one far below it is bound by its own chain (latency,
issue, occupancy) and does not (docs/PERFORMANCE.md, session 43). One profiled forward of
many launches sorts them into the two kinds at once.

  tools/ncu_table.py res/ncuall.csv [--top N]

Columns that the CSV lacks print as nan; rows that are not data (ncu's notes, the program's
own output mixed into stdout) are skipped.
"""
import csv
import math
import re
import statistics
import sys

METRICS = [  # (raw metric name, column title, format)
    ("gpu__time_duration.sum", "med", "%9.1f"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram%", "%6.1f"),
    ("dram__bytes_read.sum", "read", "%11.0f"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm%", "%6.1f"),
    ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue%", "%6.1f"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "warps%", "%6.1f"),
]


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return math.nan


def load(path):
    """The header, the units row and the data rows of the first table in the file."""
    with open(path, newline="", errors="replace") as f:
        rows = list(csv.reader(f))
    for i, row in enumerate(rows):
        if "Kernel Name" in row:
            header = row
            units = rows[i + 1] if i + 1 < len(rows) else []
            return header, units, [r for r in rows[i + 2:] if len(r) == len(header)]
    sys.exit(f"{path}: no 'Kernel Name' column (not ncu --csv --page raw output)")


def table(header, units, data, top):
    col = {name: i for i, name in enumerate(header)}
    groups = {}
    for r in data:
        name = re.sub(r"\(.*", "", r[col["Kernel Name"]])  # the name without its argument list
        grid = r[col["launch__grid_size"]] if "launch__grid_size" in col else ""
        groups.setdefault((name, grid), []).append(r)

    def med(rs, metric):
        vals = [number(r[col[metric]]) for r in rs] if metric in col else []
        vals = [v for v in vals if not math.isnan(v)]
        return statistics.median(vals) if vals else math.nan

    lines = []
    for (name, grid), rs in groups.items():
        total = sum(number(r[col[METRICS[0][0]]]) for r in rs) if METRICS[0][0] in col else math.nan
        lines.append((total, name, grid, len(rs), [med(rs, m) for m, _, _ in METRICS]))
    lines.sort(key=lambda x: -x[0] if not math.isnan(x[0]) else 0)
    unit = units[col[METRICS[0][0]]] if METRICS[0][0] in col and units else "?"
    grand = sum(x[0] for x in lines if not math.isnan(x[0]))
    print(f"{len(data)} launches, {len(lines)} kernels, total {grand:.0f} {unit}; med = median duration ({unit})")
    print("%-56s %-14s %5s %9s " % ("kernel", "grid", "n", "total") + " ".join("%*s" % (len(fmt % 0), t) for _, t, fmt in METRICS))
    for total, name, grid, n, vals in lines[:top]:
        cells = " ".join(fmt % v for v, (_, _, fmt) in zip(vals, METRICS))
        print("%-56s %-14s %5d %9.0f %s" % (name[:56], grid[:14], n, total, cells))


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    top = 60
    if "--top" in argv:
        i = argv.index("--top")
        try:
            top = int(argv[i + 1])
        except (IndexError, ValueError):
            sys.exit("--top needs a number")
        del argv[i:i + 2]
    header, units, data = load(argv[0])
    table(header, units, data, top)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
