// RoPE over x [head_dim, heads, tokens]: a cos/sin table of the step's positions (shared by the
// step's RoPE ops), then every head of every token; llama's adjacent pairs (Rope) or NeoX's
// halves (RopeNeox).
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops.h"

namespace tandem::cpu {

namespace {

// NeoX's pairs (x[i], x[i + n_rot/2]); cs holds cos, sin per pair as for rope_row.
void rope_neox_row(const float* x, const float* cs, int64_t n_rot, float* out, int64_t n) {
  const int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[i], x1 = x[i + half];
    out[i] = x0 * c - x1 * s;
    out[i + half] = x0 * s + x1 * c;
  }
  std::copy(x + n_rot, x + n, out + n_rot);
}

// The cos/sin pairs of every position of a step (n_rot floats each), kept while the positions,
// n_rot and base stay the same: the Q and K RoPE of every layer share one table, computed once.
struct RopeTable {
  int64_t n_rot = 0;
  float freq_base = 0.0f;
  std::vector<int32_t> positions;
  std::vector<float> cs;
};

const RopeTable& rope_table(ThreadPool& pool, const int32_t* pos, int64_t n, int64_t n_rot,
                            float freq_base) {
  thread_local RopeTable tls_table;  // the calling thread's: a backend's ops run on one thread
  RopeTable& table = tls_table;      // the caller's, also inside worker tasks
  if (table.n_rot == n_rot && table.freq_base == freq_base && table.positions.size() == size_t(n) &&
      std::equal(pos, pos + n, table.positions.begin())) {
    return table;
  }
  // Same double-precision frequencies as the reference, so only float rounding differs.
  std::vector<double> inv_freq(static_cast<size_t>(n_rot / 2));
  for (int64_t i = 0; i < n_rot; i += 2) {
    inv_freq[size_t(i / 2)] = std::pow(double(freq_base), -double(i) / double(n_rot));
  }
  table.n_rot = 0;  // invalid until filled (a throw below leaves no stale table)
  table.positions.assign(pos, pos + n);
  table.cs.resize(size_t(n * n_rot));
  pool.parallel_for(n, std::max<int64_t>(1, kElementwiseGrain / (8 * n_rot)),
                    [&](int64_t t0, int64_t t1) {
                      for (int64_t t = t0; t < t1; ++t) {
                        float* cs = table.cs.data() + t * n_rot;
                        for (int64_t i = 0; i < n_rot; i += 2) {
                          const double theta = double(pos[t]) * inv_freq[size_t(i / 2)];
                          cs[i] = float(std::cos(theta));
                          cs[i + 1] = float(std::sin(theta));
                        }
                      }
                    });
  table.n_rot = n_rot;
  table.freq_base = freq_base;
  return table;
}

void rope(const OpContext& ctx, const NodeExecution& e, bool neox) {
  const TensorDesc& a = *e.inputs[0].desc;
  const auto* x = static_cast<const float*>(e.inputs[0].data);
  const auto* pos = static_cast<const int32_t*>(e.inputs[1].data);
  auto* out = static_cast<float*>(e.output.data);
  const OpParams& p = e.node->params;
  const int64_t d = a.ne[0], heads = a.ne[1], n_rot = p.n_rot;
  const RopeTable& table = rope_table(ctx.pool, pos, a.ne[2], n_rot, p.freq_base);
  const int64_t tokens = a.ne[2] * a.ne[3];
  ctx.pool.parallel_for(
      tokens, std::max<int64_t>(1, kElementwiseGrain / (heads * d)), [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const float* cs = table.cs.data() + (t % a.ne[2]) * n_rot;
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t off = (t * heads + h) * d;
            (neox ? rope_neox_row : ctx.k.rope_row)(x + off, cs, n_rot, out + off, d);
          }
        }
      });
}

void run_rope(const OpContext& ctx, const NodeExecution& e) {
  rope(ctx, e, false);
}

void run_rope_neox(const OpContext& ctx, const NodeExecution& e) {
  rope(ctx, e, true);
}

}  // namespace

void add_rope_kernels(KernelTable<Kernel>& rows) {
  rows.add(OpKind::Rope, {DType::F32, DType::I32}, run_rope);
  rows.add(OpKind::RopeNeox, {DType::F32, DType::I32}, run_rope_neox);
}

}  // namespace tandem::cpu
