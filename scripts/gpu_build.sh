# Sourced by the scripts/gpu_*.sh scripts on the GPU machine: unpacks the kit's dependency prefix
# (GoogleTest, Benchmark, OpenBLAS, CLI11, nlohmann-json) into /tmp/deps once, sets the library
# path, configures build/gpu for sm_90 (Release, tests on) and builds the targets given.
#   source scripts/gpu_build.sh tandem llama_test    (needs $OUT; logs to $OUT/build.log)
if [[ -f .gpu-tools/gpu-deps-debian12.tar.xz && ! -d /tmp/deps ]]; then
  tar -xJf .gpu-tools/gpu-deps-debian12.tar.xz -C /tmp
fi
export LD_LIBRARY_PATH=/tmp/deps/lib:/tmp/deps/lib/x86_64-linux-gnu OPENBLAS_CORETYPE=SkylakeX
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
gpu_build_t0=$(date +%s)
cmake -S . -B build/gpu -G Ninja -DTANDEM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DTANDEM_BUILD_TESTS=ON -DCMAKE_PREFIX_PATH=/tmp/deps -DPKG_CONFIG_EXECUTABLE=/tmp/deps/bin/pkg-config \
  "-DCMAKE_CXX_FLAGS=-isystem /tmp/deps/include" >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
timeout 400 cmake --build build/gpu -j16 --target "$@" >>"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
echo "build: $(($(date +%s) - gpu_build_t0)) s"
rm -f "$OUT/build.log"
