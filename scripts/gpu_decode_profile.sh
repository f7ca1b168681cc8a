#!/usr/bin/env bash
# Where a decode step's device time goes, Tandem against llama.cpp on the same GGUF files:
# Nsight Compute times every kernel of a few decode tokens one at a time (graph nodes included;
# the gaps between kernels are not counted) and the sums per kernel name are printed per token.
# Usage (repo root, .gpu-tools/ holding the GPU kit): OUT=/tmp/out bash scripts/gpu_decode_profile.sh [PRESET:TYPE ...]
#   e.g. llama-3.2-1b:q4_0 (the default) llama-3.1-8b:q4_0
set -u
OUT=${OUT:-/tmp/tandem_profile}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh tandem
B=build/gpu/bin/tandem
M=/tmp/vs-llama-models; mkdir -p $M
LB=/tmp/llama-bench
[ -x $LB ] || { xz -dc .gpu-tools/llama-bench-b10472-cuda-sm90.xz >$LB && chmod +x $LB; }
NCU="ncu --graph-profiling node --cache-control none --clock-control none --metrics gpu__time_duration.sum --csv"
TOKENS=${TOKENS:-3}
for spec in "${@:-llama-3.2-1b:q4_0}"; do
  preset=${spec%%:*} type=${spec##*:}
  m=$M/$preset-$type.gguf
  [ -f $m ] || timeout 300 $B synth --preset $preset --type $type -o $m >/dev/null
  echo "== $preset $type: tandem (bench -p 0 -n $TOKENS after a warm-up run)"
  timeout 200 $NCU $B bench -m $m --strategy gpu -p 0 -n $TOKENS -r 1 -t 16 >"$OUT/tandem-$preset-$type.csv" 2>/dev/null
  python3 scripts/ncu_summary.py "$OUT/tandem-$preset-$type.csv" --tokens $((2 * TOKENS))
  echo "== $preset $type: llama.cpp (llama-bench -p 0 -n $TOKENS -r 1, with its warm-up)"
  timeout 200 $NCU $LB -m $m -ngl 99 -fa 1 -p 0 -n $TOKENS -r 1 >"$OUT/llama-$preset-$type.csv" 2>/dev/null
  python3 scripts/ncu_summary.py "$OUT/llama-$preset-$type.csv" --tokens $((TOKENS + 1))
done
