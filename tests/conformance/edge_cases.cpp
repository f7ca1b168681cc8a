// Edge cases: for every op and every dtype combination, shapes drawn (from fixed seeds, so the
// catalog is the same everywhere) around the sizes where the kernels split their work, each
// with its neighbours, plus 1 and odd sizes, decode (one token or column) and prefill batches,
// and inputs that are views (an offset, a row stride, a permutation) where the op reads them.
// Shapes stay small: the count is in the variety, not the size.
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "catalog.h"
#include "tandem/blocks.h"
#include "tandem/kernel_table.h"

namespace tandem::conformance {

namespace {

using Sizes = std::vector<int64_t>;

// The edges, from the kernels that split there:
// - 4: the CPU's output tiles (kTileRows x kTileCols); 8 and 16 floats: an AVX2 / AVX-512 vector;
// - 32: a Q8_0 / Q4_0 block (kQuantBlock) and a CUDA warp; 64: the CPU's row chunk (kRowChunk)
//   and attention key block;
// - 128, 256, 1024: CUDA block sizes (softmax and norm threads, elementwise and copy blocks);
//   256 is also a K-quant super-block (kSuperBlock) and the CUDA staged matvec's group.
const Sizes kVectorEdges{1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65};
const Sizes kRowEdges{127, 128, 129, 255, 256, 257, 1023, 1024, 1025};
const Sizes kFewRows{1, 2, 3, 4, 5, 7};

// Matrix products: inner dims K, weight rows M, activation columns N (batch: 1 is decode).
// N edges: 2 (the CPU's f16/bf16 matvec), 8 (CUDA's matvec columns, kMatvecMaxColumns) and 16
// (OpenBLAS and AMX from 16 columns); M x N around 16 outputs switches the quantized products
// between f32 and 8-bit activations (kMinOutputsForInt8Activations).
const Sizes kFloatK{1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129};
const Sizes kRowsM{1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65};
const Sizes kColsN{1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17};
// Whole Q8_0 / Q4_0 blocks, 1 to 17 of them; 256 and 512 take CUDA's staged matvec (K a
// multiple of its 256-element group), 224 and 288 its generic kernel.
const Sizes kBlockK{32, 64, 96, 160, 224, 256, 288, 480, 512, 544};
const Sizes kSuperK{256, 512, 768};

std::vector<DType> k_quant_dtypes() {
  return {std::begin(kKQuantDTypes), std::end(kKQuantDTypes)};
}

// A first dim valid for dtype: any for floats, whole blocks for the block formats.
int64_t draw_width(Draw& d, DType dtype) {
  if (is_k_quant(dtype)) return d.pick(kSuperK);
  if (quantized(dtype)) return d.pick(kBlockK);
  return d.percent(80) ? d.pick(kVectorEdges) : d.pick(kRowEdges);
}

// Draws `count` distinct cases from `one` (which returns false for a repeat).
template <class F>
void draw(Catalog& cat, int count, uint64_t seed, F&& one) {
  Draw d(seed);
  for (int added = 0, tries = 0; added < count && tries < count * 50; ++tries) {
    if (one(cat, d)) ++added;
  }
}

// Copy: contiguous sources of every dtype pair; for the float and integer formats also
// transposed, permuted, row-strided and offset views (the one op that reads strided inputs).
void copy_edges(Catalog& cat) {
  const std::vector<DType> types = convertible_dtypes();
  for (DType src : types) {
    for (DType dst : types) {
      const bool q = quantized(src) || quantized(dst);
      const std::string prefix = "copy/" + dt(src) + "_to_" + dt(dst) + "/edge_";
      const uint64_t seed = 0xC0B1 + uint64_t(src) * 64 + uint64_t(dst);
      draw(cat, 6, seed, [&](Catalog& c, Draw& d) {
        Shape s{q ? d.pick(kBlockK) : draw_width(d, src), d.pick(kFewRows)};
        if (d.percent(30)) s.push_back(d.pick({2, 3}));
        Graph g;
        g.copy(input(g, "x", src, s), dst);
        return c.add_drawn(prefix + dims(s), std::move(g));
      });
      if (quantized(src)) {
        // Rows of a larger tensor, at an offset (a quantized copy reads contiguous rows only).
        draw(cat, 2, seed + 1, [&](Catalog& c, Draw& d) {
          const int64_t w = d.pick(kBlockK), rows = d.pick({1, 2, 3, 5}), skip = d.pick({1, 2});
          const int64_t rb = int64_t(row_bytes(src, w));
          Graph g;
          const TensorId x = input(g, "x", src, {w, rows + skip + 1});
          g.copy(g.view(x, {w, rows}, {dtype_traits(src).block_bytes, rb}, skip * rb), dst);
          return c.add_drawn(prefix + "rows_" + std::to_string(skip) + "_to_" +
                                 std::to_string(skip + rows) + "_of_" + std::to_string(w) + "x" +
                                 std::to_string(rows + skip + 1),
                             std::move(g));
        });
      }
      if (q) continue;
      draw(cat, 5, seed + 2, [&](Catalog& c, Draw& d) {
        const int64_t es = dtype_traits(src).block_bytes;
        const int64_t n0 = d.pick(kVectorEdges), n1 = d.pick(kVectorEdges), n2 = d.pick({1, 2, 3});
        Graph g;
        std::string kind;
        switch (d.below(4)) {
          case 0:
            g.copy(g.transpose(input(g, "x", src, {n0, n1})), dst);
            kind = "transposed_" + std::to_string(n0) + "x" + std::to_string(n1);
            break;
          case 1: {
            std::array<int32_t, kMaxDims> axes{0, 1, 2, 3};
            std::array<int32_t, 3> three{0, 1, 2};
            const int64_t r = d.below(5);
            for (int64_t i = 0; i <= r; ++i) std::next_permutation(three.begin(), three.end());
            std::copy(three.begin(), three.end(), axes.begin());
            g.copy(g.permute(input(g, "x", src, {n0, n1, n2 + 1}), axes), dst);
            kind = "permuted" + std::to_string(axes[0]) + std::to_string(axes[1]) +
                   std::to_string(axes[2]) + "_" + dims({n0, n1, n2 + 1});
            break;
          }
          case 2: {  // a window: offset rows and columns, rows wider than the window
            const int64_t w = n0 + 3;
            g.copy(g.view(input(g, "x", src, {w, n1 + 2}), {n0, n1}, {es, w * es}, (w + 2) * es),
                   dst);
            kind = "window_" + std::to_string(n0) + "x" + std::to_string(n1);
            break;
          }
          default: {  // every other row of a 3-d tensor, dims 1 and 2 swapped
            const TensorId x = input(g, "x", src, {n0, 2 * n1, n2});
            const TensorId v =
                g.view(x, {n0, n1, n2}, {es, 2 * n0 * es, 2 * n0 * n1 * es}, n0 * es);
            g.copy(g.permute(v, {0, 2, 1, 3}), dst);
            kind = "strided_permuted_" + dims({n0, n1, n2});
          }
        }
        return c.add_drawn(prefix + kind, std::move(g));
      });
    }
  }
  for (DType d : {DType::I32, DType::I8}) {
    const std::string prefix = "copy/" + dt(d) + "_to_" + dt(d) + "/edge_";
    draw(cat, 4, 0xC0B2 + uint64_t(d), [&](Catalog& c, Draw& r) {
      const Shape s{r.pick(kVectorEdges), r.pick(kFewRows)};
      const bool t = r.percent(50);
      Graph g;
      const TensorId x = input(g, "x", d, s);
      g.copy(t ? g.transpose(x) : x, d);
      return c.add_drawn(prefix + (t ? "transposed_" : "") + dims(s), std::move(g));
    });
  }
}

void get_rows_edges(Catalog& cat) {
  std::vector<DType> types = convertible_dtypes();
  for (DType k : k_quant_dtypes()) types.push_back(k);
  for (DType dtype : types) {
    draw(cat, 8, 0x6E7 + uint64_t(dtype), [&](Catalog& c, Draw& d) {
      const int64_t w = draw_width(d, dtype), rows = d.pick({1, 2, 3, 5, 17, 33});
      const int64_t ids = d.pick({1, 2, 3, 7, 8, 9, 33});
      Graph g;
      const TensorId table = weight(g, "table", dtype, {w, rows});
      const TensorId id = input(g, "ids", DType::I32, {ids});
      g.get_rows(table, id);
      return c.add_drawn("get_rows/" + dt(dtype) + "/edge_" + std::to_string(w) + "x" +
                             std::to_string(rows) + "_ids" + std::to_string(ids),
                         std::move(g), {{id, Fill::RowIds, rows}});
    });
  }
}

// One product a [K, M, a2, a3] x b [K, N, b2, b3]; batches broadcast a over b.
bool add_product(Catalog& cat, DType a_type, int64_t K, int64_t M, int64_t N, int64_t a2,
                 int64_t b2, int64_t a3, int64_t b3) {
  Graph g;
  g.matmul(weight(g, "a", a_type, {K, M, a2, a3}), input(g, "b", DType::F32, {K, N, b2, b3}));
  std::string name = std::string(quantized(a_type) ? "quantized_matmul/" : "matmul/") + dt(a_type) +
                     ".f32/edge_k" + std::to_string(K) + "_m" + std::to_string(M) + "_n" +
                     std::to_string(N);
  if (b2 * b3 > 1) name += "_batch" + dims({a2, a3}) + "_of_" + dims({b2, b3});
  return cat.add_drawn(std::move(name), std::move(g));
}

// Views as operands: the weights a window of rows of a larger matrix (one part of a fused
// projection), the activations some columns of a larger batch, or reshaped from a flat vector.
void product_view_cases(Catalog& cat, DType a_type, int64_t K, int64_t M, int64_t N) {
  const std::string prefix =
      std::string(quantized(a_type) ? "quantized_matmul/" : "matmul/") + dt(a_type) + ".f32/";
  const int64_t rb = int64_t(row_bytes(a_type, K)), eb = dtype_traits(a_type).block_bytes;
  {
    Graph g;
    const TensorId a = weight(g, "a", a_type, {K, 3 * M});
    g.matmul(g.view(a, {K, M}, {eb, rb}, M * rb), input(g, "b", DType::F32, {K, N}));
    cat.add_drawn(prefix + "weight_rows_view_k" + std::to_string(K) + "_m" + std::to_string(M) +
                      "_of_" + std::to_string(3 * M) + "_n" + std::to_string(N),
                  std::move(g));
  }
  {
    Graph g;
    const TensorId b = input(g, "b", DType::F32, {K, N + 3});
    g.matmul(weight(g, "a", a_type, {K, M}), g.view(b, {K, N}, {4, 4 * K}, 3 * 4 * K));
    cat.add_drawn(prefix + "activation_columns_view_k" + std::to_string(K) + "_m" +
                      std::to_string(M) + "_n" + std::to_string(N) + "_of_" + std::to_string(N + 3),
                  std::move(g));
  }
  {
    Graph g;
    const TensorId b = input(g, "b", DType::F32, {K * N});
    g.matmul(weight(g, "a", a_type, {K, M}), g.reshape(b, {K, N}));
    cat.add_drawn(prefix + "reshaped_activations_k" + std::to_string(K) + "_m" + std::to_string(M) +
                      "_n" + std::to_string(N),
                  std::move(g));
  }
}

void draw_products(Catalog& cat, DType a_type, const Sizes& ks, int count, uint64_t seed) {
  draw(cat, count, seed, [&](Catalog& c, Draw& d) {
    const int64_t K = d.pick(ks), M = d.pick(kRowsM), N = d.pick(kColsN);
    int64_t a2 = 1, b2 = 1, a3 = 1, b3 = 1;
    if (d.percent(20)) {
      b2 = d.pick({2, 3});
      a2 = d.percent(50) ? 1 : b2;
      if (d.percent(30)) {
        b3 = 2;
        a3 = d.pick({1, 2});
      }
    }
    return add_product(c, a_type, K, M, N, a2, b2, a3, b3);
  });
}

void matmul_edges(Catalog& cat) {
  for (DType d : float_dtypes()) {
    draw_products(cat, d, kFloatK, 36, 0x3A7 + uint64_t(d));
    // OpenBLAS takes f32 products of at least 16 columns, 64 rows and 64 inner elements.
    add_product(cat, d, 64, 64, 16, 1, 1, 1, 1);
    add_product(cat, d, 65, 65, 17, 1, 1, 1, 1);
    add_product(cat, d, 129, 63, 33, 1, 1, 1, 1);
    product_view_cases(cat, d, 33, 9, 5);
  }
  for (DType d : {DType::Q8_0, DType::Q4_0}) {
    draw_products(cat, d, kBlockK, 34, 0x3A8 + uint64_t(d));
    // Around 16 outputs: f32 activations below, 8-bit ones from there.
    for (int64_t M : {15, 16, 17}) add_product(cat, d, 64, M, 1, 1, 1, 1, 1);
    add_product(cat, d, 96, 5, 3, 1, 1, 1, 1);
    add_product(cat, d, 96, 4, 4, 1, 1, 1, 1);
    product_view_cases(cat, d, 256, 17, 2);
    product_view_cases(cat, d, 96, 5, 9);
  }
  for (DType d : k_quant_dtypes()) {
    draw_products(cat, d, kSuperK, 14, 0x3A9 + uint64_t(d));
    for (int64_t M : {15, 16}) add_product(cat, d, 256, M, 1, 1, 1, 1, 1);
    product_view_cases(cat, d, 256, 7, 3);
  }
}

// A contiguous input of `s` that is a view: rows at an offset into a larger tensor, or a flat
// vector reshaped; otherwise a plain leaf. The suffix names which.
TensorId maybe_view(Graph& g, Draw& d, const std::string& name, const Shape& s,
                    std::string& suffix) {
  const int64_t n0 = s[0], rows = s.size() > 1 ? s[1] : 1;
  switch (d.below(6)) {
    case 0:
      if (s.size() == 2) {
        suffix += "_" + name + "_rows_at_offset";
        return g.view(input(g, name, DType::F32, {n0, rows + 2}), {n0, rows}, {4, 4 * n0}, 4 * n0);
      }
      [[fallthrough]];
    case 1:
      if (s.size() == 2) {
        suffix += "_" + name + "_reshaped";
        return g.reshape(input(g, name, DType::F32, {n0 * rows}), {n0, rows});
      }
      [[fallthrough]];
    default:
      return input(g, name, DType::F32, s);
  }
}

Shape draw_elementwise_shape(Draw& d) {
  if (d.percent(10)) return {d.pick({16383, 16384, 16385})};  // the CPU's parallel grain
  Shape s{d.percent(75) ? d.pick(kVectorEdges) : d.pick(kRowEdges), d.pick(kFewRows)};
  if (d.percent(25)) s.push_back(d.pick({2, 3}));
  if (s.size() == 3 && d.percent(30)) s.push_back(2);
  return s;
}

void elementwise_edges(Catalog& cat) {
  for (OpKind op : {OpKind::Add, OpKind::Mul}) {
    draw(cat, 26, 0xE1E + uint64_t(op), [&](Catalog& c, Draw& d) {
      const Shape a = draw_elementwise_shape(d);
      // b: the same shape, or a divisor of it in each dim (1 broadcasts; others repeat).
      Shape b = a;
      std::string how = "same";
      switch (d.below(5)) {
        case 0:
          b = {a[0]};
          how = "row";
          break;
        case 1:
          b = {1};
          how = "scalar";
          break;
        case 2:
          b[0] = 1;
          how = "column";
          break;
        case 3:
          for (size_t i = 1; i < b.size(); ++i) b[i] = b[i] % 2 == 0 ? 2 : 1;
          how = "repeated";
          break;
        default:
          break;
      }
      if (b == a) how = "same";
      Graph g;
      std::string suffix;
      const TensorId x = maybe_view(g, d, "a", a, suffix);
      const TensorId y = b == a ? maybe_view(g, d, "b", b, suffix) : input(g, "b", DType::F32, b);
      op == OpKind::Add ? g.add(x, y) : g.mul(x, y);
      return c.add_drawn(
          std::string(op_name(op)) + "/f32/edge_" + dims(a) + "_by_" + how + "_" + dims(b) + suffix,
          std::move(g));
    });
  }
  for (OpKind op : {OpKind::Scale, OpKind::Silu, OpKind::Gelu, OpKind::SwiGlu}) {
    draw(cat, 15, 0xE1F + uint64_t(op), [&](Catalog& c, Draw& d) {
      const Shape s = draw_elementwise_shape(d);
      Graph g;
      std::string suffix;
      const TensorId x = maybe_view(g, d, "x", s, suffix);
      switch (op) {
        case OpKind::Scale:
          g.scale(x, -1.75f);
          break;
        case OpKind::Silu:
          g.silu(x);
          break;
        case OpKind::Gelu:
          g.gelu(x);
          break;
        default:
          g.swiglu(x, maybe_view(g, d, "up", s, suffix));
      }
      return c.add_drawn(std::string(op_name(op)) + "/f32/edge_" + dims(s) + suffix, std::move(g));
    });
  }
}

// Row lengths for the row-wise ops: vector and warp edges, and CUDA's thread counts per row
// (128 below 256, 256 below 1024, then 1024).
int64_t draw_row_length(Draw& d) {
  return d.percent(60) ? d.pick(kVectorEdges) : d.pick(kRowEdges);
}

void softmax_edges(Catalog& cat) {
  draw(cat, 32, 0x50F7, [&](Catalog& c, Draw& d) {
    const int64_t n = draw_row_length(d), rows = d.pick(kFewRows);
    Shape x{n, rows};
    if (d.percent(25)) x.push_back(d.pick({2, 3}));
    const int kind = int(d.below(3));  // 0: no mask, 1: a mask, 2: a causal mask
    const float scale = float(d.pick({1, 2, 3})) * 0.125f;
    Graph g;
    const TensorId in = input(g, "x", DType::F32, x);
    std::vector<LeafFill> fills;
    std::string name = "softmax/f32/edge_" + dims(x) + "_scale" + std::to_string(int(scale * 8));
    if (kind == 0 || (kind == 2 && n < rows)) {  // a causal mask needs a key per query
      g.softmax(in, kNoTensor, scale);
    } else {
      const Shape m{n, rows + (kind == 1 ? d.pick({0, 2}) : 0)};
      const TensorId mask = input(g, "mask", DType::F32, m);
      g.softmax(in, mask, scale);
      if (kind == 2) fills.push_back({mask, Fill::CausalMask, 0});
      name += (kind == 2 ? "_causal_mask" : "_mask") + dims(m);
    }
    return c.add_drawn(std::move(name), std::move(g), std::move(fills));
  });
}

void norm_edges(Catalog& cat) {
  draw(cat, 22, 0x4E0, [&](Catalog& c, Draw& d) {
    const Shape x{draw_row_length(d), d.pick(kFewRows), d.pick({1, 1, 2})};
    const bool w = d.percent(60);
    const float eps = d.percent(50) ? 1e-5f : 1e-6f;
    Graph g;
    g.rms_norm(input(g, "x", DType::F32, x), w ? weight(g, "w", DType::F32, {x[0]}) : kNoTensor,
               eps);
    return c.add_drawn("rms_norm/f32/edge_" + dims(x) + (w ? "_w" : "") + "_eps" +
                           std::to_string(int(std::lround(-std::log10(eps)))),
                       std::move(g));
  });
  draw(cat, 22, 0x4E1, [&](Catalog& c, Draw& d) {
    // At least 7 elements: the variance of fewer random values can vanish next to their mean,
    // which no float order of summation reproduces within the exact threshold.
    int64_t n = draw_row_length(d);
    while (n < 7) n = draw_row_length(d);
    const Shape x{n, d.pick(kFewRows), d.pick({1, 1, 2})};
    const int params = int(d.below(3));
    Graph g;
    g.layer_norm(input(g, "x", DType::F32, x),
                 params >= 1 ? weight(g, "w", DType::F32, {n}) : kNoTensor,
                 params >= 2 ? weight(g, "b", DType::F32, {n}) : kNoTensor, 1e-5f);
    return c.add_drawn(
        "layer_norm/f32/edge_" + dims(x) + (params >= 1 ? "_w" : "") + (params >= 2 ? "_b" : ""),
        std::move(g));
  });
}

void rope_edges(Catalog& cat) {
  draw(cat, 32, 0x20BE, [&](Catalog& c, Draw& d) {
    const int64_t dim =
        d.pick({2, 4, 6, 7, 8, 14, 16, 18, 30, 32, 33, 34, 62, 64, 65, 66, 80, 96, 126, 128, 130});
    const int64_t even = dim - dim % 2;
    const int32_t n_rot = int32_t(d.percent(60) ? even : std::max<int64_t>(2, even / 2 & ~1));
    const int64_t heads = d.pick({1, 2, 3, 5, 8}), tokens = d.pick({1, 2, 3, 7, 8, 9});
    const float base = float(d.pick({10000, 500000, 1000000}));
    const bool sequential = d.percent(50);
    Graph g;
    const TensorId x = input(g, "x", DType::F32, {dim, heads, tokens});
    const TensorId pos = input(g, "pos", DType::I32, {tokens});
    g.rope(x, pos, n_rot, base);
    return c.add_drawn("rope/f32.i32/edge_" + dims({dim, heads, tokens}) + "_rot" +
                           std::to_string(n_rot) + "_base" + std::to_string(int64_t(base)) +
                           (sequential ? "_sequential" : ""),
                       std::move(g),
                       {{pos, sequential ? Fill::SequentialPositions : Fill::RandomPositions,
                         d.pick({64, 4096, 32768})}});
  });
}

// Attention edges: head dims around CUDA's 32/64/128/256 lanes-per-thread steps and its f16
// decode kernel (head dim 128, at most 8 tokens, 4 query heads a block, 8-key tiles, 64 keys a
// round); groups around 4 query heads per kv head; contexts around the CPU's 64-key blocks and
// 256-key chunks and CUDA's 64-key splits.
void attention_edges(Catalog& cat) {
  for (DType kv : {DType::F32, DType::F16}) {
    draw(cat, 30, 0xA77E + uint64_t(kv), [&](Catalog& c, Draw& d) {
      const int64_t D =
          d.percent(30) ? 128 : d.pick({2, 4, 16, 31, 32, 33, 63, 64, 65, 96, 127, 129, 255, 256});
      const int64_t group = d.pick({1, 2, 3, 4, 5, 8}), hkv = d.pick({1, 2, 3});
      const int64_t tokens = d.pick({1, 1, 2, 7, 8, 9, 17});
      const int64_t context = std::max(
          tokens, d.pick({1, 7, 8, 9, 63, 64, 65, 127, 128, 129, 255, 256, 257, 300, 513}));
      // The reference's work, kept to a few million multiply-adds a case.
      if (D * group * hkv * tokens * context > (int64_t(4) << 20)) return false;
      const bool sequential = d.percent(75);
      Graph g;
      const TensorId q = input(g, "q", DType::F32, {D, group * hkv, tokens});
      const TensorId k = leaf(g, OpKind::KvCache, "k", kv, {D, hkv, context});
      const TensorId v = leaf(g, OpKind::KvCache, "v", kv, {D, hkv, context});
      const TensorId pos = input(g, "pos", DType::I32, {tokens});
      g.attention(q, k, v, pos, float(1.0 / std::sqrt(double(D))));
      return c.add_drawn(
          "attention/f32." + dt(kv) + "/edge_d" + std::to_string(D) + "_hq" +
              std::to_string(group * hkv) + "_hkv" + std::to_string(hkv) + "_t" +
              std::to_string(tokens) + "_c" + std::to_string(context) +
              (sequential ? "" : "_scattered"),
          std::move(g),
          {{pos, sequential ? Fill::SequentialPositions : Fill::RandomPositions, context}});
    });
  }
}

void dequantize_edges(Catalog& cat) {
  std::vector<DType> types{DType::Q8_0, DType::Q4_0, DType::F16, DType::BF16};
  for (DType k : k_quant_dtypes()) types.push_back(k);
  for (DType dtype : types) {
    draw(cat, 8, 0xDE0 + uint64_t(dtype), [&](Catalog& c, Draw& d) {
      Shape s{draw_width(d, dtype), d.pick(kFewRows)};
      if (d.percent(30)) s.push_back(d.pick({2, 3}));
      Graph g;
      g.dequantize(weight(g, "x", dtype, s));
      return c.add_drawn("dequantize/" + dt(dtype) + "/edge_" + dims(s), std::move(g));
    });
  }
}

void kv_write_edges(Catalog& cat) {
  for (DType kv : {DType::F32, DType::F16}) {
    draw(cat, 12, 0x4B5 + uint64_t(kv), [&](Catalog& c, Draw& d) {
      const int64_t D = d.pick({2, 4, 7, 8, 9, 31, 32, 33, 64, 65, 128, 129});
      const int64_t hkv = d.pick({1, 2, 3, 8}), tokens = d.pick({1, 1, 2, 5, 8, 9, 17});
      const int64_t context = std::max(tokens, d.pick({1, 9, 37, 64, 65, 129}));
      Graph g;
      const TensorId cache = leaf(g, OpKind::KvCache, "cache", kv, {D, hkv, context});
      const TensorId src = input(g, "src", DType::F32, {D, hkv, tokens});
      const TensorId pos = input(g, "pos", DType::I32, {tokens});
      g.kv_write(cache, src, pos);
      return c.add_drawn("kv_write/" + dt(kv) + ".f32.i32/edge_d" + std::to_string(D) + "_hkv" +
                             std::to_string(hkv) + "_c" + std::to_string(context) + "_t" +
                             std::to_string(tokens),
                         std::move(g), {{pos, Fill::SequentialPositions, context}});
    });
  }
}

}  // namespace

// RopeNeox at the drawn rope shapes' sizes: the pairs are half a rotated span apart.
void rope_neox_edges(Catalog& cat) {
  draw(cat, 16, 0x20BF, [&](Catalog& c, Draw& d) {
    const int64_t dim = d.pick({2, 4, 6, 7, 8, 16, 18, 32, 33, 64, 65, 80, 128, 130});
    const int64_t even = dim - dim % 2;
    const int32_t n_rot = int32_t(d.percent(60) ? even : std::max<int64_t>(2, even / 2 & ~1));
    const int64_t heads = d.pick({1, 2, 3, 5, 8}), tokens = d.pick({1, 2, 3, 7, 8, 9});
    Graph g;
    const TensorId x = input(g, "x", DType::F32, {dim, heads, tokens});
    const TensorId pos = input(g, "pos", DType::I32, {tokens});
    g.rope_neox(x, pos, n_rot, 1000000.0f);
    return c.add_drawn(
        "rope_neox/f32.i32/edge_" + dims({dim, heads, tokens}) + "_rot" + std::to_string(n_rot),
        std::move(g), {{pos, Fill::RandomPositions, 4096}});
  });
}

// Mixture of experts: routing over expert counts around the vector widths, and expert products
// whose per-expert column counts straddle the CPU's tiles and its switch to 8-bit activations
// (M x columns around 16), with b one column per token or one per chosen expert.
void moe_edges(Catalog& cat) {
  draw(cat, 12, 0x30E1, [&](Catalog& c, Draw& d) {
    const int64_t experts = d.pick({1, 2, 3, 4, 7, 8, 9, 16, 17, 60, 64, 128});
    const int64_t k = std::min(experts, d.pick({1, 2, 4, 8})), tokens = d.pick(kColsN);
    Graph g;
    g.moe_route(input(g, "logits", DType::F32, {experts, tokens}), int32_t(k));
    return c.add_drawn("moe_route/f32/edge_" + dims({experts, tokens}) + "_k" + std::to_string(k),
                       std::move(g));
  });
  auto products = [&](DType a_type, const Sizes& ks, int count, uint64_t seed) {
    draw(cat, count, seed, [&](Catalog& c, Draw& d) {
      const int64_t K = d.pick(ks), M = d.pick(kRowsM), experts = d.pick({1, 2, 3, 4, 8});
      const int64_t k = d.pick({1, 2, 3, 4}), tokens = d.pick(kColsN);
      const int64_t b_cols = d.percent(70) ? 1 : k;
      Graph g;
      const TensorId ids = input(g, "ids", DType::I32, {k, tokens});
      g.expert_matmul(weight(g, "a", a_type, {K, M, experts}),
                      input(g, "b", DType::F32, {K, b_cols, tokens}), ids);
      return c.add_drawn("expert_matmul/" + dt(a_type) + ".f32.i32/edge_a" + dims({K, M, experts}) +
                             "_b" + dims({K, b_cols, tokens}) + "_k" + std::to_string(k),
                         std::move(g), {{ids, Fill::RowIds, experts}});
    });
  };
  for (DType d : float_dtypes()) products(d, kFloatK, 8, 0x30E2 + uint64_t(d));
  for (DType d : {DType::Q8_0, DType::Q4_0}) products(d, kBlockK, 8, 0x30E3 + uint64_t(d));
  for (DType d : k_quant_dtypes()) products(d, kSuperK, 4, 0x30E4 + uint64_t(d));
}

void add_edge_cases(Catalog& cat) {
  copy_edges(cat);
  get_rows_edges(cat);
  matmul_edges(cat);
  elementwise_edges(cat);
  softmax_edges(cat);
  norm_edges(cat);
  rope_edges(cat);
  attention_edges(cat);
  dequantize_edges(cat);
  kv_write_edges(cat);
  rope_neox_edges(cat);
  moe_edges(cat);
}

}  // namespace tandem::conformance
