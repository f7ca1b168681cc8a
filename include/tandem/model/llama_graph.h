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
  int sequence = 0;             // whose KV cache the step reads and writes (kv_cache_name)
  // A pipeline stage: layers [layer_begin, layer_end) only (layer_end -1: n_layer). A stage after
  // the first reads the hidden state in place of the token embedding (hidden_in); a stage before
  // the last ends with it (hidden_out) in place of the output layer.
  int layer_begin = 0;
  int layer_end = -1;
  // A mixture of experts: the layers whose experts are split in two products, one over the
  // `experts` named here gathered into weights of their own (hot_expert_name), one over the
  // layer's tensors for the others, added before the weighted sum. `share`: the part of the
  // router's choices expected to name one of them (for cost estimates).
  struct HotExperts {
    int layer = 0;
    std::vector<int32_t> experts;
    double share = 0.0;
  };
  std::vector<HotExperts> hot_experts;
};

// The weights of a split layer (LlamaGraphOptions::hot_experts), for `what` one of
// "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps": "blk.L.ffn_gate_hot.weight" etc., the slab of
// the hot experts in their order; and for "hot_map" / "cold_map", the i32 [n_expert] maps of the
// two products (hot: an expert's slot in the slab or -1; cold: the expert itself or -1).
std::string hot_expert_name(int layer, const std::string& what);

struct LlamaGraph {
  Graph graph;
  TensorId tokens = kNoTensor;     // i32 [n_tokens], bound per run
  TensorId positions = kNoTensor;  // i32 [n_tokens], bound per run
  TensorId logits = kNoTensor;     // f32 [n_vocab, n_tokens or 1]; none before the last stage
  // Pipeline stages: f32 [n_embd, n_tokens], the hidden state between two stages. A stage after
  // the first has hidden_in and no tokens; a stage before the last has hidden_out, no logits.
  TensorId hidden_in = kNoTensor;
  TensorId hidden_out = kNoTensor;
  // Batched decode only: i32 [n_tokens], bound to 0, 1, ..., n_tokens - 1 per run (the row each
  // sequence's attention output goes to).
  TensorId rows = kNoTensor;
  int64_t n_ctx = 0;
  // A mixture of experts: each layer's router choices (i32 [n_expert_used, n_tokens]), in layer
  // order; not outputs unless a caller marks them (Session's routing statistics).
  struct Route {
    int layer = 0;
    TensorId ids = kNoTensor;
  };
  std::vector<Route> routes;

  // What the step produces: the logits, or a stage's hidden state.
  TensorId output() const { return logits != kNoTensor ? logits : hidden_out; }
};

// Name of the KV-cache leaf of layer `layer` of sequence `sequence` ("cache_k.3", "cache_v.3";
// "cache_k.3.s2" for sequence 2): persistent state that prefill and decode graphs share by name.
std::string kv_cache_name(bool key, int layer, int sequence = 0);

// Throws InvalidArgument for impossible options and Format when a weight is missing or has the
// wrong shape.
LlamaGraph build_llama_graph(const LlamaConfig& config, const gguf::File& weights,
                             const LlamaGraphOptions& options);

// One decode step of several sequences, one token each (row r belongs to sequences[r], at
// positions[r]): the matrix products, norms and FFN run on all rows at once; each row's
// attention reads and writes its own sequence's KV cache. Logits of every row. Throws as
// build_llama_graph, and InvalidArgument for no sequence or a repeated one.
LlamaGraph build_llama_decode_batch(const LlamaConfig& config, const gguf::File& weights,
                                    int64_t n_ctx, DType kv_dtype,
                                    const std::vector<int>& sequences);

}  // namespace tandem
