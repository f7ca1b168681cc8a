#!/usr/bin/env bash
# Where a mixture-of-experts decode step under a GPU budget spends its time, on the GPU machine:
# the Qwen3-30B-A3B shape (tandem synth, Q4_0), `tandem bench --strategy auto --gpu-mem $BUDGET`
# tg with the CPU backend's groups on and off (TANDEM_CPU_FUSION), its per-op times (--stats)
# and a trace of the decode (segments per device), cpu_bench's expert and dense products at 16
# threads, and llama-bench `-ncmoe $NCMOE` tg in the same call.
# Usage (repo root, .gpu-tools/ holding the GPU kit):
#   OUT=/tmp/out BUDGET=8 NCMOE=29 SKEW=0 bash scripts/gpu_moe_profile.sh
set -u
OUT=${OUT:-/tmp/tandem_moe_profile}
BUDGET=${BUDGET:-8}  # GiB
NCMOE=${NCMOE:-29}
SKEW=${SKEW:-0}
REPS=${REPS:-3}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh tandem cpu_bench || exit 1
B=build/gpu/bin/tandem
M=/tmp/vs-llama-models; mkdir -p $M
LB=/tmp/llama-bench
[ -x $LB ] || { xz -dc .gpu-tools/llama-bench-b10472-cuda-sm90.xz >$LB && chmod +x $LB; }
m=$M/qwen3-30b-a3b-q4_0-skew$SKEW.gguf
t0=$(date +%s)
[ -f $m ] || timeout 500 $B synth --preset qwen3-30b-a3b --type q4_0 --moe-skew $SKEW -o $m >/dev/null ||
  { echo "synth failed"; exit 1; }
echo "synth: $(($(date +%s) - t0)) s"
TANDEM_BENCH_THREADS=16 timeout 200 build/gpu/bench/cpu_bench --benchmark_min_time=0.3 \
  --benchmark_filter='^(copy|matvec_q4_0_4096x14336|expert_matmul_q4_0)' 2>&1 |
  grep -E "^(copy|matvec|expert)" | awk '{print $1, $(NF)}' | sed 's/^/cpu_bench /'
run() {  # label, env, extra args
  local label=$1 env=$2; shift 2
  env $env timeout 300 $B bench -m $m --strategy auto --gpu-mem ${BUDGET}GiB -t 16 "$@" 2>&1
}
for round in 1 2; do
  for f in 1 0; do
    run "fusion $f" "TANDEM_CPU_FUSION=$f" -p 0 -n 64 -r $REPS | grep -E "tg64|rror" |
      sed "s/^/round $round TANDEM_CPU_FUSION=$f /"
  done
done
run stats TANDEM_CPU_FUSION=1 -p 0 -n 16 -r 1 --stats >$OUT/stats.txt
tail -32 $OUT/stats.txt
run trace TANDEM_CPU_FUSION=1 -p 0 -n 16 -r 1 --trace $OUT/trace.json >/dev/null
python3 scripts/trace_summary.py $OUT/trace.json --gaps 2
timeout 300 $LB -m $m -ngl 99 -ncmoe $NCMOE -fa 1 -p 0 -n 64 -r $REPS 2>&1 | grep -E "\| *tg64 *\|" |
  sed "s/^/llama.cpp -ncmoe $NCMOE /"
