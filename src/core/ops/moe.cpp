// Mixture of experts, as llama.cpp's build_moe_ffn: MoeRoute picks each token's top_k experts
// from its gate logits, MoeWeights gives their softmax probabilities, ExpertMatMul multiplies
// each token by its chosen experts' matrices only (ggml's MUL_MAT_ID) and MoeCombine sums the
// expert outputs by weight.
#include <algorithm>

#include "families.h"

namespace tandem::ops {

namespace {

// ids [k, T] as chosen for logits (or activations) with T tokens in dim `token_dim`.
void expect_ids(OpInference& c, size_t i, int64_t tokens) {
  const TensorDesc& ids = c.in(i);
  c.expect_dtype(i, {DType::I32}, "ids");
  if (ids.n_dims > 2 || ids.ne[1] != tokens) {
    c.fail("ids '" + ids.name + "' " + shape_string(ids) + " must be [k, " +
           std::to_string(tokens) + "]");
  }
}

TensorDesc infer_route(OpInference& c) {
  const TensorDesc& logits = c.in(0);
  c.expect_dtype(0, {DType::F32}, "logits");
  if (logits.n_dims > 2) c.fail("logits " + shape_string(logits) + " must be [n_expert, tokens]");
  const int32_t k = c.params.top_k;
  if (k < 1 || k > logits.ne[0]) {
    c.fail("top_k " + std::to_string(k) + " must be in [1, " + std::to_string(logits.ne[0]) +
           "] (the experts)");
  }
  return contiguous(DType::I32, {k, logits.ne[1], 1, 1}, 2);
}

TensorDesc infer_weights(OpInference& c) {
  const TensorDesc& logits = c.in(0);
  c.expect_dtype(0, {DType::F32}, "logits");
  if (logits.n_dims > 2) c.fail("logits " + shape_string(logits) + " must be [n_expert, tokens]");
  expect_ids(c, 1, logits.ne[1]);
  return contiguous(DType::F32, {c.in(1).ne[0], logits.ne[1], 1, 1}, 2);
}

TensorDesc infer_expert_matmul(OpInference& c) {
  const TensorDesc &a = c.in(0), &b = c.in(1);
  c.expect_dtype(0,
                 {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K,
                  DType::Q5_K, DType::Q6_K},
                 "a");
  c.expect_dtype(1, {DType::F32}, "b");
  if (a.n_dims > 3 || a.ne[0] != b.ne[0] || b.n_dims > 3) {
    c.fail("a '" + a.name + "' " + shape_string(a) + " must be [K, M, n_expert] and b '" + b.name +
           "' " + shape_string(b) + " [K, 1 or k, tokens] with the same K");
  }
  expect_ids(c, 2, b.ne[2]);
  if (c.inputs.size() > 3) {
    const TensorDesc& map = c.in(3);
    c.expect_dtype(3, {DType::I32}, "map");
    if (map.n_dims > 1) {
      c.fail("map '" + map.name + "' " + shape_string(map) +
             " must be [n_expert]: one entry per expert");
    }
  }
  if (!(c.params.scale > 0.0f && c.params.scale <= 1.0f)) {
    c.fail("share " + std::to_string(c.params.scale) + " must be in (0, 1]");
  }
  const int64_t k = c.in(2).ne[0];
  if (b.ne[1] != 1 && b.ne[1] != k) {
    c.fail("b '" + b.name + "' " + shape_string(b) + " must have 1 or " + std::to_string(k) +
           " columns per token (one per chosen expert)");
  }
  return contiguous(DType::F32, {a.ne[1], k, b.ne[2], 1}, 3);
}

TensorDesc infer_combine(OpInference& c) {
  const TensorDesc &x = c.in(0), &w = c.in(1);
  c.expect_dtype(0, {DType::F32}, "experts");
  c.expect_dtype(1, {DType::F32}, "weights");
  if (x.n_dims > 3 || w.n_dims > 2 || w.ne[0] != x.ne[1] || w.ne[1] != x.ne[2]) {
    c.fail("experts '" + x.name + "' " + shape_string(x) + " must be [n, k, tokens] and weights '" +
           w.name + "' " + shape_string(w) + " [k, tokens]");
  }
  return contiguous(DType::F32, {x.ne[0], x.ne[2], 1, 1}, 2);
}

void work_route(const Graph& g, const Node& n, OpWork& w) {
  // one comparison per expert per pick
  const TensorDesc& logits = g.tensor(n.inputs[0]);
  w.flops = double(logits.elements()) * double(n.params.top_k);
}

void work_weights(const Graph& g, const Node& n, OpWork& w) {
  // max, exp and sum over every expert
  w.flops = 3.0 * double(g.tensor(n.inputs[0]).elements());
}

void work_expert_matmul(const Graph& g, const Node& n, OpWork& w) {
  const TensorDesc &a = g.tensor(n.inputs[0]), &ids = g.tensor(n.inputs[2]);
  // With a map, the share of the choices expected to name an expert of `a` (the rest are
  // skipped): a product over a layer's hot experts, or over the others.
  const double products = double(ids.elements()) * double(n.params.scale);
  w.flops = 2.0 * double(a.ne[0]) * double(a.ne[1]) * products;
  // Only the chosen experts' matrices are read: at most one per (token, choice).
  const double read = std::min(double(a.ne[2]), products) / double(a.ne[2]);
  w.bytes -= double(data_bytes(a)) * (1.0 - read);
  w.dtype_class = dtype_class(a.dtype);
}

void work_combine(const Graph& g, const Node& n, OpWork& w) {
  w.flops = 2.0 * double(g.tensor(n.inputs[0]).elements());
}

constexpr OpDescriptor kOps[] = {
    {.op = OpKind::MoeRoute,
     .name = "moe_route",
     .doc = "gate logits [n_expert, T] -> i32 [top_k, T]: each token's top_k experts, best first",
     .min_inputs = 1,
     .max_inputs = 1,
     .attributes = kAttrTopK,
     .infer = infer_route,
     .work = work_route},
    {.op = OpKind::MoeWeights,
     .name = "moe_weights",
     .doc = "softmax(logits [n_expert, T]) of the chosen ids [k, T] -> [k, T] (normalize: / sum)",
     .min_inputs = 2,
     .max_inputs = 2,
     .attributes = kAttrNormalize,
     .infer = infer_weights,
     .work = work_weights},
    {.op = OpKind::ExpertMatMul,
     .name = "expert_matmul",
     .doc = "a [K, M, n] x b [K, 1 or k, T] for the experts ids [k, T] -> f32 [M, k, T]; with a "
            "map [n_expert], choice e reads a's expert map[e], and map[e] < 0 gives zeros "
            "(scale: the share of choices expected to reach a, for costs)",
     .min_inputs = 3,
     .max_inputs = 4,
     .attributes = kAttrScale,
     .infer = infer_expert_matmul,
     .work = work_expert_matmul},
    {.op = OpKind::MoeCombine,
     .name = "moe_combine",
     .doc = "sum over k of experts [n, k, T] * weights [k, T] -> [n, T]",
     .min_inputs = 2,
     .max_inputs = 2,
     .infer = infer_combine,
     .work = work_combine},
};

}  // namespace

std::span<const OpDescriptor> moe_ops() {
  return kOps;
}

}  // namespace tandem::ops
