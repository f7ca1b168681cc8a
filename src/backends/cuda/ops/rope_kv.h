// Which nodes a fused RoPE / KV-cache-write launch takes: rope_kv_write_kernel's (rope.cu) and the
// staged products' RoPE tail (staged_matvec.cuh). Host code (rope_kv.cpp), so the matching runs
// and is tested without a GPU.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "ops.h"

namespace tandem::cuda {

// One tensor of a fused RoPE / KV-write launch, [d, heads, T] contiguous f32: rotated or copied
// as is, written to `out` (a Rope node's output) and/or to `cache` at its token's position (a
// KvWrite node's cache: position p's row at p * token_stride).
struct RopeKvPart {
  const float* src = nullptr;
  float* out = nullptr;
  uint8_t* cache = nullptr;
  int64_t d = 0, heads = 0, n = 0;
  int64_t token_stride = 0, capacity = 0;
  DType cache_dtype = DType::F32;
  bool rotate = false;
};
constexpr int kMaxRopeKvParts = 4;
struct RopeKvParts {
  std::array<RopeKvPart, kMaxRopeKvParts> part;
  int count = 0;
  bool neox = false;  // every rotated part: RopeNeox
};

// Up to two Rope nodes (Q, K) at the same positions, n_rot and base, then up to two KvWrite nodes
// (K, V) at those positions: a KvWrite of a Rope's output is that part's cache, others a part of
// their own.
struct RopeKvMatch {
  RopeKvParts parts;
  const TensorRef* positions = nullptr;  // I32, one per token
  int n_rot = 0;
  float freq_base = 0.0f;
};
// How many of the segment's first nodes that is (fewer than 2: no fused launch), filling *m.
size_t match_rope_kv_write(std::span<const NodeExecution> segment, RopeKvMatch* m);

// Whether m, the four nodes match_rope_kv_write took for one token (Q rotated; K rotated and
// cached; V cached; adjacent pairs, one head size), is followed in the segment by the Attention
// over the two caches at the same position that reads the Q Rope's output: the general attention
// kernel then rotates and writes them itself (attention.cu).
bool attention_follows(std::span<const NodeExecution> segment, const RopeKvMatch& m);
// The same from the segment: 5, filling *m; else 0.
size_t match_rope_kv_attention(std::span<const NodeExecution> segment, RopeKvMatch* m);
// Launches the general attention kernel for Attention node e with m's RoPE and cache writes
// (attention_follows), where the kernel's shapes allow it (attention.cu); false: nothing ran.
bool run_rope_kv_attention(const OpContext& ctx, const NodeExecution& e, const RopeKvMatch& m);

// Most weight matrices (same K and dtype) one staged launch multiplies with one b: Q, K and V.
inline constexpr int kMaxParts = 3;
// With a RopeTail the staged launch of Q, K and V of one token (products 0, 1, 2) does the work
// of the four nodes after them that rope_kv_write_kernel would: after its row sums a CTA rotates
// its row pairs (2j, 2j + 1) of the parts that rotate, writes them to the Rope outputs and the
// rows of the parts with a cache to it at the token's position. Arrays are per product.
struct RopeTail {
  const int32_t* pos = nullptr;  // the token's position
  int32_t* error_flag = nullptr;
  double log_base = 0.0;
  int n_rot = 0, head_dim = 0;
  float* out[kMaxParts] = {};      // the Rope node's output; nullptr: the part does not rotate
  uint8_t* cache[kMaxParts] = {};  // the KvWrite node's cache; nullptr: none
  int64_t token_stride[kMaxParts] = {}, capacity[kMaxParts] = {};
  DType cache_dtype = DType::F16;
};
// The nodes after n products of one b (one column) that a RopeTail takes: Rope (adjacent pairs)
// of products 0 and 1, the KvWrite of the second Rope's output and the KvWrite of product 2, all
// of one token: 4, filling *tail; else 0.
size_t rope_tail_of(std::span<const NodeExecution> segment, size_t n, RopeTail* tail);

}  // namespace tandem::cuda
