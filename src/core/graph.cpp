#include "tandem/graph.h"

#include <algorithm>
#include <string>

#include "tandem/error.h"
#include "tandem/hash.h"
#include "tandem/op.h"

namespace tandem {

namespace {

std::string where_of(OpKind op) {
  return "graph " + std::string(op_name(op));
}

[[noreturn]] void fail(OpKind op, const std::string& message) {
  throw_error(ErrorCode::InvalidArgument, where_of(op), message);
}

}  // namespace

void Graph::check_id(TensorId id, std::string_view where) const {
  if (id < 0 || size_t(id) >= tensors_.size()) {
    throw_error(ErrorCode::InvalidArgument, std::string(where),
                "unknown tensor id " + std::to_string(id) + " (graph has " +
                    std::to_string(tensors_.size()) + " tensors)");
  }
}

const Node& Graph::node(TensorId id) const {
  check_id(id, "graph");
  return nodes_[size_t(id)];
}

const TensorDesc& Graph::tensor(TensorId id) const {
  check_id(id, "graph");
  return tensors_[size_t(id)];
}

TensorId Graph::storage_of(TensorId id) const {
  const TensorDesc& t = tensor(id);
  return t.is_view() ? t.view_of : id;
}

TensorId Graph::push(Node node, TensorDesc desc) {
  auto id = TensorId(nodes_.size());
  node.id = id;
  desc.id = id;
  if (desc.name.empty()) desc.name = std::string(op_name(node.op)) + "#" + std::to_string(id);
  nodes_.push_back(std::move(node));
  tensors_.push_back(std::move(desc));
  signature_.value.store(0, std::memory_order_relaxed);
  leaf_names_.value.store(0, std::memory_order_relaxed);
  return id;
}

TensorId Graph::leaf(OpKind op, TensorDesc desc) {
  if (!is_leaf(op)) fail(op, "is not a leaf op");
  // Re-derive strides so a caller cannot smuggle in an inconsistent layout.
  TensorDesc d = make_tensor_desc(std::move(desc.name), desc.dtype, desc.ne, desc.n_dims);
  d.role = op == OpKind::Input    ? TensorRole::Input
           : op == OpKind::Weight ? TensorRole::Weight
                                  : TensorRole::KvCache;
  Node n;
  n.op = op;
  return push(std::move(n), std::move(d));
}

TensorId Graph::input(std::string name, DType dtype, std::initializer_list<int64_t> ne) {
  return leaf(OpKind::Input, make_tensor_desc(std::move(name), dtype, ne));
}
TensorId Graph::weight(std::string name, DType dtype, std::initializer_list<int64_t> ne) {
  return leaf(OpKind::Weight, make_tensor_desc(std::move(name), dtype, ne));
}
TensorId Graph::kv_cache(std::string name, DType dtype, std::initializer_list<int64_t> ne) {
  return leaf(OpKind::KvCache, make_tensor_desc(std::move(name), dtype, ne));
}

TensorId Graph::add_node(OpKind op, std::vector<TensorId> inputs, OpParams params, DType out_dtype,
                         const Dims* view_ne, const Dims* view_nb, int64_t view_offset,
                         int view_dims) {
  const OpDescriptor* d = find_op_descriptor(op);
  if (!d) {
    throw_error(ErrorCode::InvalidArgument, "graph", "unknown op " + std::to_string(int(op)));
  }
  if (d->op_class == OpClass::Leaf)
    fail(op, "leaves are added with input(), weight() or kv_cache()");
  for (TensorId id : inputs) check_id(id, where_of(op));
  if (inputs.size() < size_t(d->min_inputs) || inputs.size() > size_t(d->max_inputs)) {
    fail(op, "takes " + std::to_string(d->min_inputs) +
                 (d->min_inputs == d->max_inputs ? "" : " to " + std::to_string(d->max_inputs)) +
                 " inputs (got " + std::to_string(inputs.size()) + ")");
  }
  if (d->op_class == OpClass::Compute && !d->strided_inputs) {
    for (TensorId id : inputs) {
      const TensorDesc& t = tensors_[size_t(id)];
      if (!t.is_contiguous()) {
        fail(op,
             "input '" + t.name + "' " + shape_string(t) + " is not contiguous (insert a copy)");
      }
    }
  }

  TensorDesc out;
  try {
    OpInference inference{*this,   op,      inputs,      params,   out_dtype,
                          view_ne, view_nb, view_offset, view_dims};
    out = d->infer(inference);
  } catch (const Error& e) {
    // A shape error from make_tensor_desc names no op; report it as this op's.
    if (e.where().starts_with("graph")) throw;
    fail(op, e.message());
  }
  if (d->op_class == OpClass::Compute && !d->aliases_output) out.role = TensorRole::Activation;
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.params = params;
  return push(std::move(n), std::move(out));
}

TensorId Graph::copy(TensorId a, DType dtype) {
  return add_node(OpKind::Copy, {a}, {}, dtype);
}
TensorId Graph::get_rows(TensorId table, TensorId ids) {
  return add_node(OpKind::GetRows, {table, ids});
}
TensorId Graph::matmul(TensorId a, TensorId b) {
  check_id(a, "graph matmul");
  bool quantized = dtype_traits(tensor(a).dtype).is_quantized;
  return add_node(quantized ? OpKind::QuantizedMatMul : OpKind::MatMul, {a, b});
}
TensorId Graph::add(TensorId a, TensorId b) {
  return add_node(OpKind::Add, {a, b});
}
TensorId Graph::mul(TensorId a, TensorId b) {
  return add_node(OpKind::Mul, {a, b});
}
TensorId Graph::scale(TensorId a, float s) {
  OpParams p;
  p.scale = s;
  return add_node(OpKind::Scale, {a}, p);
}
TensorId Graph::softmax(TensorId a, TensorId mask, float scale) {
  OpParams p;
  p.scale = scale;
  if (mask == kNoTensor) return add_node(OpKind::Softmax, {a}, p);
  return add_node(OpKind::Softmax, {a, mask}, p);
}
TensorId Graph::rms_norm(TensorId x, TensorId w, float eps) {
  OpParams p;
  p.eps = eps;
  if (w == kNoTensor) return add_node(OpKind::RmsNorm, {x}, p);
  return add_node(OpKind::RmsNorm, {x, w}, p);
}
TensorId Graph::layer_norm(TensorId x, TensorId w, TensorId b, float eps) {
  OpParams p;
  p.eps = eps;
  std::vector<TensorId> in{x};
  if (w != kNoTensor) in.push_back(w);
  if (b != kNoTensor) {
    if (w == kNoTensor) fail(OpKind::LayerNorm, "a bias needs a weight");
    in.push_back(b);
  }
  return add_node(OpKind::LayerNorm, std::move(in), p);
}
TensorId Graph::rope(TensorId x, TensorId pos, int32_t n_rot, float freq_base) {
  OpParams p;
  p.n_rot = n_rot;
  p.freq_base = freq_base;
  return add_node(OpKind::Rope, {x, pos}, p);
}
TensorId Graph::rope_neox(TensorId x, TensorId pos, int32_t n_rot, float freq_base) {
  OpParams p;
  p.n_rot = n_rot;
  p.freq_base = freq_base;
  return add_node(OpKind::RopeNeox, {x, pos}, p);
}
TensorId Graph::silu(TensorId x) {
  return add_node(OpKind::Silu, {x});
}
TensorId Graph::gelu(TensorId x) {
  return add_node(OpKind::Gelu, {x});
}
TensorId Graph::swiglu(TensorId gate, TensorId up) {
  return add_node(OpKind::SwiGlu, {gate, up});
}
TensorId Graph::attention(TensorId q, TensorId k_cache, TensorId v_cache, TensorId pos,
                          float scale) {
  OpParams p;
  p.scale = scale;
  return add_node(OpKind::Attention, {q, k_cache, v_cache, pos}, p);
}
TensorId Graph::dequantize(TensorId a) {
  return add_node(OpKind::Dequantize, {a});
}
TensorId Graph::kv_write(TensorId cache, TensorId src, TensorId pos) {
  return add_node(OpKind::KvWrite, {cache, src, pos});
}
TensorId Graph::moe_route(TensorId logits, int32_t top_k) {
  OpParams p;
  p.top_k = top_k;
  return add_node(OpKind::MoeRoute, {logits}, p, DType::I32);
}
TensorId Graph::moe_weights(TensorId logits, TensorId ids, bool normalize) {
  OpParams p;
  p.normalize = normalize;
  return add_node(OpKind::MoeWeights, {logits, ids}, p);
}
TensorId Graph::expert_matmul(TensorId a, TensorId b, TensorId ids, TensorId map, float share) {
  OpParams p;
  p.scale = share;
  if (map == kNoTensor) return add_node(OpKind::ExpertMatMul, {a, b, ids}, p);
  return add_node(OpKind::ExpertMatMul, {a, b, ids, map}, p);
}
TensorId Graph::moe_combine(TensorId experts, TensorId weights) {
  return add_node(OpKind::MoeCombine, {experts, weights});
}

namespace {
int to_dims(std::initializer_list<int64_t> list, Dims& out, OpKind op) {
  if (list.size() < 1 || list.size() > size_t(kMaxDims)) fail(op, "needs 1 to 4 dims");
  out = {1, 1, 1, 1};
  size_t i = 0;
  for (int64_t v : list) out[i++] = v;
  return int(list.size());
}
}  // namespace

TensorId Graph::view(TensorId a, std::initializer_list<int64_t> ne,
                     std::initializer_list<int64_t> nb, int64_t offset_bytes) {
  Dims dims, strides;
  int n = to_dims(ne, dims, OpKind::View);
  if (int(nb.size()) != n) fail(OpKind::View, "needs one stride per dim");
  to_dims(nb, strides, OpKind::View);
  return add_node(OpKind::View, {a}, {}, DType::F32, &dims, &strides, offset_bytes, n);
}
TensorId Graph::reshape(TensorId a, std::initializer_list<int64_t> ne) {
  Dims dims;
  int n = to_dims(ne, dims, OpKind::Reshape);
  return add_node(OpKind::Reshape, {a}, {}, DType::F32, &dims, nullptr, 0, n);
}
TensorId Graph::permute(TensorId a, std::array<int32_t, kMaxDims> axes) {
  OpParams p;
  p.axes = axes;
  return add_node(OpKind::Permute, {a}, p);
}
TensorId Graph::transpose(TensorId a) {
  return add_node(OpKind::Transpose, {a});
}

void Graph::mark_output(TensorId id) {
  check_id(id, "graph mark_output");
  if (std::find(outputs_.begin(), outputs_.end(), id) != outputs_.end()) return;
  outputs_.push_back(id);
  TensorDesc& t = tensors_[size_t(id)];
  if (t.role == TensorRole::Activation) t.role = TensorRole::Output;
  signature_.value.store(0, std::memory_order_relaxed);
}

void Graph::set_name(TensorId id, std::string name) {
  check_id(id, "graph set_name");
  tensors_[size_t(id)].name = std::move(name);
  leaf_names_.value.store(0, std::memory_order_relaxed);
}

uint64_t Graph::leaf_names_hash() const {
  if (uint64_t memo = leaf_names_.value.load(std::memory_order_relaxed)) return memo;
  uint64_t h = 0x13198A2E03707344ull;
  for (const Node& n : nodes_) {
    if (is_leaf(n.op)) h = hash_combine(h, std::hash<std::string>{}(tensors_[size_t(n.id)].name));
  }
  if (h == 0) h = 1;  // 0 marks "not computed"
  leaf_names_.value.store(h, std::memory_order_relaxed);
  return h;
}

uint64_t Graph::signature() const {
  if (uint64_t memo = signature_.value.load(std::memory_order_relaxed)) return memo;
  // A 64-bit multiply-xorshift over the structure, one word at a time; names do not matter to
  // a plan.
  uint64_t h = 0x243F6A8885A308D3ull;
  auto mix = [&h](uint64_t v) {
    h = (h ^ v) * kGoldenRatio64;
    h ^= h >> 29;
  };
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    const TensorDesc& t = tensors_[i];
    mix(uint64_t(n.op) | uint64_t(n.inputs.size()) << 8 | uint64_t(t.dtype) << 16 |
        uint64_t(t.role) << 24);
    for (TensorId in : n.inputs) mix(uint64_t(in));
    for (int d = 0; d < kMaxDims; ++d) {
      mix(uint64_t(t.ne[size_t(d)]));
      mix(uint64_t(t.nb[size_t(d)]));
    }
    mix(uint64_t(t.view_offset));
    uint32_t bits[3];
    __builtin_memcpy(&bits[0], &n.params.eps, 4);
    __builtin_memcpy(&bits[1], &n.params.scale, 4);
    __builtin_memcpy(&bits[2], &n.params.freq_base, 4);
    mix(uint64_t(bits[0]) | uint64_t(bits[1]) << 32);
    mix(uint64_t(bits[2]) | uint64_t(uint32_t(n.params.n_rot)) << 32);
    for (int32_t ax : n.params.axes) mix(uint64_t(uint32_t(ax)));
    mix(uint64_t(uint32_t(n.params.top_k)) | uint64_t(n.params.normalize) << 32);
  }
  for (TensorId o : outputs_) mix(uint64_t(o));
  if (h == 0) h = 1;  // 0 marks "not computed"
  signature_.value.store(h, std::memory_order_relaxed);
  return h;
}

std::vector<int32_t> Graph::last_uses() const {
  std::vector<int32_t> last(nodes_.size(), -1);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    for (TensorId in : nodes_[i].inputs) {
      last[size_t(in)] = int32_t(i);
      TensorId s = storage_of(in);
      last[size_t(s)] = std::max(last[size_t(s)], int32_t(i));
    }
  }
  return last;
}

Graph Graph::from_nodes(const std::vector<Node>& nodes, const std::vector<TensorDesc>& descs) {
  if (descs.size() != nodes.size()) {
    throw_error(ErrorCode::InvalidArgument, "graph from_nodes",
                "needs one description per node (" + std::to_string(nodes.size()) + " nodes, " +
                    std::to_string(descs.size()) + " descriptions)");
  }
  // Index nodes by their ids, then emit in dependency order (Kahn), re-inferring shapes.
  std::vector<int> index_of(nodes.size(), -1);
  for (size_t i = 0; i < nodes.size(); ++i) {
    TensorId id = nodes[i].id;
    if (id < 0 || size_t(id) >= nodes.size() || index_of[size_t(id)] != -1) {
      throw_error(ErrorCode::InvalidArgument, "graph from_nodes",
                  "node ids must be unique and in [0, " + std::to_string(nodes.size()) + ") (got " +
                      std::to_string(id) + ")");
    }
    index_of[size_t(id)] = int(i);
  }
  std::vector<int> pending(nodes.size(), 0);
  std::vector<std::vector<TensorId>> users(nodes.size());
  for (const Node& n : nodes) {
    for (TensorId in : n.inputs) {
      if (in < 0 || size_t(in) >= nodes.size()) {
        throw_error(ErrorCode::InvalidArgument, "graph from_nodes",
                    "node " + std::to_string(n.id) + " reads unknown tensor " + std::to_string(in));
      }
      pending[size_t(n.id)]++;
      users[size_t(in)].push_back(n.id);
    }
  }
  std::vector<TensorId> ready, order;
  for (size_t id = 0; id < nodes.size(); ++id) {
    if (pending[id] == 0) ready.push_back(TensorId(id));
  }
  while (!ready.empty()) {
    TensorId id = ready.back();
    ready.pop_back();
    order.push_back(id);
    for (TensorId u : users[size_t(id)]) {
      if (--pending[size_t(u)] == 0) ready.push_back(u);
    }
  }
  if (order.size() != nodes.size()) {
    throw_error(ErrorCode::InvalidArgument, "graph from_nodes",
                "the graph has a cycle (" + std::to_string(nodes.size() - order.size()) +
                    " nodes on or behind it)");
  }
  Graph g;
  std::vector<TensorId> new_id(nodes.size(), kNoTensor);
  for (TensorId old : order) {
    const Node& n = nodes[size_t(index_of[size_t(old)])];
    const TensorDesc& d = descs[size_t(index_of[size_t(old)])];
    std::vector<TensorId> ins;
    for (TensorId in : n.inputs) ins.push_back(new_id[size_t(in)]);
    TensorId id;
    if (is_leaf(n.op)) {
      id = g.leaf(n.op, d);
    } else {
      Dims ne = d.ne, nb = d.nb;
      // A view's stored offset is cumulative; add_node wants it relative to its source.
      int64_t offset =
          n.op == OpKind::View && !ins.empty() ? d.view_offset - g.tensor(ins[0]).view_offset : 0;
      id = g.add_node(n.op, std::move(ins), n.params, d.dtype, &ne, &nb, offset, d.n_dims);
      if (!d.name.empty()) g.set_name(id, d.name);
    }
    new_id[size_t(old)] = id;
    if (d.role == TensorRole::Output) g.mark_output(id);
  }
  return g;
}

}  // namespace tandem
