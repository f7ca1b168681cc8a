// What the two attention kernels share (attention.cu: every shape; decode_attention.cu: f16
// decode on tensor cores): the split of the context over blocks and how the splits meet.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops.h"

namespace tandem::cuda {

// A split's partial result in scratch: m, l, two pad floats (keep acc 16-byte aligned), acc[D]
// (f32 in the general kernel; the decode kernel keeps acc / l in f16, in the same scratch).
inline constexpr int kPartialHeader = 4;

// Blocks: (kv head x group_slices) x splits x tokens; a split covers `chunk` cache positions.
struct AttentionPlan {
  int group_slices;
  int splits;
  int chunk;
  // A token whose context has at most this many keys runs it whole in split 0 (the other
  // splits leave at once): below it, the split handshake and combine cost more than the keys.
  int whole_keys = 0;
};

// Scratch bytes of the plan's partial results (none for one split).
size_t partial_bytes(const TensorDesc& q, const AttentionPlan& plan);
// The plan, or one split per block where the context lacks counters or scratch for it.
AttentionPlan fit_to_context(const OpContext& ctx, const TensorDesc& q, const TensorDesc& k,
                             AttentionPlan plan);

inline bool is_aligned(const void* p, size_t a) {
  return reinterpret_cast<uintptr_t>(p) % a == 0;
}

// A block's place in a plan's grid: kv head hk, its query heads [h0, h0 + n_heads) (slices of
// at most kHeads of the group), split and query token.
struct BlockPlace {
  int hk, split, t, h0, n_heads;
};
template <int kHeads>
__device__ __forceinline__ BlockPlace block_place(int Hq, int Hkv, int group_slices) {
  const int slice = int(blockIdx.x) % group_slices, group = Hq / Hkv;
  BlockPlace b;
  b.hk = int(blockIdx.x) / group_slices;
  b.split = int(blockIdx.y);
  b.t = int(blockIdx.z);
  b.h0 = b.hk * group + slice * kHeads;
  b.n_heads = min(kHeads, group - slice * kHeads);
  return b;
}

// The keys [begin, end) the block of split `split` takes from a context of n keys: its chunk,
// or, for a context of at most whole_keys keys, all of them in split 0 and none elsewhere (whole:
// no split handshake; end < begin where a chunk lies past the context).
struct KeySlice {
  int begin, end;
  bool whole;
};
__device__ __forceinline__ KeySlice key_slice(int n, int split, int chunk, int whole_keys) {
  if (n <= whole_keys) return KeySlice{split == 0 ? 0 : n, n, true};
  const int begin = split * chunk;
  return KeySlice{begin, min(begin + chunk, n), false};
}

// The keys a relaxed read of the position says the context of C positions holds, before the
// wait for the kernel that may write it: a hint for prefetches, never for results.
__device__ __forceinline__ int hinted_keys(const int32_t* position, int C) {
  int hint;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(hint) : "l"(position));
  return hint >= 0 && hint < C ? hint + 1 : 0;
}

// The keys a query at position p attends (p + 1), or none when p lies outside a cache of C
// positions: the device flag is raised and the token skipped.
__device__ __forceinline__ int keys_seen(int p, int C, int32_t* error_flag) {
  if (p >= 0 && p < C) return p + 1;
  if (threadIdx.x == 0) atomicCAS(error_flag, kDeviceOk, kPositionOutOfRange);
  return 0;
}

// The split handshake: each block has published its partial result; the last of `splits`
// blocks to arrive at `counter` returns true and then sees every partial. Called by every
// thread of the block; s_last is a __shared__ flag. One acquire-release atomic by thread 0
// orders the block's stores (the barrier before it makes them thread 0's to release) and, in
// the last block, every other block's (the barrier after it passes them on); a fence in every
// thread, as before, measured 0.3 us slower per launch.
__device__ __forceinline__ bool last_to_arrive(uint32_t* counter, int splits, bool& s_last) {
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n"
                 : "=r"(old)
                 : "l"(counter)
                 : "memory");
    s_last = old == uint32_t(splits - 1);
  }
  __syncthreads();
  return s_last;
}

// The decode kernel: the scratch it would use for this node (0 when the shape is not its), and
// its launch when the node's shape, alignment and device allow (false: use the general kernel).
size_t decode_attention_scratch_bytes(const NodeExecution& e, int sm_count);
bool decode_attention_takes(const OpContext& ctx, const NodeExecution& e);
bool try_decode_attention(const OpContext& ctx, const NodeExecution& e);

}  // namespace tandem::cuda
