#!/usr/bin/env bash
# Builds and runs the CPU backend benchmarks on the GPU machine's host CPU (CPU-only Release
# build in build/cpuhost), for 1, 2, 4, 8 and 16 threads, and writes everything to $OUT:
#   cpu_bench.json   Google Benchmark JSON (every run, with the machine context)
#   cpu_bench.txt    console output, ending with the summary table (ratios from this run)
#   cpu_table.txt    the summary table alone
#   machine.txt      lscpu, memory, compiler, OpenBLAS, git revision
# Usage: OUT=/some/dir bench/cpu_host.sh
# Optional: THREADS=1,2,4,8,16  JOBS=16  BENCH_ARGS="--benchmark_filter=matvec"
set -euo pipefail

: "${OUT:?set OUT to the folder that receives the results}"
THREADS="${THREADS:-1,2,4,8,16}"
JOBS="${JOBS:-16}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build/cpuhost"
mkdir -p "$OUT"
export OPENBLAS_CORETYPE=SkylakeX  # as in every test and bench; OpenBLAS reads it at load

{
  echo "date: $(date -u +%FT%TZ)"
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "threads: $THREADS"
  echo "--- lscpu"; lscpu || true
  echo "--- memory"; free -g || true
  echo "--- numa"; (command -v numactl >/dev/null && numactl --hardware) || echo "numactl not installed"
  echo "--- compiler"; c++ --version | head -1 || true
  echo "--- cmake"; cmake --version | head -1 || true
  echo "--- openblas"; (pkg-config --modversion openblas || echo "pkg-config openblas not found")
  echo "--- load"; uptime || true
} > "$OUT/machine.txt" 2>&1

# Tests off: only the benchmark is needed. Warnings stay warnings on an unknown compiler.
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=OFF \
  -DTANDEM_BUILD_TESTS=OFF -DTANDEM_BUILD_BENCH=ON -DTANDEM_WERROR=OFF 2>&1 | tee "$OUT/configure.txt"
if ! cmake --build "$BUILD" -j "$JOBS" --target cpu_bench 2>&1 | tee "$OUT/build.txt"; then
  echo "cpu_bench did not build (is Google Benchmark installed? see $OUT/build.txt)" >&2
  exit 1
fi

TANDEM_BENCH_THREADS="$THREADS" "$BUILD/bench/cpu_bench" --benchmark_color=false \
  --benchmark_out="$OUT/cpu_bench.json" --benchmark_out_format=json ${BENCH_ARGS:-} 2>&1 |
  tee "$OUT/cpu_bench.txt"

sed -n '/^Summary/,$p' "$OUT/cpu_bench.txt" > "$OUT/cpu_table.txt"
echo "results in $OUT: cpu_bench.json cpu_bench.txt cpu_table.txt machine.txt"
