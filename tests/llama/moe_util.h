// What the mixture-of-experts tests share (beside llama_util.h's NMSE of logits and options): a
// host beside a fake GPU, and a model whose experts are most of its bytes.
#pragma once

#include <cmath>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "llama_util.h"
#include "tandem/model/llama_graph.h"
#include "tandem/model/synthetic.h"
#include "tandem/runtime.h"
#include "tandem/scheduler.h"
#include "test_backends.h"

namespace tandem::moe_test {

using test::nmse;
using test::options;

// A host backend and a "GPU" whose memory the executor cannot touch, the host named "host" so
// that nothing can pass by spelling "cpu".
inline std::vector<std::shared_ptr<Backend>> host_and_fake_gpu() {
  return {test::make_cpu("host"), test::make_gpu("gpu")};
}

inline bool is_expert(const std::string& name) {
  return name.find("_exps") != std::string::npos;
}

// A MoE model whose experts are most of its bytes (Qwen3-30B-A3B's ratio: 128 experts, 8 per
// token) and devices where the dense part belongs on the GPU: a slow host (100 GFLOP/s,
// 10 GB/s) and a fast GPU behind a 20 GB/s link. Each expert tensor (1.1 MB) takes ~55 us to
// stream, longer than a decode step's GPU work; a token reads 8/128 of it.
struct ExpertHeavy {
  std::string path;
  gguf::File file;
  LlamaConfig config;
  std::shared_ptr<Backend> host = test::make_cpu("host"), gpu = test::make_gpu("gpu");

  ExpertHeavy()
      : path(write()), file(gguf::File::open(path)), config(LlamaConfig::from_gguf(file)) {}
  static std::string write() {
    const auto& dir = test::process_temp_dir("tandem_moe_test_");
    const std::string p = (dir / "expert_heavy.gguf").string();
    if (std::filesystem::exists(p)) return p;
    SyntheticSpec spec = synthetic_preset("tiny-moe", DType::Q8_0, 5);
    spec.n_embd = 128;
    spec.n_expert = 128;
    spec.n_expert_used = 8;
    spec.threads = 1;
    write_synthetic_model(spec, p);
    return p;
  }
  static CostModel costs() {
    auto profile = [](double gflops, double bandwidth, double launch, LinkProfile link) {
      BackendProfile b;
      b.peak_gflops.fill(gflops);
      b.memory_bandwidth_gbs = bandwidth;
      b.launch_us = launch;
      b.link = link;
      return b;
    };
    CostModel m;
    m.set_profile("host", profile(100.0, 10.0, 1.0, {}));
    m.set_profile("gpu", profile(1e5, 1000.0, 1.0, {20.0, 5.0}));
    return m;
  }
  Graph graph(int64_t n_tokens) const {
    LlamaGraphOptions o;
    o.n_tokens = n_tokens;
    o.n_ctx = 64;
    o.kv_dtype = DType::F32;
    return build_llama_graph(config, file, o).graph;
  }
};

}  // namespace tandem::moe_test
