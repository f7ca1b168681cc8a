#!/usr/bin/env bash
# The main job: installs what is missing, builds `tandem`, generates a synthetic LLaMA model
# (no download) and benchmarks it with CPU, GPU (where present) and automatic placement side by
# side, followed by the scheduler's summary for each.
#   scripts/main_job.sh [PRESET [TYPE]]   e.g. scripts/main_job.sh llama-3.2-1b q4_0
# Default: llama-3.2-1b where a GPU is present, else the ~160M-parameter "small"; q4_0.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh

if [[ -n "${1:-}" ]]; then
  model_preset="$1"
elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  model_preset=llama-3.2-1b
else
  model_preset=small
fi
model_type="${2:-q4_0}"

cmake --preset "$TANDEM_PRESET"
cmake --build --preset "$TANDEM_PRESET" -j "$TANDEM_JOBS" --target tandem
bin="build/$TANDEM_PRESET/bin/tandem"
model="build/$TANDEM_PRESET/models/${model_preset}-${model_type}.gguf"
mkdir -p "$(dirname "$model")"
[[ -f "$model" ]] || "$bin" synth --preset "$model_preset" --type "$model_type" -o "$model"
"$bin" devices | grep -E '^[a-z]+(:[0-9]+)? \(' || true
"$bin" bench -m "$model" -p 64 -n 32 -r 3
