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
# ctest prints its summary ("100% tests passed, 0 tests failed out of N") and lists skips.
ctest --preset "$TANDEM_PRESET" --output-on-failure --no-tests=error -j "$TANDEM_JOBS"
