#!/usr/bin/env python3
"""Sums an Nsight Compute CSV (--metrics gpu__time_duration.sum --csv) per kernel name.

Usage: ncu_summary.py FILE.csv [--tokens N] [--top K]
With --tokens the sums are divided by N (a decode run's token count, warm-up included), so the
figures read as per-token device time per kernel.
"""
import argparse
import collections
import csv

UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--tokens", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=24)
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv, newline="")))
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if head is None:
        print(f"{a.csv}: no kernel rows (did the program run?)")
        return
    h = rows[head]
    ki, mi, vi, ui = (h.index(c) for c in ("Kernel Name", "Metric Name", "Metric Value", "Metric Unit"))
    total = collections.defaultdict(float)
    count = collections.Counter()
    for r in rows[head + 1:]:
        if len(r) <= vi or r[mi] != "gpu__time_duration.sum":
            continue
        name = r[ki].split("(")[0][:70]
        total[name] += float(r[vi].replace(",", "")) * UNITS.get(r[ui], 1.0)
        count[name] += 1
    n = a.tokens
    print(f"kernels {sum(count.values()) / n:.1f} per token, {sum(total.values()) / n:.1f} us per token")
    for k, v in sorted(total.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"{v / n:9.1f} us {count[k] / n:7.1f} x {v / count[k]:7.2f} us  {k}")


if __name__ == "__main__":
    main()
