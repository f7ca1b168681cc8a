#include "tandem/model/llama_config.h"

#include <cmath>
#include <optional>

#include "tandem/error.h"

namespace tandem {
namespace {

// Bounds that keep every derived size (n_embd * n_vocab, cache bytes) far from overflow.
constexpr int64_t kMaxDim = int64_t(1) << 24;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxExperts = 4096;

[[noreturn]] void fail_key(const gguf::File& f, std::string_view key, const std::string& what) {
  throw_error(ErrorCode::Format, "llama " + f.path(),
              "key '" + std::string(key) + "' at offset " + std::to_string(f.key_offset(key)) +
                  ": " + what);
}

int64_t read_dim(const gguf::File& f, std::string_view key, int64_t max = kMaxDim) {
  uint64_t v = f.get_uint(key);
  if (v < 1 || v > uint64_t(max)) {
    fail_key(f, key, std::to_string(v) + " is not in [1, " + std::to_string(max) + "]");
  }
  return int64_t(v);
}

int64_t read_dim_or(const gguf::File& f, std::string_view key, int64_t fallback) {
  return f.has(key) ? read_dim(f, key) : fallback;
}

// Without a fallback the key is required (get_float reports it missing).
float read_positive_float(const gguf::File& f, std::string_view key,
                          std::optional<double> fallback) {
  double v = f.has(key) || !fallback ? f.get_float(key) : *fallback;
  if (!std::isfinite(v) || v <= 0.0 || v > 1e30) {
    fail_key(f, key, std::to_string(v) + " is not a positive finite number");
  }
  return float(v);
}

int32_t read_token_id(const gguf::File& f, std::string_view key, int64_t n_vocab) {
  if (!f.has(key)) return -1;
  int64_t v = f.get_int(key);
  if (v < 0 || v >= n_vocab) {
    fail_key(f, key,
             "token id " + std::to_string(v) + " is not in [0, " + std::to_string(n_vocab) + ")");
  }
  return int32_t(v);
}

void check_tensor(const gguf::File& f, const std::string& name, Dims want, bool is_norm) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (t == nullptr)
    throw_error(ErrorCode::Format, "llama " + f.path(), "missing tensor '" + name + "'");
  auto shape = [](const Dims& ne) {
    std::string s = "[";  // appended piecewise: g++ 12 misreports "[" + to_string(...)
    for (int d = 0; d < kMaxDims; ++d) s += std::to_string(ne[d]) + (d + 1 < kMaxDims ? ", " : "]");
    return s;
  };
  std::string where = "llama " + f.path();
  std::string subject =
      "tensor '" + name + "' at offset " + std::to_string(f.data_offset() + t->offset) + ": ";
  if (t->ne != want) {
    throw_error(ErrorCode::Format, where,
                subject + "shape " + shape(t->ne) + ", expected " + shape(want));
  }
  const auto& traits = dtype_traits(t->dtype);
  if (is_norm ? !traits.is_float : !(traits.is_float || traits.is_quantized)) {
    throw_error(ErrorCode::Format, where,
                subject + "dtype " + std::string(traits.name) + " is not allowed for a " +
                    (is_norm ? "norm" : "weight"));
  }
}

}  // namespace

std::string_view llama_file_type_name(uint32_t file_type) {
  switch (file_type) {
    case 0:
      return "ALL_F32";
    case 1:
      return "MOSTLY_F16";
    case 2:
      return "MOSTLY_Q4_0";
    case 3:
      return "MOSTLY_Q4_1";
    case 7:
      return "MOSTLY_Q8_0";
    case 8:
      return "MOSTLY_Q5_0";
    case 9:
      return "MOSTLY_Q5_1";
    case 10:
      return "MOSTLY_Q2_K";
    case 11:
      return "MOSTLY_Q3_K_S";
    case 12:
      return "MOSTLY_Q3_K_M";
    case 13:
      return "MOSTLY_Q3_K_L";
    case 14:
      return "MOSTLY_Q4_K_S";
    case 15:
      return "MOSTLY_Q4_K_M";
    case 16:
      return "MOSTLY_Q5_K_S";
    case 17:
      return "MOSTLY_Q5_K_M";
    case 18:
      return "MOSTLY_Q6_K";
    case 32:
      return "MOSTLY_BF16";
    default:
      return "";
  }
}

std::string llama_layer_tensor(int64_t layer, std::string_view suffix) {
  return "blk." + std::to_string(layer) + "." + std::string(suffix);
}

LlamaConfig LlamaConfig::from_gguf(const gguf::File& f) {
  std::string arch = f.get_string("general.architecture");
  if (arch != "llama" && arch != "qwen3moe") {
    throw_error(ErrorCode::Unsupported, "llama " + f.path(),
                "key 'general.architecture' at offset " +
                    std::to_string(f.key_offset("general.architecture")) + ": architecture '" +
                    arch + "' is not llama or qwen3moe");
  }
  // "<arch>.<key>", e.g. "qwen3moe.block_count".
  auto key = [&arch](std::string_view k) { return arch + "." + std::string(k); };
  LlamaConfig c;
  c.arch = arch;
  if (f.has("general.name")) c.name = f.get_string("general.name");
  c.n_embd = read_dim(f, key("embedding_length"));
  c.n_layer = read_dim(f, key("block_count"), kMaxLayers);
  c.n_ff = read_dim(f, key("feed_forward_length"));
  c.n_head = read_dim(f, key("attention.head_count"));
  c.n_head_kv = read_dim_or(f, key("attention.head_count_kv"), c.n_head);
  c.context_length = read_dim(f, key("context_length"), int64_t(1) << 30);
  if (c.n_head % c.n_head_kv != 0) {
    fail_key(
        f, key("attention.head_count_kv"),
        std::to_string(c.n_head_kv) + " does not divide head_count " + std::to_string(c.n_head));
  }
  if (f.has(key("attention.key_length"))) {
    c.head_dim = read_dim(f, key("attention.key_length"));
    if (f.has(key("attention.value_length")) &&
        read_dim(f, key("attention.value_length")) != c.head_dim) {
      fail_key(f, key("attention.value_length"), "differs from key_length (unsupported)");
    }
  } else {
    if (c.n_embd % c.n_head != 0) {
      fail_key(f, key("attention.head_count"),
               std::to_string(c.n_head) + " does not divide embedding_length " +
                   std::to_string(c.n_embd));
    }
    c.head_dim = c.n_embd / c.n_head;
  }
  if (c.n_head * c.head_dim > kMaxDim) {
    fail_key(f, key("attention.head_count"), "head_count * head_dim is too large");
  }
  c.n_rot = read_dim_or(f, key("rope.dimension_count"), c.head_dim);
  if (c.n_rot > c.head_dim || c.n_rot % 2 != 0) {
    fail_key(f, key("rope.dimension_count"),
             std::to_string(c.n_rot) + " must be even and at most head_dim " +
                 std::to_string(c.head_dim));
  }
  c.rms_eps = read_positive_float(f, key("attention.layer_norm_rms_epsilon"), std::nullopt);
  c.rope_freq_base = read_positive_float(f, key("rope.freq_base"), 10000.0);

  // Experts: llama.cpp's Mixtral (llama) and Qwen3-MoE both renormalize the chosen weights.
  const uint64_t experts = f.has(key("expert_count")) ? f.get_uint(key("expert_count")) : 0;
  if (experts > uint64_t(kMaxExperts)) {
    fail_key(f, key("expert_count"),
             std::to_string(experts) + " is not in [0, " + std::to_string(kMaxExperts) + "]");
  }
  c.n_expert = int64_t(experts);
  if (arch == "qwen3moe" && c.n_expert == 0) {
    fail_key(f, key("expert_count"), "qwen3moe needs experts (missing or 0)");
  }
  if (c.is_moe()) {
    c.n_expert_used = read_dim(f, key("expert_used_count"), c.n_expert);
    c.n_ff_expert = read_dim_or(f, key("expert_feed_forward_length"), c.n_ff);
    c.norm_expert_weights = true;
  }
  c.qk_norm = arch == "qwen3moe";
  c.rope_neox = arch == "qwen3moe";

  const gguf::TensorInfo* embd = f.find_tensor("token_embd.weight");
  if (embd == nullptr)
    throw_error(ErrorCode::Format, "llama " + f.path(), "missing tensor 'token_embd.weight'");
  if (f.has("tokenizer.ggml.tokens")) {
    c.n_vocab = int64_t(f.get_string_array("tokenizer.ggml.tokens").size());
    if (c.n_vocab < 1) fail_key(f, "tokenizer.ggml.tokens", "is empty");
  } else if (f.has(key("vocab_size"))) {
    c.n_vocab = read_dim(f, key("vocab_size"));
  } else {
    c.n_vocab = embd->ne[1];
  }
  if (f.has(key("vocab_size")) && read_dim(f, key("vocab_size")) != c.n_vocab) {
    fail_key(f, key("vocab_size"),
             std::to_string(f.get_uint(key("vocab_size"))) + " differs from the " +
                 std::to_string(c.n_vocab) + " tokens");
  }
  c.bos_token_id = read_token_id(f, "tokenizer.ggml.bos_token_id", c.n_vocab);
  c.eos_token_id = read_token_id(f, "tokenizer.ggml.eos_token_id", c.n_vocab);

  const int64_t q_dim = c.n_head * c.head_dim;
  const int64_t kv_dim = c.n_head_kv * c.head_dim;
  check_tensor(f, "token_embd.weight", {c.n_embd, c.n_vocab, 1, 1}, false);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    check_tensor(f, llama_layer_tensor(l, "attn_norm.weight"), {c.n_embd, 1, 1, 1}, true);
    check_tensor(f, llama_layer_tensor(l, "attn_q.weight"), {c.n_embd, q_dim, 1, 1}, false);
    check_tensor(f, llama_layer_tensor(l, "attn_k.weight"), {c.n_embd, kv_dim, 1, 1}, false);
    check_tensor(f, llama_layer_tensor(l, "attn_v.weight"), {c.n_embd, kv_dim, 1, 1}, false);
    check_tensor(f, llama_layer_tensor(l, "attn_output.weight"), {q_dim, c.n_embd, 1, 1}, false);
    if (c.qk_norm) {
      check_tensor(f, llama_layer_tensor(l, "attn_q_norm.weight"), {c.head_dim, 1, 1, 1}, true);
      check_tensor(f, llama_layer_tensor(l, "attn_k_norm.weight"), {c.head_dim, 1, 1, 1}, true);
    }
    check_tensor(f, llama_layer_tensor(l, "ffn_norm.weight"), {c.n_embd, 1, 1, 1}, true);
    if (c.is_moe()) {
      const int64_t E = c.n_expert, F = c.n_ff_expert;
      check_tensor(f, llama_layer_tensor(l, "ffn_gate_inp.weight"), {c.n_embd, E, 1, 1}, false);
      check_tensor(f, llama_layer_tensor(l, "ffn_gate_exps.weight"), {c.n_embd, F, E, 1}, false);
      check_tensor(f, llama_layer_tensor(l, "ffn_up_exps.weight"), {c.n_embd, F, E, 1}, false);
      check_tensor(f, llama_layer_tensor(l, "ffn_down_exps.weight"), {F, c.n_embd, E, 1}, false);
    } else {
      check_tensor(f, llama_layer_tensor(l, "ffn_gate.weight"), {c.n_embd, c.n_ff, 1, 1}, false);
      check_tensor(f, llama_layer_tensor(l, "ffn_up.weight"), {c.n_embd, c.n_ff, 1, 1}, false);
      check_tensor(f, llama_layer_tensor(l, "ffn_down.weight"), {c.n_ff, c.n_embd, 1, 1}, false);
    }
  }
  check_tensor(f, "output_norm.weight", {c.n_embd, 1, 1, 1}, true);
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  if (!c.tied_embeddings) check_tensor(f, "output.weight", {c.n_embd, c.n_vocab, 1, 1}, false);
  return c;
}

}  // namespace tandem
