#!/usr/bin/env bash
# Calibration on the GPU machine: `tandem calibrate` (full) for cpu and cuda:0, then the cost
# model's per-op accuracy (median |estimated - actual| / actual over every op timed alone by
# `run --stats`) on the 1B and 8B Q4_0 shapes, on the CPU alone and with --strategy gpu
# (cuda:0), from the calibration alone and after one learning run, with each run's noise floor
# (scripts/estimate_error.py), and a table.
# Usage (repo root, .gpu-tools/ holding the GPU kit): OUT=/tmp/out bash scripts/gpu_calibrate.sh
# (CALIBRATE_FLAGS=--quick measures what run and bench calibrate on first use)
# $OUT keeps at most 7 small files: calibrate.txt, one summary per model and device (4),
# table.txt and, when a build fails, its log.
set -u
OUT=${OUT:-/tmp/tandem_calibrate}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/gpu_build.sh tandem
B=build/gpu/bin/tandem

# A fresh cache: the first run of every command below uses what calibrate wrote.
export XDG_CACHE_HOME=/tmp/tandem-calibrate-cache
rm -rf "$XDG_CACHE_HOME"
THREADS=${THREADS:-16}
t0=$(date +%s)
timeout 300 $B calibrate ${CALIBRATE_FLAGS:-} -t "$THREADS" -v >"$OUT/calibrate.txt" 2>&1 || { tail -20 "$OUT/calibrate.txt"; exit 1; }
echo "calibrate: $(($(date +%s) - t0)) s"
grep -E "^(cpu|cuda)|measured in|link to device|cost profile written" "$OUT/calibrate.txt"

PRISTINE=/tmp/tandem-calibrated-profile.json
cp "$(ls "$XDG_CACHE_HOME"/tandem/cost-profile-*.json | head -1)" $PRISTINE
M=/tmp/vs-llama-models
mkdir -p $M
[ -f $M/llama-3.2-1b-q4_0.gguf ] || timeout 100 $B synth --preset llama-3.2-1b --type q4_0 -o $M/llama-3.2-1b-q4_0.gguf >/dev/null
[ -f $M/llama-3.1-8b-q4_0.gguf ] || timeout 200 $B synth --preset llama-3.1-8b --type q4_0 -o $M/llama-3.1-8b-q4_0.gguf >/dev/null
PROMPTS=("the quick brown fox jumps over the lazy dog and then" "a completely different prompt about rivers, mountains and the sea")
printf "%-6s %-8s %10s %12s %8s %12s %8s\n" model device "timed ops" "calibrated" floor "+1 learned" floor >"$OUT/table.txt"
for model in 1b:llama-3.2-1b 8b:llama-3.1-8b; do
  name=${model%%:*}
  for strategy in cpu gpu; do
    log="$OUT/$name-$strategy.txt"
    : >"$log"
    # Run 1 uses the calibration alone; run 2 (another prompt) also what run 1 taught. -c 64
    # holds both runs' tokens, as bench sizes its context.
    cp $PRISTINE /tmp/tandem-profile-run.json
    row=""
    for run in 0 1; do
      echo "== run $((run + 1)) (${PROMPTS[$run]})" >>"$log"
      timeout 240 $B run -m $M/${model#*:}-q4_0.gguf -p "${PROMPTS[$run]}" -n 16 -c 64 -t "$THREADS" \
        --greedy --strategy $strategy --stats --cost-profile /tmp/tandem-profile-run.json \
        --trace /tmp/calib-trace.json >/dev/null 2>/tmp/calib-run.txt || echo "exit $?" >>"$log"
      sed -n '/^placement:/,$p' /tmp/calib-run.txt | grep -v "^trace written" >>"$log"
      python3 scripts/estimate_error.py /tmp/calib-trace.json >>"$log" 2>&1
      ops=$(grep -o "over [0-9]* timed ops" "$log" | tail -1 | awk '{print $2}')
      err=$(grep "^median |error|" "$log" | tail -1 | awk '{print $3}')
      floor=$(grep "^noise floor" "$log" | tail -1 | awk '{print $3}')
      row="$row ${err:-?} ${floor:-?}"
    done
    device=$([ $strategy = cpu ] && echo cpu || echo cuda:0)
    printf "%-6s %-8s %10s %12s %8s %12s %8s\n" $name $device "${ops:-?}" $row >>"$OUT/table.txt"
  done
done
rm -f /tmp/calib-trace.json /tmp/calib-run.txt
echo
echo "per-op median |estimated - actual| / actual (Q4_0, prompt + 16 tokens, -t $THREADS):"
cat "$OUT/table.txt"
