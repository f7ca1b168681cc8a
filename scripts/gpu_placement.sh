#!/usr/bin/env bash
# Automatic placement on the GPU machine: builds tandem for sm_90, prints `tandem plan` for the
# 8B Q4_0 model under 2, 3 and 4 GiB budgets and with the whole GPU, then runs the budgets set
# of the comparison with llama.cpp (.gpu-tools/vs-llama.py: llama.cpp's fit against
# --strategy auto, and auto against tandem's best --ngl under the same budget).
# Usage (repo root, .gpu-tools/ holding the GPU kit): OUT=/tmp/out bash scripts/gpu_placement.sh [SETS]
set -u
OUT=${OUT:-/tmp/tandem_placement}
SETS=${1:-budgets}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
tar -xJf .gpu-tools/gpu-deps-debian12.tar.xz -C /tmp
export LD_LIBRARY_PATH=/tmp/deps/lib:/tmp/deps/lib/x86_64-linux-gnu OPENBLAS_CORETYPE=SkylakeX
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
t0=$(date +%s)
cmake -S . -B build/gpu -G Ninja -DTANDEM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DTANDEM_BUILD_TESTS=ON -DCMAKE_PREFIX_PATH=/tmp/deps -DPKG_CONFIG_EXECUTABLE=/tmp/deps/bin/pkg-config \
  "-DCMAKE_CXX_FLAGS=-isystem /tmp/deps/include" >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
timeout 400 cmake --build build/gpu -j16 --target tandem ${TARGETS:-} >>"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
B=build/gpu/bin/tandem
M=/tmp/vs-llama-models; mkdir -p $M
m8=$M/llama-3.1-8b-q4_0.gguf
[ -f $m8 ] || timeout 200 $B synth --preset llama-3.1-8b --type q4_0 -o $m8 >/dev/null
for mem in 2GiB 3GiB 4GiB; do
  echo "== plan --strategy auto --gpu-mem $mem"
  timeout 60 $B plan -m $m8 --strategy auto --gpu-mem $mem -c 576 2>&1 | grep -vE "^  (token|output)" | head -40
done
echo "== plan --strategy auto (whole GPU)"
timeout 60 $B plan -m $m8 --strategy auto -c 576 2>&1 | grep -E "^(residency|prefill|decode)|ops:"
[ -n "$SETS" ] && PYTHONUNBUFFERED=1 timeout 480 python3 .gpu-tools/vs-llama.py --tandem $B --set "$SETS" 2>&1 | tee "$OUT/vs-llama.txt"
