#!/usr/bin/env python3
"""Summarizes a Tandem Chrome trace (tandem run/bench --trace) per track: when the track's first
span starts and its last ends (ms from the trace's first span), how long it was busy, and its
largest idle gaps, so where a step waits shows without drawing it.

    python3 scripts/trace_summary.py trace.json [--gaps N]"""
import argparse, json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--gaps", type=int, default=3, help="largest gaps to list per track")
    a = ap.parse_args()
    events = json.load(open(a.trace))["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        print("no spans")
        return
    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e["dur"] for e in spans)
    print(f"span {(t1 - t0) / 1e3:.2f} ms, {len(spans)} events")
    for tid in sorted(names):
        mine = sorted((e for e in spans if e["tid"] == tid), key=lambda e: e["ts"])
        if not mine:
            continue
        busy, gaps, end = 0.0, [], None
        for e in mine:
            if end is not None and e["ts"] > end:
                gaps.append((e["ts"] - end, end, e["name"]))
            busy += e["dur"]
            end = max(end or 0, e["ts"] + e["dur"])
        first, last = (mine[0]["ts"] - t0) / 1e3, (end - t0) / 1e3
        big = sorted(gaps, reverse=True)[: a.gaps]
        gap_text = ", ".join(f"{g / 1e3:.2f} ms at {(at - t0) / 1e3:.2f} before {n}"
                             for g, at, n in big)
        print(f"{names[tid]:>24}: {first:7.2f} - {last:7.2f} ms, busy {busy / 1e3:7.2f} ms, "
              f"{len(mine)} spans; gaps: {gap_text}")


if __name__ == "__main__":
    main()
