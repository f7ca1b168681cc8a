// Hyperparameters of a LLaMA-family GGUF model, read and validated from the metadata, with every
// tensor the graph builder needs checked for presence and shape: `llama` (Llama 2/3, Mistral;
// with `<arch>.expert_count` > 0 the Mixtral mixture of experts) and `qwen3moe` (Qwen3's experts,
// per-head Q/K RMSNorm and NeoX RoPE). Keys are read under the architecture's prefix.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tandem/model/gguf.h"

namespace tandem {

struct LlamaConfig {
  std::string arch = "llama";       // general.architecture: "llama" or "qwen3moe"
  std::string name;                 // general.name, "" if absent
  int64_t n_vocab = 0;              // tokens (tokenizer.ggml.tokens / token_embd rows)
  int64_t n_embd = 0;               // llama.embedding_length
  int64_t n_layer = 0;              // llama.block_count
  int64_t n_ff = 0;                 // llama.feed_forward_length
  int64_t n_head = 0;               // llama.attention.head_count
  int64_t n_head_kv = 0;            // llama.attention.head_count_kv (default n_head)
  int64_t head_dim = 0;             // llama.attention.key_length (default n_embd / n_head)
  int64_t n_rot = 0;                // llama.rope.dimension_count (default head_dim)
  float rms_eps = 1e-5f;            // llama.attention.layer_norm_rms_epsilon
  float rope_freq_base = 10000.0f;  // llama.rope.freq_base (default 10000)
  int64_t context_length = 0;       // llama.context_length (the trained maximum)
  bool tied_embeddings = false;     // no output.weight: the output reuses token_embd.weight
  int32_t bos_token_id = -1;        // tokenizer.ggml.bos_token_id, -1 if absent
  int32_t eos_token_id = -1;        // tokenizer.ggml.eos_token_id, -1 if absent
  // Mixture of experts (0 experts: the dense feed-forward block of ffn_gate / ffn_up / ffn_down).
  int64_t n_expert = 0;       // <arch>.expert_count
  int64_t n_expert_used = 0;  // <arch>.expert_used_count, in [1, n_expert]
  int64_t n_ff_expert = 0;    // rows of each expert: <arch>.expert_feed_forward_length or n_ff
  bool norm_expert_weights = false;  // the chosen experts' weights rescaled to sum to 1
  bool qk_norm = false;    // per-head RMSNorm of Q and K before RoPE (attn_q_norm, attn_k_norm)
  bool rope_neox = false;  // RoPE rotates (x[i], x[i + n_rot/2]) rather than adjacent pairs

  bool is_moe() const { return n_expert > 0; }

  // Reads and validates the config. A wrong or missing key is Error{Format} naming the key; a
  // missing or misshapen tensor is Error{Format} naming the tensor; another
  // general.architecture is Error{Unsupported}.
  static LlamaConfig from_gguf(const gguf::File& file);
};

// llama.cpp's name of a general.file_type (llama_ftype without its prefix: "MOSTLY_Q4_K_M" for
// 15), or "" for an id it does not name.
std::string_view llama_file_type_name(uint32_t file_type);

// "blk.<layer>.<suffix>", e.g. llama_layer_tensor(3, "attn_q.weight").
std::string llama_layer_tensor(int64_t layer, std::string_view suffix);

}  // namespace tandem
