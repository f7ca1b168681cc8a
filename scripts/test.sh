#!/usr/bin/env bash
# Installs what is missing, builds everything with warnings as errors and runs every test.
#   scripts/test.sh          the release build (CUDA compiled where nvcc is found)
#   scripts/test.sh --asan   the AddressSanitizer + UndefinedBehaviorSanitizer build (CPU only)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
if [[ "${1:-}" == "--asan" ]]; then
  TANDEM_PRESET=asan
fi

echo "test: preset ${TANDEM_PRESET}, ${TANDEM_JOBS} jobs"
cmake --preset "$TANDEM_PRESET" -DTANDEM_BUILD_TESTS=ON
cmake --build --preset "$TANDEM_PRESET" -j "$TANDEM_JOBS"
log="build/$TANDEM_PRESET/ctest-output.txt"
ctest --preset "$TANDEM_PRESET" --output-on-failure --no-tests=error -j "$TANDEM_JOBS" | tee "$log"
# Why tests were skipped (GTEST_SKIP messages), then ctest's summary line once more.
skips="build/$TANDEM_PRESET/Testing/Temporary/LastTest.log"
if grep -q ": Skipped$" "$skips"; then
  echo "test: skipped tests said:"
  grep -A1 ": Skipped$" "$skips" | grep -vE ": Skipped$|^--$" | sort | uniq -c
fi
echo "test (${TANDEM_PRESET}): $(grep -E "tests passed|tests failed" "$log" | tail -1)"
