#!/usr/bin/env bash
# End-to-end run on the GPU machine: builds tandem for sm_90, checks LLaMA logits on the GPU
# against the reference, synthesizes Llama-3.2-1B and Llama-3.1-8B shaped Q4_0 models and
# benchmarks them (all on GPU, CPU only, and llama.cpp-style -ngl 24 hybrid), plus the CPU
# kernels' thread scaling. Logs go to $OUT; a short table is printed last.
# Usage (repo root): OUT=/tmp/out bash scripts/gpu_e2e.sh   [DEPS=.e2e/deps for missing packages]
set -u
OUT=${OUT:-/tmp/tandem_e2e}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
ROOT=$PWD
export OPENBLAS_CORETYPE=SkylakeX
PREFIX=()
if [ -d "${DEPS:-.e2e/deps}" ]; then
  D=$(cd "${DEPS:-.e2e/deps}" && pwd)
  PREFIX=(-DCMAKE_PREFIX_PATH="$D" -DCMAKE_CXX_FLAGS="-isystem $D/include")
  export LD_LIBRARY_PATH="$D/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; lscpu | grep -E "Model name|Flags" | cut -c1-200; } >"$OUT/machine.txt" 2>&1
head -3 "$OUT/machine.txt"
t0=$(date +%s)
cmake -S . -B build/gpu -G Ninja -DTANDEM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_BUILD_TYPE=Release "${PREFIX[@]}" >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
timeout 300 cmake --build build/gpu -j16 --target tandem llama_test cpu_bench >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
B=build/gpu/bin/tandem
timeout 90 build/gpu/tests/llama/llama_test --gtest_brief=1 >"$OUT/llama_test.log" 2>&1
echo "llama_test exit $?: $(grep -cE 'measured' "$OUT/llama_test.log") measured; $(grep -E 'PASSED|FAILED' "$OUT/llama_test.log" | tr '\n' ' ')"
grep -E "measured.*cuda|measured.*gpu" "$OUT/llama_test.log" | head -8
M=/tmp/models; mkdir -p $M
t1=$(date +%s); $B synth --preset llama-3.2-1b --type q4_0 -o $M/1b.gguf >/dev/null; echo "synth 1b: $(($(date +%s) - t1)) s"
t1=$(date +%s); timeout 120 $B synth --preset llama-3.1-8b --type q4_0 -o $M/8b.gguf >/dev/null; echo "synth 8b: $(($(date +%s) - t1)) s"
$B devices >"$OUT/devices.txt" 2>&1; grep -E "^[a-z]+(:[0-9])? \(" "$OUT/devices.txt"
run() { local name=$1; shift; timeout "$1" $B bench "${@:2}" --output-format json >"$OUT/$name.json" 2>"$OUT/$name.err" || echo "$name: exit $? $(tail -2 "$OUT/$name.err")"; }
run b1_gpu 60 -m $M/1b.gguf --strategy gpu -p 512 -n 128 -r 3
run b1_cpu 90 -m $M/1b.gguf --strategy cpu -p 128 -n 64 -r 2 -t 16
run b8_gpu 90 -m $M/8b.gguf --strategy gpu -p 512 -n 128 -r 3
run b8_ngl24 120 -m $M/8b.gguf --strategy gpu -ngl 24 -p 128 -n 32 -r 2 -t 16
run b8_auto 90 -m $M/8b.gguf --strategy auto -p 128 -n 32 -r 2 -t 16
TANDEM_BENCH_THREADS=1,4,16 timeout 120 build/gpu/bench/cpu_bench --benchmark_filter='Copy|Matvec' \
  --benchmark_min_time=0.1 >"$OUT/cpu_bench.txt" 2>&1; echo "cpu_bench exit $?"
sed -n '/^Summary/,$p' "$OUT/cpu_bench.txt" | head -30
echo "== tandem bench (tokens/s, mean ± sd)"
python3 - "$OUT" <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "b*.json"))):
    try:
        rows = json.load(open(f))
    except Exception as e:
        print(os.path.basename(f), "no json:", e); continue
    for r in rows:
        print(f"{os.path.basename(f)[:-5]:10} {r['strategy']:6} {r['test']:6} {r['avg_ts']:10.1f} ± {r['stddev_ts']:7.1f}  {r['placement'][:90]}")
PY
