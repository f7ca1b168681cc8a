#include "tandem/graph.h"

#include <algorithm>
#include <string>

#include "tandem/error.h"
#include "tandem/hash.h"

namespace tandem {

namespace {

constexpr std::string_view kOpNames[kOpKindCount] = {
    "input",     "weight", "kv_cache", "view",      "reshape",          "permute",
    "transpose", "copy",   "get_rows", "matmul",    "quantized_matmul", "add",
    "mul",       "scale",  "softmax",  "rms_norm",  "layer_norm",       "rope",
    "silu",      "gelu",   "swiglu",   "attention", "dequantize",       "kv_write"};

std::string where_of(OpKind op) {
  return "graph " + std::string(op_name(op));
}

[[noreturn]] void fail(OpKind op, const std::string& message) {
  throw_error(ErrorCode::InvalidArgument, where_of(op), message);
}

void expect_dtype(OpKind op, const TensorDesc& t, std::initializer_list<DType> allowed,
                  const char* what) {
  for (DType d : allowed) {
    if (t.dtype == d) return;
  }
  std::string list;
  for (DType d : allowed) list += (list.empty() ? "" : ", ") + std::string(dtype_name(d));
  fail(op, std::string(what) + " '" + t.name + "' has dtype " + std::string(dtype_name(t.dtype)) +
               " (expected " + list + ")");
}

void expect_contiguous(OpKind op, const TensorDesc& t) {
  if (!t.is_contiguous()) {
    fail(op, "input '" + t.name + "' " + shape_string(t) + " is not contiguous (insert a copy)");
  }
}

void expect_same_shape(OpKind op, const TensorDesc& a, const TensorDesc& b) {
  if (!a.same_shape(b)) {
    fail(op, "shapes differ: '" + a.name + "' " + shape_string(a) + " vs '" + b.name + "' " +
                 shape_string(b));
  }
}

bool broadcasts(const TensorDesc& a, const TensorDesc& b) {
  for (int i = 0; i < kMaxDims; ++i) {
    if (a.ne[size_t(i)] % b.ne[size_t(i)] != 0) return false;
  }
  return true;
}

TensorDesc contiguous(DType dtype, const Dims& ne, int n_dims) {
  return make_tensor_desc("", dtype, ne, n_dims);
}

}  // namespace

std::string_view op_name(OpKind op) {
  auto i = size_t(op);
  return i < size_t(kOpKindCount) ? kOpNames[i] : std::string_view("unknown");
}

std::optional<OpKind> op_from_name(std::string_view name) {
  for (int i = 0; i < kOpKindCount; ++i) {
    if (kOpNames[size_t(i)] == name) return OpKind(i);
  }
  return std::nullopt;
}

bool is_leaf(OpKind op) {
  return op == OpKind::Input || op == OpKind::Weight || op == OpKind::KvCache;
}

bool is_metadata(OpKind op) {
  return op == OpKind::View || op == OpKind::Reshape || op == OpKind::Permute ||
         op == OpKind::Transpose;
}

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
  if (size_t(op) >= size_t(kOpKindCount)) {
    throw_error(ErrorCode::InvalidArgument, "graph", "unknown op " + std::to_string(int(op)));
  }
  if (is_leaf(op)) fail(op, "leaves are added with input(), weight() or kv_cache()");
  for (TensorId id : inputs) check_id(id, where_of(op));

  for (TensorId id : inputs) {
    if (op != OpKind::Copy && !is_metadata(op)) expect_contiguous(op, tensors_[size_t(id)]);
  }

  TensorDesc out;
  try {
    infer(op, inputs, params, out_dtype, view_ne, view_nb, view_offset, view_dims, out);
  } catch (const Error& e) {
    // A shape error from make_tensor_desc names no op; report it as this op's.
    if (e.where().starts_with("graph")) throw;
    fail(op, e.message());
  }
  if (!is_metadata(op) && op != OpKind::KvWrite) out.role = TensorRole::Activation;
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.params = params;
  return push(std::move(n), std::move(out));
}

void Graph::infer(OpKind op, const std::vector<TensorId>& inputs, OpParams& params, DType out_dtype,
                  const Dims* view_ne, const Dims* view_nb, int64_t view_offset, int view_dims,
                  TensorDesc& out) const {
  auto arity = [&](size_t lo, size_t hi) {
    if (inputs.size() < lo || inputs.size() > hi) {
      fail(op, "takes " + std::to_string(lo) + (lo == hi ? "" : " to " + std::to_string(hi)) +
                   " inputs (got " + std::to_string(inputs.size()) + ")");
    }
  };
  auto in = [&](size_t i) -> const TensorDesc& { return tensors_[size_t(inputs[i])]; };
  switch (op) {
    case OpKind::Copy: {
      arity(1, 1);
      const TensorDesc& a = in(0);
      bool a_int = a.dtype == DType::I32 || a.dtype == DType::I8;
      bool o_int = out_dtype == DType::I32 || out_dtype == DType::I8;
      if (a_int != o_int || (a_int && a.dtype != out_dtype)) {
        fail(op, "cannot convert " + std::string(dtype_name(a.dtype)) + " to " +
                     std::string(dtype_name(out_dtype)));
      }
      if ((dtype_traits(a.dtype).is_quantized || dtype_traits(out_dtype).is_quantized) &&
          !a.is_contiguous()) {
        fail(op, "a quantized copy needs a contiguous input");
      }
      out = contiguous(out_dtype, a.ne, a.n_dims);
      break;
    }
    case OpKind::GetRows: {
      arity(2, 2);
      const TensorDesc &table = in(0), &ids = in(1);
      expect_dtype(op, table, {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0},
                   "table");
      expect_dtype(op, ids, {DType::I32}, "ids");
      if (table.n_dims != 2 || ids.n_dims != 1) {
        fail(op, "needs a 2-d table and 1-d ids (got " + shape_string(table) + ", " +
                     shape_string(ids) + ")");
      }
      out = contiguous(DType::F32, {table.ne[0], ids.ne[0], 1, 1}, 2);
      break;
    }
    case OpKind::MatMul:
    case OpKind::QuantizedMatMul: {
      arity(2, 2);
      const TensorDesc &a = in(0), &b = in(1);
      if (op == OpKind::MatMul) {
        expect_dtype(op, a, {DType::F32, DType::F16, DType::BF16}, "a");
      } else {
        expect_dtype(op, a, {DType::Q8_0, DType::Q4_0}, "a");
      }
      expect_dtype(op, b, {DType::F32}, "b");
      if (a.ne[0] != b.ne[0]) {
        fail(op, "inner dims differ: '" + a.name + "' " + shape_string(a) + " vs '" + b.name +
                     "' " + shape_string(b));
      }
      if (b.ne[2] % a.ne[2] != 0 || b.ne[3] % a.ne[3] != 0) {
        fail(op, "batch dims of '" + a.name + "' " + shape_string(a) + " do not divide '" + b.name +
                     "' " + shape_string(b));
      }
      out = contiguous(DType::F32, {a.ne[1], b.ne[1], b.ne[2], b.ne[3]}, std::max(2, b.n_dims));
      break;
    }
    case OpKind::Add:
    case OpKind::Mul: {
      arity(2, 2);
      const TensorDesc &a = in(0), &b = in(1);
      expect_dtype(op, a, {DType::F32}, "a");
      expect_dtype(op, b, {DType::F32}, "b");
      if (!broadcasts(a, b)) {
        fail(op, "'" + b.name + "' " + shape_string(b) + " does not broadcast to '" + a.name +
                     "' " + shape_string(a));
      }
      out = contiguous(DType::F32, a.ne, a.n_dims);
      break;
    }
    case OpKind::Scale:
    case OpKind::Silu:
    case OpKind::Gelu: {
      arity(1, 1);
      expect_dtype(op, in(0), {DType::F32}, "input");
      out = contiguous(DType::F32, in(0).ne, in(0).n_dims);
      break;
    }
    case OpKind::Softmax: {
      arity(1, 2);
      const TensorDesc& a = in(0);
      expect_dtype(op, a, {DType::F32}, "input");
      if (inputs.size() == 2) {
        const TensorDesc& m = in(1);
        expect_dtype(op, m, {DType::F32}, "mask");
        if (m.ne[0] != a.ne[0] || m.ne[1] < a.ne[1] || m.ne[2] != 1 || m.ne[3] != 1) {
          fail(op, "mask " + shape_string(m) + " must be [" + std::to_string(a.ne[0]) +
                       ", >= " + std::to_string(a.ne[1]) + "]");
        }
      }
      out = contiguous(DType::F32, a.ne, a.n_dims);
      break;
    }
    case OpKind::RmsNorm:
    case OpKind::LayerNorm: {
      arity(1, op == OpKind::RmsNorm ? 2 : 3);
      const TensorDesc& x = in(0);
      expect_dtype(op, x, {DType::F32}, "x");
      for (size_t i = 1; i < inputs.size(); ++i) {
        expect_dtype(op, in(i), {DType::F32}, "weight");
        if (in(i).elements() != x.ne[0]) {
          fail(op, "weight '" + in(i).name + "' " + shape_string(in(i)) + " must have " +
                       std::to_string(x.ne[0]) + " elements");
        }
      }
      if (!(params.eps >= 0.0f)) fail(op, "eps must be >= 0");
      out = contiguous(DType::F32, x.ne, x.n_dims);
      break;
    }
    case OpKind::Rope: {
      arity(2, 2);
      const TensorDesc &x = in(0), &pos = in(1);
      expect_dtype(op, x, {DType::F32}, "x");
      expect_dtype(op, pos, {DType::I32}, "positions");
      if (x.n_dims > 3 || pos.elements() != x.ne[2]) {
        fail(op, "x " + shape_string(x) + " must be [head_dim, heads, tokens] with one position " +
                     "per token (got " + std::to_string(pos.elements()) + ")");
      }
      if (params.n_rot <= 0 || params.n_rot % 2 != 0 || params.n_rot > x.ne[0]) {
        fail(op, "n_rot " + std::to_string(params.n_rot) + " must be even and in [2, " +
                     std::to_string(x.ne[0]) + "]");
      }
      if (!(params.freq_base > 0.0f)) fail(op, "freq_base must be > 0");
      out = contiguous(DType::F32, x.ne, x.n_dims);
      break;
    }
    case OpKind::SwiGlu: {
      arity(2, 2);
      expect_dtype(op, in(0), {DType::F32}, "gate");
      expect_dtype(op, in(1), {DType::F32}, "up");
      expect_same_shape(op, in(0), in(1));
      out = contiguous(DType::F32, in(0).ne, in(0).n_dims);
      break;
    }
    case OpKind::Attention: {
      arity(4, 4);
      const TensorDesc &q = in(0), &k = in(1), &v = in(2), &pos = in(3);
      expect_dtype(op, q, {DType::F32}, "q");
      expect_dtype(op, k, {DType::F32, DType::F16}, "k");
      expect_dtype(op, v, {DType::F32, DType::F16}, "v");
      expect_dtype(op, pos, {DType::I32}, "positions");
      expect_same_shape(op, k, v);
      if (k.dtype != v.dtype) fail(op, "k and v dtypes differ");
      if (q.n_dims > 3 || k.n_dims > 3 || q.ne[0] != k.ne[0]) {
        fail(op, "q " + shape_string(q) + " and k " + shape_string(k) +
                     " must be [head_dim, heads, tokens] and [head_dim, kv_heads, context]");
      }
      if (q.ne[1] % k.ne[1] != 0) {
        fail(op, "query heads " + std::to_string(q.ne[1]) + " are not a multiple of kv heads " +
                     std::to_string(k.ne[1]));
      }
      if (pos.elements() != q.ne[2]) fail(op, "needs one position per query token");
      out = contiguous(DType::F32, q.ne, q.n_dims);
      break;
    }
    case OpKind::Dequantize: {
      arity(1, 1);
      expect_dtype(op, in(0), {DType::Q8_0, DType::Q4_0, DType::F16, DType::BF16}, "input");
      out = contiguous(DType::F32, in(0).ne, in(0).n_dims);
      break;
    }
    case OpKind::KvWrite: {
      arity(3, 3);
      const TensorDesc &cache = in(0), &src = in(1), &pos = in(2);
      expect_dtype(op, cache, {DType::F32, DType::F16}, "cache");
      expect_dtype(op, src, {DType::F32}, "src");
      expect_dtype(op, pos, {DType::I32}, "positions");
      if (cache.n_dims > 3 || src.ne[0] != cache.ne[0] || src.ne[1] != cache.ne[1] ||
          src.ne[3] != 1 || pos.elements() != src.ne[2]) {
        fail(op, "src " + shape_string(src) + " must be [" + std::to_string(cache.ne[0]) + ", " +
                     std::to_string(cache.ne[1]) + ", tokens] with one position per token");
      }
      out = cache;  // the output aliases the cache's storage
      out.name.clear();
      out.view_of = storage_of(inputs[0]);
      out.role = TensorRole::KvCache;
      break;
    }
    case OpKind::View: {
      arity(1, 1);
      const TensorDesc& a = in(0);
      if (!view_ne || !view_nb || view_dims < 1 || view_dims > kMaxDims) {
        fail(op, "needs dims and strides");
      }
      out = make_tensor_desc("", a.dtype, *view_ne, view_dims);
      for (int i = 0; i < view_dims; ++i) out.nb[size_t(i)] = (*view_nb)[size_t(i)];
      for (int i = view_dims; i < kMaxDims; ++i)
        out.nb[size_t(i)] = out.nb[size_t(view_dims - 1)] * out.ne[size_t(view_dims - 1)];
      if (out.nb[0] != dtype_traits(a.dtype).block_bytes) {
        fail(op, "the first stride must be one element (" +
                     std::to_string(dtype_traits(a.dtype).block_bytes) + " bytes)");
      }
      for (int i = 1; i < kMaxDims; ++i) {
        if (out.nb[size_t(i)] <= 0) fail(op, "strides must be positive");
      }
      if (view_offset < 0 || size_t(view_offset) + out.bytes() > a.bytes()) {
        fail(op, "view of " + std::to_string(out.bytes()) + " bytes at offset " +
                     std::to_string(view_offset) + " exceeds '" + a.name + "' (" +
                     std::to_string(a.bytes()) + " bytes)");
      }
      out.view_of = storage_of(inputs[0]);
      out.view_offset = a.view_offset + view_offset;
      break;
    }
    case OpKind::Reshape: {
      arity(1, 1);
      const TensorDesc& a = in(0);
      if (!view_ne || view_dims < 1) fail(op, "needs dims");
      if (!a.is_contiguous()) fail(op, "input '" + a.name + "' is not contiguous");
      out = make_tensor_desc("", a.dtype, *view_ne, view_dims);
      if (out.elements() != a.elements()) {
        fail(op, "cannot reshape " + shape_string(a) + " to " + shape_string(out) +
                     " (element counts differ)");
      }
      out.view_of = storage_of(inputs[0]);
      out.view_offset = a.view_offset;
      break;
    }
    case OpKind::Permute:
    case OpKind::Transpose: {
      arity(1, 1);
      const TensorDesc& a = in(0);
      if (dtype_traits(a.dtype).is_quantized) fail(op, "cannot permute a quantized tensor");
      if (op == OpKind::Transpose) params.axes = {1, 0, 2, 3};
      std::array<bool, kMaxDims> seen{};
      for (int32_t ax : params.axes) {
        if (ax < 0 || ax >= kMaxDims || seen[size_t(ax)])
          fail(op, "axes must be a permutation of 0..3");
        seen[size_t(ax)] = true;
      }
      out = a;
      out.name.clear();
      for (int i = 0; i < kMaxDims; ++i) {
        out.ne[size_t(params.axes[size_t(i)])] = a.ne[size_t(i)];
        out.nb[size_t(params.axes[size_t(i)])] = a.nb[size_t(i)];
      }
      out.n_dims =
          std::max(a.n_dims,
                   int(*std::max_element(params.axes.begin(), params.axes.begin() + a.n_dims)) + 1);
      out.role = TensorRole::Activation;
      out.view_of = storage_of(inputs[0]);
      break;
    }
    default:
      fail(op, "unknown op");
  }
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
