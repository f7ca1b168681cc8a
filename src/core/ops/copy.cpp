// Conversions and lookups: Copy (cast, quantize, make contiguous), Dequantize, GetRows.
#include "families.h"

namespace tandem::ops {

namespace {

TensorDesc infer_copy(OpInference& c) {
  const TensorDesc& a = c.in(0);
  const bool a_int = a.dtype == DType::I32 || a.dtype == DType::I8;
  const bool o_int = c.out_dtype == DType::I32 || c.out_dtype == DType::I8;
  if (a_int != o_int || (a_int && a.dtype != c.out_dtype)) {
    c.fail("cannot convert " + std::string(dtype_name(a.dtype)) + " to " +
           std::string(dtype_name(c.out_dtype)));
  }
  if ((dtype_traits(a.dtype).is_quantized || dtype_traits(c.out_dtype).is_quantized) &&
      !a.is_contiguous()) {
    c.fail("a quantized copy needs a contiguous input");
  }
  return contiguous_like(c.out_dtype, a);
}

void work_copy(const Graph& g, const Node& n, OpWork& w) {
  // One conversion per element.
  const TensorDesc& out = g.tensor(n.id);
  w.flops = g.tensor(n.inputs[0]).dtype == out.dtype ? 0.0 : double(out.elements());
}

TensorDesc infer_dequantize(OpInference& c) {
  c.expect_dtype(
      0, {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::F16, DType::BF16},
      "input");
  return contiguous_like(DType::F32, c.in(0));
}

void work_dequantize(const Graph& g, const Node& n, OpWork& w) {
  w.flops = double(g.tensor(n.id).elements());  // one scale multiply per element
  w.dtype_class = dtype_class(g.tensor(n.inputs[0]).dtype);
}

TensorDesc infer_get_rows(OpInference& c) {
  const TensorDesc &table = c.in(0), &ids = c.in(1);
  c.expect_dtype(0,
                 {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K,
                  DType::Q5_K, DType::Q6_K},
                 "table");
  c.expect_dtype(1, {DType::I32}, "ids");
  if (table.n_dims != 2 || ids.n_dims != 1) {
    c.fail("needs a 2-d table and 1-d ids (got " + shape_string(table) + ", " + shape_string(ids) +
           ")");
  }
  return contiguous(DType::F32, {table.ne[0], ids.ne[0], 1, 1}, 2);
}

void work_get_rows(const Graph& g, const Node& n, OpWork& w) {
  // Only the selected rows of the table are read.
  const TensorDesc &table = g.tensor(n.inputs[0]), &ids = g.tensor(n.inputs[1]);
  w.bytes = double(data_bytes(ids)) +
            double(ids.ne[0]) * double(row_bytes(table.dtype, table.ne[0])) +
            double(data_bytes(g.tensor(n.id)));
  w.dtype_class = dtype_class(table.dtype);
}

constexpr OpDescriptor kOps[] = {
    {.op = OpKind::Copy,
     .name = "copy",
     .doc = "a contiguous copy that may change dtype (cast, quantize)",
     .min_inputs = 1,
     .max_inputs = 1,
     .strided_inputs = true,
     .infer = infer_copy,
     .work = work_copy},
    {.op = OpKind::GetRows,
     .name = "get_rows",
     .doc = "table[:, ids] as f32 (embedding lookup)",
     .min_inputs = 2,
     .max_inputs = 2,
     .infer = infer_get_rows,
     .work = work_get_rows},
    {.op = OpKind::Dequantize,
     .name = "dequantize",
     .doc = "q8_0/q4_0/q4_k/q5_k/q6_k/f16/bf16 -> f32",
     .min_inputs = 1,
     .max_inputs = 1,
     .infer = infer_dequantize,
     .work = work_dequantize},
};

}  // namespace

std::span<const OpDescriptor> copy_ops() {
  return kOps;
}

}  // namespace tandem::ops
