// ggml's K-quants Q4_K, Q5_K and Q6_K: reference quantization (the algorithms of ggml's
// quantize_row_q*_K_ref, same float operations in the same order, so the bytes match) and
// dequantization.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "tandem/dtype.h"

namespace tandem {

namespace {

constexpr int kSubBlock = 32;  // Q4_K / Q5_K sub-block
constexpr int kSubBlocks = int(kSuperBlock) / kSubBlock;
constexpr int kQ6SubBlock = 16;
constexpr int kQ6SubBlocks = int(kSuperBlock) / kQ6SubBlock;
constexpr float kGroupMaxEps = 1e-15f;  // below this a Q6_K group counts as all zero

// Round to nearest, ties to even, for |x| < 2^22: ggml's nearest_int (adds 1.5 * 2^23).
int nearest_int(float x) {
  const float v = x + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &v, sizeof i);
  return (i & 0x007fffff) - 0x00400000;
}

// Asymmetric quantization of n values to [0, nmax] with x ~ scale * L - min_out, searching
// nstep + 1 scales around nmax / (max - min) by weighted least squares (ggml's
// make_qkx2_quants). Returns the scale; min_out >= 0.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* min_out, uint8_t* Laux, float rmin, float rdelta, int nstep,
                       bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *min_out = -min;
    return 0.0f;
  }
  float iscale = float(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = uint8_t(std::max(0, std::min(nmax, l)));
    float diff = scale * float(L[i]) + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *min_out = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * float(is) + float(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = uint8_t(l);
      const float w = weights[i];
      sum_l += w * float(l);
      sum_l2 += w * float(l) * float(l);
      sum_xl += w * float(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * float(Laux[i]) + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *min_out = -min;
  return scale;
}

// Symmetric quantization of n values to [-nmax, nmax - 1] (stored + nmax), weighting by x^2 and
// trying 18 scales around nmax / max (ggml's make_qx_quants with rmse_type 1, no weights).
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  auto clamp = [nmax](int l) { return std::max(-nmax, std::min(nmax - 1, l)); };
  float iscale = float(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp(nearest_int(iscale * x[i]));
    L[i] = int8_t(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * float(l);
    suml2 += w * float(l) * float(l);
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(float(nmax) + 0.1f * float(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp(nearest_int(iscale * x[i]));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * float(l);
      suml2 += w * float(l) * float(l);
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = int8_t(nmax + clamp(nearest_int(iscale * x[i])));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// The shared part of Q4_K and Q5_K: per 32-element sub-block a scale and a min by
// make_qkx2_quants, both quantized to 6 bits against the super-block's largest, then every
// element requantized against its sub-block's rounded scale and min. L receives 0..nmax.
template <class Block>
void quantize_scales_mins(const float* x, Block& y, uint8_t* L, int nmax, float rmin, int nstep) {
  float mins[kSubBlocks], scales[kSubBlocks], weights[kSubBlock];
  uint8_t Laux[kSubBlock];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < kSubBlocks; ++j) {
    const float* xb = x + kSubBlock * j;
    float sum_x2 = 0;
    for (int l = 0; l < kSubBlock; ++l) sum_x2 += xb[l] * xb[l];
    const float av_x = std::sqrt(sum_x2 / float(kSubBlock));
    for (int l = 0; l < kSubBlock; ++l) weights[l] = av_x + std::fabs(xb[l]);
    scales[j] = make_qkx2_quants(kSubBlock, nmax, xb, weights, L + kSubBlock * j, &mins[j], Laux,
                                 rmin, 0.1f, nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  std::memset(y.scales, 0, sizeof y.scales);
  for (int j = 0; j < kSubBlocks; ++j) {
    const auto ls = uint8_t(std::min(63, int(uint8_t(nearest_int(inv_scale * scales[j])))));
    const auto lm = uint8_t(std::min(63, int(uint8_t(nearest_int(inv_min * mins[j])))));
    k_pack_scale_min(j, ls, lm, y.scales);
  }
  y.d = f32_to_f16(max_scale / 63.0f);
  y.dmin = f32_to_f16(max_min / 63.0f);
  for (int j = 0; j < kSubBlocks; ++j) {
    uint8_t sc, m;
    k_scale_min(j, y.scales, sc, m);
    const float d = f16_to_f32(y.d) * float(sc);
    if (d == 0.0f) continue;  // L keeps make_qkx2_quants' values, as in ggml
    const float dm = f16_to_f32(y.dmin) * float(m);
    for (int i = 0; i < kSubBlock; ++i) {
      const int l = nearest_int((x[kSubBlock * j + i] + dm) / d);
      L[kSubBlock * j + i] = uint8_t(std::max(0, std::min(nmax, l)));
    }
  }
}

}  // namespace

void quantize_row_q4_K(const float* src, BlockQ4_K* dst, int64_t n) {
  row_bytes(DType::Q4_K, n);
  uint8_t L[kSuperBlock];
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    BlockQ4_K& y = dst[b];
    quantize_scales_mins(src + b * kSuperBlock, y, L, 15, -1.0f, 20);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l)
        y.qs[c * 32 + l] = uint8_t(L[c * 64 + l] | (L[c * 64 + 32 + l] << 4));
    }
  }
}

void quantize_row_q5_K(const float* src, BlockQ5_K* dst, int64_t n) {
  row_bytes(DType::Q5_K, n);
  uint8_t L[kSuperBlock];
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    BlockQ5_K& y = dst[b];
    quantize_scales_mins(src + b * kSuperBlock, y, L, 31, -0.5f, 15);
    std::memset(y.qh, 0, sizeof y.qh);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        int l1 = L[c * 64 + l], l2 = L[c * 64 + 32 + l];
        if (l1 > 15) {
          l1 -= 16;
          y.qh[l] |= uint8_t(1 << (2 * c));
        }
        if (l2 > 15) {
          l2 -= 16;
          y.qh[l] |= uint8_t(2 << (2 * c));
        }
        y.qs[c * 32 + l] = uint8_t(l1 | (l2 << 4));
      }
    }
  }
}

void quantize_row_q6_K(const float* src, BlockQ6_K* dst, int64_t n) {
  row_bytes(DType::Q6_K, n);
  int8_t L[kSuperBlock];
  float scales[kQ6SubBlocks];
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const float* x = src + b * kSuperBlock;
    BlockQ6_K& y = dst[b];
    float max_scale = 0, max_abs_scale = 0;
    for (int j = 0; j < kQ6SubBlocks; ++j) {
      scales[j] = make_qx_quants(kQ6SubBlock, 32, x + kQ6SubBlock * j, L + kQ6SubBlock * j);
      if (std::fabs(scales[j]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y, 0, sizeof y);
      continue;
    }
    const float iscale = -128.0f / max_scale;
    y.d = f32_to_f16(1 / iscale);
    for (int j = 0; j < kQ6SubBlocks; ++j) {
      y.scales[j] = int8_t(std::min(127, nearest_int(iscale * scales[j])));
    }
    for (int j = 0; j < kQ6SubBlocks; ++j) {
      const float d = f16_to_f32(y.d) * float(y.scales[j]);
      if (d == 0.0f) continue;  // L keeps make_qx_quants' values, as in ggml
      for (int i = 0; i < kQ6SubBlock; ++i) {
        const int l = nearest_int(x[kQ6SubBlock * j + i] / d);
        L[kQ6SubBlock * j + i] = int8_t(std::max(-32, std::min(31, l)) + 32);
      }
    }
    // Per half of 128: element 32 * k + l (k < 4) has its low nibble in ql[l + 32 * (k & 1)]
    // (high nibble for k >= 2) and its top two bits at bit 2k of qh[l].
    for (int h = 0; h < 2; ++h) {
      const int8_t* Lh = L + 128 * h;
      uint8_t* ql = y.ql + 64 * h;
      uint8_t* qh = y.qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = uint8_t((Lh[l] & 0x0F) | ((Lh[l + 64] & 0x0F) << 4));
        ql[l + 32] = uint8_t((Lh[l + 32] & 0x0F) | ((Lh[l + 96] & 0x0F) << 4));
        qh[l] = uint8_t((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                        ((Lh[l + 96] >> 4) << 6));
      }
    }
  }
}

void dequantize_row_q4_K(const BlockQ4_K* src, float* dst, int64_t n) {
  row_bytes(DType::Q4_K, n);
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const BlockQ4_K& x = src[b];
    const float d = f16_to_f32(x.d), min = f16_to_f32(x.dmin);
    float* y = dst + b * kSuperBlock;
    for (int j = 0; j < kSubBlocks; ++j) {
      uint8_t sc, m;
      k_scale_min(j, x.scales, sc, m);
      const float dj = d * float(sc), mj = min * float(m);
      const uint8_t* q = x.qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) y[32 * j + l] = dj * float((q[l] >> shift) & 0x0F) - mj;
    }
  }
}

void dequantize_row_q5_K(const BlockQ5_K* src, float* dst, int64_t n) {
  row_bytes(DType::Q5_K, n);
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const BlockQ5_K& x = src[b];
    const float d = f16_to_f32(x.d), min = f16_to_f32(x.dmin);
    float* y = dst + b * kSuperBlock;
    for (int j = 0; j < kSubBlocks; ++j) {
      uint8_t sc, m;
      k_scale_min(j, x.scales, sc, m);
      const float dj = d * float(sc), mj = min * float(m);
      const uint8_t* q = x.qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        const int v = ((q[l] >> shift) & 0x0F) + (((x.qh[l] >> j) & 1) << 4);
        y[32 * j + l] = dj * float(v) - mj;
      }
    }
  }
}

void dequantize_row_q6_K(const BlockQ6_K* src, float* dst, int64_t n) {
  row_bytes(DType::Q6_K, n);
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const BlockQ6_K& x = src[b];
    const float d = f16_to_f32(x.d);
    float* y = dst + b * kSuperBlock;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = x.ql + 64 * h;
      const uint8_t* qh = x.qh + 32 * h;
      const int8_t* sc = x.scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[128 * h + l] = d * float(sc[is]) * float(q1);
        y[128 * h + l + 32] = d * float(sc[is + 2]) * float(q2);
        y[128 * h + l + 64] = d * float(sc[is + 4]) * float(q3);
        y[128 * h + l + 96] = d * float(sc[is + 6]) * float(q4);
      }
    }
  }
}

}  // namespace tandem
