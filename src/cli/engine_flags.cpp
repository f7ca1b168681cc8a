#include "engine_flags.h"

#include "cli_util.h"
#include "commands_impl.h"
#include "tandem/error.h"

namespace tandem::cli {

void EngineFlags::add(CLI::App& cmd, bool model_required) {
  auto* m = cmd.add_option("-m,--model", model, "GGUF model file");
  if (model_required) m->required();
  cmd.add_option("--gpu-mem", gpu_mem,
                 "Memory each GPU may hold for weights and KV cache (e.g. 6GiB); the rest runs "
                 "on the CPU");
  cmd.add_option("-t,--threads", threads, "CPU threads (0: physical cores)");
  cmd.add_option("--n-gpu-layers,--ngl", n_gpu_layers,
                 "Like llama.cpp -ngl: layers >= N, the embedding and (below n_layer + 1) the "
                 "output run on the CPU");
  cmd.add_option("-c,--ctx-size", ctx, "KV cache length in tokens (0: min(trained, 4096))");
  cmd.add_option("--kv-type", kv_type, "KV cache type: f16 or f32")->capture_default_str();
  cmd.add_option("-o,--override-tensor", overrides,
                 "Pin weights to a backend: REGEX=BACKEND (e.g. 'blk\\.[0-9]+\\.ffn_.*=cpu')");
  cmd.add_flag("--strict", strict, "Fail instead of falling back to another backend");
}

EngineOptions EngineFlags::to_options(const std::string& strategy) const {
  EngineOptions o;
  o.model_path = model;
  o.strategy = strategy;
  o.threads = threads;
  TANDEM_CHECK_ARG(threads >= 0 && threads <= 1024, "--threads", "must be in [0, 1024]");
  TANDEM_CHECK_ARG(ctx >= 0, "--ctx-size", "must be >= 0");
  o.n_ctx = ctx;
  if (n_gpu_layers != -1) {
    TANDEM_CHECK_ARG(n_gpu_layers >= 0, "--n-gpu-layers",
                     "must be >= 0 (got " + std::to_string(n_gpu_layers) + ")");
    o.n_gpu_layers = n_gpu_layers;
  }
  o.strict = strict;
  o.kv_dtype = parse_dtype(kv_type, "--kv-type");
  TANDEM_CHECK_ARG(o.kv_dtype == DType::F16 || o.kv_dtype == DType::F32, "--kv-type",
                   "must be f16 or f32 (got " + kv_type + ")");
  if (!gpu_mem.empty()) o.gpu_memory = parse_size(gpu_mem, "--gpu-mem");
  for (const auto& ov : overrides) {
    auto eq = ov.rfind('=');
    TANDEM_CHECK_ARG(eq != std::string::npos && eq > 0 && eq + 1 < ov.size(), "--override-tensor",
                     "expected REGEX=BACKEND (got '" + ov + "')");
    o.pins.push_back(TensorPin{ov.substr(0, eq), ov.substr(eq + 1)});
  }
  return o;
}

}  // namespace tandem::cli
