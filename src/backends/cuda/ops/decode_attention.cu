// Decode attention over an f16 KV cache with head dim 128 on tensor cores (the general kernel
// in attention.cu serves every other shape).
#include <algorithm>
#include <atomic>

#include "attention.cuh"
#include "common.cuh"

namespace tandem::cuda {

namespace {

// The decode kernel: f16 cache, head dim 128, few query tokens. Two blocks share an SM; each warp
// streams tiles of 8 keys through a 2-deep cp.async ring in shared memory and scores and sums
// them on tensor cores. The QK^T mma's 16 rows carry each head of the group twice: rows 0-3 the
// f16 nearest q (and p), rows 4-7 the f16 rounding error, so the products keep ~22 bits of q and
// p while K and V enter exactly. PV runs transposed (O^T = V^T P^T, 16 dims by those 8 rows), so
// no accumulator entry is wasted and a tile takes 8 mma, not 16.
constexpr int kDecodeDim = 128;
constexpr int kDecodeWarps = 8;
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kDecodeBlocksPerSm = 2;  // 16 warps an SM hide the mma, ldmatrix and exp latencies
constexpr int kDecodeHeads = 4;        // query heads per block: 2 x 4 of the mma's 8 used rows
constexpr int kDecodeRows = 2 * kDecodeHeads;  // high and low parts
constexpr int kTileKeys = 8;                   // n of the QK^T mma, k of the PV mma
constexpr int kStages = 2;                     // tiles in flight per warp
constexpr int kRowBytes = kDecodeDim * 2;      // one f16 row: 16 chunks of 16 bytes
constexpr int kTileBytes = kTileKeys * kRowBytes;
constexpr int kRingBytes = kDecodeWarps * kStages * 2 * kTileBytes;  // 64 KiB
constexpr int kBlockKeys = kDecodeWarps * kTileKeys;  // keys per round of the block's warps
constexpr int kDecodeMaxSplits = 32;                  // a warp lane each in the combine
constexpr int64_t kDecodeMaxTokens = 8;
// Contexts run whole in one block per head up to two rounds of the block's warps. 8B decode on
// an H100: tg128 (contexts up to 128) +4% over the split plan, 2% slower at 256-320 keys.
constexpr int kWholeKeys = 2 * kBlockKeys;
// The warps' sums meet as [warp][row][dim]; 4 floats of padding a row put the 32 lanes' stores
// of a transposed accumulator entry in distinct banks. They go after the ring where two blocks an
// SM still fit (H100, H200), so each warp stores its sums as soon as it is done (0.1 us a launch
// faster on the H100); elsewhere (A100: 164 KiB an SM) into the ring once every warp is done
// with it.
constexpr int kAccStride = kDecodeDim + 4;
constexpr int kQWords = kDecodeDim / 8;  // a lane's q fragments: 8 k16 steps x 2 registers
static_assert(kDecodeThreads == kDecodeHeads * kDecodeDim / 2,
              "the block combine: 2 dims a thread");
static_assert(kDecodeThreads == kDecodeHeads * (kDecodeDim / 4) * 2,
              "the split combine: 4 dims and half of the splits a thread");
static_assert(kDecodeMaxSplits == 32, "the split combine: lane i weighs split i");
constexpr int kAccBytes = kDecodeWarps * kDecodeRows * kAccStride * 4;
static_assert(kAccBytes <= kRingBytes, "the warps' sums fit in the ring");
static_assert(kDecodeWarps * 2 == kQWords, "the q fragments: warp w builds k16 step w");

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// Four 8x8 f16 matrices; lanes 8i..8i+7 give the row addresses of matrix i.
template <bool kTranspose>
__device__ __forceinline__ void load_matrices(uint32_t address, uint32_t (&r)[4]) {
  if constexpr (kTranspose) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address)
                 : "memory");
  }
}

// d += a * b for a 16x16 a whose rows 8-15 are zero (a0: k 0-7, a2: k 8-15) and a 16x8 b.
__device__ __forceinline__ void mma_k16(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0,
                                        uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
// d += a * b for a 16x8 a (a0: rows 0-7, a1: rows 8-15) and an 8x8 b.
__device__ __forceinline__ void mma_k8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

// The f16 pair nearest (x, y) or, for a low row, the f16 pair nearest its rounding error.
__device__ __forceinline__ uint32_t f16_part(float x, float y, bool low) {
  __half2 h = __floats2half2_rn(x, y);
  if (low) {
    const float2 f = __half22float2(h);
    h = __floats2half2_rn(x - f.x, y - f.y);
  }
  return *reinterpret_cast<const uint32_t*>(&h);
}

// One block per (kv head, slice of up to 4 of its query heads, split, token); warp w takes the
// split's tiles w, w + 8, ... Scores are kept in log2 units (q is pre-scaled by log2 e).
__global__ __launch_bounds__(kDecodeThreads, kDecodeBlocksPerSm) void decode_attention_kernel(
    const float* q, const __half* k, const __half* v, const int32_t* pos, float* out, int Hq,
    int Hkv, int C, int64_t head_stride, int token_stride, float scale_log2, int group_slices,
    int splits, int chunk, int whole_keys, int acc_offset, float* partial, uint32_t* counters,
    int32_t* error_flag) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) unsigned char smem[];
  // q's mma fragments, read from here every tile (held in registers they cost 16 of them, and
  // the kernel measured 5% slower): [word / 4][lane][word % 4].
  __shared__ __align__(16) uint32_t s_q[kQWords / 4][32][4];
  __shared__ float s_m[kDecodeWarps][kDecodeHeads], s_l[kDecodeWarps][kDecodeHeads];
  __shared__ bool s_last;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const auto [hk, split, t, h0, n_heads] = block_place<kDecodeHeads>(Hq, Hkv, group_slices);
  // mma fragments: lane holds row lane / 4 (head row % 4; rows 4-7 the low parts) and
  // columns 2 * (lane % 4) + {0, 1} (+8 for the second half of a k16 step).
  const int t4 = lane % 4, row = lane / 4, row_head = row % kDecodeHeads;
  const bool low = row >= kDecodeHeads;

  // Launched as a programmatic dependent: until the preceding kernel is done (it may write q,
  // this token's K/V row, even pos) the block only pulls the keys of its warps' first tiles
  // into the L2, as far as a relaxed read of pos says the context reaches (a stale hint costs
  // fetches, never results; starting the copies from it measured slower than waiting for pos).
  // How much to fetch early is a balance: these fetches slow the preceding launch's split
  // combine (its critical path) in the L2, the rest waits for the wait. H100, per launch: the
  // first tiles 9.3 us, a quarter of the split 9.5, three quarters 9.7, all of it 10.4.
  {
    const KeySlice hinted = key_slice(hinted_keys(pos + t, C), split, chunk, whole_keys);
    const int first = hinted.begin, first_tiles_end = min(hinted.end, first + kBlockKeys);
    for (int i = threadIdx.x; i < 4 * (first_tiles_end - first); i += kDecodeThreads) {
      const __half* base = (i % 4 < 2 ? k : v) + hk * head_stride;
      prefetch_l2(base + int64_t(first + i / 4) * token_stride + (i % 2) * 64);
    }
  }
  grid_launch_dependents();
  grid_dependency_wait();

  // q and pos are loaded together; the K/V copies wait only for pos. This thread builds lane
  // `lane`'s q fragment of k16 step `warp` (dims 16 * warp + 2 * t4 + {0, 1, 8, 9}).
  const float* q_dims =
      q + (int64_t(t) * Hq + h0 + min(row_head, n_heads - 1)) * kDecodeDim + 16 * warp + 2 * t4;
  const float2 q_a = *reinterpret_cast<const float2*>(q_dims);
  const float2 q_b = *reinterpret_cast<const float2*>(q_dims + 8);
  // pos from the L2: the hint may have left its line in L1.
  const int n_kv = keys_seen(__ldcg(pos + t), C, error_flag);
  // A short context runs whole in split 0 (the other splits leave at once), without the split
  // handshake and combine.
  const auto [begin, end, whole] = key_slice(n_kv, split, chunk, whole_keys);
  if (whole && split > 0) return;
  const int n_tiles = end > begin ? (end - begin + kTileKeys - 1) / kTileKeys : 0;
  const int my_tiles = n_tiles > warp ? (n_tiles - warp + kDecodeWarps - 1) / kDecodeWarps : 0;
  auto tile_key = [&](int i) { return begin + (i * kDecodeWarps + warp) * kTileKeys; };

  // Row r of a stage holds key tile_key + r; its 16-byte chunk c sits at slot c ^ r, so the
  // 8 rows an ldmatrix phase reads (one chunk each) fall in distinct banks. Lane copies chunk
  // lane % 16 of rows lane / 16 + {0, 2, 4, 6}.
  unsigned char* ring = smem + warp * kStages * 2 * kTileBytes;
  const int copy_chunk = lane % 16, copy_row = lane / 16;
  const __half* k_lane = k + hk * head_stride + copy_chunk * 8;
  const __half* v_lane = v + hk * head_stride + copy_chunk * 8;
  auto issue = [&](int i) {
    const int key0 = tile_key(i);
    const int64_t tile_offset = int64_t(key0) * token_stride;
    const __half* k_tile = k_lane + tile_offset;
    const __half* v_tile = v_lane + tile_offset;
    const uint32_t stage = shared_address(ring + (i % kStages) * 2 * kTileBytes);
#pragma unroll
    for (int u = 0; u < kTileKeys / 2; ++u) {
      const int r = copy_row + 2 * u;
      const bool valid = key0 + r < end;  // key0 < end: a masked row reads nothing, from row key0
      const int offset = valid ? r * token_stride : 0;  // the host keeps 8 rows within int
      const uint32_t slot = uint32_t(r * kRowBytes + (copy_chunk ^ r) * 16);
      copy_async_16(stage + slot, k_tile + offset, valid);
      copy_async_16(stage + kTileBytes + slot, v_tile + offset, valid);
    }
  };
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    if (s < my_tiles) issue(s);
    copy_async_commit();  // empty groups keep the count uniform for wait_group
  }

  {
    const bool live = row_head < n_heads;
    const float sa = live ? scale_log2 : 0.0f;
    const uint2 words =
        make_uint2(f16_part(q_a.x * sa, q_a.y * sa, low), f16_part(q_b.x * sa, q_b.y * sa, low));
    *reinterpret_cast<uint2*>(&s_q[warp / 2][lane][2 * (warp % 2)]) = words;
  }
  __syncthreads();
  // O^T: acc[n] holds dims 16n + row (entries 0, 1) and 16n + 8 + row (entries 2, 3) of rows
  // 2 * t4 + {0, 1}, i.e. of heads (2 * t4) % 4 + {0, 1}, whose corrections sit in lanes 4 * head.
  float acc[kDecodeDim / 16][4];
#pragma unroll
  for (int n = 0; n < kDecodeDim / 16; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  const int corr_lane = 4 * ((2 * t4) % kDecodeHeads);
  float m_run = -INFINITY, l_run = 0.0f;  // this lane's head, over this warp's keys
  // ldmatrix rows: key lane % 8, chunk 4 * pair + lane / 8 (the same for K and V^T).
  const int r8 = lane % 8;
  auto matrix_row = [&](int pair) {
    return uint32_t(r8 * kRowBytes + (((4 * pair + lane / 8) ^ r8) * 16));
  };
  for (int i = 0; i < my_tiles; ++i) {
    copy_async_wait<kStages - 1>();  // tile i's group is complete
    __syncwarp();                    // and every lane's part of it is visible
    const uint32_t k_tile = shared_address(ring + (i % kStages) * 2 * kTileBytes);
    const uint32_t v_tile = k_tile + kTileBytes;
    float s_even[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s_odd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int pair = 0; pair < kDecodeDim / 32; ++pair) {
      uint32_t b[4];
      load_matrices<false>(k_tile + matrix_row(pair), b);
      const uint4 w = *reinterpret_cast<const uint4*>(&s_q[pair][lane][0]);
      mma_k16(s_even, w.x, w.y, b[0], b[1]);
      mma_k16(s_odd, w.z, w.w, b[2], b[3]);
    }
    // Lane holds head row_head's scores of keys 2 * t4 + {0, 1}: high rows plus low rows.
    float s0 = s_even[0] + s_odd[0], s1 = s_even[1] + s_odd[1];
    s0 += __shfl_xor_sync(0xffffffffu, s0, 16);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 16);
    const int j = tile_key(i) + 2 * t4;
    if (j >= end) s0 = -INFINITY;
    if (j + 1 >= end) s1 = -INFINITY;
    float mx = fmaxf(s0, s1);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_run, mx);
    const float base = m_new == -INFINITY ? 0.0f : m_new;  // no -inf - -inf
    const float corr = exp2f(m_run - base);
    const float p0 = exp2f(s0 - base), p1 = exp2f(s1 - base);
    float psum = p0 + p1;
    psum += __shfl_xor_sync(0xffffffffu, psum, 1);
    psum += __shfl_xor_sync(0xffffffffu, psum, 2);
    l_run = l_run * corr + psum;
    m_run = m_new;
    // p as the b fragment of P^T: row `row` of P, keys 2 * t4 + {0, 1}.
    const uint32_t pb = f16_part(p0, p1, low);
    const float corr0 = __shfl_sync(0xffffffffu, corr, corr_lane);
    const float corr1 = __shfl_sync(0xffffffffu, corr, corr_lane + 4);
#pragma unroll
    for (int n = 0; n < kDecodeDim / 16; ++n) {
      acc[n][0] *= corr0;
      acc[n][1] *= corr1;
      acc[n][2] *= corr0;
      acc[n][3] *= corr1;
    }
#pragma unroll
    for (int pair = 0; pair < kDecodeDim / 32; ++pair) {
      uint32_t a[4];  // V^T of dims 8 * (4 * pair + u) + row, keys 2 * t4 + {0, 1}
      load_matrices<true>(v_tile + matrix_row(pair), a);
      mma_k8(acc[2 * pair], a[0], a[1], pb);
      mma_k8(acc[2 * pair + 1], a[2], a[3], pb);
    }
    __syncwarp();  // every lane is done reading the stage before it is refilled
    if (i + kStages < my_tiles) issue(i + kStages);
    copy_async_commit();
  }
  copy_async_wait<0>();

  // The warps meet in shared memory (acc_offset 0: in the ring, once every warp is done with
  // it); the high and low rows of a head are summed by the combine.
  if (acc_offset == 0) __syncthreads();
  float* s_acc = reinterpret_cast<float*>(smem + acc_offset);  // [warp][row][kAccStride]
  {
    float* dst = s_acc + (warp * kDecodeRows + 2 * t4) * kAccStride + row;
#pragma unroll
    for (int n = 0; n < kDecodeDim / 16; ++n) {
      dst[16 * n] = acc[n][0];
      dst[kAccStride + 16 * n] = acc[n][1];
      dst[16 * n + 8] = acc[n][2];
      dst[kAccStride + 16 * n + 8] = acc[n][3];
    }
  }
  if (!low && t4 == 0) {
    s_m[warp][row_head] = m_run;
    s_l[warp][row_head] = l_run;
  }
  __syncthreads();

  // Thread: head g, dims d, d + 1. With one split this is the answer, else the split's partial.
  // A split's partial: m and l as floats, then its normalised sum (acc / l) in f16 (relative
  // error 2^-12, as the f16 cache's own): half the bytes the combine reads on the launch's
  // critical path (0.3 us a launch on the H200), inside the plan's f32-sized scratch.
  constexpr int kHalfStride = kPartialHeader + kDecodeDim / 2;
  const int g = threadIdx.x / (kDecodeDim / 2);
  if (g < n_heads) {
    const int d = threadIdx.x % (kDecodeDim / 2) * 2;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, s_m[w][g]);
    float L = 0.0f, A0 = 0.0f, A1 = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float f = mx == -INFINITY ? 0.0f : exp2f(s_m[w][g] - mx);
      const float* rows = s_acc + (w * kDecodeRows + g) * kAccStride + d;
      const float2 high = *reinterpret_cast<const float2*>(rows);
      const float2 low_part = *reinterpret_cast<const float2*>(rows + kDecodeHeads * kAccStride);
      L += s_l[w][g] * f;
      A0 += (high.x + low_part.x) * f;
      A1 += (high.y + low_part.y) * f;
    }
    const int64_t h = h0 + g;
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    if (splits == 1 || whole) {
      *reinterpret_cast<float2*>(out + (int64_t(t) * Hq + h) * kDecodeDim + d) =
          make_float2(A0 * inv, A1 * inv);
    } else {
      float* part = partial + ((int64_t(t) * Hq + h) * splits + split) * kHalfStride;
      *reinterpret_cast<__half2*>(part + kPartialHeader + d / 2) =
          __floats2half2_rn(A0 * inv, A1 * inv);
      if (d == 0) *reinterpret_cast<float2*>(part) = make_float2(mx, L);
    }
  }
  if (splits == 1 || whole) return;
  uint32_t* counter = counters + int64_t(t) * gridDim.x + blockIdx.x;
  if (!last_to_arrive(counter, splits, s_last)) return;
  if (threadIdx.x == 0) *counter = 0;  // ready for the next launch (and graph replays)

  // Thread: head g, dims 4c..4c+3, splits of one parity; all its loads are in flight at once.
  if (g >= n_heads) return;  // whole warps: 64 threads a head
  const int c = threadIdx.x % (kDecodeDim / 2) / 2, parity = threadIdx.x % 2;
  const float* parts = partial + (int64_t(t) * Hq + h0 + g) * splits * kHalfStride;
  // Lane i weighs split i, l_i 2^(m_i - m) (the warp's 32 lanes cover kDecodeMaxSplits); a
  // thread then sums its splits' normalised sums.
  const float2 ml = lane < splits
                        ? __ldcg(reinterpret_cast<const float2*>(parts + lane * kHalfStride))
                        : make_float2(-INFINITY, 0.0f);
  uint2 a[kDecodeMaxSplits / 2];
#pragma unroll
  for (int i = 0; i < kDecodeMaxSplits / 2; ++i) {
    const int sp = 2 * i + parity;
    a[i] = sp < splits ? __ldcg(reinterpret_cast<const uint2*>(parts + sp * kHalfStride +
                                                               kPartialHeader + 2 * c))
                       : make_uint2(0u, 0u);
  }
  float mx = ml.x;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  const float f = mx == -INFINITY ? 0.0f : exp2f(ml.x - mx) * ml.y;
  float L = f;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) L += __shfl_xor_sync(0xffffffffu, L, o);
  float4 A = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int i = 0; i < kDecodeMaxSplits / 2; ++i) {
    const float fi = __shfl_sync(0xffffffffu, f, 2 * i + parity);
    const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&a[i].x));
    const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&a[i].y));
    A.x += lo.x * fi;
    A.y += lo.y * fi;
    A.z += hi.x * fi;
    A.w += hi.y * fi;
  }
  A.x += __shfl_xor_sync(0xffffffffu, A.x, 1);
  A.y += __shfl_xor_sync(0xffffffffu, A.y, 1);
  A.z += __shfl_xor_sync(0xffffffffu, A.z, 1);
  A.w += __shfl_xor_sync(0xffffffffu, A.w, 1);
  if (parity == 0) {
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    *reinterpret_cast<float4*>(out + (int64_t(t) * Hq + h0 + g) * kDecodeDim + 4 * c) =
        make_float4(A.x * inv, A.y * inv, A.z * inv, A.w * inv);
  }
#else
  __trap();  // the host only routes here for sm_80+ code (decode_smem_bytes)
#endif
}

AttentionPlan plan_decode_attention(const TensorDesc& q, const TensorDesc& k, int sm_count) {
  const int64_t Hq = q.ne[1], T = q.ne[2], Hkv = k.ne[1], C = k.ne[2];
  const int group_slices = int((Hq / Hkv + kDecodeHeads - 1) / kDecodeHeads);
  const int64_t units = Hkv * group_slices * T;
  // One wave of kDecodeBlocksPerSm blocks an SM, and at least a tile per warp in each split.
  // (One block an SM, leaving the other slot to the next kernel, measured slower.)
  int64_t splits = std::max<int64_t>(int64_t(sm_count) * kDecodeBlocksPerSm / units, 1);
  splits = std::min<int64_t>({splits, kDecodeMaxSplits, (C + kBlockKeys - 1) / kBlockKeys});
  splits = std::max<int64_t>(splits, 1);
  int64_t chunk = (C + splits - 1) / splits;
  chunk = (chunk + kBlockKeys - 1) / kBlockKeys * kBlockKeys;
  splits = (C + chunk - 1) / chunk;
  return AttentionPlan{group_slices, int(splits), int(chunk), kWholeKeys};
}

// The decode kernel's shapes (alignment is checked at launch).
bool is_decode_shape(const NodeExecution& e) {
  const TensorDesc& q = *e.inputs[0].desc;
  return e.inputs[1].desc->dtype == DType::F16 && e.inputs[2].desc->dtype == DType::F16 &&
         q.ne[0] == kDecodeDim && q.ne[2] <= kDecodeMaxTokens;
}

// The dynamic shared memory the decode kernel's sm_80+ code takes on this device: the ring, plus
// room for the warps' sums where two blocks an SM still fit; 0 when it cannot run here. Asked
// once per device (the attributes it sets belong to the current device).
int decode_smem_bytes(const OpContext& ctx) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> state[kMaxDevices];  // 0 unknown, else the answer + 1
  const int device = ctx.state->device;
  if (device < 0 || device >= kMaxDevices) return 0;
  int s = state[device].load(std::memory_order_acquire) - 1;
  if (s < 0) {
    cudaFuncAttributes attr{};
    s = 0;
    if (cudaFuncGetAttributes(&attr, decode_attention_kernel) == cudaSuccess &&
        attr.ptxVersion >= 80) {
      const size_t fixed = attr.sharedSizeBytes;
      s = ctx.smem_pair >= kRingBytes + kAccBytes + fixed ? kRingBytes + kAccBytes
          : ctx.smem_optin >= kRingBytes + fixed          ? kRingBytes
                                                          : 0;
    }
    if (s > 0 &&
        (cudaFuncSetAttribute(decode_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              s) != cudaSuccess ||
         cudaFuncSetAttribute(decode_attention_kernel,
                              cudaFuncAttributePreferredSharedMemoryCarveout,
                              cudaSharedmemCarveoutMaxShared) != cudaSuccess)) {
      s = 0;
    }
    if (s == 0) (void)cudaGetLastError();  // a failed query is an answer, not an error
    state[device].store(s + 1, std::memory_order_release);
  }
  return s;
}

void launch_decode(const OpContext& ctx, const NodeExecution& e, int smem) {
  const TensorDesc& q = *e.inputs[0].desc;
  const TensorDesc& k = *e.inputs[1].desc;
  const AttentionPlan plan = fit_to_context(ctx, q, k, plan_decode_attention(q, k, ctx.sm_count));
  constexpr float kLog2e = 1.4426950408889634f;
  const dim3 grid(unsigned(k.ne[1] * plan.group_slices), unsigned(plan.splits), unsigned(q.ne[2]));
  ctx.check(
      launch_programmatic(
          ctx.stream, grid, dim3(kDecodeThreads), size_t(smem), decode_attention_kernel,
          static_cast<const float*>(e.inputs[0].data), static_cast<const __half*>(e.inputs[1].data),
          static_cast<const __half*>(e.inputs[2].data),
          static_cast<const int32_t*>(e.inputs[3].data), static_cast<float*>(e.output.data),
          int(q.ne[1]), int(k.ne[1]), int(k.ne[2]), k.nb[1] / 2, int(k.nb[2] / 2),
          e.node->params.scale * kLog2e, plan.group_slices, plan.splits, plan.chunk,
          plan.whole_keys, smem > kRingBytes ? kRingBytes : 0, static_cast<float*>(ctx.scratch),
          ctx.counters, ctx.error_flag),
      "attention", "launch");
}

// cp.async and the vector loads and stores need 16-byte rows and outputs; V must share K's
// layout; a tile's row offsets are int.
bool decode_aligned(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& k = *e.inputs[1].desc;
  const TensorDesc& v = *e.inputs[2].desc;
  return is_aligned(e.inputs[0].data, 8) && is_aligned(e.inputs[1].data, 16) &&
         is_aligned(e.inputs[2].data, 16) && k.nb[2] / 2 * kTileKeys <= INT32_MAX &&
         is_aligned(e.output.data, 16) && is_aligned(ctx.scratch, 16) && k.nb[0] == 2 &&
         k.nb[1] % 16 == 0 && k.nb[2] % 16 == 0 && v.nb[0] == k.nb[0] && v.nb[1] == k.nb[1] &&
         v.nb[2] == k.nb[2];
}

}  // namespace

size_t decode_attention_scratch_bytes(const NodeExecution& e, int sm_count) {
  if (!is_decode_shape(e)) return 0;
  const TensorDesc& q = *e.inputs[0].desc;
  return partial_bytes(q, plan_decode_attention(q, *e.inputs[1].desc, sm_count));
}

bool decode_attention_takes(const OpContext& ctx, const NodeExecution& e) {
  return is_decode_shape(e) && decode_aligned(ctx, e) && decode_smem_bytes(ctx) > 0;
}

bool try_decode_attention(const OpContext& ctx, const NodeExecution& e) {
  if (!decode_attention_takes(ctx, e)) return false;
  launch_decode(ctx, e, decode_smem_bytes(ctx));
  return true;
}

}  // namespace tandem::cuda
