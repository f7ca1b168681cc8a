// Copy (strided gather, casts, quantization: integers bit for bit, the rest through f32)
// and Dequantize; load_f32 and store_f32, which every family reads and writes through.
#include <cstring>

#include "ops.h"

namespace tandem::reference {

std::vector<float> load_f32(const TensorRef& t) {
  const TensorDesc& d = *t.desc;
  std::vector<float> out(size_t(d.elements()));
  const auto* base = static_cast<const uint8_t*>(t.data);
  const int64_t row = d.ne[0];
  size_t k = 0;
  for (int64_t i3 = 0; i3 < d.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < d.ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < d.ne[1]; ++i1) {
        const uint8_t* p = base + i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3];
        if (dtype_traits(d.dtype).is_quantized || d.nb[0] == dtype_traits(d.dtype).block_bytes) {
          to_f32(d.dtype, p, out.data() + k, row);
          k += size_t(row);
        } else {
          for (int64_t i0 = 0; i0 < row; ++i0) to_f32(d.dtype, p + i0 * d.nb[0], &out[k++], 1);
        }
      }
  return out;
}

void store_f32(const TensorRef& t, const std::vector<float>& values) {
  const TensorDesc& d = *t.desc;
  auto* base = static_cast<uint8_t*>(t.data);
  const int64_t row = d.ne[0];
  for (int64_t r = 0; r < d.rows(); ++r) {
    from_f32(d.dtype, values.data() + r * row, base + r * d.nb[1], row);
  }
}

namespace {

void run_copy(const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& o = *e.output.desc;
  if (a.dtype == DType::I32 || a.dtype == DType::I8) {  // integer copies keep their bits
    size_t es = size_t(dtype_traits(a.dtype).block_bytes);
    auto* dst = static_cast<uint8_t*>(e.output.data);
    const auto* src = static_cast<const uint8_t*>(e.inputs[0].data);
    for (int64_t i3 = 0; i3 < a.ne[3]; ++i3)
      for (int64_t i2 = 0; i2 < a.ne[2]; ++i2)
        for (int64_t i1 = 0; i1 < a.ne[1]; ++i1)
          for (int64_t i0 = 0; i0 < a.ne[0]; ++i0) {
            std::memcpy(dst, src + i0 * a.nb[0] + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3], es);
            dst += es;
          }
    (void)o;
    return;
  }
  store_f32(e.output, load_f32(e.inputs[0]));
}

void run_dequantize(const NodeExecution& e) {
  store_f32(e.output, load_f32(e.inputs[0]));
}

}  // namespace

void add_copy_kernels(KernelTable<ReferenceKernel>& rows) {
  rows.add(OpKind::Copy, convertible_dtypes(), run_copy);
  rows.add(OpKind::Copy, {DType::I32}, run_copy);
  rows.add(OpKind::Copy, {DType::I8}, run_copy);
  for (DType d : {DType::Q8_0, DType::Q4_0, DType::F16, DType::BF16}) {
    rows.add(OpKind::Dequantize, {d, DType::F32}, run_dequantize);
  }
  for (DType d : kKQuantDTypes) rows.add(OpKind::Dequantize, {d, DType::F32}, run_dequantize);
}

}  // namespace tandem::reference
