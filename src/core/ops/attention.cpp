// Attention over a KV cache and the cache write that feeds it. Caches are
// [head_dim, kv_heads, context]; query head h reads KV head h / (heads / kv_heads).
#include "families.h"

namespace tandem::ops {

namespace {

TensorDesc infer_attention(OpInference& c) {
  const TensorDesc &q = c.in(0), &k = c.in(1), &v = c.in(2), &pos = c.in(3);
  c.expect_dtype(0, {DType::F32}, "q");
  c.expect_dtype(1, {DType::F32, DType::F16}, "k");
  c.expect_dtype(2, {DType::F32, DType::F16}, "v");
  c.expect_dtype(3, {DType::I32}, "positions");
  c.expect_same_shape(1, 2);
  if (k.dtype != v.dtype) c.fail("k and v dtypes differ");
  if (q.n_dims > 3 || k.n_dims > 3 || q.ne[0] != k.ne[0]) {
    c.fail("q " + shape_string(q) + " and k " + shape_string(k) +
           " must be [head_dim, heads, tokens] and [head_dim, kv_heads, context]");
  }
  if (q.ne[1] % k.ne[1] != 0) {
    c.fail("query heads " + std::to_string(q.ne[1]) + " are not a multiple of kv heads " +
           std::to_string(k.ne[1]));
  }
  if (pos.elements() != q.ne[2]) c.fail("needs one position per query token");
  return contiguous_like(DType::F32, q);
}

void work_attention(const Graph& g, const Node& n, OpWork& w) {
  // Every query head attends over the whole cache length C (positions are data, so C is the
  // planning bound): 2D for q.k, 2D for p.v, 5 for scale, max, exp, sum, divide.
  const TensorDesc &q = g.tensor(n.inputs[0]), &k = g.tensor(n.inputs[1]);
  const double D = double(q.ne[0]), Hq = double(q.ne[1]), T = double(q.ne[2]), C = double(k.ne[2]);
  w.flops = Hq * T * C * (4.0 * D + 5.0);
  w.dtype_class = DTypeClass::F32;
}

TensorDesc infer_kv_write(OpInference& c) {
  const TensorDesc &cache = c.in(0), &src = c.in(1), &pos = c.in(2);
  c.expect_dtype(0, {DType::F32, DType::F16}, "cache");
  c.expect_dtype(1, {DType::F32}, "src");
  c.expect_dtype(2, {DType::I32}, "positions");
  if (cache.n_dims > 3 || src.ne[0] != cache.ne[0] || src.ne[1] != cache.ne[1] || src.ne[3] != 1 ||
      pos.elements() != src.ne[2]) {
    c.fail("src " + shape_string(src) + " must be [" + std::to_string(cache.ne[0]) + ", " +
           std::to_string(cache.ne[1]) + ", tokens] with one position per token");
  }
  TensorDesc out = cache;  // the output aliases the cache's storage
  out.name.clear();
  out.view_of = c.storage_of(0);
  out.role = TensorRole::KvCache;
  return out;
}

void work_kv_write(const Graph& g, const Node& n, OpWork& w) {
  // Reads src and positions, writes T rows of the cache (not the whole cache).
  const TensorDesc &cache = g.tensor(n.inputs[0]), &src = g.tensor(n.inputs[1]);
  w.bytes = double(data_bytes(src)) + double(data_bytes(g.tensor(n.inputs[2]))) +
            double(src.ne[2]) * double(row_bytes(cache.dtype, cache.ne[0] * cache.ne[1]));
}

constexpr OpDescriptor kOps[] = {
    {.op = OpKind::Attention,
     .name = "attention",
     .doc = "causal grouped-query attention of q over a KV cache; query t sees [0, pos[t]]",
     .min_inputs = 4,
     .max_inputs = 4,
     .attributes = kAttrScale,
     .infer = infer_attention,
     .work = work_attention},
    {.op = OpKind::KvWrite,
     .name = "kv_write",
     .doc = "cache[:, :, pos[t]] = src[:, :, t]; the output aliases the cache",
     .min_inputs = 3,
     .max_inputs = 3,
     .aliases_output = true,
     .infer = infer_kv_write,
     .work = work_kv_write},
};

}  // namespace

std::span<const OpDescriptor> attention_ops() {
  return kOps;
}

}  // namespace tandem::ops
