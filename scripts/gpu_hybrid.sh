#!/usr/bin/env bash
# Hybrid execution on the GPU machine: builds tandem for sm_90, checks LLaMA logits on the GPU
# against the reference, measures pinned host-to-device bandwidth, then runs the hybrid set of
# the comparison with llama.cpp (.gpu-tools/vs-llama.py, see its header) on the same files.
# Usage (repo root, .gpu-tools/ holding the GPU kit): OUT=/tmp/out bash scripts/gpu_hybrid.sh [SETS]
set -u
OUT=${OUT:-/tmp/tandem_hybrid}
SETS=${1:-hybrid}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh tandem llama_test cuda_test conformance_test
for t in llama/llama_test cuda/cuda_test conformance/conformance_test; do
  log="$OUT/$(basename $t).log"
  timeout 180 build/gpu/tests/$t --gtest_brief=1 >"$log" 2>&1
  echo "$(basename $t) exit $?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$log" | tr '\n' ' ')"
done
python3 - <<'PY' 2>&1 | tee "$OUT/pcie.txt"
import torch
n = 1 << 30
h = torch.empty(n, dtype=torch.uint8).pin_memory(); d = torch.empty(n, dtype=torch.uint8, device="cuda")
for _ in range(3): d.copy_(h, non_blocking=True)
torch.cuda.synchronize(); s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
t = []
for _ in range(5):
    s.record(); d.copy_(h, non_blocking=True); e.record(); e.synchronize(); t.append(s.elapsed_time(e))
t.sort(); print(f"pinned H2D: {n / (t[2] / 1e3) / 1e9:.1f} GB/s (median of 5, 1 GiB)")
PY
B=build/gpu/bin/tandem
# A quick check on the 1B model first: a hybrid prefill that stalls shows here in seconds.
$B synth --preset llama-3.2-1b --type q4_0 -o /tmp/1b.gguf >/dev/null
for n in 0 8; do
  timeout 60 $B bench -m /tmp/1b.gguf --strategy gpu --ngl $n -p 512 -n 16 -r 2 -t 16 >"$OUT/1b_ngl$n.txt" 2>&1
  echo "1b ngl $n: exit $?"; grep -E "pp512|tg16" "$OUT/1b_ngl$n.txt" | head -2 | tr -s " "
done
M=/tmp/vs-llama-models; mkdir -p $M
[ -f $M/llama-3.1-8b-q4_0.gguf ] || timeout 200 $B synth --preset llama-3.1-8b --type q4_0 -o $M/llama-3.1-8b-q4_0.gguf >/dev/null
timeout 90 $B bench -m $M/llama-3.1-8b-q4_0.gguf --strategy gpu --ngl 16 -p 512 -n 0 -r 1 -t 16 \
  --trace "$OUT/trace-ngl16.json" >/dev/null 2>&1 || echo "trace run failed"
PYTHONUNBUFFERED=1 timeout 400 python3 .gpu-tools/vs-llama.py --tandem $B --set "$SETS" 2>&1 | tee "$OUT/vs-llama.txt"
