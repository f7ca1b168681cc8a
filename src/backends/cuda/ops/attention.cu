// Attention in one pass over K and V (online softmax), causal and grouped-query. A block
// serves one kv head, one query token and one slice of the context for every query head that
// shares the kv head, so K and V are read once. Short queries (decode) split the context over
// many blocks; the last block of a token combines the slices (no second launch). A context of
// at most kWholeKeys keys runs whole in the first slice's block. Decode over an
// f16 cache with head dim 128 has its own kernel (decode_attention.cu: cp.async staging, tensor
// cores); this general kernel serves every other shape.
#include <algorithm>
#include <cmath>

#include "attention.cuh"
#include "common.cuh"
#include "ops.h"
#include "rope_kv.h"
#include "tandem/error.h"

namespace tandem::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxGroup =
    4;  // query heads per block (Llama 3: 32/8); larger groups use more blocks
constexpr int kMaxDim = 256;
// The combining block keeps one scale per (head, slice) in the reused accumulator tile.
constexpr int kMaxSplits = kWarps * kMaxDim;
// Contexts run whole in one block per head up to four steps of the block's warps (8 keys a warp
// a step). 1B decode on an H100: tg128 (contexts up to 128) +13% over the split plan with its
// handshake and combine (~5 us a layer), even at 128-192 keys, 5-20% slower from 192 on.
constexpr int kWholeKeys = 4 * kWarps * (32 / kMaxGroup);
static_assert(kWarps == 4 && kMaxGroup <= kWarps, "the combine gives one warp per head");
static_assert(32 % kMaxGroup == 0, "a warp step scores 32 / kMaxGroup keys");

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (sizeof(T) == 4) {
    return v;
  } else {
    return __half2float(v);
  }
}

template <typename T, int kN>
struct alignas(sizeof(T) * kN > 16 ? 16 : sizeof(T) * kN) Vec {
  T x[kN];
};

// This lane's kDpl consecutive dims of one row (dims >= D read as 0).
template <typename T, int kDpl, bool kFull>
__device__ __forceinline__ void load_dims(const T* row, int d0, int D, float (&out)[kDpl]) {
  if constexpr (kFull) {
    const Vec<T, kDpl> v = *reinterpret_cast<const Vec<T, kDpl>*>(row + d0);
#pragma unroll
    for (int i = 0; i < kDpl; ++i) out[i] = to_float(v.x[i]);
  } else {
#pragma unroll
    for (int i = 0; i < kDpl; ++i) out[i] = d0 + i < D ? to_float(row[d0 + i]) : 0.0f;
  }
}

// The same dims kept in their storage type (registers for 8 rows of K and V in flight).
template <typename T, int kDpl, bool kFull>
__device__ __forceinline__ Vec<T, kDpl> load_raw(const T* row, int d0, int D) {
  if constexpr (kFull) {
    return *reinterpret_cast<const Vec<T, kDpl>*>(row + d0);
  } else {
    Vec<T, kDpl> v;
#pragma unroll
    for (int i = 0; i < kDpl; ++i) v.x[i] = d0 + i < D ? row[d0 + i] : T(0.0f);
    return v;
  }
}

// Sums 32 values over the warp so that lane l ends with the total of v[l]: 31 shuffles for 32
// dot products instead of 5 each (a butterfly that halves the live values per step).
template <int kW>
__device__ __forceinline__ void transpose_reduce_step(float (&v)[32], int lane) {
  const bool upper = lane & kW;
#pragma unroll
  for (int i = 0; i < kW; ++i) {
    const float send = upper ? v[i] : v[i + kW];
    const float keep = upper ? v[i + kW] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kW);
  }
}
__device__ __forceinline__ float transpose_reduce(float (&v)[32], int lane) {
  transpose_reduce_step<16>(v, lane);
  transpose_reduce_step<8>(v, lane);
  transpose_reduce_step<4>(v, lane);
  transpose_reduce_step<2>(v, lane);
  transpose_reduce_step<1>(v, lane);
  return v[0];
}

// With kRope (one token, run_rope_kv_attention) the kernel also does the RoPE of Q and K
// and the two cache writes before it: q is the unrotated Q, and every block rotates its heads'
// q in registers (pair (2j, 2j + 1) in one lane: kDpl even). The block whose keys hold the
// token's position (split 0 for a whole context) writes its heads' rotated q to the Q Rope's
// output and the rotated K row and the V row of its kv head to the K Rope's output and the caches,
// then reads them back with the other keys (one slice per kv head: no other block reads them).
struct AttentionRope {
  const float* k_src = nullptr;  // the token's unrotated K, [D, Hkv]
  const float* v_src = nullptr;  // and V
  float* q_out = nullptr;        // the Rope nodes' outputs, [D, Hq] and [D, Hkv]
  float* k_out = nullptr;
  int n_rot = 0;
  double log_base = 0.0;
};

template <typename T, int kDpl, bool kFull, bool kRope>
__global__ __launch_bounds__(kWarps * 32) void attention_kernel(
    const float* q, const T* k, const T* v, const int32_t* pos, float* out, int D, int Hq, int Hkv,
    int C, int64_t head_stride, int64_t token_stride, float scale, int group_slices, int splits,
    int chunk, int whole_keys, float* partial, uint32_t* counters, int32_t* error_flag,
    AttentionRope rope) {
  static_assert(!kRope || kDpl % 2 == 0, "a lane holds whole pairs");
  __shared__ float s_m[kWarps][kMaxGroup], s_l[kWarps][kMaxGroup];
  __shared__ float s_acc[kWarps][kMaxGroup][kMaxDim];
  __shared__ bool s_last;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const auto [hk, split, t, h0, n_heads] = block_place<kMaxGroup>(Hq, Hkv, group_slices);
  // Launched as a programmatic dependent: until the preceding kernel is done (it may write q,
  // this token's K/V row, even pos) the block only pulls its first keys (a whole context: all
  // of them) into the L2, as far as a relaxed read of pos says the context reaches (a stale
  // hint costs fetches, never results); the next kernel may launch at once and fetch its
  // weights while this one runs (1B F16 decode on an H100: +5%).
  {
    const KeySlice hinted = key_slice(hinted_keys(pos + t, C), split, chunk, whole_keys);
    const int first = hinted.begin;
    const int last = hinted.whole ? hinted.end : min(hinted.end, first + 32);
    const int64_t row_bytes = int64_t(D) * int64_t(sizeof(T));
    const int lines = int((row_bytes + 127) / 128);
    for (int i = threadIdx.x; i < 2 * lines * (last - first); i += blockDim.x) {
      const int key = first + i / (2 * lines), line = (i / 2) % lines;
      const T* base = (i % 2 ? v : k) + hk * head_stride + int64_t(key) * token_stride;
      prefetch_l2(reinterpret_cast<const unsigned char*>(base) + int64_t(line) * 128);
    }
  }
  grid_launch_dependents();
  grid_dependency_wait();
  const int n_kv = keys_seen(pos[t], C, error_flag);
  // A short context runs whole in split 0 (the other splits leave at once): the split handshake
  // and combine cost more than its keys (1B decode on an H100: ~5 us a layer).
  const auto [begin, end, whole] = key_slice(n_kv, split, chunk, whole_keys);
  if (whole && split > 0) return;
  const int d0 = lane * kDpl;

  float qr[kMaxGroup][kDpl], acc[kMaxGroup][kDpl], m[kMaxGroup], l[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kDpl; ++i) {
      acc[g][i] = 0.0f;
      qr[g][i] = !kRope && g < n_heads && d0 + i < D
                     ? q[(int64_t(t) * Hq + h0 + g) * D + d0 + i] * scale
                     : 0.0f;
    }
  }
  if constexpr (kRope) {
    const int32_t position = pos[t];
    const bool owner = whole ? split == 0 : begin <= n_kv - 1 && n_kv - 1 < end;
#pragma unroll
    for (int i = 0; i < kDpl; i += 2) {
      const int dim = d0 + i;
      if (dim >= D) break;       // D is even: dim + 1 < D
      double c = 1.0, sn = 0.0;  // dims past n_rot pass as they are
      if (dim < rope.n_rot) rope_angle(dim / 2, position, rope.n_rot, rope.log_base, c, sn);
      auto rotate = [&](const float* x, float& y0, float& y1) {
        rope_rotate(x[dim], x[dim + 1], c, sn, y0, y1);
      };
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= n_heads) break;
        float y0, y1;
        rotate(q + int64_t(h0 + g) * D, y0, y1);
        qr[g][i] = y0 * scale;
        qr[g][i + 1] = y1 * scale;
        if (owner && warp == 0) {
          rope.q_out[int64_t(h0 + g) * D + dim] = y0;
          rope.q_out[int64_t(h0 + g) * D + dim + 1] = y1;
        }
      }
      if (owner && warp == 1) {
        float y0, y1;
        rotate(rope.k_src + int64_t(hk) * D, y0, y1);
        rope.k_out[int64_t(hk) * D + dim] = y0;
        rope.k_out[int64_t(hk) * D + dim + 1] = y1;
        if (n_kv > 0) {
          T* row = const_cast<T*>(k) + hk * head_stride + int64_t(n_kv - 1) * token_stride;
          row[dim] = T(y0);
          row[dim + 1] = T(y1);
        }
      }
      if (owner && warp == 2 && n_kv > 0) {
        T* row = const_cast<T*>(v) + hk * head_stride + int64_t(n_kv - 1) * token_stride;
        row[dim] = T(rope.v_src[int64_t(hk) * D + dim]);
        row[dim + 1] = T(rope.v_src[int64_t(hk) * D + dim + 1]);
      }
    }
    if (owner) __syncthreads();  // the rows are written before any warp reads them
  }
  const T* kh = k + hk * head_stride;
  const T* vh = v + hk * head_stride;
  // Each step takes kKeys keys per warp (their K and V rows in flight together) and forms the
  // kKeys x kMaxGroup scores in one transposed reduction: lane l holds the score of key l / 4
  // for head l % 4, and keeps the online-softmax state (m, l) of head l % 4.
  constexpr int kKeys = 32 / kMaxGroup;
  const int my_key = lane / kMaxGroup, my_head = lane % kMaxGroup;
  float m_lane = -INFINITY, l_lane = 0.0f;
  for (int j0 = begin + warp * kKeys; j0 < end; j0 += kWarps * kKeys) {
    Vec<T, kDpl> kr[kKeys], vr[kKeys];
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      const int j = min(j0 + u, end - 1);  // clamped rows are loaded but masked below
      kr[u] = load_raw<T, kDpl, kFull>(kh + j * token_stride, d0, D);
      vr[u] = load_raw<T, kDpl, kFull>(vh + j * token_stride, d0, D);
    }
    float dots[32];
#pragma unroll
    for (int u = 0; u < kKeys; ++u)
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        float p = 0.0f;
#pragma unroll
        for (int i = 0; i < kDpl; ++i) p += qr[g][i] * to_float(kr[u].x[i]);
        dots[u * kMaxGroup + g] = p;
      }
    // Every lane must join the shuffles; validity only masks the result.
    const float reduced = transpose_reduce(dots, lane);
    const bool valid = j0 + my_key < end && my_head < n_heads;
    const float score = valid ? reduced : -INFINITY;
    float mx = score;
#pragma unroll
    for (int o = kMaxGroup; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float m_new = fmaxf(m_lane, mx);
    // A head with no valid key yet keeps m = -inf; its weights stay 0.
    const float corr = m_new == -INFINITY ? 1.0f : __expf(m_lane - m_new);
    const float w = valid ? __expf(score - m_new) : 0.0f;
    float wsum = w;
#pragma unroll
    for (int o = kMaxGroup; o < 32; o <<= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, o);
    l_lane = l_lane * corr + wsum;
    m_lane = m_new;
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      const float c = __shfl_sync(0xffffffffu, corr, g);
#pragma unroll
      for (int i = 0; i < kDpl; ++i) acc[g][i] *= c;
#pragma unroll
      for (int u = 0; u < kKeys; ++u) {
        const float wu = __shfl_sync(0xffffffffu, w, u * kMaxGroup + g);
#pragma unroll
        for (int i = 0; i < kDpl; ++i) acc[g][i] += wu * to_float(vr[u].x[i]);
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = __shfl_sync(0xffffffffu, m_lane, g);
    l[g] = __shfl_sync(0xffffffffu, l_lane, g);
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (lane == 0) {
      s_m[warp][g] = m[g];
      s_l[warp][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < kDpl; ++i) {
      if (d0 + i < D) s_acc[warp][g][d0 + i] = acc[g][i];
    }
  }
  __syncthreads();

  // Combine the warps; with one split this is the answer, else this slice's partial result.
  const int stride = D + kPartialHeader;
  for (int idx = threadIdx.x; idx < n_heads * D; idx += blockDim.x) {
    const int g = idx / D, d = idx % D;
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w][g]);
    float L = 0.0f, A = 0.0f;
    if (mx != -INFINITY) {
      for (int w = 0; w < kWarps; ++w) {
        const float f = expf(s_m[w][g] - mx);
        L += s_l[w][g] * f;
        A += s_acc[w][g][d] * f;
      }
    }
    const int64_t h = h0 + g;
    if (splits == 1 || whole) {
      out[(int64_t(t) * Hq + h) * D + d] = L > 0.0f ? A / L : 0.0f;
    } else {
      float* part = partial + ((int64_t(t) * Hq + h) * splits + split) * stride;
      part[kPartialHeader + d] = A;
      if (d == 0) {
        part[0] = mx;
        part[1] = L;
      }
    }
  }
  if (splits == 1 || whole) return;
  uint32_t* counter = counters + int64_t(t) * gridDim.x + blockIdx.x;
  if (!last_to_arrive(counter, splits, s_last)) return;
  // Warp g finds head g's slice scales (one pass over m and l); then each warp sums a quarter
  // of the slices for every head with vector loads, and the warps' sums meet in shared memory.
  float* s_scale = &s_acc[0][0][0];  // reused: kMaxGroup * splits floats (splits <= kMaxSplits)
  if (warp < n_heads) {
    const float* parts = partial + (int64_t(t) * Hq + h0 + warp) * splits * stride;
    float mx = -INFINITY;
    for (int sp = lane; sp < splits; sp += 32) mx = fmaxf(mx, __ldcg(parts + sp * stride));
    mx = warp_max(mx);
    float L = 0.0f;
    for (int sp = lane; sp < splits; sp += 32) {
      const float f = mx == -INFINITY ? 0.0f : __expf(__ldcg(parts + sp * stride) - mx);
      L += __ldcg(parts + sp * stride + 1) * f;
      s_scale[warp * splits + sp] = f;
    }
    L = warp_sum(L);
    if (lane == 0) s_l[0][warp] = L;
  }
  __syncthreads();
  float sum[kMaxGroup][kDpl];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int i = 0; i < kDpl; ++i) sum[g][i] = 0.0f;
#pragma unroll 4
  for (int sp = warp; sp < splits; sp += kWarps) {
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= n_heads) break;
      const float* acc_s =
          partial + ((int64_t(t) * Hq + h0 + g) * splits + sp) * stride + kPartialHeader;
      const float f = s_scale[g * splits + sp];
      float v[kDpl];
      if constexpr (kFull && kDpl == 4) {
        const float4 x = __ldcg(reinterpret_cast<const float4*>(acc_s + d0));
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
      } else {
#pragma unroll
        for (int i = 0; i < kDpl; ++i) v[i] = d0 + i < D ? __ldcg(acc_s + d0 + i) : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < kDpl; ++i) sum[g][i] += f * v[i];
    }
  }
  __syncthreads();  // s_scale (aliasing s_acc) is no longer read
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int i = 0; i < kDpl; ++i) {
      if (d0 + i < D) s_acc[warp][g][d0 + i] = sum[g][i];
    }
  __syncthreads();
  for (int idx = threadIdx.x; idx < n_heads * D; idx += blockDim.x) {
    const int g = idx / D, d = idx % D;
    const float A = s_acc[0][g][d] + s_acc[1][g][d] + s_acc[2][g][d] + s_acc[3][g][d];
    const float L = s_l[0][g];
    out[(int64_t(t) * Hq + h0 + g) * D + d] = L > 0.0f ? A / L : 0.0f;
  }
  if (threadIdx.x == 0) *counter = 0;  // ready for the next launch (and graph replays)
}

AttentionPlan plan_attention(const TensorDesc& q, const TensorDesc& k, int sm_count) {
  const int64_t Hq = q.ne[1], T = q.ne[2], Hkv = k.ne[1], C = k.ne[2];
  const int group_slices = int((Hq / Hkv + kMaxGroup - 1) / kMaxGroup);
  const int64_t units = Hkv * group_slices * T;
  const int64_t target_blocks = int64_t(sm_count) * 2;
  int64_t splits = 1;
  if (units < target_blocks) {
    splits = std::min<int64_t>({(target_blocks + units - 1) / units, (C + 63) / 64, kMaxSplits});
    splits = std::max<int64_t>(splits, 1);
  }
  const int64_t chunk = (C + splits - 1) / splits;
  splits = (C + chunk - 1) / chunk;
  return AttentionPlan{group_slices, int(splits), int(chunk), kWholeKeys};
}

// The general kernel for node e; with `rope` (the match of run_rope_kv_attention) it also
// does the RoPE and cache writes before it, from the unrotated Q.
template <typename T, int kDpl>
void launch(const OpContext& ctx, const NodeExecution& e, const AttentionPlan& plan, bool full,
            const RopeKvMatch* rope) {
  const TensorDesc& q = *e.inputs[0].desc;
  const TensorDesc& k = *e.inputs[1].desc;
  const int64_t elem = int64_t(sizeof(T));
  dim3 grid(unsigned(k.ne[1] * plan.group_slices), unsigned(plan.splits), unsigned(q.ne[2]));
  AttentionRope r;
  if (rope) {
    const RopeKvParts& parts = rope->parts;
    r = AttentionRope{parts.part[1].src, parts.part[2].src, parts.part[0].out,
                      parts.part[1].out, rope->n_rot,       std::log(double(rope->freq_base))};
  }
  auto args = [&](auto kernel) {
    const float* qp = rope ? rope->parts.part[0].src : static_cast<const float*>(e.inputs[0].data);
    const T* kp = static_cast<const T*>(e.inputs[1].data);
    const T* vp = static_cast<const T*>(e.inputs[2].data);
    const int32_t* pp = static_cast<const int32_t*>(e.inputs[3].data);
    float* op = static_cast<float*>(e.output.data);
    float* partial = static_cast<float*>(ctx.scratch);
    ctx.check(
        launch_programmatic(ctx.stream, grid, dim3(kWarps * 32), 0, kernel, qp, kp, vp, pp, op,
                            int(q.ne[0]), int(q.ne[1]), int(k.ne[1]), int(k.ne[2]), k.nb[1] / elem,
                            k.nb[2] / elem, e.node->params.scale, plan.group_slices, plan.splits,
                            plan.chunk, plan.whole_keys, partial, ctx.counters, ctx.error_flag, r),
        "attention", "launch");
  };
  if constexpr (kDpl % 2 == 0) {
    if (rope) {
      return full ? args(attention_kernel<T, kDpl, true, true>)
                  : args(attention_kernel<T, kDpl, false, true>);
    }
  }
  if (full) {
    args(attention_kernel<T, kDpl, true, false>);
  } else {
    args(attention_kernel<T, kDpl, false, false>);
  }
}

template <typename T>
void launch_for_dim(const OpContext& ctx, const NodeExecution& e, const AttentionPlan& plan,
                    bool aligned, const RopeKvMatch* rope = nullptr) {
  const int64_t D = e.inputs[0].desc->ne[0];
  if (D <= 32) {
    launch<T, 1>(ctx, e, plan, aligned && D == 32, rope);
  } else if (D <= 64) {
    launch<T, 2>(ctx, e, plan, aligned && D == 64, rope);
  } else if (D <= 128) {
    launch<T, 4>(ctx, e, plan, aligned && D == 128, rope);
  } else {
    launch<T, 8>(ctx, e, plan, aligned && D == 256, rope);
  }
}

}  // namespace

size_t partial_bytes(const TensorDesc& q, const AttentionPlan& plan) {
  if (plan.splits == 1) return 0;
  return size_t(q.ne[2] * q.ne[1]) * size_t(plan.splits) * size_t(q.ne[0] + kPartialHeader) *
         sizeof(float);
}

AttentionPlan fit_to_context(const OpContext& ctx, const TensorDesc& q, const TensorDesc& k,
                             AttentionPlan plan) {
  const size_t counters_needed = size_t(k.ne[1] * plan.group_slices * q.ne[2]);
  if (plan.splits > 1 &&
      (counters_needed > ctx.counter_count || partial_bytes(q, plan) > ctx.scratch_bytes)) {
    plan = AttentionPlan{plan.group_slices, 1, int(k.ne[2]), 0};
  }
  return plan;
}

namespace {

// The general kernel for node e over its cache dtype and head dim, planned for this context; with
// `rope`, the RoPE and cache writes too (run_rope_kv_attention).
void launch_general(const OpContext& ctx, const NodeExecution& e,
                    const RopeKvMatch* rope = nullptr) {
  const TensorDesc& q = *e.inputs[0].desc;
  const TensorDesc& k = *e.inputs[1].desc;
  const AttentionPlan plan = fit_to_context(ctx, q, k, plan_attention(q, k, ctx.sm_count));
  // The loads may be 16-byte vectors.
  const bool aligned = is_aligned(e.inputs[1].data, 16) && is_aligned(e.inputs[2].data, 16) &&
                       k.nb[1] % 16 == 0 && k.nb[2] % 16 == 0;
  if (k.dtype == DType::F16) {
    launch_for_dim<__half>(ctx, e, plan, aligned, rope);
  } else {
    launch_for_dim<float>(ctx, e, plan, aligned, rope);
  }
}

// An upper bound over both kernels: which one runs is decided at launch.
size_t attention_scratch_bytes(const NodeExecution& e, int sm_count) {
  const TensorDesc& q = *e.inputs[0].desc;
  return std::max(partial_bytes(q, plan_attention(q, *e.inputs[1].desc, sm_count)),
                  decode_attention_scratch_bytes(e, sm_count));
}

void run_attention(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& q = *e.inputs[0].desc;
  if (q.ne[0] > kMaxDim) {
    throw_error(ErrorCode::Unsupported, ctx.state->id + " attention",
                "head dim " + std::to_string(q.ne[0]) + " exceeds " + std::to_string(kMaxDim));
  }
  if (try_decode_attention(ctx, e)) {
    ctx.check_launch("attention");
    return;
  }
  launch_general(ctx, e);
  ctx.check_launch("attention");
}

}  // namespace

bool run_rope_kv_attention(const OpContext& ctx, const NodeExecution& e, const RopeKvMatch& m) {
  const TensorDesc& q = *e.inputs[0].desc;
  const TensorDesc& k = *e.inputs[1].desc;
  // The general kernel's shapes with whole pairs in a lane and one slice per kv head; the
  // decode kernel's (head dim 128 over f16) keep their own launches.
  if (q.ne[0] <= 32 || q.ne[0] > kMaxDim || q.ne[1] % k.ne[1] != 0 ||
      q.ne[1] / k.ne[1] > kMaxGroup || decode_attention_takes(ctx, e)) {
    return false;
  }
  launch_general(ctx, e, &m);
  ctx.check_launch("rope + kv_write + attention");
  return true;
}

void add_attention_kernels(KernelTable<Kernel>& rows) {
  const Kernel attention{run_attention, attention_scratch_bytes};
  add_row(rows, OpKind::Attention, {DType::F32, DType::I32}, attention);
  add_row(rows, OpKind::Attention, {DType::F32, DType::F16, DType::I32}, attention);
}

}  // namespace tandem::cuda
