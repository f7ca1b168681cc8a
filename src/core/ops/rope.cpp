// RoPE as llama.cpp's `llama` models use it: adjacent pairs (x[2i], x[2i+1]) of the first n_rot
// dims rotated by pos * freq_base^(-2i/n_rot); RopeNeox (Qwen, GPT-NeoX) rotates the pairs
// (x[i], x[i + n_rot/2]) by the same angles.
#include "families.h"

namespace tandem::ops {

namespace {

TensorDesc infer_rope(OpInference& c) {
  const TensorDesc &x = c.in(0), &pos = c.in(1);
  c.expect_dtype(0, {DType::F32}, "x");
  c.expect_dtype(1, {DType::I32}, "positions");
  if (x.n_dims > 3 || pos.elements() != x.ne[2]) {
    c.fail("x " + shape_string(x) + " must be [head_dim, heads, tokens] with one position " +
           "per token (got " + std::to_string(pos.elements()) + ")");
  }
  const int32_t n_rot = c.params.n_rot;
  if (n_rot <= 0 || n_rot % 2 != 0 || n_rot > x.ne[0]) {
    c.fail("n_rot " + std::to_string(n_rot) + " must be even and in [2, " +
           std::to_string(x.ne[0]) + "]");
  }
  if (!(c.params.freq_base > 0.0f)) c.fail("freq_base must be > 0");
  return contiguous_like(DType::F32, x);
}

void work_rope(const Graph& g, const Node& n, OpWork& w) {
  // 6 per rotated pair (4 multiplies, 2 adds), n_rot/2 pairs per row
  w.flops = 3.0 * double(n.params.n_rot) * double(g.tensor(n.inputs[0]).rows());
}

constexpr OpDescriptor kOps[] = {
    {.op = OpKind::Rope,
     .name = "rope",
     .doc = "rotates adjacent pairs of the first n_rot dims by pos * base^(-2i/n_rot)",
     .min_inputs = 2,
     .max_inputs = 2,
     .attributes = kAttrNRot | kAttrFreqBase,
     .infer = infer_rope,
     .work = work_rope},
    {.op = OpKind::RopeNeox,
     .name = "rope_neox",
     .doc = "rotates pairs (x[i], x[i + n_rot/2]) by pos * base^(-2i/n_rot)",
     .min_inputs = 2,
     .max_inputs = 2,
     .attributes = kAttrNRot | kAttrFreqBase,
     .infer = infer_rope,
     .work = work_rope},
};

}  // namespace

std::span<const OpDescriptor> rope_ops() {
  return kOps;
}

}  // namespace tandem::ops
