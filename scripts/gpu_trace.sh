#!/usr/bin/env bash
# One hybrid prefill on the GPU machine, timed on the device timeline: builds tandem for sm_90,
# generates the 8B Q4_0 model, and for each --ngl given benches pp512 (3 repetitions) and writes
# the Chrome trace of one more, plus `tandem plan` for that placement.
# Usage (repo root, .gpu-tools/ holding the GPU kit): OUT=/tmp/out bash scripts/gpu_trace.sh [NGL...]
# Writes $OUT/trace-nglN.json and prints the bench and plan lines.
set -u
OUT=${OUT:-/tmp/tandem_trace}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh tandem
B=build/gpu/bin/tandem
M=/tmp/vs-llama-models; mkdir -p $M
m8=$M/llama-3.1-8b-q4_0.gguf
[ -f $m8 ] || timeout 200 $B synth --preset llama-3.1-8b --type q4_0 -o $m8 >/dev/null
for n in "${@:-16}"; do
  echo "== --ngl $n"
  timeout 60 $B plan -m $m8 --strategy gpu --ngl $n -c 576 2>&1 | grep -E "^(residency|prefill|decode)|ops:|predicted"
  timeout 120 $B bench -m $m8 --strategy gpu --ngl $n -p 512 -n 64 -r 3 -t 16 2>&1 | grep -E "pp512|tg64"
  timeout 60 $B bench -m $m8 --strategy gpu --ngl $n -p 512 -n 0 -r 1 -t 16 \
    --trace "$OUT/trace-ngl$n.json" >/dev/null 2>&1 || echo "trace run failed"
done
