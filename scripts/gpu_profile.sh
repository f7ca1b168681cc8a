#!/usr/bin/env bash
# Profiles the attention and matrix-vector kernels with Nsight Compute on the GPU machine
# (prebuilt cuda_bench; clocks left as they are). Reports land under $OUT.
set -u
OUT=${OUT:-/tmp/tandem_gpu_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH="$PWD/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
timeout 200 ncu --clock-control none -k regex:"attention_kernel|matvec_kernel|quantize_b" -c 6 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis \
  prebuilt/bench/cuda_bench --benchmark_filter='BM_Attention/4096/1/16|BM_QuantizedMatvec/4096/14336/1/4' \
  --benchmark_min_time=0.01 >"$OUT/ncu.txt" 2>&1
echo "ncu exit $?"
grep -E "attention_kernel|matvec_kernel|quantize_b|Duration|Achieved Occupancy|Registers Per|Memory Throughput|DRAM Throughput|Block Limit|Stall|Theoretical Occ|Waves Per SM|Grid Size|L1/TEX Hit|Warp Cycles Per Issued" "$OUT/ncu.txt" | head -120
