#!/usr/bin/env bash
# Installs what is missing, builds everything with warnings as errors and runs every test.
#   scripts/test.sh          the release build (CUDA compiled where nvcc is found), then the
#                            installed package built from an outside project, and pytest
#                            over the Python module
#   scripts/test.sh --asan   the AddressSanitizer build, UndefinedBehaviorSanitizer in the
#                            libraries (CPU only)
#   scripts/test.sh --tsan   the thread-pool and scheduler tests under ThreadSanitizer (CPU only)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
if [[ "${1:-}" == "--asan" ]]; then
  TANDEM_PRESET=asan
fi

if [[ "${1:-}" == "--tsan" ]]; then
  # Only the code that runs threads: cpu_test (ThreadPool) and sched_test (Scheduler, Executor,
  # streamed copies, telemetry). The kernel tests in cpu_test are left out: slow under TSan.
  tsan_tests='^(ThreadPool|Scheduler|Capabilities|ExecutorTest|CostModel|Telemetry|ExtensionOp)\.|/StreamedTest\.'
  echo "test: preset tsan, ${TANDEM_JOBS} jobs, tests matching ${tsan_tests}"
  cmake --preset tsan -DTANDEM_BUILD_TESTS=ON
  cmake --build --preset tsan -j "$TANDEM_JOBS" --target cpu_test sched_test
  log=build/tsan/ctest-output.txt
  TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}" ctest --preset tsan --output-on-failure \
    --no-tests=error -j "$TANDEM_JOBS" -R "$tsan_tests" | tee "$log"
  echo "test (tsan): $(grep -E "tests passed|tests failed" "$log" | tail -1)"
  exit 0
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
# The installed package, used from an outside project (not under the sanitizers: their runtime
# would have to come first into every program that loads the library).
if [[ "$TANDEM_PRESET" != asan ]]; then
  bash scripts/install_check.sh "build/$TANDEM_PRESET"
  # The Python module, with an interpreter that has NumPy and pytest (setup.sh installs them
  # for the system's python3; a python3 earlier on the PATH may lack them).
  python=""
  for candidate in python3 /usr/bin/python3; do
    if "$candidate" -c "import numpy, pytest" 2>/dev/null; then python=$candidate; break; fi
  done
  [[ -n "$python" ]] || { echo "test: no python3 with numpy and pytest" >&2; exit 1; }
  PYTHONPATH="build/$TANDEM_PRESET/python" "$python" -m pytest -q -p no:cacheprovider python/tests
fi
