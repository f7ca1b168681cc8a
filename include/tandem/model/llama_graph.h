// Builds LLaMA-family inference graphs (prefill of a batch of positions, or decode of one
// token) over a KV cache. The graph names its weights as the GGUF file does, so an executor
// binds them to the mapped file by name. The model layer builds graphs and never runs kernels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/graph.h"
#include "tandem/model/gguf.h"
#include "tandem/model/llama_config.h"

namespace tandem {

struct LlamaGraphOptions {
  int64_t n_tokens = 1;         // tokens in this step (1 for decode)
  int64_t n_ctx = 0;            // KV cache length; 0: min(context_length, 4096)
  DType kv_dtype = DType::F16;  // F16 or F32
  bool all_logits = false;      // logits of every token, else of the last only
};

struct LlamaGraph {
  Graph graph;
  TensorId tokens = kNoTensor;     // i32 [n_tokens], bound per run
  TensorId positions = kNoTensor;  // i32 [n_tokens], bound per run
  TensorId logits = kNoTensor;     // f32 [n_vocab, n_tokens or 1]
  int64_t n_ctx = 0;
};

// Name of the KV-cache leaf of layer `layer` ("cache_k.3", "cache_v.3"): persistent state that
// prefill and decode graphs share by name.
std::string kv_cache_name(bool key, int layer);

// Throws InvalidArgument for impossible options and Format when a weight is missing or has the
// wrong shape.
LlamaGraph build_llama_graph(const LlamaConfig& config, const gguf::File& weights,
                             const LlamaGraphOptions& options);

}  // namespace tandem
