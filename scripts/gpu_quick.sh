#!/usr/bin/env bash
# Runs on the GPU machine in one go: configures Release for sm_90, builds what is
# asked, runs tests and benchmarks, writes logs under $OUT and prints a short summary last.
#   TESTS=<gtest filter>  cuda_test with that filter; TESTS=all: cuda, conformance and llama suites
#   BENCH=<regex>         cuda_bench --benchmark_filter (MINTIME seconds per case, default 0.2)
#   E2E=1                 synthesizes 1B and 8B Q4_0 models and runs `tandem bench` on them
#   DEPS=<prefix>         GoogleTest/Benchmark/OpenBLAS/CLI11/nlohmann copied from a build machine
#                         (the bare GPU machine lacks them); default .e2e/deps, then deps
set -u
OUT=${OUT:-/tmp/tandem_gpu_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
D=${DEPS:-}
[ -z "$D" ] && [ -d .e2e/deps ] && D=$PWD/.e2e/deps
[ -z "$D" ] && [ -d deps ] && D=$PWD/deps
PREFIX=()
if [ -n "$D" ]; then
  PREFIX=(-DCMAKE_PREFIX_PATH="$D" "-DCMAKE_CXX_FLAGS=-isystem $D/include")
  export LD_LIBRARY_PATH="$D/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
export OPENBLAS_CORETYPE=SkylakeX
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
targets=(cuda_bench)
[ -n "${TESTS:-}" ] && targets+=(cuda_test)
[ "${TESTS:-}" = all ] && targets+=(conformance_test llama_test)
[ -n "${E2E:-}" ] && targets+=(tandem)
cmake -S . -B build/gpu -G Ninja -DTANDEM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_BUILD_TYPE=Release "${PREFIX[@]}" >"$OUT/configure.log" 2>&1 ||
  { tail -20 "$OUT/configure.log"; exit 1; }
t0=$(date +%s)
timeout 300 cmake --build build/gpu -j16 --target "${targets[@]}" >"$OUT/build.log" 2>&1 ||
  { grep -m3 -A10 error "$OUT/build.log" | head -60; exit 1; }
echo "build $(($(date +%s) - t0)) s"
suite() {  # name binary [filter]
  timeout 180 "$2" --gtest_brief=1 ${3:+--gtest_filter="$3"} >"$OUT/$1.log" 2>&1
  echo "$1 exit $? $(grep -E 'PASSED|FAILED' "$OUT/$1.log" | tr '\n' ' ' | cut -c1-300)"
}
if [ "${TESTS:-}" = all ]; then
  suite cuda_test build/gpu/tests/cuda/cuda_test
  suite conformance_test build/gpu/tests/conformance/conformance_test
  suite llama_test build/gpu/tests/llama/llama_test
elif [ -n "${TESTS:-}" ]; then
  suite cuda_test build/gpu/tests/cuda/cuda_test "$TESTS"
fi
if [ -n "${E2E:-}" ]; then
  B=build/gpu/bin/tandem M=/tmp/tandem_models
  mkdir -p $M
  $B synth --preset llama-3.2-1b --type q4_0 -o $M/1b.gguf >/dev/null
  $B synth --preset llama-3.1-8b --type q4_0 -o $M/8b.gguf >/dev/null
  timeout 90 $B bench -m $M/1b.gguf --strategy gpu -p 512 -n 128 -r 3 >"$OUT/bench_1b.md" 2>&1
  timeout 90 $B bench -m $M/8b.gguf --strategy gpu -p 512 -n 128 -r 3 >"$OUT/bench_8b.md" 2>&1
  # Three strategies with 8 layers on the CPU: -n 128 -r 3 outlasted 120 s (H100, 2026-11-21).
  timeout 200 $B bench -m $M/8b.gguf -ngl 24 -p 512 -n 64 -r 2 >"$OUT/bench_8b_ngl24.md" 2>&1
  grep -hE "^\| tandem" "$OUT"/bench_*.md | cut -c1-200
fi
if [ -n "${BENCH:-}" ]; then
  timeout 240 build/gpu/bench/cuda_bench --benchmark_filter="$BENCH" \
    --benchmark_min_time="${MINTIME:-0.2}" >"$OUT/cuda_bench.log" 2>&1
  echo "cuda_bench exit $?"
  grep -E "^BM_" "$OUT/cuda_bench.log" | sed -E 's/ +/ /g' | cut -c1-200
fi
