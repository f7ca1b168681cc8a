// The op set and the Graph builder: nodes in topological order, shapes and dtypes inferred,
// invalid graphs rejected with a clear error.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/tensor.h"

namespace tandem {

enum class OpKind : uint8_t {
  Input,    // leaf: data bound at run time
  Weight,   // leaf: constant data (model weights), persistent across runs
  KvCache,  // leaf: persistent state written by KvWrite
  View,     // metadata ops: alias their source's storage, no backend selection
  Reshape,
  Permute,
  Transpose,
  Copy,             // contiguous copy, may change dtype (cast, quantize)
  GetRows,          // table[:, ids] (embedding lookup) -> f32
  MatMul,           // a [K, M] (f32/f16/bf16) x b [K, N] (f32) -> f32 [M, N]
  QuantizedMatMul,  // a [K, M] (q8_0/q4_0/K-quants) x b [K, N] (f32) -> f32 [M, N]
  Add,              // a + b, b broadcast over a (a.ne[i] % b.ne[i] == 0)
  Mul,              // a * b, same broadcast
  Scale,            // a * params.scale
  Softmax,          // softmax over ne[0] of (a * scale + mask)
  RmsNorm,          // x / sqrt(mean(x^2) + eps) [* w]
  LayerNorm,        // (x - mean) / sqrt(var + eps) [* w] [+ b]
  Rope,             // rotate adjacent pairs of the first n_rot dims by pos * base^(-2i/n_rot)
  Silu,
  Gelu,        // tanh approximation, as ggml
  SwiGlu,      // silu(gate) * up
  Attention,   // causal grouped-query attention of q over a KV cache, query t sees [0, pos[t]]
  Dequantize,  // q8_0/q4_0/K-quants/f16/bf16 -> f32
  KvWrite,     // cache[:, :, pos[t]] = src[:, :, t]; the output aliases the cache
  // Mixture of experts (llama.cpp's build_moe_ffn): route, weigh, multiply per expert, combine.
  MoeRoute,      // gate logits [n_expert, T] -> i32 [top_k, T]: the top_k experts, best first
  MoeWeights,    // logits [n_expert, T], ids [k, T] -> softmax probabilities of the chosen [k, T]
  ExpertMatMul,  // a [K, M, n_expert] x b [K, 1 or k, T] by ids [k, T] -> f32 [M, k, T]
  MoeCombine,    // experts [n, k, T] weighted by w [k, T], summed over k -> [n, T]
  RopeNeox,      // Rope rotating pairs (x[i], x[i + n_rot/2]) (GPT-NeoX, Qwen)
};
// The built-in ops; more may be registered at run time (tandem/op.h, below kMaxOpKinds).
inline constexpr int kOpKindCount = int(OpKind::RopeNeox) + 1;

std::string_view op_name(OpKind op);
std::optional<OpKind> op_from_name(std::string_view name);
bool is_leaf(OpKind op);      // Input, Weight, KvCache
bool is_metadata(OpKind op);  // View, Reshape, Permute, Transpose
// True for ops that run on a backend (neither leaves nor metadata).
inline bool is_compute(OpKind op) {
  return !is_leaf(op) && !is_metadata(op);
}

struct OpParams {
  float eps = 0.0f;                                // RmsNorm, LayerNorm
  float scale = 1.0f;                              // Scale, Softmax, Attention
  float freq_base = 10000.0f;                      // Rope
  int32_t n_rot = 0;                               // Rope: number of leading dims rotated (even)
  std::array<int32_t, kMaxDims> axes{0, 1, 2, 3};  // Permute: dim i of the input goes to axes[i]
  int32_t top_k = 0;                               // MoeRoute: experts chosen per token
  bool normalize = false;  // MoeWeights: the chosen probabilities rescaled to sum to 1
  bool operator==(const OpParams&) const = default;
};

// One node produces one tensor; its id is its index in the graph.
struct Node {
  TensorId id = kNoTensor;
  OpKind op = OpKind::Input;
  std::vector<TensorId> inputs;
  OpParams params;
};

class Graph {
 public:
  // Leaves.
  TensorId input(std::string name, DType dtype, std::initializer_list<int64_t> ne);
  TensorId weight(std::string name, DType dtype, std::initializer_list<int64_t> ne);
  TensorId kv_cache(std::string name, DType dtype, std::initializer_list<int64_t> ne);
  TensorId leaf(OpKind op, TensorDesc desc);

  // Ops. Each checks its inputs and infers the output's shape and dtype.
  TensorId copy(TensorId a, DType dtype);
  TensorId get_rows(TensorId table, TensorId ids);
  TensorId matmul(TensorId a, TensorId b);  // picks QuantizedMatMul for quantized weights
  TensorId add(TensorId a, TensorId b);
  TensorId mul(TensorId a, TensorId b);
  TensorId scale(TensorId a, float s);
  TensorId softmax(TensorId a, TensorId mask = kNoTensor, float scale = 1.0f);
  TensorId rms_norm(TensorId x, TensorId w, float eps);
  TensorId layer_norm(TensorId x, TensorId w, TensorId b, float eps);
  TensorId rope(TensorId x, TensorId pos, int32_t n_rot, float freq_base);
  TensorId rope_neox(TensorId x, TensorId pos, int32_t n_rot, float freq_base);
  TensorId silu(TensorId x);
  TensorId gelu(TensorId x);
  TensorId swiglu(TensorId gate, TensorId up);
  TensorId attention(TensorId q, TensorId k_cache, TensorId v_cache, TensorId pos, float scale);
  TensorId dequantize(TensorId a);
  TensorId kv_write(TensorId cache, TensorId src, TensorId pos);
  // Mixture of experts: the top_k experts of each token's gate logits, their softmax weights
  // (normalize: rescaled to sum to 1 over the chosen), the chosen experts' products with b
  // (a [K, M, n_expert]; b [K, 1 or k, T]) and their weighted sum.
  TensorId moe_route(TensorId logits, int32_t top_k);
  TensorId moe_weights(TensorId logits, TensorId ids, bool normalize);
  // With a map ([n_expert] i32), choice e reads a's expert map[e], or none (zeros) where
  // map[e] < 0; `share` is the part of the choices expected to reach a (for cost estimates).
  TensorId expert_matmul(TensorId a, TensorId b, TensorId ids, TensorId map = kNoTensor,
                         float share = 1.0f);
  TensorId moe_combine(TensorId experts, TensorId weights);
  TensorId view(TensorId a, std::initializer_list<int64_t> ne, std::initializer_list<int64_t> nb,
                int64_t offset_bytes);
  TensorId reshape(TensorId a, std::initializer_list<int64_t> ne);
  TensorId permute(TensorId a, std::array<int32_t, kMaxDims> axes);
  TensorId transpose(TensorId a);

  // The generic entry every builder above goes through. Unknown input ids, wrong arity,
  // wrong dtypes and mismatched shapes throw InvalidArgument naming the op and the values.
  TensorId add_node(OpKind op, std::vector<TensorId> inputs, OpParams params = {},
                    DType out_dtype = DType::F32, const Dims* view_ne = nullptr,
                    const Dims* view_nb = nullptr, int64_t view_offset = 0, int view_dims = 0);

  // Builds a graph from nodes in any order: sorts them topologically, re-inferring every
  // shape; throws InvalidArgument on a cycle or an unknown tensor.
  static Graph from_nodes(const std::vector<Node>& nodes, const std::vector<TensorDesc>& leaves);

  void mark_output(TensorId id);
  void set_name(TensorId id, std::string name);

  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(TensorId id) const;
  const TensorDesc& tensor(TensorId id) const;
  const std::vector<TensorId>& outputs() const { return outputs_; }
  size_t size() const { return nodes_.size(); }
  // The tensor that owns id's storage (id itself unless it is a view).
  TensorId storage_of(TensorId id) const;
  // Hash of ops, inputs, params, shapes, dtypes and roles (not names): equal graphs share plans.
  uint64_t signature() const;
  // Hash of the leaves' names (inputs, weights, KV caches): what pins, residency and bindings
  // key on beside the signature. Computed once per change of the graph, like signature().
  uint64_t leaf_names_hash() const;
  // Nodes that read each tensor, and the last node index reading it (or -1).
  std::vector<int32_t> last_uses() const;

 private:
  TensorId push(Node node, TensorDesc desc);
  void check_id(TensorId id, std::string_view where) const;

  // signature() computed once per change of the graph (0: not yet); copies like a value.
  struct SignatureMemo {
    mutable std::atomic<uint64_t> value{0};
    SignatureMemo() = default;
    SignatureMemo(const SignatureMemo& other)
        : value(other.value.load(std::memory_order_relaxed)) {}
    SignatureMemo& operator=(const SignatureMemo& other) {
      value.store(other.value.load(std::memory_order_relaxed), std::memory_order_relaxed);
      return *this;
    }
  };

  std::vector<Node> nodes_;
  std::vector<TensorDesc> tensors_;
  std::vector<TensorId> outputs_;
  SignatureMemo signature_;
  SignatureMemo leaf_names_;
};

}  // namespace tandem
