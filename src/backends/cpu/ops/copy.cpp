// Copy (strided gather, cast between float types, quantize) and Dequantize, split by rows.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ops.h"
#include "tandem/error.h"

namespace tandem::cpu {

void row_to_f32(const Kernels& k, DType dtype, const void* src, float* dst, int64_t n) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(dst, src, size_t(n) * sizeof(float));
      return;
    case DType::F16:
      return k.f16_to_f32(static_cast<const uint16_t*>(src), dst, n);
    case DType::BF16:
      return k.bf16_to_f32(static_cast<const uint16_t*>(src), dst, n);
    case DType::Q8_0:
      return k.dequantize_q8_0(static_cast<const uint8_t*>(src), dst, n);
    case DType::Q4_0:
      return k.dequantize_q4_0(static_cast<const uint8_t*>(src), dst, n);
    case DType::Q4_K:  // the reference's own loops: cheap next to the products that read them
    case DType::Q5_K:
    case DType::Q6_K:
      return to_f32(dtype, src, dst, n);
    default:
      throw_error(ErrorCode::Unsupported, "cpu copy",
                  "cannot convert " + std::string(dtype_name(dtype)) + " to f32");
  }
}

void row_from_f32(const Kernels& k, DType dtype, const float* src, void* dst, int64_t n) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(dst, src, size_t(n) * sizeof(float));
      return;
    case DType::F16:
      return k.f32_to_f16(src, static_cast<uint16_t*>(dst), n);
    case DType::BF16:
      return k.f32_to_bf16(src, static_cast<uint16_t*>(dst), n);
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return from_f32(dtype, src, dst, n);
    default:
      throw_error(ErrorCode::Unsupported, "cpu copy",
                  "cannot convert f32 to " + std::string(dtype_name(dtype)));
  }
}

namespace {

void run_copy(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& o = *e.output.desc;
  const auto* src = static_cast<const uint8_t*>(e.inputs[0].data);
  auto* dst = static_cast<uint8_t*>(e.output.data);
  if (a.dtype == o.dtype && a.is_contiguous()) {
    const int64_t bytes = int64_t(o.bytes());
    ctx.pool.parallel_for(bytes, 1 << 18, [&](int64_t b0, int64_t b1) {
      std::memcpy(dst + b0, src + b0, size_t(b1 - b0));
    });
    return;
  }
  const int64_t n0 = a.ne[0];
  const auto elem = size_t(dtype_traits(a.dtype).block_bytes);
  const bool row_contiguous = dtype_traits(a.dtype).is_quantized || a.nb[0] == int64_t(elem);
  const bool ints = a.dtype == DType::I32 || a.dtype == DType::I8;
  const size_t out_row = row_bytes(o.dtype, n0);
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / n0);
  ctx.pool.parallel_for(a.rows(), grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(ints ? 0 : static_cast<size_t>(n0));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
      const uint8_t* s = src + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3];
      uint8_t* d = dst + size_t(r) * out_row;
      if (ints) {  // integer copies keep their bits
        for (int64_t i = 0; i < n0; ++i) std::memcpy(d + size_t(i) * elem, s + i * a.nb[0], elem);
        continue;
      }
      if (row_contiguous) {
        if (o.dtype == DType::F32) {
          row_to_f32(ctx.k, a.dtype, s, reinterpret_cast<float*>(d), n0);
          continue;
        }
        row_to_f32(ctx.k, a.dtype, s, row.data(), n0);
      } else {
        for (int64_t i = 0; i < n0; ++i)
          row_to_f32(ctx.k, a.dtype, s + i * a.nb[0], &row[size_t(i)], 1);
      }
      row_from_f32(ctx.k, o.dtype, row.data(), d, n0);
    }
  });
}

}  // namespace

void add_copy_kernels(KernelTable<Kernel>& rows) {
  rows.add(OpKind::Copy, convertible_dtypes(), run_copy);
  rows.add(OpKind::Copy, {DType::I32}, run_copy);
  rows.add(OpKind::Copy, {DType::I8}, run_copy);
  for (DType d : {DType::Q8_0, DType::Q4_0, DType::F16, DType::BF16}) {
    rows.add(OpKind::Dequantize, {d, DType::F32}, run_copy);
  }
  for (DType d : kKQuantDTypes) rows.add(OpKind::Dequantize, {d, DType::F32}, run_copy);
}

}  // namespace tandem::cpu
