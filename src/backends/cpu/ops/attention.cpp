// Causal grouped-query attention over the KV cache in one pass (online softmax). A task owns
// (token, kv head, chunk of cache positions) and serves every query head of that kv head, so
// each K/V row is read from memory once per group; a decode step with few kv heads still
// splits over threads by chunks of the context. Chunks' partial states merge at the end.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "ops.h"

namespace tandem::cpu {

namespace {

constexpr int64_t kKeyBlock = 64;       // keys scored together (their K/V rows stay in L1)
constexpr int64_t kMinChunkKeys = 256;  // below this a chunk's merge costs more than it saves

// One query head's running softmax over a range of keys.
struct PartialState {
  float max = -INFINITY;
  float sum = 0.0f;
};

void run_attention(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& q = *e.inputs[0].desc;
  const TensorDesc& k = *e.inputs[1].desc;
  const auto* qd = static_cast<const float*>(e.inputs[0].data);
  const void* kd = e.inputs[1].data;
  const void* vd = e.inputs[2].data;
  const auto* pos = static_cast<const int32_t*>(e.inputs[3].data);
  auto* out = static_cast<float*>(e.output.data);
  const int64_t D = q.ne[0], Hq = q.ne[1], T = q.ne[2], Hkv = k.ne[1], C = k.ne[2];
  const int64_t group = Hq / Hkv;
  const float scale = e.node->params.scale;
  const bool half = k.dtype == DType::F16;
  check_positions("cpu attention", pos, T, C);
  const Kernels& kn = ctx.k;

  int64_t max_keys = 0;
  for (int64_t t = 0; t < T; ++t) max_keys = std::max<int64_t>(max_keys, int64_t(pos[t]) + 1);
  const int64_t want = (2 * int64_t(ctx.pool.size()) + T * Hkv - 1) / (T * Hkv);
  const int64_t chunks =
      std::max<int64_t>(1, std::min(want, (max_keys + kMinChunkKeys - 1) / kMinChunkKeys));
  const int64_t chunk_keys = (max_keys + chunks - 1) / chunks;

  // Per (token, kv head, chunk, head of the group): the state and the unnormalized output;
  // the heads of a group sit next to each other so the kernels serve them in one call. With one
  // chunk the output itself accumulates (the same index) and no merge pass runs.
  const bool single_chunk = chunks == 1;
  std::vector<PartialState> states(single_chunk ? 0 : size_t(T * Hq * chunks));
  std::vector<float> partial(single_chunk ? 0 : size_t(T * Hq * chunks * D));
  auto slot = [&](int64_t t, int64_t h, int64_t c) {
    return size_t(((t * Hkv + h / group) * chunks + c) * group + h % group);
  };
  const int64_t row_stride = Hkv * D;  // elements between cache positions

  // Every thread claims items one at a time, the last tokens (most keys, in a prefill) first: a
  // prefill's token t reads t + 1 keys, and contiguous ranges of items left the last thread with
  // most of the work (twice the mean with many threads).
  const int64_t items = T * Hkv * chunks;
  std::atomic<int64_t> next_item{0};
  auto run_items = [&](int) {
    std::vector<float> score(static_cast<size_t>(kKeyBlock * group));
    std::vector<PartialState> own(single_chunk ? size_t(group) : 0);
    for (int64_t claimed; (claimed = next_item.fetch_add(1, std::memory_order_relaxed)) < items;) {
      const int64_t item = items - 1 - claimed;
      const int64_t chunk = item % chunks, hk = (item / chunks) % Hkv, t = item / (chunks * Hkv);
      const int64_t n_kv = int64_t(pos[t]) + 1;
      const int64_t j_begin = chunk * chunk_keys, j_end = std::min(n_kv, j_begin + chunk_keys);
      const size_t first = slot(t, hk * group, chunk);
      PartialState* st = single_chunk ? own.data() : states.data() + first;
      float* acc = (single_chunk ? out : partial.data()) + first * size_t(D);
      std::fill(st, st + group, PartialState{});
      std::fill(acc, acc + group * D, 0.0f);
      const float* qg = qd + (t * Hq + hk * group) * D;
      for (int64_t j0 = j_begin; j0 < j_end; j0 += kKeyBlock) {
        const int64_t nj = std::min(kKeyBlock, j_end - j0);
        const int64_t off = (j0 * Hkv + hk) * D;
        if (half) {
          kn.dot_rows_f16(static_cast<const uint16_t*>(kd) + off, row_stride, nj, qg, group, D,
                          score.data());
        } else {
          kn.dot_rows_f32(static_cast<const float*>(kd) + off, row_stride, nj, qg, group, D,
                          score.data());
        }
        for (int64_t g = 0; g < group; ++g) {
          float* sg = score.data() + g * nj;
          float block_max = -INFINITY;
          for (int64_t j = 0; j < nj; ++j) {
            sg[j] *= scale;
            block_max = std::max(block_max, sg[j]);
          }
          if (block_max > st[g].max) {
            if (st[g].sum > 0.0f) {
              const float correction = std::exp(st[g].max - block_max);
              st[g].sum *= correction;
              kn.scale(acc + g * D, correction, acc + g * D, D);
            }
            st[g].max = block_max;
          }
          for (int64_t j = 0; j < nj; ++j) sg[j] -= st[g].max;
          kn.exp_inplace(sg, nj);
          for (int64_t j = 0; j < nj; ++j) st[g].sum += sg[j];
        }
        if (half) {
          kn.accumulate_rows_f16(static_cast<const uint16_t*>(vd) + off, row_stride, nj,
                                 score.data(), group, acc, D);
        } else {
          kn.accumulate_rows_f32(static_cast<const float*>(vd) + off, row_stride, nj, score.data(),
                                 group, acc, D);
        }
      }
      if (single_chunk) {  // as the merge does for one chunk: its weight is exp(0) = 1
        for (int64_t g = 0; g < group; ++g) kn.scale(acc + g * D, 1.0f / st[g].sum, acc + g * D, D);
      }
    }
  };
  if (items == 1) {
    run_items(0);
  } else {
    ctx.pool.run(run_items);
  }
  if (single_chunk) return;

  // Merge the chunks of each (token, head): rescale every chunk to the overall maximum.
  ctx.pool.parallel_for(T * Hq, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t th = i0; th < i1; ++th) {
      const int64_t t = th / Hq, h = th % Hq;
      float* o = out + th * D;
      float overall = -INFINITY;
      for (int64_t c = 0; c < chunks; ++c) overall = std::max(overall, states[slot(t, h, c)].max);
      float total = 0.0f;
      std::fill(o, o + D, 0.0f);
      for (int64_t c = 0; c < chunks; ++c) {
        const PartialState& st = states[slot(t, h, c)];
        if (st.sum <= 0.0f) continue;  // a chunk beyond this token's last position
        const float w = std::exp(st.max - overall);
        total += st.sum * w;
        kn.axpy_f32(w, partial.data() + slot(t, h, c) * size_t(D), o, D);
      }
      kn.scale(o, 1.0f / total, o, D);
    }
  });
}

}  // namespace

void add_attention_kernels(KernelTable<Kernel>& rows) {
  rows.add(OpKind::Attention, {DType::F32, DType::I32}, run_attention);
  rows.add(OpKind::Attention, {DType::F32, DType::F16, DType::I32}, run_attention);
}

}  // namespace tandem::cpu
