#!/usr/bin/env bash
# The GPU decode and K-quant checks in one call on the GPU machine (about 5 minutes on an H200):
# the CUDA, llama and conformance suites; `vs-llama.py --set gpu,dtypes,cpu`; 8B Q4_0 tg128 after
# 4,096 tokens against llama-bench, two rounds; the one-token products' share of the device copy
# (cuda_bench); the K-quant models against llama-bench (scripts/gpu_kquants.sh).
# Usage (repo root, .gpu-tools/ holding the GPU kit): OUT=/tmp/out bash scripts/gpu_checks.sh
set -u
export OUT=${OUT:-/tmp/tandem_checks}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
lscpu | grep -E "Model name|^CPU\(s\)"
source scripts/gpu_build.sh tandem cuda_test llama_test conformance_test cuda_bench
suite() {  # name binary
  timeout 200 "$2" --gtest_brief=1 >"$OUT/$1.log" 2>&1
  echo "$1 exit $? $(grep -E 'PASSED|FAILED' "$OUT/$1.log" | tr '\n' ' ' | cut -c1-400)"
}
suite cuda_test build/gpu/tests/cuda/cuda_test
suite llama_test build/gpu/tests/llama/llama_test
suite conformance_test build/gpu/tests/conformance/conformance_test
export PYTHONUNBUFFERED=1
timeout 330 python3 .gpu-tools/vs-llama.py --tandem build/gpu/bin/tandem --set gpu,dtypes,cpu \
  --reps 2 2>&1 | tail -12
LB=/tmp/llama-bench
M=/tmp/vs-llama-models/llama-3.1-8b-q4_0.gguf
for i in 1 2; do
  echo "-d 4096 round $i"
  timeout 100 $LB -m $M -ngl 99 -fa 1 -p 0 -n 128 -d 4096 -r 3 2>&1 | grep tg128 |
    awk -F'|' '{print "llama.cpp", $(NF-1)}'
  timeout 100 build/gpu/bin/tandem bench -m $M --strategy gpu -p 0 -n 128 -d 4096 -r 3 2>&1 |
    grep tg128 | awk -F'|' '{print "tandem", $(NF-1)}'
done
# K x rows, one column: Q4_0 (4), Q8_0 (8), Q4_K (40), Q5_K (50), Q6_K (60); pct_of_copy is the
# share of the device-to-device copy rate measured first.
F='BM_CopyDeviceToDevice/1024|BM_QuantizedMatvec/(4096/14336|14336/4096)/1/(4|8|40|50|60)/'
timeout 120 build/gpu/bench/cuda_bench --benchmark_filter="$F" --benchmark_min_time=0.3 2>&1 |
  grep -E "^BM_Q" | sed -E 's/ +/ /g' | grep -oE "^BM_QuantizedMatvec/[0-9/]+|median_us=[0-9.]+|pct_of_copy=[0-9.]+ [a-z0-9_]+" |
  paste -sd' ' | sed 's/ BM_/\nBM_/g'
echo
timeout 200 bash scripts/gpu_kquants.sh 2>&1 | grep -vE "^NVIDIA|^build"
