#!/usr/bin/env bash
# CPU thread-pool stall check: many short `tandem run --strategy cpu` generations while other
# processes keep the cores busy; prints the median and slowest generation time. A pool whose
# waiting threads hold the CPU that the thread they wait for needs shows as a slowest run many
# times the median, or, when every run stalls, as a median many times that of the same runs on
# one thread (-t 1, no pool). Checks: slowest within 3x of the median, and that median within 3x
# of the one-thread median. Pool runs and -t 1 runs alternate; a slowest run beyond 3x while the
# -t 1 runs themselves spread beyond 3x is INCONCLUSIVE (exit 2): the machine's load sets it.
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

# Generation seconds of one run with the extra arguments $@, from the tokens/s figure (the
# seconds are printed to the millisecond, too coarse for a 2 ms run).
gen_time() {
  "$bin" run -m "$model" -p hello -n "$n" --strategy cpu "$@" 2>&1 >/dev/null |
    awk '/^generation:/ { gsub(/[(]/, "", $7); printf "%.6f\n", $2 / $7 }'
}
# Pool runs and -t 1 runs alternate, so that both meet the same load from other processes.
pool_file=$(mktemp)
single_file=$(mktemp)
trap 'stop_busy; rm -f "$pool_file" "$single_file"' EXIT
for ((i = 0; i < runs; ++i)); do
  gen_time "${threads[@]}" >>"$pool_file"
  gen_time -t 1 >>"$single_file"
done
# "fastest median 90th-percentile slowest" of sorted numbers on stdin
summary() {
  awk '{ v[NR] = $1 } END {
    median = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    p90 = v[int(0.9 * (NR - 1)) + 1]
    printf "%.6f %.6f %.6f %.6f\n", v[1], median, p90, v[NR] }'
}

pool=$(sort -g "$pool_file" | summary)
single=$(sort -g "$single_file" | summary)
stop_busy

read -r fastest median p90 slowest <<<"$pool"
read -r s_fastest s_median s_p90 s_slowest <<<"$single"
echo "pool_stall: $runs runs of $n tokens, threads ${THREADS:-default}, $busy busy processes," \
  "$cores cores, load average $(cut -d' ' -f1 /proc/loadavg)"
awk -v f="$fastest" -v m="$median" -v p="$p90" -v s="$slowest" -v sf="$s_fastest" \
  -v sm="$s_median" -v sp="$s_p90" -v ss="$s_slowest" 'BEGIN {
  format = "%-5s generation ms: fastest %.2f median %.2f p90 %.2f slowest %.2f (slowest/median %.1fx)\n"
  printf format, "pool", 1e3 * f, 1e3 * m, 1e3 * p, 1e3 * s, s / m
  printf format, "-t 1", 1e3 * sf, 1e3 * sm, 1e3 * sp, 1e3 * ss, ss / sm
  printf "pool median / -t 1 median: %.1fx\n", m / sm
  ok = s <= 3 * m && m <= 3 * sm
  if (ok) { print "PASS: slowest within 3x of the median, median within 3x of -t 1"; exit 0 }
  if (m <= 3 * sm && ss > 3 * sm) {
    print "INCONCLUSIVE: -t 1 too spreads beyond 3x (other processes set the spread)"
    exit 2
  }
  print "FAIL: slowest beyond 3x of the median, or median beyond 3x of -t 1"
  exit 1 }'
