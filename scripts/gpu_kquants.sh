#!/usr/bin/env bash
# K-quant models end to end on the GPU machine, against llama-bench on the same files: 1B and 8B
# Q4_K_M all on the GPU (pp512, tg64) and the 8B with 24 of 32 layers on the GPU (-ngl 24).
# Usage (repo root, .gpu-tools/ holding the GPU kit): OUT=/tmp/out bash scripts/gpu_kquants.sh
set -u
OUT=${OUT:-/tmp/tandem_kquants}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh tandem
B=build/gpu/bin/tandem
M=/tmp/vs-llama-models; mkdir -p $M
LB=/tmp/llama-bench
[ -x $LB ] || { xz -dc .gpu-tools/llama-bench-b10472-cuda-sm90.xz >$LB && chmod +x $LB; }
for preset in llama-3.2-1b llama-3.1-8b; do
  m=$M/$preset-q4_k_m.gguf
  [ -f $m ] || timeout 300 $B synth --preset $preset --type q4_k_m -o $m >/dev/null
done
row() {  # model ngl
  echo "== $(basename $1) -ngl $2"
  timeout 200 $LB -m $1 -ngl $2 -fa 1 -p 512 -n 64 -r 3 -t 16 2>&1 | grep -E "pp512|tg64" | sed 's/^/llama.cpp /'
  timeout 200 $B bench -m $1 --strategy gpu --ngl $2 -p 512 -n 64 -r 3 -t 16 2>&1 | grep -E "pp512|tg64" | sed 's/^/tandem /'
}
row $M/llama-3.2-1b-q4_k_m.gguf 99
row $M/llama-3.1-8b-q4_k_m.gguf 99
row $M/llama-3.1-8b-q4_k_m.gguf 24
