#!/usr/bin/env bash
# Mixture-of-experts models on the GPU machine against llama-bench on the same files: the
# Qwen3-30B-A3B shape (tandem synth, Q4_0 by default) all on the GPU, pp512 and tg64.
# Usage (repo root, .gpu-tools/ holding the GPU kit): OUT=/tmp/out bash scripts/gpu_moe.sh [PRESET:TYPE ...]
set -u
OUT=${OUT:-/tmp/tandem_moe}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh tandem || exit 1
B=build/gpu/bin/tandem
M=/tmp/vs-llama-models; mkdir -p $M
LB=/tmp/llama-bench
[ -x $LB ] || { xz -dc .gpu-tools/llama-bench-b10472-cuda-sm90.xz >$LB && chmod +x $LB; }
for spec in "${@:-qwen3-30b-a3b:q4_0}"; do
  preset=${spec%%:*} type=${spec##*:}
  m=$M/$preset-$type.gguf
  t0=$(date +%s)
  [ -f $m ] || timeout 500 $B synth --preset $preset --type $type -o $m >/dev/null || { echo "synth failed"; continue; }
  echo "== $preset $type ($(du -h $m | cut -f1), synth $(($(date +%s) - t0)) s)"
  timeout 300 $LB -m $m -ngl 99 -fa 1 -p 512 -n 64 -r 2 2>&1 | grep -E "pp512|tg64|error" | sed 's/^/llama.cpp /'
  timeout 300 $B bench -m $m --strategy gpu -p 512 -n 64 -r 2 -t 16 2>&1 | grep -E "pp512|tg64|rror" | sed 's/^/tandem /'
done
