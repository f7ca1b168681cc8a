#!/usr/bin/env bash
# `tandem serve` on the GPU machine: builds tandem with the server (the machine lacks
# cpp-httplib: .gpu-tools/httplib-prefix.tar.xz holds Debian 12's libcpp-httplib 0.11.4, its
# header and the brotli headers it includes), serves the 1B Q4_0 model all on the GPU with
# 1, 4 and 16 slots and runs bench/serve_bench.py against each (1, 4 and 16 clients).
# Usage (repo root, .gpu-tools/ holding the GPU kit): OUT=/tmp/out bash scripts/gpu_serve.sh
set -u
OUT=${OUT:-/tmp/tandem_serve}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
[ -d /tmp/httplib-prefix ] || tar -xJf .gpu-tools/httplib-prefix.tar.xz -C /tmp || exit 1
export PKG_CONFIG_PATH=/tmp/httplib-prefix/lib/pkgconfig
rm -f build/gpu/CMakeCache.txt  # a cached "cpp-httplib not found" from an earlier configure
source scripts/gpu_build.sh tandem || exit 1
export LD_LIBRARY_PATH=/tmp/httplib-prefix/lib:$LD_LIBRARY_PATH
B=build/gpu/bin/tandem
$B serve --help >/dev/null 2>&1 || { echo "tandem was built without the server"; exit 1; }
M=/tmp/vs-llama-models; mkdir -p $M
m=$M/llama-3.2-1b-q4_0.gguf
[ -f $m ] || timeout 300 $B synth --preset llama-3.2-1b --type q4_0 -o $m >/dev/null
port=18433
for slots in ${SLOTS:-1 4 16}; do
  $B serve -m $m --port $port -np $slots -c $((512 * slots)) --strategy gpu >"$OUT/serve-$slots.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1 && break; sleep 0.2; done
  echo "== $slots slots"
  timeout 300 python3 bench/serve_bench.py --url http://127.0.0.1:$port --clients 1,4,16 \
    --requests ${REQUESTS:-64} --max-tokens ${MAX_TOKENS:-64}
  kill $pid; wait $pid 2>/dev/null
done
