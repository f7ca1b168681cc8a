#!/usr/bin/env bash
# Runs on the GPU machine (device tool): builds Release for sm_90, runs cuda_test, the
# conformance tests and cuda_bench, writes logs under $OUT and prints a short table last.
# Google Test/Benchmark come from ./deps (a prefix copied from the build machine) when the
# machine has none; ./prebuilt holds binaries built elsewhere, used only if the build fails.
set -u
OUT=${OUT:-/tmp/tandem_gpu_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
ROOT=$PWD
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -1
  cmake --version | head -1
  c++ --version | head -1
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

PREFIX=()
if [ -d deps ]; then
  PREFIX=(-DCMAKE_PREFIX_PATH="$ROOT/deps")
  export PKG_CONFIG_PATH="$ROOT/deps/lib/x86_64-linux-gnu/pkgconfig:${PKG_CONFIG_PATH:-}"
  export LD_LIBRARY_PATH="$ROOT/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
fi
export OPENBLAS_CORETYPE=SkylakeX
BIN=build/gpu
start=$(date +%s)
if cmake -S . -B build/gpu -G Ninja -DTANDEM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_BUILD_TYPE=Release -DTANDEM_WERROR=ON "${PREFIX[@]}" >"$OUT/configure.log" 2>&1 &&
  cmake --build build/gpu -j16 >"$OUT/build.log" 2>&1; then
  echo "build: ok in $(($(date +%s) - start)) s"
else
  echo "build: FAILED after $(($(date +%s) - start)) s"
  tail -25 "$OUT/configure.log" "$OUT/build.log" 2>/dev/null
  BIN=prebuilt
fi

# Each binary runs under a timeout so a hung kernel cannot eat the whole device call; the
# full log names the test that was running.
echo "== cuda_test"
timeout 240 "$BIN/tests/cuda/cuda_test" >"$OUT/cuda_test.log" 2>&1
status=$?
echo "cuda_test exit $status"
grep -E "FAILED|Failure|nmse|PASSED|SKIPPED" "$OUT/cuda_test.log" | head -40
[ $status -eq 0 ] || tail -5 "$OUT/cuda_test.log"
for t in "$BIN"/tests/conformance/*test; do
  [ -x "$t" ] || continue
  echo "== $(basename "$t")"
  timeout 300 "$t" >"$OUT/conformance.log" 2>&1
  status=$?
  echo "conformance exit $status"
  grep -E "FAILED|PASSED|SKIPPED|refuses|skipped" "$OUT/conformance.log" | head -30
  [ $status -eq 0 ] || tail -5 "$OUT/conformance.log"
done

if command -v ncu >/dev/null; then
  echo "== ncu (decode attention, Q4_0 matvec)"
  timeout 120 ncu --clock-control none -k regex:"attention_kernel|matvec_kernel|quantize_b" -c 5 \
    --section SpeedOfLight --section Occupancy "$BIN/bench/cuda_bench" \
    --benchmark_filter='BM_Attention/4096/1/16|BM_QuantizedMatvec/4096/14336/1/4' \
    --benchmark_min_time=0.01 >"$OUT/ncu.txt" 2>&1
  grep -E "^  [a-z_ ]*(void |)[a-z_<>:]*(attention|matvec|quantize_b)|Duration|DRAM Throughput|SM Active|Elapsed Cycles|Achieved Occupancy" \
    "$OUT/ncu.txt" | sed -E 's/\(const.*\) \(/ (/' | head -40
fi

echo "== cuda_bench"
timeout 240 "$BIN/bench/cuda_bench" --benchmark_out="$OUT/cuda_bench.json" \
  --benchmark_out_format=json --benchmark_min_time=0.2 >"$OUT/cuda_bench.log" 2>&1
echo "cuda_bench exit $?"
python3 - "$OUT/cuda_bench.json" <<'PY'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except Exception as e:  # the log says why
    print("no benchmark json:", e); sys.exit(0)
print(data["context"].get("host_name", ""), "|", data["context"].get("date", ""))
print(f"{'benchmark':58} {'median_us':>10} {'GB/s':>8} {'%copy':>6} {'TFLOP/s':>8}")
for b in data["benchmarks"]:
    if b.get("error_occurred"):
        print(f"{b['name']:58} error: {b.get('error_message')}"); continue
    g = lambda k: b.get(k, float("nan"))
    print(f"{b['name'][:58]:58} {g('median_us'):10.2f} {g('GB/s'):8.0f} {g('pct_of_copy'):6.1f} {g('TFLOP/s'):8.1f}")
PY
