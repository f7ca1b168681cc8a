#!/usr/bin/env bash
# Two GPUs of one host: builds tandem for sm_90, runs cuda_test, sched_test and llama_test, measures
# peer copy bandwidth, checks that logits of the 1B and 8B shapes split across two GPUs
# (--tensor-split 1,1) match one GPU (--split-mode none), then benches the split (pp512, tg64)
# against llama-bench -sm layer on 8B Q8_0 and a 64-layer 8B-shaped model, in one table.
# Usage (repo root, .gpu-tools/ holding the GPU kit): OUT=/tmp/out bash scripts/gpu_multi.sh
# Writes $OUT/multi.log (every step's output), $OUT/table.md and $OUT/bench.json.
set -u
OUT=${OUT:-/tmp/tandem_multi}
mkdir -p "$OUT"
LOG="$OUT/multi.log"
: >"$LOG"
cd "$(dirname "$0")/.." || exit 1
say() { echo "$@" | tee -a "$LOG"; }
fail() {
  say "FAIL: $*"
  exit 1
}

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
nvidia-smi --query-gpu=index,name,memory.total,memory.free --format=csv,noheader | tee -a "$LOG"
[ "${gpus:-0}" -ge 2 ] || fail "this needs 2 GPUs, $gpus visible (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset})"
nvidia-smi topo -m >>"$LOG" 2>&1

t0=$(date +%s)
status=0 # set on a failed test or a logits mismatch; the benches still run
tar -xJf .gpu-tools/gpu-deps-debian12.tar.xz -C /tmp
export LD_LIBRARY_PATH=/tmp/deps/lib:/tmp/deps/lib/x86_64-linux-gnu OPENBLAS_CORETYPE=SkylakeX
cmake -S . -B build/gpu -G Ninja -DTANDEM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DTANDEM_BUILD_TESTS=ON -DCMAKE_PREFIX_PATH=/tmp/deps -DPKG_CONFIG_EXECUTABLE=/tmp/deps/bin/pkg-config \
  "-DCMAKE_CXX_FLAGS=-isystem /tmp/deps/include" >>"$LOG" 2>&1 || fail "configure (see $LOG)"
timeout 200 cmake --build build/gpu -j16 --target tandem >>"$LOG" 2>&1 || fail "build tandem (see $LOG)"
say "build tandem: $(($(date +%s) - t0)) s"
B=build/gpu/bin/tandem

# The models, generated while the tests build (vs-llama.py's paths, so a warm machine reuses them).
M=/tmp/vs-llama-models
mkdir -p $M
M1=$M/llama-3.2-1b-q8_0.gguf M8=$M/llama-3.1-8b-q8_0.gguf M64=$M/llama-3.1-8b-64l-q4_0.gguf
(
  [ -f $M1 ] || $B synth --preset llama-3.2-1b --type q8_0 -t 8 -o $M1 >/dev/null
  [ -f $M8 ] || $B synth --preset llama-3.1-8b --type q8_0 -t 8 -o $M8 >/dev/null
  [ -f $M64 ] || $B synth --preset llama-3.1-8b --n-layer 64 --type q4_0 -t 8 -o $M64 >/dev/null
) >>"$LOG" 2>&1 &
synth=$!
timeout 240 cmake --build build/gpu -j8 --target cuda_test sched_test llama_test >>"$LOG" 2>&1 || fail "build tests (see $LOG)"
say "build tests: $(($(date +%s) - t0)) s"
# llama_test's gpu cases split the tiny models across both GPUs (the default with two).
for t in cuda/cuda_test sched/sched_test llama/llama_test; do
  echo "== $t" >>"$LOG"
  timeout 180 build/gpu/tests/$t --gtest_brief=1 >>"$LOG" 2>&1
  rc=$?
  say "$(basename $t) exit $rc"
  [ $rc -eq 0 ] || status=1
done
grep -E '^\[  (FAILED|SKIPPED) |^\[ measured \] peer' "$LOG" | head -20

python3 - <<'PY' 2>&1 | tee -a "$LOG"
import torch
n = 1 << 30
print("peer access 0->1:", torch.cuda.can_device_access_peer(0, 1), " 1->0:", torch.cuda.can_device_access_peer(1, 0))
a = torch.empty(n, dtype=torch.uint8, device="cuda:0"); b = torch.empty(n, dtype=torch.uint8, device="cuda:1")
for _ in range(3): b.copy_(a, non_blocking=True)
torch.cuda.synchronize(0); torch.cuda.synchronize(1)
with torch.cuda.device(0):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t = []
    for _ in range(5):
        s.record(); b.copy_(a, non_blocking=True); e.record(); e.synchronize(); t.append(s.elapsed_time(e))
t.sort(); print(f"peer copy cuda:0 -> cuda:1: {n / (t[2] / 1e3) / 1e9:.1f} GB/s (median of 5, 1 GiB)")
PY

wait $synth || fail "synth (see $LOG)"
say "models ready: $(($(date +%s) - t0)) s"
# Logits: the split across two GPUs against one GPU, 24 tokens, every position.
tokens=$(seq -s, 11 37 900)
for m in $M1 $M8; do
  timeout 120 $B logits -m $m --tokens "$tokens" --all --strategy gpu -sm none --out /tmp/one.bin >>"$LOG" 2>&1 || fail "logits one GPU $m"
  timeout 120 $B logits -m $m --tokens "$tokens" --all --strategy gpu -ts 1,1 --out /tmp/two.bin >>"$LOG" 2>&1 || fail "logits two GPUs $m"
  python3 - "$m" <<'PY' 2>&1 | tee -a "$LOG"
import math, sys
from array import array
def load(path):
    a = array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a
a, b = load("/tmp/one.bin"), load("/tmp/two.bin")
ok = len(a) == len(b) and len(a) > 0 and all(math.isfinite(x) for x in b)
num = sum((float(x) - float(y)) ** 2 for x, y in zip(a, b)) if ok else 0.0
den = sum(float(x) ** 2 for x in a) or 1.0
nmse = num / den if ok else float("inf")
worst = max(abs(x - y) for x, y in zip(a, b)) if ok else float("nan")
print(f"logits {sys.argv[1].split('/')[-1]}: two GPUs vs one: {len(b)} values, nmse {nmse:.3g}, "
      f"max |diff| {worst:.3g} -> {'ok' if nmse <= 1e-6 else 'MISMATCH'}")
PY
done
grep -qE "MISMATCH|Traceback" "$LOG" && { say "FAIL: logits of two GPUs differ from one (see $LOG)"; status=1; }

# Throughput: tandem split, tandem one GPU, llama-bench split, on the same files.
LB=/tmp/llama-bench
[ -x $LB ] || { xz -dc .gpu-tools/llama-bench-b10472-cuda-sm90.xz >$LB && chmod +x $LB; }
: >/tmp/rows.jsonl
row() {  # name, tool, args...
  local name=$1 tool=$2
  shift 2
  local out
  if [ "$tool" = llama ]; then
    out=$(timeout 150 $LB "$@" -o json 2>>"$LOG")
  else
    out=$(timeout 150 $B bench "$@" --output-format json 2>>"$LOG")
  fi
  echo "$out" >>"$LOG"
  python3 -c '
import json, sys
rows = json.loads(sys.argv[3] or "[]")
for r in rows:
    test = r.get("test") or ("pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"])
    print(json.dumps({"model": sys.argv[1], "tool": sys.argv[2], "test": test[:2], "ts": r["avg_ts"],
                      "placement": r.get("placement", "")}))' "$name" "$tool" "$out" >>/tmp/rows.jsonl
}
for m in $M8 $M64; do
  n=$(basename $m .gguf)
  row $n "tandem -ts 1,1" -m $m --strategy gpu -ts 1,1 -p 512 -n 64 -r 3
  row $n "tandem -sm none" -m $m --strategy gpu -sm none -p 512 -n 64 -r 3
  row $n llama -m $m -sm layer -ts 1/1 -ngl 99 -fa 1 -p 512 -n 64 -r 3
done
cp /tmp/rows.jsonl "$OUT/bench.json"
python3 - <<'PY' | tee "$OUT/table.md" | tee -a "$LOG"
import json
rows = [json.loads(l) for l in open("/tmp/rows.jsonl") if l.strip()]
get = lambda m, tool, t: next((r["ts"] for r in rows if r["model"] == m and r["tool"] == tool and r["test"] == t), float("nan"))
print("| model | test | llama-bench -sm layer -ts 1/1 | tandem -ts 1,1 | ratio | tandem -sm none (1 GPU) |")
print("|---|---|---:|---:|---:|---:|")
for m in dict.fromkeys(r["model"] for r in rows):
    for t in ("pp", "tg"):
        l, s, one = get(m, "llama", t), get(m, "tandem -ts 1,1", t), get(m, "tandem -sm none", t)
        print(f"| {m} | {t} | {l:,.1f} | {s:,.1f} | {s / l if l == l and l else float('nan'):.2f} | {one:,.1f} |")
for r in rows:
    if r["tool"] == "tandem -ts 1,1" and r["test"] == "tg":
        print(f"\nplacement {r['model']}: {r['placement']}")
PY
say "total: $(($(date +%s) - t0)) s, status $status"
exit $status
