# Sourced by the scripts: the preset to use and the environment for builds and runs.
# CUDA code is compiled wherever nvcc is found (CUDA tests skip without a GPU).
if [[ -d /usr/local/cuda/bin ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# OpenBLAS mis-detects some virtual CPUs; pin a core type it knows, where the CPU has AVX-512
# (SkylakeX kernels die of SIGILL elsewhere).
if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-SkylakeX}"
fi
if command -v nvcc >/dev/null; then
  TANDEM_PRESET="${TANDEM_PRESET:-gpu}"
else
  TANDEM_PRESET="${TANDEM_PRESET:-cpu}"
fi
TANDEM_JOBS="${TANDEM_JOBS:-$(nproc)}"
