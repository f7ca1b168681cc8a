// ExpertMatMul (ggml's MUL_MAT_ID): out[:, j, t] = expert ids[j, t]'s matrix x b[:, j or 0, t],
// or with a map, expert map[ids[j, t]]'s, and zeros (no product) where that entry is negative.
// The (token, choice) pairs are grouped by expert and each chosen expert's weights multiply all
// of its pairs' columns: every expert's weights are read once per call, and experts nobody chose
// are not read at all. Q4_0 / Q8_0 weights take all experts in one pass over the pool (columns
// quantized once, then every (expert, row chunk) as one work item, claimed by the threads as
// they go); K-quant and float weights, and products too small for 8-bit activations, run one
// dense product per expert.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "../amx.h"
#include "ops.h"
#include "tandem/error.h"

namespace tandem::cpu {

namespace {

// Rows of one work item of the quantized pass: a multiple of the AMX panel and of kTileRows.
constexpr int64_t kItemRows = 64;

// Per calling thread, reused across calls so decode does not allocate.
struct ExpertScratch {
  std::vector<int8_t> qs, bp;
  std::vector<float> d, products, dap;
  std::vector<int32_t> bias;
  std::vector<int64_t> packed;                     // per expert: its first AMX column tile, or -1
  std::vector<std::pair<int32_t, int32_t>> items;  // (expert, first row)
};

// The quantized experts of one call: the pairs' columns quantized in expert order (column s is
// pair order[s]; skipped pairs are in no expert's bucket), then each work item multiplies kItemRows
// weight rows of one expert with all of that expert's columns (AMX tiles where the expert has a
// full tile of columns), into products [pairs, M] in expert order, copied to out by pair at the
// end. Decode (8 experts x 768 rows) was 16 pool dispatches of one expert each, ~35 GB/s of weights
// on 16 threads.
void quantized_experts(const OpContext& ctx, const TensorDesc& a, const uint8_t* abase,
                       const float* bdata, int64_t b_cols, int64_t k, int64_t tokens,
                       const std::vector<int64_t>& first, const std::vector<int64_t>& order,
                       float* out) {
  const Kernels& kern = ctx.k;
  const int64_t K = a.ne[0], M = a.ne[1], n_expert = a.ne[2];
  const int64_t pairs = int64_t(order.size()), nb = K / kQuantBlock;
  constexpr int64_t T = amx::kTile;
  thread_local ExpertScratch tls;
  ExpertScratch& s = tls;
  // One token whose every choice reads the same column (decode's gate and up products): that
  // column is quantized once, and every pair's products read activation column 0.
  const bool shared_column = b_cols == 1 && tokens == 1;
  const int64_t columns = shared_column ? 1 : pairs;
  s.qs.resize(size_t(columns * K));
  s.d.resize(size_t(columns * nb));
  s.bias.resize(size_t(columns * nb * kBiasLanes));
  s.products.resize(size_t(pairs * M));
  ctx.pool.parallel_for(
      columns, std::max<int64_t>(1, kElementwiseGrain / K), [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t p = shared_column ? 0 : order[size_t(c)], t = p / k, j = p % k;
          kern.quantize_activations(bdata + (t * b_cols + (b_cols == 1 ? 0 : j)) * K, K,
                                    s.qs.data() + c * K, s.d.data() + c * nb,
                                    s.bias.data() + c * nb * kBiasLanes);
        }
      });
  const QuantizedActivations act{s.qs.data(), s.d.data(), s.bias.data(), K};
  const bool amx =
      ctx.amx && (a.dtype == DType::Q4_0 || a.dtype == DType::Q8_0) && M >= T && !shared_column;
  // AMX: each expert with a full tile of columns gets its column tiles packed.
  s.packed.assign(size_t(n_expert), -1);
  int64_t tiles = 0;
  for (int64_t x = 0; amx && x < n_expert; ++x) {
    const int64_t n = first[size_t(x + 1)] - first[size_t(x)];
    if (n < kAmxMinCols) continue;
    s.packed[size_t(x)] = tiles;
    tiles += (n + T - 1) / T;
  }
  if (tiles > 0) {
    s.bp.resize(size_t(tiles * nb * 512));
    s.dap.resize(size_t(tiles * nb * T));
    ctx.pool.parallel_for(n_expert, 1, [&](int64_t x0, int64_t x1) {
      for (int64_t x = x0; x < x1; ++x) {
        if (s.packed[size_t(x)] < 0) continue;
        const int64_t p0 = first[size_t(x)], n = first[size_t(x + 1)] - p0;
        for (int64_t ct = 0; ct * T < n; ++ct) {
          const int64_t c = p0 + ct * T, at = s.packed[size_t(x)] + ct;
          amx::pack_activations(s.qs.data() + c * K, s.d.data() + c * nb,
                                int(std::min<int64_t>(T, n - ct * T)), K,
                                s.bp.data() + at * nb * 512, s.dap.data() + at * nb * T);
        }
      }
    });
  }
  s.items.clear();
  for (int64_t x = 0; x < n_expert; ++x) {
    if (first[size_t(x + 1)] == first[size_t(x)]) continue;
    for (int64_t m = 0; m < M; m += kItemRows) s.items.emplace_back(int32_t(x), int32_t(m));
  }
  const auto tile = quantized_tile(kern, a.dtype);
  ctx.pool.parallel_chunks(int64_t(s.items.size()), 1, [&](int64_t i0, int64_t i1) {
    std::vector<int8_t> wp;
    std::vector<float> wd, out_tile;
    bool configured = false;
    for (int64_t i = i0; i < i1; ++i) {
      const auto [x, m0] = s.items[size_t(i)];
      const int64_t p0 = first[size_t(x)], n = first[size_t(x) + 1] - p0;
      const int64_t m1 = std::min<int64_t>(M, m0 + kItemRows);
      const uint8_t* w = abase + x * a.nb[2];
      const size_t wrb = size_t(a.nb[1]);
      if (shared_column) {
        for (int64_t c = p0; c < p0 + n; ++c) {
          for_each_tile(m0, m1, 0, 1, [&](int64_t m, int rows, int64_t, int) {
            tile(w + size_t(m) * wrb, wrb, rows, act, 0, 1, s.products.data() + c * M + m, M);
          });
        }
        continue;
      }
      if (s.packed[size_t(x)] < 0) {
        for_each_tile(m0, m1, p0, p0 + n, [&](int64_t m, int rows, int64_t c, int cols) {
          tile(w + size_t(m) * wrb, wrb, rows, act, c, cols, s.products.data() + c * M + m, M);
        });
        continue;
      }
      if (!configured) {
        wp.resize(size_t(nb * T * 32));
        wd.resize(size_t(nb * T));
        out_tile.resize(size_t(T * T));
        amx::configure_tiles();
        configured = true;
      }
      for (int64_t m = m0; m < m1; m += T) {
        const int rows = int(std::min<int64_t>(T, M - m));
        amx::pack_weights(a.dtype == DType::Q4_0, w + size_t(m) * wrb, wrb, rows, nb, wp.data(),
                          wd.data());
        for (int64_t ct = 0; ct * T < n; ++ct) {
          const int64_t at = s.packed[size_t(x)] + ct;
          amx::tile_product(wp.data(), wd.data(), s.bp.data() + at * nb * 512,
                            s.dap.data() + at * nb * T, nb, out_tile.data());
          const int cols = int(std::min<int64_t>(T, n - ct * T));
          for (int c = 0; c < cols; ++c)
            for (int r = 0; r < rows; ++r) {
              s.products[size_t((p0 + ct * T + c) * M + m + r)] = out_tile[size_t(r * T + c)];
            }
        }
      }
    }
    if (configured) amx::release_tiles();
  });
  ctx.pool.parallel_for(pairs, std::max<int64_t>(1, kElementwiseGrain / M),
                        [&](int64_t c0, int64_t c1) {
                          for (int64_t c = c0; c < c1; ++c) {
                            std::memcpy(out + order[size_t(c)] * M, s.products.data() + c * M,
                                        size_t(M) * sizeof(float));
                          }
                        });
}

// The experts of a node's choices: ids[p], or with a map (the 4th input) map[ids[p]], where a
// negative entry skips the choice. Every choice is checked on construction (ids and map are
// data): an id must name a map entry (or an expert), and an entry an expert or none.
class ExpertChoices {
 public:
  explicit ExpertChoices(const NodeExecution& e);
  // The expert of choice p = t * k + j, negative where the choice is skipped (zeros).
  int32_t expert(int64_t p) const { return map_ ? map_[ids_[p]] : ids_[p]; }

 private:
  const int32_t* ids_;
  const int32_t* map_;
};

ExpertChoices::ExpertChoices(const NodeExecution& e)
    : ids_(static_cast<const int32_t*>(e.inputs[2].data)),
      map_(e.inputs.size() > 3 ? static_cast<const int32_t*>(e.inputs[3].data) : nullptr) {
  const int64_t n_expert = e.inputs[0].desc->ne[2];
  const int64_t n_ids = map_ ? e.inputs[3].desc->ne[0] : n_expert;
  for (int64_t p = 0; p < e.inputs[2].desc->elements(); ++p) {
    if (ids_[p] < 0 || ids_[p] >= n_ids) {
      throw_error(
          ErrorCode::InvalidArgument, "cpu expert_matmul",
          "expert id " + std::to_string(ids_[p]) + " is not in [0, " + std::to_string(n_ids) + ")");
    }
    if (map_ && map_[ids_[p]] >= n_expert) {
      throw_error(ErrorCode::InvalidArgument, "cpu expert_matmul",
                  "map entry " + std::to_string(map_[ids_[p]]) + " of expert id " +
                      std::to_string(ids_[p]) + " is not in [0, " + std::to_string(n_expert) +
                      ") nor negative (skipped)");
    }
  }
}

void run_expert_matmul(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc &a = *e.inputs[0].desc, &b = *e.inputs[1].desc, &id = *e.inputs[2].desc;
  const auto* abase = static_cast<const uint8_t*>(e.inputs[0].data);
  const auto* bdata = static_cast<const float*>(e.inputs[1].data);
  const ExpertChoices choices(e);
  auto* out = static_cast<float*>(e.output.data);
  const int64_t K = a.ne[0], M = a.ne[1], n_expert = a.ne[2], k = id.ne[0], T = id.ne[1];
  const int64_t pairs = k * T;

  // Pairs sorted by expert (counting sort, stable: token order within an expert); a skipped
  // pair is in no bucket, its output column zeros.
  std::vector<int64_t> first(static_cast<size_t>(n_expert + 1), 0);
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t x = choices.expert(p);
    if (x >= 0) {
      ++first[size_t(x) + 1];
    } else {
      std::fill(out + p * M, out + (p + 1) * M, 0.0f);
    }
  }
  for (int64_t x = 0; x < n_expert; ++x) first[size_t(x + 1)] += first[size_t(x)];
  if (first[size_t(n_expert)] == 0) return;  // every choice skipped
  std::vector<int64_t> order(static_cast<size_t>(first[size_t(n_expert)]));
  std::vector<int64_t> next(first.begin(), first.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t x = choices.expert(p);
    if (x >= 0) order[size_t(next[size_t(x)]++)] = p;
  }

  const bool quantized = dtype_traits(a.dtype).is_quantized;
  if ((a.dtype == DType::Q4_0 || a.dtype == DType::Q8_0) && int8_activations(M, 1)) {
    quantized_experts(ctx, a, abase, bdata, b.ne[1], k, T, first, order, out);
    return;
  }
  int64_t widest = 0;
  for (int64_t x = 0; x < n_expert; ++x) {
    widest = std::max(widest, first[size_t(x + 1)] - first[size_t(x)]);
  }
  std::vector<float> columns(static_cast<size_t>(widest * K)), products(size_t(widest * M));
  for (int64_t x = 0; x < n_expert; ++x) {
    const int64_t p0 = first[size_t(x)], n = first[size_t(x + 1)] - p0;
    if (n == 0) continue;
    // The pair p = t * k + j reads b column j (or 0 when b has one column per token) of token t.
    const float* src = nullptr;
    if (b.ne[1] == k && n == 1) {
      src = bdata + order[size_t(p0)] * K;  // one column, already contiguous
    } else {
      for (int64_t c = 0; c < n; ++c) {
        const int64_t p = order[size_t(p0 + c)], t = p / k, j = p % k;
        const float* col = bdata + (t * b.ne[1] + (b.ne[1] == 1 ? 0 : j)) * K;
        std::copy(col, col + K, columns.begin() + c * K);
      }
      src = columns.data();
    }
    const uint8_t* w = abase + x * a.nb[2];
    if (quantized && !int8_activations(M, 1)) {
      // Fewer than 16 rows: f32 activations whatever the pairs, as the CUDA backend does (an
      // expert's columns may be one token's, repeated once per choice: 2 rows x 8 pairs of 2
      // tokens are 4 distinct outputs, too few to average 8-bit rounding out).
      exact_matmul_2d(ctx.k, a.dtype, w, size_t(a.nb[1]), src, products.data(), M, n, K);
    } else if (quantized) {
      quantized_matmul_2d(ctx, a.dtype, w, size_t(a.nb[1]), src, products.data(), M, n, K);
    } else {
      float_matmul_2d(ctx, a.dtype, w, src, products.data(), M, n, K);
    }
    for (int64_t c = 0; c < n; ++c) {
      const float* from = products.data() + c * M;
      std::copy(from, from + M, out + order[size_t(p0 + c)] * M);
    }
  }
}

// Rows of one work item of a one-token group's gate and up (a multiple of kTileRows): their
// 8 x 768 rows are 192 items (two matrices each).
constexpr int64_t kGroupItemRows = 32;
// Rows of one work item of the down product (one expert's): 8 experts x 2048 rows are 128
// items, each 55 KB of one expert's weights in a row (items of 32 rows of all 8 experts read
// 8 runs of 14 KB: 57-66 GB/s on 16 threads where gate and up read 87).
constexpr int64_t kDownItemRows = 128;

// Whether x's bytes share memory with e's map (never without one).
bool overlaps_map(const TensorRef& x, const NodeExecution& e) {
  return e.inputs.size() > 3 && overlaps(x, e.inputs[3]);
}

// Whether two ExpertMatMuls read their experts through one map (the same memory), or neither
// has one: their choices then name the same experts.
bool same_map(const NodeExecution& x, const NodeExecution& y) {
  if (x.inputs.size() != y.inputs.size()) return false;
  return x.inputs.size() < 4 || (x.inputs[3].data == y.inputs[3].data &&
                                 x.inputs[3].desc->ne[0] == y.inputs[3].desc->ne[0]);
}

// A one-token ExpertMatMul of Q4_0 / Q8_0 experts with 8-bit activations: b [K, 1 or k, 1],
// ids [k, 1], a contiguous map or none, out [M, k, 1], none sharing memory with another.
bool one_token_experts(const NodeExecution& e) {
  if (e.node->op != OpKind::ExpertMatMul || e.inputs.size() < 3 || e.inputs.size() > 4) {
    return false;
  }
  if (e.inputs.size() == 4 && (e.inputs[3].desc->dtype != DType::I32 ||
                               !e.inputs[3].desc->is_contiguous() || overlaps_map(e.output, e))) {
    return false;
  }
  const TensorDesc &a = *e.inputs[0].desc, &b = *e.inputs[1].desc, &id = *e.inputs[2].desc;
  const TensorDesc& out = *e.output.desc;
  const int64_t k = id.ne[0];
  return (a.dtype == DType::Q4_0 || a.dtype == DType::Q8_0) && b.dtype == DType::F32 &&
         id.dtype == DType::I32 && out.dtype == DType::F32 && a.ne[3] == 1 && b.ne[0] == a.ne[0] &&
         (b.ne[1] == 1 || b.ne[1] == k) && b.ne[2] * b.ne[3] == 1 &&
         id.ne[1] * id.ne[2] * id.ne[3] == 1 && out.ne[0] == a.ne[1] && out.ne[1] == k &&
         out.ne[2] * out.ne[3] == 1 && b.is_contiguous() && out.is_contiguous() &&
         id.is_contiguous() && int8_activations(a.ne[1], 1) && !overlaps(e.output, e.inputs[1]) &&
         !overlaps(e.output, e.inputs[2]);
}

// y reads nothing x writes, or is x's own memory (an op run in place over its input).
bool disjoint_or_same(const TensorRef& x, const TensorRef& y) {
  return !overlaps(x, y) || (x.data == y.data && x.desc->bytes() == y.desc->bytes());
}

// Gate and up (and their SwiGLU): every item multiplies kGroupItemRows rows of one chosen
// expert's gate and up matrices with the token's column; a skipped choice's items give zeros.
void gate_up_group(const OpContext& ctx, std::span<const NodeExecution> group) {
  const NodeExecution &g = group[0], &u = group[1];
  const TensorDesc& a = *g.inputs[0].desc;
  const int64_t K = a.ne[0], M = a.ne[1], k = g.inputs[2].desc->ne[0];
  const ExpertChoices choices(g);  // up's too: the same ids and map
  const QuantizedActivations act =
      quantize_columns(ctx, static_cast<const float*>(g.inputs[1].data), K, 1);
  const auto tile = quantized_tile(ctx.k, a.dtype);
  const auto* wg = static_cast<const uint8_t*>(g.inputs[0].data);
  const auto* wu = static_cast<const uint8_t*>(u.inputs[0].data);
  auto* gate = static_cast<float*>(g.output.data);
  auto* up = static_cast<float*>(u.output.data);
  float* s = group.size() == 3 ? static_cast<float*>(group[2].output.data) : nullptr;
  const size_t wrb = size_t(a.nb[1]);
  const int64_t chunks = (M + kGroupItemRows - 1) / kGroupItemRows;
  ctx.pool.parallel_chunks(k * chunks, 1, [&](int64_t i0, int64_t i1) {
    float gv[kGroupItemRows], uv[kGroupItemRows];
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t j = i / chunks, m0 = (i % chunks) * kGroupItemRows;
      const int64_t m1 = std::min(M, m0 + kGroupItemRows), n = m1 - m0, at = j * M + m0;
      const int32_t x = choices.expert(j);
      if (x < 0) {
        // Zeros, and their SwiGLU by the same kernel as the node alone runs over them.
        std::fill(gv, gv + n, 0.0f);
        std::fill(uv, uv + n, 0.0f);
      } else {
        const uint8_t* xg = wg + x * g.inputs[0].desc->nb[2];
        const uint8_t* xu = wu + x * u.inputs[0].desc->nb[2];
        for_each_tile(m0, m1, 0, 1, [&](int64_t m, int rows, int64_t, int) {
          tile(xg + size_t(m) * wrb, wrb, rows, act, 0, 1, gv + (m - m0), kGroupItemRows);
          tile(xu + size_t(m) * wrb, wrb, rows, act, 0, 1, uv + (m - m0), kGroupItemRows);
        });
      }
      std::copy(gv, gv + n, gate + at);
      std::copy(uv, uv + n, up + at);
      if (s) ctx.k.swiglu(gv, uv, s + at, n);
    }
  });
}

// Down and MoeCombine: every item multiplies kDownItemRows rows of one chosen expert's down
// matrix with that choice's column (a long run of one expert's rows, as a dense product reads
// them), or zeros for a skipped choice; the item that completes a row range sums its k products
// by the router's weights.
void down_combine_group(const OpContext& ctx, std::span<const NodeExecution> group) {
  const NodeExecution &d = group[0], &c = group[1];
  const TensorDesc& a = *d.inputs[0].desc;
  const int64_t K = a.ne[0], M = a.ne[1], k = d.inputs[2].desc->ne[0];
  const ExpertChoices choices(d);
  const QuantizedActivations act =
      quantize_columns(ctx, static_cast<const float*>(d.inputs[1].data), K, k);
  const std::vector<float> weights(static_cast<const float*>(c.inputs[1].data),
                                   static_cast<const float*>(c.inputs[1].data) + k);
  const auto tile = quantized_tile(ctx.k, a.dtype);
  const auto* w = static_cast<const uint8_t*>(d.inputs[0].data);
  auto* products = static_cast<float*>(d.output.data);
  auto* out = static_cast<float*>(c.output.data);
  const size_t wrb = size_t(a.nb[1]);
  const int64_t chunks = (M + kDownItemRows - 1) / kDownItemRows;
  // Products done per row range: the calling thread's, reused (no allocation a token).
  thread_local std::vector<int64_t> tls_done;
  std::vector<int64_t>& done = tls_done;
  done.assign(size_t(chunks), 0);
  ctx.pool.parallel_chunks(k * chunks, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t j = i / chunks, r = i % chunks;
      const int64_t m0 = r * kDownItemRows, m1 = std::min(M, m0 + kDownItemRows), n = m1 - m0;
      const int32_t x = choices.expert(j);
      if (x < 0) {
        std::fill(products + j * M + m0, products + j * M + m1, 0.0f);
      } else {
        const uint8_t* wx = w + x * a.nb[2];
        for_each_tile(m0, m1, 0, 1, [&](int64_t m, int rows, int64_t, int) {
          tile(wx + size_t(m) * wrb, wrb, rows, act, j, 1, products + j * M + m, M);
        });
      }
      if (std::atomic_ref(done[size_t(r)]).fetch_add(1, std::memory_order_acq_rel) != k - 1) {
        continue;
      }
      // In order, as MoeCombine sums: the first scaled, the others added one by one.
      ctx.k.scale(products + m0, weights[0], out + m0, n);
      for (int64_t e = 1; e < k; ++e) {
        ctx.k.axpy_f32(weights[size_t(e)], products + e * M + m0, out + m0, n);
      }
    }
  });
}

}  // namespace

size_t expert_group_size(const OpContext& /*ctx*/, std::span<const NodeExecution> execs) {
  if (execs.size() < 2 || !one_token_experts(execs[0])) return 1;
  const NodeExecution &e0 = execs[0], &e1 = execs[1];
  const TensorDesc& a = *e0.inputs[0].desc;
  const int64_t k = e0.inputs[2].desc->ne[0];
  if (e0.inputs[1].desc->ne[1] == 1) {
    // Gate and up: the same column, ids and map (or none), matrices of one shape and dtype,
    // outputs apart.
    const TensorDesc& a1 = *e1.inputs[0].desc;
    if (!one_token_experts(e1) || e1.inputs[1].data != e0.inputs[1].data ||
        e1.inputs[1].desc->ne[1] != 1 || e1.inputs[2].data != e0.inputs[2].data ||
        e1.inputs[2].desc->ne[0] != k || !same_map(e0, e1) || a1.dtype != a.dtype ||
        a1.ne[0] != a.ne[0] || a1.ne[1] != a.ne[1] || a1.ne[2] != a.ne[2] || a1.nb[1] != a.nb[1] ||
        overlaps(e0.output, e1.output) || overlaps(e1.output, e0.inputs[1]) ||
        overlaps(e1.output, e0.inputs[2]) || overlaps(e0.output, e1.inputs[1]) ||
        overlaps(e0.output, e1.inputs[2])) {
      return 1;
    }
    if (execs.size() < 3) return 2;
    const NodeExecution& e2 = execs[2];
    const bool swiglu =
        e2.node->op == OpKind::SwiGlu && e2.inputs.size() == 2 &&
        e2.inputs[0].data == e0.output.data && e2.inputs[1].data == e1.output.data &&
        e2.output.desc->dtype == DType::F32 &&
        e2.output.desc->elements() == e0.output.desc->elements() &&
        e2.output.desc->is_contiguous() && !overlaps(e2.output, e0.inputs[1]) &&
        !overlaps(e2.output, e0.inputs[2]) && !overlaps_map(e2.output, e0) &&
        disjoint_or_same(e0.output, e2.output) && disjoint_or_same(e1.output, e2.output);
    return swiglu ? 3 : 2;
  }
  // Down and MoeCombine of its products by k weights of one token.
  const bool combine = e1.node->op == OpKind::MoeCombine && e1.inputs.size() == 2 &&
                       e1.inputs[0].data == e0.output.data &&
                       e1.inputs[1].desc->dtype == DType::F32 &&
                       e1.inputs[1].desc->elements() == k && e1.output.desc->dtype == DType::F32 &&
                       e1.output.desc->elements() == a.ne[1] && e1.output.desc->is_contiguous() &&
                       !overlaps(e1.output, e0.inputs[1]) && !overlaps(e1.output, e0.inputs[2]) &&
                       !overlaps_map(e1.output, e0) && !overlaps(e1.output, e1.inputs[1]) &&
                       (e1.output.data == e0.output.data || !overlaps(e1.output, e0.output));
  return combine ? 2 : 1;
}

void expert_group(const OpContext& ctx, std::span<const NodeExecution> group) {
  if (group[0].inputs[1].desc->ne[1] == 1) {
    gate_up_group(ctx, group);
  } else {
    down_combine_group(ctx, group);
  }
}

void add_expert_matmul_kernels(KernelTable<Kernel>& rows) {
  for (DType d : float_dtypes()) {
    rows.add(OpKind::ExpertMatMul, {d, DType::F32, DType::I32}, run_expert_matmul);
  }
  rows.add(OpKind::ExpertMatMul, {DType::Q8_0, DType::F32, DType::I32}, run_expert_matmul);
  rows.add(OpKind::ExpertMatMul, {DType::Q4_0, DType::F32, DType::I32}, run_expert_matmul);
  for (DType d : kKQuantDTypes) {
    rows.add(OpKind::ExpertMatMul, {d, DType::F32, DType::I32}, run_expert_matmul);
  }
}

}  // namespace tandem::cpu
