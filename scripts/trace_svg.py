#!/usr/bin/env python3
"""Draws a Tandem Chrome trace (tandem run/bench --trace) as an SVG timeline, one row a track.

    python3 scripts/trace_svg.py trace.json out.svg [--title TEXT]

Segments, streamed copies and transfers are drawn where the device timeline put them, so the
overlap of a GPU's copy queue with its execution shows at a glance."""
import argparse, json, html

COLORS = {"segment": "#4c78a8", "weight": "#f58518", "graph": "#bab0ac"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("svg")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    events = json.load(open(a.trace))["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e["dur"] for e in spans)
    tracks = [t for t in sorted(names) if any(e["tid"] == t for e in spans)]
    left, width, row, top = 150, 900, 28, 40
    scale = width / (t1 - t0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" '
           f'height="{top + row * len(tracks) + 40}" font-family="sans-serif" font-size="12">',
           f'<text x="10" y="20" font-size="14">{html.escape(a.title)}</text>']
    for i, tid in enumerate(tracks):
        y = top + i * row
        out.append(f'<text x="10" y="{y + 17}">{html.escape(names[tid])}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{width}" height="{row - 4}" fill="#f4f4f4"/>')
        for e in spans:
            if e["tid"] != tid:
                continue
            x = left + (e["ts"] - t0) * scale
            w = max(0.5, e["dur"] * scale)
            color = COLORS.get(e["name"], "#54a24b")
            out.append(f'<rect x="{x:.2f}" y="{y + 2}" width="{w:.2f}" height="{row - 8}" '
                       f'fill="{color}" stroke="white" stroke-width="0.3"/>')
    y = top + len(tracks) * row + 16
    for ms in range(0, int((t1 - t0) / 1000) + 1, 5):
        x = left + ms * 1000 * scale
        out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{y - 12}" stroke="#ccc"/>')
        out.append(f'<text x="{x:.1f}" y="{y}" text-anchor="middle">{ms} ms</text>')
    out.append("</svg>")
    open(a.svg, "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
