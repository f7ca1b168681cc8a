#!/usr/bin/env bash
# Installs what is missing, builds tandem-demo and runs it: one transformer block on every
# available backend, each checked against the reference. Extra arguments go to tandem-demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh

cmake --preset "$TANDEM_PRESET"
cmake --build --preset "$TANDEM_PRESET" -j "$TANDEM_JOBS" --target tandem-demo
"build/$TANDEM_PRESET/examples/tandem-demo" "$@"
