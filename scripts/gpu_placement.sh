#!/usr/bin/env bash
# Automatic placement on the GPU machine: builds tandem for sm_90, prints `tandem plan` for the
# 8B Q4_0 model under 2, 3 and 4 GiB budgets and with the whole GPU, then runs the budgets set
# of the comparison with llama.cpp (.gpu-tools/vs-llama.py: llama.cpp's fit against
# --strategy auto, and auto against tandem's best --ngl under the same budget).
# Usage (repo root, .gpu-tools/ holding the GPU kit): OUT=/tmp/out [TUNE=3GiB] bash scripts/gpu_placement.sh [SETS]
# TUNE=BUDGET also runs `tandem tune` under that budget.
set -u
OUT=${OUT:-/tmp/tandem_placement}
SETS=${1:-budgets}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh tandem ${TARGETS:-}
B=build/gpu/bin/tandem
M=/tmp/vs-llama-models; mkdir -p $M
m8=$M/llama-3.1-8b-q4_0.gguf
[ -f $m8 ] || timeout 200 $B synth --preset llama-3.1-8b --type q4_0 -o $m8 >/dev/null
for mem in 2GiB 3GiB 4GiB; do
  echo "== plan --strategy auto --gpu-mem $mem"
  timeout 60 $B plan -m $m8 --strategy auto --gpu-mem $mem -c 577 2>&1 | grep -E "^(residency|prefill|decode)|ops:|  layers [0-9]"
done
echo "== plan --strategy auto (whole GPU)"
timeout 60 $B plan -m $m8 --strategy auto -c 576 2>&1 | grep -E "^(residency|prefill|decode)|ops:"
if [ -n "${TUNE:-}" ]; then
  echo "== tune --gpu-mem $TUNE"
  timeout 240 $B tune -m $m8 --gpu-mem $TUNE -p 512 -n 32 -r 1 -t 16 2>&1 | tail -14
fi
cp ~/.cache/tandem/cost-profile-*.json "$OUT/" 2>/dev/null
[ -n "$SETS" ] && PYTHONUNBUFFERED=1 timeout 480 python3 .gpu-tools/vs-llama.py --tandem $B --set "$SETS" 2>&1 | tee "$OUT/vs-llama.txt"
