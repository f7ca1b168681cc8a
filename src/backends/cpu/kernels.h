// The per-ISA kernel table. kernels/*.inc hold the bodies; isa_*.cpp compile them once per
// instruction set (per-file flags), so one binary carries scalar, AVX2 and AVX-512 code and
// picks a table at run time. Kernels work on rows; the ops/ drivers split rows over threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tandem::cpu {

enum class Isa : uint8_t { Scalar, Avx2, Avx512, Avx512Vnni };
inline constexpr int kIsaCount = 4;
std::string_view isa_name(Isa isa);

// Activations quantized to 8 bits in blocks of 32 (Q8_0-like, split into planes so a kernel
// loads 32 or 64 quants at once): column c has quants qs[c*k ...], scales d[c*k/32 ...] and
// per block 8 int32 bias lanes bias[c*k/4 ...] = {-8 * sum(quants), 0, ..., 0}: the integer
// dot products start from it, which folds Q4_0's zero point (8) in exactly.
struct QuantizedActivations {
  const int8_t* qs = nullptr;
  const float* d = nullptr;
  const int32_t* bias = nullptr;
  int64_t k = 0;
};
inline constexpr int64_t kBiasLanes = 8;

// Activations for the K-quant products (ggml's Q8_K): 8 bits with one scale per 256, so a
// super-block's sub-block scales multiply exact integer sums and only its total meets a float.
// Column c has quants qs[c*k ...], scales d[c*k/256 ...] and the sum of every 16 quants
// sums[c*k/16 ...] (for Q4_K/Q5_K's mins and Q6_K's offset of 32).
struct KQuantizedActivations {
  const int8_t* qs = nullptr;
  const float* d = nullptr;
  const int16_t* sums = nullptr;
  int64_t k = 0;
};
inline constexpr int64_t kKActivationBlock = 256;
inline constexpr int64_t kKActivationSumGroup = 16;

// Output tiles of at most this many weight rows x activation columns per kernel call.
inline constexpr int kTileRows = 4;
inline constexpr int kTileCols = 4;

struct Kernels {
  Isa isa;
  // Quantizes one row of k floats (k a multiple of 32) into qs, d and bias (see above).
  void (*quantize_activations)(const float* x, int64_t k, int8_t* qs, float* d, int32_t* bias);
  // out[c * out_stride + r] = weight row r . activation column (col0 + c), for r < rows and
  // c < cols (each at most 4). Weight rows start every w_row_bytes bytes (GGUF blocks).
  void (*q4_0_tile)(const uint8_t* w, size_t w_row_bytes, int rows, const QuantizedActivations& a,
                    int64_t col0, int cols, float* out, int64_t out_stride);
  void (*q8_0_tile)(const uint8_t* w, size_t w_row_bytes, int rows, const QuantizedActivations& a,
                    int64_t col0, int cols, float* out, int64_t out_stride);
  // Quantizes one row of k floats (k a multiple of 256) into qs, d and sums (see above).
  void (*quantize_activations_k)(const float* x, int64_t k, int8_t* qs, float* d, int16_t* sums);
  // The same tiles for K-quant weight rows (GGUF Q4_K / Q5_K / Q6_K).
  void (*q4_k_tile)(const uint8_t* w, size_t w_row_bytes, int rows, const KQuantizedActivations& a,
                    int64_t col0, int cols, float* out, int64_t out_stride);
  void (*q5_k_tile)(const uint8_t* w, size_t w_row_bytes, int rows, const KQuantizedActivations& a,
                    int64_t col0, int cols, float* out, int64_t out_stride);
  void (*q6_k_tile)(const uint8_t* w, size_t w_row_bytes, int rows, const KQuantizedActivations& a,
                    int64_t col0, int cols, float* out, int64_t out_stride);
  // out[c * ldo + r] = a row r . b row c over k floats (rows, cols at most 4).
  void (*f32_tile)(const float* a, int64_t lda, int rows, const float* b, int64_t ldb, int cols,
                   int64_t k, float* out, int64_t ldo);
  float (*dot_f32)(const float* a, const float* b, int64_t n);
  float (*dot_f16)(const uint16_t* a, const float* b, int64_t n);
  float (*dot_bf16)(const uint16_t* a, const float* b, int64_t n);
  void (*axpy_f32)(float alpha, const float* x, float* y, int64_t n);  // y += alpha x
  void (*axpy_f16)(float alpha, const uint16_t* x, float* y, int64_t n);
  // Attention over a block of cache rows for n_x query heads that share them: each row is
  // read once for all heads. Rows hold n elements, `stride` elements apart; xs, weights and
  // accs are n_x consecutive vectors. scores[x * n_rows + j] = row j . xs[x];
  // accs[x] += sum_j weights[x * n_rows + j] * row j.
  void (*dot_rows_f32)(const float* rows, int64_t stride, int64_t n_rows, const float* xs,
                       int64_t n_x, int64_t n, float* scores);
  void (*dot_rows_f16)(const uint16_t* rows, int64_t stride, int64_t n_rows, const float* xs,
                       int64_t n_x, int64_t n, float* scores);
  void (*accumulate_rows_f32)(const float* rows, int64_t stride, int64_t n_rows,
                              const float* weights, int64_t n_x, float* accs, int64_t n);
  void (*accumulate_rows_f16)(const uint16_t* rows, int64_t stride, int64_t n_rows,
                              const float* weights, int64_t n_x, float* accs, int64_t n);
  // GGUF Q8_0 / Q4_0 blocks to float32 (n a multiple of 32), bit-identical to the reference.
  void (*dequantize_q8_0)(const uint8_t* src, float* dst, int64_t n);
  void (*dequantize_q4_0)(const uint8_t* src, float* dst, int64_t n);
  void (*f16_to_f32)(const uint16_t* src, float* dst, int64_t n);
  void (*f32_to_f16)(const float* src, uint16_t* dst, int64_t n);
  void (*bf16_to_f32)(const uint16_t* src, float* dst, int64_t n);
  void (*f32_to_bf16)(const float* src, uint16_t* dst, int64_t n);
  void (*exp_inplace)(float* x, int64_t n);  // relative error below 3e-7
  void (*add)(const float* x, const float* y, float* out, int64_t n);
  void (*mul)(const float* x, const float* y, float* out, int64_t n);
  void (*scale)(const float* x, float s, float* out, int64_t n);
  void (*silu)(const float* x, float* out, int64_t n);
  void (*gelu)(const float* x, float* out, int64_t n);
  void (*swiglu)(const float* gate, const float* up, float* out, int64_t n);
  // softmax(x * scale + mask) over n; mask may be null.
  void (*softmax_row)(const float* x, const float* mask, float scale, float* out, int64_t n);
  void (*rms_norm_row)(const float* x, const float* w, float eps, float* out, int64_t n);
  void (*layer_norm_row)(const float* x, const float* w, const float* b, float eps, float* out,
                         int64_t n);
  // Rotates pairs (x[2i], x[2i+1]) for 2i < n_rot by cs[2i] = cos, cs[2i+1] = sin; copies the
  // rest of the n elements.
  void (*rope_row)(const float* x, const float* cs, int64_t n_rot, float* out, int64_t n);
};

// The table for isa; throws Unsupported when this CPU cannot run it.
const Kernels& kernels_for(Isa isa);

// The tables as compiled (no CPU check): one per isa_*.cpp.
const Kernels& kernels_scalar();
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();
const Kernels& kernels_avx512_vnni();

}  // namespace tandem::cpu
