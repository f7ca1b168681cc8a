#!/usr/bin/env bash
# Mixture of experts under a GPU budget on the GPU machine, against llama.cpp's hand placement:
# the Qwen3-30B-A3B shape (tandem synth, Q4_0) with the router skew off and on; tandem
# `--strategy auto --gpu-mem $BUDGET` against llama-bench `-ngl 99 -ncmoe N` for each N of a
# sweep, pp512 and tg64. llama-bench runs verbose once per N so that its CUDA0 buffers (model,
# KV cache, compute) are read from its own log: a row whose sum exceeds the budget is marked.
# Tandem's lines add the share of the expert bytes its prefill copied and, from `run
# --routing-stats`, how concentrated the file's routers are, and the hot experts the run
# chose where it runs with them (TANDEM_AB="--hot-experts": a second Tandem run with those flags).
# Usage (repo root, .gpu-tools/ holding the GPU kit):
#   OUT=/tmp/out BUDGET=8 NCMOE="26 27 28 30 32" SKEWS="0 3" bash scripts/gpu_moe_budget.sh
set -u
OUT=${OUT:-/tmp/tandem_moe_budget}
BUDGET=${BUDGET:-8}  # GiB
NCMOE=${NCMOE:-26 27 28 30 32}
SKEWS=${SKEWS:-0 3}
REPS=${REPS:-2}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh tandem || exit 1
B=build/gpu/bin/tandem
M=/tmp/vs-llama-models; mkdir -p $M
LB=/tmp/llama-bench
[ -x $LB ] || { xz -dc .gpu-tools/llama-bench-b10472-cuda-sm90.xz >$LB && chmod +x $LB; }
for skew in $SKEWS; do
  m=$M/qwen3-30b-a3b-q4_0-skew$skew.gguf
  [ -f $m ] || timeout 500 $B synth --preset qwen3-30b-a3b --type q4_0 --moe-skew $skew -o $m >/dev/null ||
    { echo "synth failed"; continue; }
  echo "== qwen3-30b-a3b q4_0, --moe-skew $skew, budget $BUDGET GiB"
  for n in $NCMOE; do
    log=$OUT/llama-skew$skew-ncmoe$n.txt
    timeout 300 $LB -m $m -ngl 99 -ncmoe $n -fa 1 -p 512 -n 64 -r $REPS -v >$log 2>&1
    mib=$(grep -E "CUDA0 (model|KV|compute) buffer size" $log | grep -oE "[0-9.]+ MiB" | awk '{s += $1} END {printf "%.0f", s}')
    fits=$(awk -v m="${mib:-0}" -v b="$BUDGET" 'BEGIN {print (m > 0 && m <= b * 1024) ? "fits" : "OVER"}')
    grep -E "\| *(pp512|tg64) *\|" $log | sed "s/^/llama.cpp -ncmoe $n (CUDA0 ${mib:-?} MiB, $fits) /"
  done
  # TANDEM_AB="--hot-experts" adds a second Tandem run with those flags.
  for flags in "" ${TANDEM_AB:+"$TANDEM_AB"}; do
    timeout 400 $B bench -m $m --strategy auto --gpu-mem ${BUDGET}GiB -p 512 -n 64 -r $REPS -t 16 \
      $flags 2>&1 | grep -E "pp512|tg64|rror|streamed by expert|hot experts" |
      sed "s/^/tandem auto $flags /"
  done
  # How concentrated this file's routers are (a prompt of the README's first 3,000 bytes).
  head -c 3000 README.md >$OUT/prompt.txt
  timeout 200 $B run -m $m --strategy auto --gpu-mem ${BUDGET}GiB -t 16 -f $OUT/prompt.txt -n 32 \
    --greedy --routing-stats 2>&1 >/dev/null | grep -E -A4 "^routing" | sed 's/^/tandem /'
  timeout 120 $B plan -m $m --strategy auto --gpu-mem ${BUDGET}GiB -c 576 -t 16 >$OUT/plan-skew$skew.txt 2>&1
  grep -E "^(residency|prefill|decode)|predicted" $OUT/plan-skew$skew.txt | head -8
done
