#!/usr/bin/env bash
# CPU thread-pool stall check: many short `tandem run --strategy cpu` generations while other
# processes keep the cores busy; prints the median and slowest generation time. A pool whose
# waiting threads hold the CPU that the thread they wait for needs shows as a slowest run many
# times the median, or, when every run stalls, as a median many times that of the same runs on
# one thread (-t 1, no pool). Checks: slowest within 3x of the median, and that median within 3x
# of the one-thread median.
#
# usage: bench/pool_stall.sh [RUNS [BUSY]]   (RUNS=30; BUSY: busy processes, default nproc - 1
#        or 1); env: TANDEM=build/cpu/bin/tandem MODEL=/tmp/tiny.gguf THREADS= N=128
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-30}
cores=$(nproc)
busy=${2:-$((cores > 1 ? cores - 1 : 1))}
bin=${TANDEM:-build/cpu/bin/tandem}
model=${MODEL:-/tmp/tiny.gguf}
n=${N:-128}
threads=()
[[ -n "${THREADS:-}" ]] && threads=(-t "$THREADS")
[[ -x "$bin" ]] || { echo "pool_stall: no $bin (build with the cpu preset first)" >&2; exit 2; }
[[ -f "$model" ]] || "$bin" synth --preset tiny --type q4_0 -o "$model" >/dev/null

pids=()
stop_busy() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_busy EXIT
for ((i = 0; i < busy; ++i)); do
  bash -c 'while :; do :; done' &
  pids+=($!)
done
sleep 0.5

# generation seconds of $1 runs with the extra arguments $2..
gen_times() {
  local count=$1
  shift
  for ((i = 0; i < count; ++i)); do
    "$bin" run -m "$model" -p hello -n "$n" --strategy cpu "$@" 2>&1 >/dev/null |
      awk '/^generation:/ {print $5}'
  done | sort -g
}
# "fastest median slowest" of sorted numbers on stdin
summary() {
  awk '{ v[NR] = $1 } END {
    median = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%.4f %.4f %.4f\n", v[1], median, v[NR] }'
}

pool=$(gen_times "$runs" "${threads[@]}" | summary)
single=$(gen_times $(((runs + 2) / 3)) -t 1 | summary)
stop_busy

read -r fastest median slowest <<<"$pool"
read -r s_fastest s_median s_slowest <<<"$single"
echo "pool_stall: $runs runs of $n tokens, threads ${THREADS:-default}, $busy busy processes," \
  "$cores cores, load average $(cut -d' ' -f1 /proc/loadavg)"
awk -v f="$fastest" -v m="$median" -v s="$slowest" -v sf="$s_fastest" -v sm="$s_median" \
  -v ss="$s_slowest" 'BEGIN {
  printf "pool      generation s: fastest %.4f median %.4f slowest %.4f (slowest/median %.1fx)\n", \
    f, m, s, s / m
  printf "-t 1      generation s: fastest %.4f median %.4f slowest %.4f\n", sf, sm, ss
  printf "pool median / -t 1 median: %.1fx\n", m / sm
  ok = s <= 3 * m && m <= 3 * sm
  print ok ? "PASS: slowest within 3x of the median, median within 3x of -t 1" : \
    "FAIL: slowest beyond 3x of the median, or median beyond 3x of -t 1"
  exit !ok }'
