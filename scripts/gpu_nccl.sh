#!/usr/bin/env bash
# Two GPUs of one host, the pipeline across processes (--ranks, NCCL): builds tandem and
# runtime_test for sm_90 with NCCL (the toolkit's, else the nvidia-nccl Python wheel's), runs the
# pipeline tests, checks that the logits of the 1B and 8B Q8_0 shapes from two ranks (one process
# per GPU) match one GPU, also with the ranks started by hand (TANDEM_RANK), checks that a bad
# rank count is refused and that killing a rank stops the other with a clear error, then benches
# --ranks 2 (pp512, tg64) next to one process split across both GPUs (-ts 1,1) and one GPU
# (-sm none), in one table.
# Usage (repo root, .gpu-tools/ holding the GPU kit): OUT=/tmp/out bash scripts/gpu_nccl.sh
# Writes $OUT/nccl.log (every step's output), $OUT/table.md and $OUT/bench.json.
set -u
OUT=${OUT:-/tmp/tandem_nccl}
mkdir -p "$OUT"
LOG="$OUT/nccl.log"
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
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off (the ranks inherit it)

t0=$(date +%s)
status=0 # set on a failed test or a logits mismatch; the benches still run
tar -xJf .gpu-tools/gpu-deps-debian12.tar.xz -C /tmp
export LD_LIBRARY_PATH=/tmp/deps/lib:/tmp/deps/lib/x86_64-linux-gnu OPENBLAS_CORETYPE=SkylakeX
# NCCL: beside the toolkit, else the Python wheel's (nvidia/nccl or nvidia/cu13 holding nccl.h).
nccl_root=""
if [ ! -f /usr/local/cuda/include/nccl.h ]; then
  nccl_h=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null |
    xargs -I{} find {}/nvidia -name nccl.h 2>/dev/null | head -1)
  [ -n "$nccl_h" ] && nccl_root=$(dirname "$(dirname "$nccl_h")")
  [ -n "$nccl_root" ] || fail "no NCCL: neither /usr/local/cuda/include/nccl.h nor a Python nvidia-nccl wheel"
  export LD_LIBRARY_PATH="$nccl_root/lib:$LD_LIBRARY_PATH"
fi
say "NCCL: ${nccl_root:-/usr/local/cuda}"
cmake -S . -B build/gpu -G Ninja -DTANDEM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DTANDEM_BUILD_TESTS=ON -DCMAKE_PREFIX_PATH=/tmp/deps -DPKG_CONFIG_EXECUTABLE=/tmp/deps/bin/pkg-config \
  ${nccl_root:+-DNCCL_ROOT=$nccl_root} "-DCMAKE_CXX_FLAGS=-isystem /tmp/deps/include" >>"$LOG" 2>&1 ||
  fail "configure (see $LOG)"
grep -E "^-- NCCL" "$LOG"
grep -q '^-- NCCL: ' "$LOG" || fail "cmake did not find NCCL (see $LOG)"
timeout 300 cmake --build build/gpu -j16 --target tandem >>"$LOG" 2>&1 || fail "build tandem (see $LOG)"
say "build tandem: $(($(date +%s) - t0)) s"
B=build/gpu/bin/tandem

# The models, generated while the test builds (vs-llama.py's paths, so a warm machine reuses them).
M=/tmp/vs-llama-models
mkdir -p $M
M1=$M/llama-3.2-1b-q8_0.gguf M8=$M/llama-3.1-8b-q8_0.gguf
(
  [ -f $M1 ] || $B synth --preset llama-3.2-1b --type q8_0 -t 8 -o $M1 >/dev/null
  [ -f $M8 ] || $B synth --preset llama-3.1-8b --type q8_0 -t 8 -o $M8 >/dev/null
) >>"$LOG" 2>&1 &
synth=$!
timeout 240 cmake --build build/gpu -j8 --target runtime_test >>"$LOG" 2>&1 || fail "build runtime_test (see $LOG)"
echo "== runtime_test Pipeline* Nccl*" >>"$LOG"
timeout 120 build/gpu/tests/runtime/runtime_test --gtest_filter='Pipeline*:Nccl*' --gtest_brief=1 >>"$LOG" 2>&1
rc=$?
say "runtime_test Pipeline* Nccl*: exit $rc"
[ $rc -eq 0 ] || status=1

# Refused at once, before any rank starts: more ranks than GPUs.
out=$(timeout 60 $B logits -m /nonexistent.gguf --tokens 1 --out /tmp/x.bin --ranks 3 2>&1)
rc=$?
say "--ranks 3 on 2 GPUs: exit $rc: $out"
{ [ $rc -ne 0 ] && echo "$out" | grep -q "3 ranks need 3 GPUs"; } || { say "FAIL: --ranks 3 was not refused clearly"; status=1; }

wait $synth || fail "synth (see $LOG)"
say "models ready: $(($(date +%s) - t0)) s"

compare() { # label, reference file, file
  python3 - "$@" <<'PY' 2>&1 | tee -a "$LOG"
import math, sys
from array import array
def load(path):
    a = array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a
label, a, b = sys.argv[1], load(sys.argv[2]), load(sys.argv[3])
ok = len(a) == len(b) and len(a) > 0 and all(math.isfinite(x) for x in b)
num = sum((float(x) - float(y)) ** 2 for x, y in zip(a, b)) if ok else 0.0
den = sum(float(x) ** 2 for x in a) or 1.0
nmse = num / den if ok else float("inf")
worst = max(abs(x - y) for x, y in zip(a, b)) if ok else float("nan")
same = sum(1 for x, y in zip(a, b) if x == y) if ok else 0
print(f"logits {label}: {len(b)} values ({len(a)} expected), {same} bitwise equal, nmse {nmse:.3g}, "
      f"max |diff| {worst:.3g} -> {'ok' if nmse <= 1e-6 else 'MISMATCH'}")
PY
}

# Logits: two ranks (one process per GPU) against one GPU, 24 tokens, every position.
tokens=$(seq -s, 11 37 900)
for m in $M1 $M8; do
  n=$(basename $m .gguf)
  timeout 180 $B logits -m $m --tokens "$tokens" --all --strategy gpu -sm none --out /tmp/one.bin >>"$LOG" 2>&1 || fail "logits one GPU $n"
  timeout 180 $B logits -m $m --tokens "$tokens" --all --strategy gpu -ts 1,1 --out /tmp/split.bin >>"$LOG" 2>&1 || fail "logits -ts 1,1 $n"
  s=$(date +%s.%N)
  timeout 300 $B logits -m $m --tokens "$tokens" --all --strategy gpu --ranks 2 --out /tmp/ranks.bin >>"$LOG" 2>&1
  rc=$?
  say "logits --ranks 2 $n: exit $rc, $(python3 -c "print(round($(date +%s.%N) - $s, 1))") s"
  if [ $rc -ne 0 ]; then status=1; continue; fi
  compare "$n --ranks 2 vs one GPU" /tmp/one.bin /tmp/ranks.bin
  compare "$n --ranks 2 vs -ts 1,1" /tmp/split.bin /tmp/ranks.bin
done

# The same by hand: the two ranks started with TANDEM_RANK, as on two hosts.
rm -f /tmp/tandem-nccl-id
for r in 1 0; do
  CUDA_VISIBLE_DEVICES=$r TANDEM_RANK=$r TANDEM_NRANKS=2 TANDEM_NCCL_ID_FILE=/tmp/tandem-nccl-id TANDEM_PIPELINE_TIMEOUT=120 \
    timeout 300 $B logits -m $M1 --tokens "$tokens" --all --strategy gpu --out /tmp/hand.bin >>"$LOG" 2>&1 &
  eval "pid$r=\$!"
done
wait $pid0
rc0=$?
wait $pid1
rc1=$?
say "logits by hand (TANDEM_RANK): exit $rc0 / $rc1"
if [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ]; then
  timeout 180 $B logits -m $M1 --tokens "$tokens" --all --strategy gpu -sm none --out /tmp/one.bin >>"$LOG" 2>&1
  compare "$(basename $M1 .gguf) by hand vs one GPU" /tmp/one.bin /tmp/hand.bin
else
  status=1
fi
grep -qE "MISMATCH|Traceback" "$LOG" && { say "FAIL: logits of --ranks 2 differ from one GPU (see $LOG)"; status=1; }

# A rank that dies: the launcher stops the other and names it, within seconds.
$B bench -m $M1 --strategy gpu --ranks 2 -p 512 -n 1024 -r 50 >/dev/null 2>/tmp/nccl_kill.err &
lpid=$!
sleep 25
r1=""
for p in $(pgrep -P $lpid); do
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'TANDEM_RANK=1' && r1=$p
done
if [ -n "$r1" ]; then
  kill -KILL "$r1"
  s=$(date +%s)
  ( sleep 120; kill -KILL $lpid 2>/dev/null ) &
  watchdog=$!
  wait $lpid
  rc=$?
  kill $watchdog 2>/dev/null
  took=$(($(date +%s) - s))
  cat /tmp/nccl_kill.err >>"$LOG"
  say "rank 1 killed: launcher exit $rc after $took s: $(grep -- '--ranks' /tmp/nccl_kill.err | tail -1)"
  { [ $rc -ne 0 ] && [ $took -lt 60 ] && grep -q "rank 1 was killed" /tmp/nccl_kill.err; } ||
    { say "FAIL: a killed rank did not stop the pipeline cleanly"; status=1; }
else
  say "FAIL: no rank 1 to kill (the bench ended early? see /tmp/nccl_kill.err)"
  cat /tmp/nccl_kill.err >>"$LOG"
  kill $lpid 2>/dev/null
  status=1
fi

# Throughput: --ranks 2, one process over both GPUs, one GPU, on the same files.
: >/tmp/nccl_rows.jsonl
row() { # name, tool, args...
  local name=$1 tool=$2
  shift 2
  local out
  out=$(timeout 400 $B bench "$@" --output-format json 2>>"$LOG")
  echo "$out" >>"$LOG"
  python3 -c '
import json, sys
rows = json.loads(sys.argv[3] or "[]")
for r in rows:
    test = r.get("test") or ("pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"])
    print(json.dumps({"model": sys.argv[1], "tool": sys.argv[2], "test": test[:2], "ts": r["avg_ts"],
                      "placement": r.get("placement", "")}))' "$name" "$tool" "$out" >>/tmp/nccl_rows.jsonl
}
for m in $M1 $M8; do
  n=$(basename $m .gguf)
  # One process first: it writes the cost profile the ranks then read (rather than each rank
  # calibrating at once).
  row $n "-sm none" -m $m --strategy gpu -sm none -p 512 -n 64 -r 3
  row $n "-ts 1,1" -m $m --strategy gpu -ts 1,1 -p 512 -n 64 -r 3
  row $n "--ranks 2" -m $m --strategy gpu --ranks 2 -p 512 -n 64 -r 3
done
cp /tmp/nccl_rows.jsonl "$OUT/bench.json"
python3 - <<'PY' | tee "$OUT/table.md" | tee -a "$LOG"
import json
rows = [json.loads(l) for l in open("/tmp/nccl_rows.jsonl") if l.strip()]
get = lambda m, tool, t: next((r["ts"] for r in rows if r["model"] == m and r["tool"] == tool and r["test"] == t), float("nan"))
print("| model | test | tandem --ranks 2 (2 processes) | tandem -ts 1,1 (1 process, 2 GPUs) | ratio | tandem -sm none (1 GPU) |")
print("|---|---|---:|---:|---:|---:|")
for m in dict.fromkeys(r["model"] for r in rows):
    for t in ("pp", "tg"):
        r2, s, one = get(m, "--ranks 2", t), get(m, "-ts 1,1", t), get(m, "-sm none", t)
        print(f"| {m} | {t} | {r2:,.1f} | {s:,.1f} | {r2 / s if s == s and s else float('nan'):.2f} | {one:,.1f} |")
for r in rows:
    if r["tool"] == "--ranks 2" and r["test"] == "tg":
        print(f"\nplacement {r['model']} --ranks 2: {r['placement']}")
PY
say "total: $(($(date +%s) - t0)) s, status $status"
exit $status
