#include "engine_flags.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>

#include "cli_util.h"
#include "commands_impl.h"
#include "placement_file.h"
#include "tandem/error.h"
#include "tandem/registry.h"

namespace tandem::cli {

bool gpu_present() {
  auto ids = available_backend_ids();
  return std::any_of(ids.begin(), ids.end(),
                     [](const std::string& id) { return id.rfind("cuda:", 0) == 0; });
}

namespace {

// --strict turns every fallback into an error; on a machine without a GPU a GPU placement can
// only fall back, so say so before loading the model (and before anything is printed).
void check_strict_has_gpu(const std::string& strategy, const SessionOptions& o) {
  const bool wants_gpu = strategy == "gpu" || (o.n_gpu_layers && *o.n_gpu_layers > 0);
  if (!o.strict || !wants_gpu || gpu_present()) return;
  std::string backends;
  for (const auto& id : available_backend_ids()) backends += (backends.empty() ? "" : ", ") + id;
  for (const auto& absent : absent_backends()) {
    if (absent.name == "cuda") backends += "; cuda: " + absent.reason;
  }
  throw_error(ErrorCode::InvalidArgument, "--strict",
              "no GPU on this machine (backends: " + backends + "), so strategy '" + strategy +
                  "' can only fall back to the CPU; use --strategy cpu, or drop --strict to "
                  "allow the fallback");
}

bool is_gpu_id(const std::string& id) {
  return id.rfind("cuda:", 0) == 0;
}

// --gpu-mem: "6GiB" for every GPU, "cuda:0=10G,cuda:1=12G" per GPU, or both ("8G,cuda:1=12G").
void parse_gpu_mem(const std::string& text, SessionOptions& o) {
  const char* flag = "--gpu-mem";
  const auto ids = available_backend_ids();
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    start = comma + 1;
    TANDEM_CHECK_ARG(!item.empty(), flag, "empty entry in '" + text + "'");
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      TANDEM_CHECK_ARG(!o.gpu_memory, flag, "gives the size for every GPU twice ('" + text + "')");
      o.gpu_memory = parse_size(item, flag);
      continue;
    }
    const std::string id = item.substr(0, eq);
    TANDEM_CHECK_ARG(is_gpu_id(id), flag,
                     "'" + id + "' is not a GPU id (expected cuda:N=SIZE, got '" + item + "')");
    TANDEM_CHECK_ARG(std::find(ids.begin(), ids.end(), id) != ids.end(), flag,
                     "no GPU '" + id + "' on this machine");
    TANDEM_CHECK_ARG(o.gpu_memory_by_id.count(id) == 0, flag, "'" + id + "' given twice");
    o.gpu_memory_by_id[id] = parse_size(item.substr(eq + 1), flag);
  }
}

// --tensor-split: proportions separated by ',' or '/' (llama-bench's spelling).
std::vector<double> parse_tensor_split(const std::string& text, int ranks) {
  const char* flag = "--tensor-split";
  std::vector<double> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t sep = std::min(text.find_first_of(",/", start), text.size());
    const std::string item = text.substr(start, sep - start);
    start = sep + 1;
    size_t used = 0;
    double v = -1.0;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TANDEM_CHECK_ARG(used == item.size() && !item.empty() && std::isfinite(v) && v >= 0.0, flag,
                     "expected proportions >= 0 such as 3,1 (got '" + text + "')");
    out.push_back(v);
  }
  TANDEM_CHECK_ARG(std::any_of(out.begin(), out.end(), [](double v) { return v > 0.0; }), flag,
                   "needs a positive proportion (got '" + text + "')");
  if (ranks > 0) {
    TANDEM_CHECK_ARG(out.size() <= size_t(ranks), flag,
                     "gives " + std::to_string(out.size()) + " proportions for " +
                         std::to_string(ranks) + " ranks");
    return out;
  }
  const auto ids = available_backend_ids();
  const size_t gpus = size_t(std::count_if(ids.begin(), ids.end(), is_gpu_id));
  TANDEM_CHECK_ARG(
      out.size() <= std::max<size_t>(gpus, 1), flag,
      "gives " + std::to_string(out.size()) + " proportions for " + std::to_string(gpus) + " GPUs");
  return out;
}

// A progress bar for each upload of weights the session reports (silent off a terminal).
HybridExecutor::Progress load_progress_bar() {
  auto bar = std::make_shared<std::unique_ptr<Progress>>();
  return [bar](size_t done, size_t total) {
    if (!*bar)
      *bar = std::make_unique<Progress>("loading weights (" + format_bytes(total) + ")", total);
    (*bar)->update(done);
    if (done >= total) bar->reset();
  };
}

}  // namespace

void EngineFlags::add(CLI::App& cmd, bool model_required, bool list_of_ngl) {
  ngl_list = list_of_ngl;
  auto* m = cmd.add_option("-m,--model", model, "GGUF model file");
  if (model_required) m->required();
  cmd.add_option("--gpu-mem", gpu_mem,
                 "Memory each GPU may hold for weights and KV cache (e.g. 6GiB, or per GPU "
                 "cuda:0=10G,cuda:1=12G); the rest runs on the CPU");
  cmd.add_option("--tensor-split", tensor_split,
                 "-ts: several GPUs: proportions of the layers per GPU, in device order (e.g. 3,1 "
                 "or 3/1); default: by each GPU's --gpu-mem or free memory");
  cmd.add_option(
         "--split-mode", split_mode,
         "-sm: several GPUs: layer (contiguous layer ranges per GPU) or none (the first GPU "
         "only); row is not supported")
      ->capture_default_str();
  cmd.add_option("-t,--threads", threads, "CPU threads (0: physical cores)");
  auto* ngl = cmd.add_option("--n-gpu-layers,--ngl", n_gpu_layers,
                             std::string("-ngl N, like llama.cpp: layers >= N, the embedding and "
                                         "(below n_layer + 1) the output run on the CPU") +
                                 (ngl_list ? "; a comma list runs each (-ngl 0,16,24)" : ""));
  if (ngl_list) {
    ngl->delimiter(',');
  } else {
    ngl->expected(1);
  }
  auto* ncmoe = cmd.add_option(
      "--n-cpu-moe", n_cpu_moe,
      std::string("-ncmoe N, like llama.cpp: the expert tensors (ffn_{gate,up,down}_exps) of "
                  "layers < N stay in host memory, where the CPU runs their expert products "
                  "(a GPU only streams them when that is cheaper, as for -ot); the rest is "
                  "placed as without it; no effect on a model without experts") +
          (ngl_list ? "; a comma list runs each (-ncmoe 0,8,16)" : ""));
  if (ngl_list) {
    ncmoe->delimiter(',');
  } else {
    ncmoe->expected(1);
  }
  cmd.add_flag("--cpu-moe", cpu_moe,
               "-cmoe, like llama.cpp: every layer's expert tensors stay in host memory "
               "(--n-cpu-moe with all layers)");
  cmd.add_flag("--hot-experts", hot_experts,
               "A mixture of experts under --strategy auto: the experts each layer's router "
               "chooses most in decode get weights of their own, which the GPU can keep while "
               "the others stay in host memory (chosen after 32 decode steps, reviewed every 32)");
  cmd.add_option("-c,--ctx-size", ctx, "KV cache length in tokens (0: min(trained, 4096))");
  cmd.add_option("--kv-type", kv_type, "KV cache type: f16 or f32")->capture_default_str();
  cmd.add_option("--override-tensor", overrides,
                 "-ot REGEX=BACKEND: pin weights to a backend (e.g. 'blk\\.[0-9]+\\.ffn_.*=cpu', "
                 "or 'exps=CPU': llama.cpp's buffer names CPU and CUDA<N> are accepted)");
  cmd.add_option("--flash-attn", flash_attn,
                 "-fa [on|1|auto]: accepted for llama.cpp compatibility: Tandem's attention is "
                 "always fused (flash-attention style); off is not supported")
      ->expected(0, 1)
      ->default_str("on");
  cmd.add_flag("--strict", strict, "Fail instead of falling back to another backend");
  cmd.add_option("--placement", placement,
                 "A placement saved by `tandem tune --save FILE`: its strategy, GPU budget and "
                 "pins (--gpu-mem and -ot given here still apply)");
  cmd.add_option("--cost-profile", cost_profile,
                 "Cost profile to use instead of this machine's (written by tandem calibrate)");
  cmd.add_flag("--no-calibrate", no_calibrate,
               "Use the built-in device figures: no profile is loaded and none is measured");
}

void EngineFlags::add_ranks(CLI::App& cmd) {
  cmd.add_option("--ranks", ranks,
                 "A pipeline of N processes, one per GPU, through NCCL: each holds a contiguous "
                 "range of layers (-ts: one proportion per rank, else even); see "
                 "docs/multi-gpu.md");
}

SessionOptions EngineFlags::to_options(const std::string& strategy, size_t ngl_index,
                                       size_t moe_index) const {
  SessionOptions o;
  o.model_path = model;
  o.strategy = strategy;
  o.log = &std::cerr;
  o.load_progress = load_progress_bar();
  o.threads = threads;
  TANDEM_CHECK_ARG(threads >= 0 && threads <= 1024, "--threads", "must be in [0, 1024]");
  TANDEM_CHECK_ARG(ctx >= 0, "--ctx-size", "must be >= 0");
  o.n_ctx = ctx;
  TANDEM_CHECK_ARG(ngl_list || n_gpu_layers.size() <= 1, "--n-gpu-layers",
                   "takes one value here (lists are for bench)");
  if (!n_gpu_layers.empty()) {
    const int ngl = n_gpu_layers.at(ngl_index);
    TANDEM_CHECK_ARG(ngl >= 0, "--n-gpu-layers", "must be >= 0 (got " + std::to_string(ngl) + ")");
    o.n_gpu_layers = ngl;
  }
  TANDEM_CHECK_ARG(ngl_list || n_cpu_moe.size() <= 1, "--n-cpu-moe",
                   "takes one value here (lists are for bench)");
  TANDEM_CHECK_ARG(!cpu_moe || n_cpu_moe.empty(), "--cpu-moe",
                   "and --n-cpu-moe exclude each other (--cpu-moe is every layer)");
  if (!n_cpu_moe.empty()) {
    const int n = n_cpu_moe.at(moe_index);
    TANDEM_CHECK_ARG(n >= 0, "--n-cpu-moe", "must be >= 0 (got " + std::to_string(n) + ")");
    o.n_cpu_moe = n;
  }
  if (cpu_moe) o.n_cpu_moe = kAllLayers;
  o.hot_experts = hot_experts;
  const std::vector<std::string> fused{"", "on", "1", "true", "auto"};
  TANDEM_CHECK_ARG(std::find(fused.begin(), fused.end(), flash_attn) != fused.end(), "--flash-attn",
                   "'" + flash_attn +
                       "' is not supported: Tandem's attention is always fused (flash-attention "
                       "style); use on, 1 or auto, or leave the flag out");
  o.strict = strict;
  o.cost_profile = cost_profile;
  o.no_calibrate = no_calibrate;
  TANDEM_CHECK_ARG(!(no_calibrate && !cost_profile.empty()), "--no-calibrate",
                   "and --cost-profile exclude each other");
  o.kv_dtype = parse_dtype(kv_type, "--kv-type");
  TANDEM_CHECK_ARG(o.kv_dtype == DType::F16 || o.kv_dtype == DType::F32, "--kv-type",
                   "must be f16 or f32 (got " + kv_type + ")");
  if (!gpu_mem.empty()) parse_gpu_mem(gpu_mem, o);
  TANDEM_CHECK_ARG(
      split_mode == "layer" || split_mode == "none", "--split-mode",
      "'" + split_mode + "' is not supported: use layer (layer ranges per GPU) or none (one GPU)" +
          (split_mode == "row" ? "; rows of one matrix across GPUs are not split" : ""));
  o.single_gpu = split_mode == "none";
  if (!tensor_split.empty()) o.tensor_split = parse_tensor_split(tensor_split, ranks);
  TANDEM_CHECK_ARG(ranks == 0 || o.gpu_memory_by_id.empty(), "--gpu-mem",
                   "with --ranks each rank has one GPU: give one size for all (e.g. 60G)");
  TANDEM_CHECK_ARG(!o.single_gpu || o.tensor_split.empty(), "--tensor-split",
                   "has no effect with --split-mode none (one GPU)");
  if (!placement.empty()) {
    TANDEM_CHECK_ARG(n_gpu_layers.empty(), "--placement",
                     "a saved placement holds its own pins; drop --n-gpu-layers");
    const PlacementFile file = load_placement(placement);
    const std::string name = model.substr(model.find_last_of('/') + 1);
    TANDEM_CHECK_ARG(file.model == name, "--placement",
                     placement + " was tuned for " + file.model + ", not " + name);
    o.strategy = file.strategy;
    if (gpu_mem.empty()) o.gpu_memory = file.gpu_memory;
    o.pins = file.pins;
  }
  for (const auto& ov : overrides) {
    auto eq = ov.rfind('=');
    TANDEM_CHECK_ARG(eq != std::string::npos && eq > 0 && eq + 1 < ov.size(), "--override-tensor",
                     "expected REGEX=BACKEND (got '" + ov + "')");
    o.pins.push_back(TensorPin{ov.substr(0, eq), ov.substr(eq + 1)});
  }
  check_strict_has_gpu(o.strategy, o);
  return o;
}

std::string EngineFlags::gpu_flags_warning() const {
  if (gpu_present()) return "";
  std::vector<std::string> given;
  if (!gpu_mem.empty()) given.push_back("--gpu-mem");
  if (std::any_of(n_gpu_layers.begin(), n_gpu_layers.end(), [](int n) { return n > 0; })) {
    given.push_back("--n-gpu-layers");
  }
  if (!tensor_split.empty()) given.push_back("--tensor-split");
  if (given.empty()) return "";
  std::string flags, why;
  for (const auto& f : given) flags += (flags.empty() ? "" : ", ") + f;
  for (const auto& absent : absent_backends()) {
    if (absent.name == "cuda") why = " (cuda: " + absent.reason + ")";
  }
  return flags + ": no GPU on this machine, so everything runs on the CPU" + why;
}

void print_gpu_flags_warning(const EngineFlags& flags) {
  const std::string warning = flags.gpu_flags_warning();
  if (!warning.empty()) std::fprintf(stderr, "tandem: warning: %s\n", warning.c_str());
}

}  // namespace tandem::cli
