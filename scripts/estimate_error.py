#!/usr/bin/env python3
"""Per-op estimate error from a trace written by `tandem run --stats --trace FILE`.

Prints the median |estimated - actual| / actual over every timed op; the same once per op of the
decode graph, its time the median of its runs (one a token; the prefill, a run's first and cold
pass, left out); the noise floor (the first line with each op estimated by the median time of its
own op and shape in this very trace: no model does better on this run); then per op name and phase
(decode: one-token ops; prefill: the rest), worst first, with the median estimated / actual (the
direction) and how many of the group's ops are off by more than 15% (what moves the overall
median).

--plan PLAN.txt takes each op's estimate from `tandem plan --ops` output (the run's model, -p,
-c, -t and --strategy, another --cost-profile) instead of the trace: the run's times held, the
error of another calibration. Ops in the trace's first graph are the plan's prefill, the rest
its decode.
--by-node N lists the decode graph's first N ops, one line each (node, op, median estimate,
median time, their ratio): ops of one key and shape that run at different paces (a layer's
gate and up against its down) show there.
usage: estimate_error.py TRACE.json [--by-shape] [--by-node N] [--plan PLAN.txt]
"""
import json
import re
import signal
import statistics
import sys
from collections import defaultdict


def plan_estimates(path):
    """{phase: {node: estimated us}} from `tandem plan --ops` text."""
    phases, phase = {}, None
    op_line = re.compile(r"^\s*(\d+)\s+\S+\s+\S+\[[^\]]*\]\s+\S+\s+([\d.]+)\s")
    with open(path) as f:
        for line in f:
            head = re.match(r"^(prefill|decode)\b", line)
            if head:
                phase = head.group(1)
                phases[phase] = {}
                continue
            m = op_line.match(line)
            if m and phase:
                phases[phase][int(m.group(1))] = float(m.group(2))
    return phases


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    by_shape = "--by-shape" in sys.argv
    plan = plan_estimates(sys.argv[sys.argv.index("--plan") + 1]) if "--plan" in sys.argv else None
    with open(sys.argv[1]) as f:
        events = json.load(f)["traceEvents"]
    graphs = sorted((e for e in events if e.get("cat") == "graph"), key=lambda e: e["ts"])
    first_graph_end = graphs[0]["ts"] + graphs[0]["dur"] if graphs else float("inf")
    errors = []
    per_node = defaultdict(list)  # (in the prefill graph, node): [(estimated, actual)]
    names = {}  # node: op name
    groups = defaultdict(list)
    by_op_shape = defaultdict(list)
    missing = 0
    for e in events:
        args = e.get("args", {})
        if e.get("cat") != "op" or not args.get("timed") or e["dur"] <= 0:
            continue
        if plan is not None:
            estimates = plan.get("prefill" if e["ts"] < first_graph_end else "decode", {})
            if args.get("node") not in estimates:
                missing += 1
                continue
            args = dict(args, estimated_us=estimates[args["node"]])
        err = abs(args["estimated_us"] - e["dur"]) / e["dur"]
        errors.append(err)
        if "node" in args:
            per_node[(e["ts"] < first_graph_end, args["node"])].append(
                (args["estimated_us"], e["dur"]))
            names[args["node"]] = e["name"]
        shape = args.get("shape", [])
        by_op_shape[(e["name"], str(shape))].append(e["dur"])
        # Tokens are the last dim of rope's and attention's outputs, the second of the others';
        # kv_write's output is the whole cache.
        tokens = shape[-1] if e["name"] in ("rope", "attention") else shape[1] if len(shape) > 1 else 1
        phase = "any" if e["name"] == "kv_write" else "decode" if tokens == 1 else "prefill"
        key = (e["name"], phase, str(shape) if by_shape else "")
        groups[key].append((err, args["estimated_us"], e["dur"], args["estimated_us"] / e["dur"]))
    if not errors:
        sys.exit("no timed ops in the trace (run with --stats and --trace)")
    if missing:
        print(f"{missing} timed ops not in the plan")
    print(f"median |error| {100 * statistics.median(errors):.1f}% over {len(errors)} timed ops")
    # Each op of the decode graphs once: its median estimate against the median of its runs (one
    # a token). The first graph (the prefill) is left out: it is the run's first, cold pass.
    node_errors = []
    for (prefill, _), v in per_node.items():
        if prefill:
            continue
        act = statistics.median(x[1] for x in v)
        node_errors.append(abs(statistics.median(x[0] for x in v) - act) / act)
    if node_errors:
        print(f"decode ops, each the median of its runs: median |error| "
              f"{100 * statistics.median(node_errors):.1f}% over {len(node_errors)} ops")
    if "--by-node" in sys.argv:
        first = int(sys.argv[sys.argv.index("--by-node") + 1])
        print(f"{'node':>5} {'op':<18} {'med est us':>11} {'med act us':>11} {'est/act':>8}")
        decode_nodes = sorted((node, v) for (prefill, node), v in per_node.items() if not prefill)
        for node, v in decode_nodes[:first]:
            est = statistics.median(x[0] for x in v)
            act = statistics.median(x[1] for x in v)
            print(f"{node:>5} {names[node]:<18} {est:>11.1f} {act:>11.1f} {est / act:>8.2f}")
    medians = {k: statistics.median(v) for k, v in by_op_shape.items()}
    floor = [abs(medians[k] - d) / d for k, v in by_op_shape.items() for d in v]
    print(f"noise floor: {100 * statistics.median(floor):.1f}% (each op estimated by the median of "
          "its op and shape in this trace)")
    rows = []
    for (name, phase, shape), v in groups.items():
        rows.append((statistics.median(x[0] for x in v), name, phase, shape, len(v),
                     statistics.median(x[1] for x in v), statistics.median(x[2] for x in v),
                     statistics.median(x[3] for x in v), sum(x[0] > 0.15 for x in v)))
    print(f"{'op':<18} {'phase':<8} {'ops':>5} {'med est us':>11} {'med act us':>11} {'med|err|':>9}"
          f" {'est/act':>8} {'>15%':>5}")
    for err, name, phase, shape, n, est, act, ratio, off in sorted(rows, reverse=True):
        print(f"{name:<18} {phase:<8} {n:>5} {est:>11.1f} {act:>11.1f} {100 * err:>8.1f}%"
              f" {ratio:>8.2f} {off:>5} {shape}")


if __name__ == "__main__":
    main()
