// The case catalog: every dtype combination the Graph builder accepts for every compute op,
// at hand-picked shapes of 1, odd sizes, non-multiples of 32 (where the dtype allows) and large
// sizes, then the edge cases drawn around the kernels' block and tile edges (edge_cases.cpp).
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "catalog.h"
#include "harness.h"
#include "tandem/kernel_table.h"

namespace tandem::conformance {

namespace {

constexpr DType kConvertible[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};
constexpr DType kFloat[] = {DType::F32, DType::F16, DType::BF16};
constexpr DType kQuantized[] = {DType::Q8_0, DType::Q4_0};
constexpr DType kCacheTypes[] = {DType::F32, DType::F16};

void copy_cases(Catalog& cat) {
  for (DType src : kConvertible) {
    for (DType dst : kConvertible) {
      const bool q = quantized(src) || quantized(dst);
      std::vector<Shape> shapes = q ? std::vector<Shape>{{32}, {96, 3}, {64, 5, 2}}
                                    : std::vector<Shape>{{1}, {37, 3}, {33, 5, 2}};
      if (cat.large()) shapes.push_back({4096, 64});
      const std::string prefix = "copy/" + dt(src) + "_to_" + dt(dst) + "/";
      for (const Shape& s : shapes) {
        Graph g;
        g.copy(input(g, "x", src, s), dst);
        cat.add(prefix + dims(s), std::move(g));
      }
      if (q) continue;
      {  // a transposed (strided) source
        Graph g;
        g.copy(g.transpose(input(g, "x", src, {5, 37})), dst);
        cat.add(prefix + "transposed_37x5", std::move(g));
      }
      {  // a view with an offset and a row stride wider than its rows
        Graph g;
        const int64_t es = dtype_traits(src).block_bytes;
        g.copy(g.view(input(g, "x", src, {40, 4}), {37, 3}, {es, 40 * es}, 2 * es), dst);
        cat.add(prefix + "view_37x3_of_40x4", std::move(g));
      }
    }
  }
  for (DType d : {DType::I32, DType::I8}) {
    const std::string prefix = "copy/" + dt(d) + "_to_" + dt(d) + "/";
    for (const Shape& s : std::vector<Shape>{{1}, {37, 3}}) {
      Graph g;
      g.copy(input(g, "x", d, s), d);
      cat.add(prefix + dims(s), std::move(g));
    }
    Graph g;
    g.copy(g.transpose(input(g, "x", d, {5, 37})), d);
    cat.add(prefix + "transposed_37x5", std::move(g));
  }
}

void get_rows_cases(Catalog& cat) {
  struct S {
    int64_t width, rows, ids;
  };
  for (DType d : kConvertible) {
    std::vector<S> shapes = quantized(d) ? std::vector<S>{{32, 5, 1}, {96, 11, 7}}
                                         : std::vector<S>{{1, 5, 1}, {37, 11, 7}};
    if (cat.large()) shapes.push_back({4096, 512, 33});
    for (const S& s : shapes) {
      Graph g;
      TensorId table = weight(g, "table", d, {s.width, s.rows});
      TensorId ids = input(g, "ids", DType::I32, {s.ids});
      g.get_rows(table, ids);
      cat.add("get_rows/" + dt(d) + "/" + std::to_string(s.width) + "x" + std::to_string(s.rows) +
                  "_ids" + std::to_string(s.ids),
              std::move(g), {{ids, Fill::RowIds, s.rows}});
    }
  }
  for (DType d : kKQuantDTypes) {
    std::vector<S> shapes{{256, 5, 1}, {512, 11, 7}};
    if (cat.large()) shapes.push_back({4096, 128, 33});
    for (const S& s : shapes) {
      Graph g;
      TensorId table = weight(g, "table", d, {s.width, s.rows});
      TensorId ids = input(g, "ids", DType::I32, {s.ids});
      g.get_rows(table, ids);
      cat.add("get_rows/" + dt(d) + "/" + std::to_string(s.width) + "x" + std::to_string(s.rows) +
                  "_ids" + std::to_string(s.ids),
              std::move(g), {{ids, Fill::RowIds, s.rows}});
    }
  }
}

void matmul_cases(Catalog& cat) {
  struct S {
    Shape a, b;
  };
  auto run = [&](DType d, const std::vector<S>& shapes) {
    for (const S& s : shapes) {
      Graph g;
      g.matmul(weight(g, "a", d, s.a), input(g, "b", DType::F32, s.b));
      cat.add(std::string(quantized(d) ? "quantized_matmul/" : "matmul/") + dt(d) + ".f32/a" +
                  dims(s.a) + "_b" + dims(s.b),
              std::move(g));
    }
  };
  for (DType d : kFloat) {
    std::vector<S> shapes{{{1, 1}, {1, 1}},          {{37, 17}, {37, 1}},
                          {{37, 17}, {37, 5}},       {{130, 33}, {130, 9}},
                          {{64, 16, 2}, {64, 5, 4}}, {{48, 7, 1, 1}, {48, 3, 3, 2}}};
    if (cat.large()) {
      shapes.push_back({{4096, 4096}, {4096, 1}});
      shapes.push_back({{4096, 1024}, {4096, 17}});
    }
    run(d, shapes);
  }
  for (DType d : kQuantized) {
    std::vector<S> shapes{{{32, 1}, {32, 1}},
                          {{64, 17}, {64, 1}},
                          {{96, 33}, {96, 5}},
                          {{160, 7}, {160, 9}},
                          {{64, 16, 2}, {64, 5, 4}}};
    if (cat.large()) {
      shapes.push_back({{4096, 4096}, {4096, 1}});
      shapes.push_back({{4096, 1024}, {4096, 17}});
    }
    run(d, shapes);
  }
  // K-quants: rows of whole 256-element super-blocks; 1x1 and 1x17 take the exact (f32
  // activation) path, the rest 8-bit activations.
  for (DType d : kKQuantDTypes) {
    std::vector<S> shapes{{{256, 1}, {256, 1}},
                          {{256, 17}, {256, 1}},
                          {{512, 33}, {512, 5}},
                          {{768, 7}, {768, 9}},
                          {{256, 16, 2}, {256, 5, 4}}};
    if (cat.large()) {  // narrower than the others: ggml's K-quant search makes filling slow
      shapes.push_back({{4096, 512}, {4096, 1}});
      shapes.push_back({{4096, 256}, {4096, 17}});
    }
    run(d, shapes);
  }
}

void elementwise_cases(Catalog& cat) {
  struct S {
    Shape a, b;
  };
  std::vector<S> binary{{{1}, {1}},           {{37, 3}, {37, 3}}, {{37, 3, 2}, {37, 1, 1}},
                        {{37, 3, 2}, {1, 3}}, {{37, 3}, {1}},     {{33, 5, 2, 3}, {33, 5, 1, 3}}};
  if (cat.large()) binary.push_back({{4096, 64}, {4096}});
  for (OpKind op : {OpKind::Add, OpKind::Mul}) {
    for (const S& s : binary) {
      Graph g;
      TensorId a = input(g, "a", DType::F32, s.a), b = input(g, "b", DType::F32, s.b);
      op == OpKind::Add ? g.add(a, b) : g.mul(a, b);
      cat.add(std::string(op_name(op)) + "/f32/" + dims(s.a) + "_by_" + dims(s.b), std::move(g));
    }
  }
  std::vector<Shape> unary{{1}, {37, 3}, {33, 5, 2}};
  if (cat.large()) unary.push_back({4096, 64});
  for (OpKind op : {OpKind::Scale, OpKind::Silu, OpKind::Gelu, OpKind::SwiGlu}) {
    for (const Shape& s : unary) {
      Graph g;
      TensorId x = input(g, "x", DType::F32, s);
      switch (op) {
        case OpKind::Scale:
          g.scale(x, 0.37f);
          break;
        case OpKind::Silu:
          g.silu(x);
          break;
        case OpKind::Gelu:
          g.gelu(x);
          break;
        default:
          g.swiglu(x, input(g, "up", DType::F32, s));
      }
      cat.add(std::string(op_name(op)) + "/f32/" + dims(s), std::move(g));
    }
  }
}

void softmax_cases(Catalog& cat) {
  for (const Shape& s : std::vector<Shape>{{1}, {37, 3}, {33, 5, 2}}) {
    Graph g;
    g.softmax(input(g, "x", DType::F32, s));
    cat.add("softmax/f32/" + dims(s), std::move(g));
  }
  struct M {
    Shape x, mask;
    bool causal;
    float scale;
  };
  std::vector<M> masked{{{37, 3}, {37, 3}, false, 0.125f},
                        {{37, 3}, {37, 5}, false, 1.0f},
                        {{37, 5, 4}, {37, 5}, true, 0.125f},
                        {{1, 1}, {1, 1}, true, 1.0f}};
  if (cat.large()) masked.push_back({{4096, 33}, {4096, 33}, true, 0.0884f});
  for (const M& m : masked) {
    Graph g;
    TensorId x = input(g, "x", DType::F32, m.x), mask = input(g, "mask", DType::F32, m.mask);
    g.softmax(x, mask, m.scale);
    std::vector<LeafFill> fills;
    if (m.causal) fills.push_back({mask, Fill::CausalMask, 0});
    cat.add("softmax/f32/" + dims(m.x) + (m.causal ? "_causal_mask" : "_mask") + dims(m.mask),
            std::move(g), fills);
  }
  if (cat.large()) {
    Graph g;
    g.softmax(input(g, "x", DType::F32, {4096, 33}));
    cat.add("softmax/f32/4096x33", std::move(g));
  }
}

void norm_cases(Catalog& cat) {
  struct S {
    Shape x;
    int params;  // 0: none, 1: weight, 2: weight and bias (layer_norm only)
    float eps;
  };
  std::vector<S> rms{{{1}, 0, 1e-5f}, {{37, 3}, 0, 1e-6f}, {{37, 3}, 1, 1e-5f}, {{33, 5, 2}, 1, 0}};
  if (cat.large()) rms.push_back({{4096, 7}, 1, 1e-5f});
  for (const S& s : rms) {
    Graph g;
    TensorId x = input(g, "x", DType::F32, s.x);
    g.rms_norm(x, s.params ? weight(g, "w", DType::F32, {s.x[0]}) : kNoTensor, s.eps);
    cat.add("rms_norm/f32/" + dims(s.x) + (s.params ? "_w" : ""), std::move(g));
  }
  std::vector<S> ln{{{2}, 0, 1e-5f},
                    {{1}, 2, 1e-5f},
                    {{37, 3}, 0, 1e-5f},
                    {{37, 3}, 1, 1e-5f},
                    {{33, 5, 2}, 2, 1e-6f}};
  if (cat.large()) ln.push_back({{4096, 7}, 2, 1e-5f});
  for (const S& s : ln) {
    Graph g;
    TensorId x = input(g, "x", DType::F32, s.x);
    TensorId w = s.params >= 1 ? weight(g, "w", DType::F32, {s.x[0]}) : kNoTensor;
    TensorId b = s.params >= 2 ? weight(g, "b", DType::F32, {s.x[0]}) : kNoTensor;
    g.layer_norm(x, w, b, s.eps);
    cat.add(
        "layer_norm/f32/" + dims(s.x) + (s.params >= 1 ? "_w" : "") + (s.params >= 2 ? "_b" : ""),
        std::move(g));
  }
}

void rope_cases(Catalog& cat) {
  struct S {
    int64_t d, heads, tokens;
    int32_t n_rot;
    float base;
    bool sequential;
  };
  std::vector<S> shapes{{2, 1, 1, 2, 10000.0f, false},
                        {64, 3, 5, 64, 10000.0f, false},
                        {64, 3, 5, 32, 10000.0f, true},
                        {80, 5, 7, 80, 500000.0f, false},
                        {6, 1, 3, 4, 10000.0f, true}};
  if (cat.large()) shapes.push_back({128, 32, 33, 128, 500000.0f, true});
  for (const S& s : shapes) {
    Graph g;
    TensorId x = input(g, "x", DType::F32, {s.d, s.heads, s.tokens});
    TensorId pos = input(g, "pos", DType::I32, {s.tokens});
    g.rope(x, pos, s.n_rot, s.base);
    cat.add("rope/f32.i32/" + dims({s.d, s.heads, s.tokens}) + "_rot" + std::to_string(s.n_rot) +
                "_base" + std::to_string(int64_t(s.base)),
            std::move(g),
            {{pos, s.sequential ? Fill::SequentialPositions : Fill::RandomPositions, 4096}});
  }
}

void rope_neox_cases(Catalog& cat) {
  struct S {
    int64_t d, heads, tokens;
    int32_t n_rot;
    float base;
  };
  std::vector<S> shapes{{2, 1, 1, 2, 10000.0f},
                        {64, 3, 5, 64, 1000000.0f},
                        {64, 3, 5, 32, 10000.0f},
                        {6, 1, 3, 4, 10000.0f}};
  if (cat.large()) shapes.push_back({128, 32, 33, 128, 1000000.0f});
  for (const S& s : shapes) {
    Graph g;
    TensorId x = input(g, "x", DType::F32, {s.d, s.heads, s.tokens});
    TensorId pos = input(g, "pos", DType::I32, {s.tokens});
    g.rope_neox(x, pos, s.n_rot, s.base);
    cat.add("rope_neox/f32.i32/" + dims({s.d, s.heads, s.tokens}) + "_rot" +
                std::to_string(s.n_rot) + "_base" + std::to_string(int64_t(s.base)),
            std::move(g), {{pos, Fill::RandomPositions, 4096}});
  }
}

void attention_cases(Catalog& cat) {
  struct S {
    int64_t d, hq, hkv, tokens, context;
    bool sequential;
  };
  std::vector<S> shapes{{4, 1, 1, 1, 1, true},
                        {64, 8, 2, 5, 37, true},
                        {64, 8, 2, 5, 37, false},
                        {64, 4, 4, 33, 40, true},
                        {80, 6, 3, 1, 77, true}};
  if (cat.large()) {
    shapes.push_back({128, 32, 8, 1, 1024, true});
    shapes.push_back({128, 32, 8, 64, 256, true});
  }
  for (DType kv : kCacheTypes) {
    for (const S& s : shapes) {
      Graph g;
      TensorId q = input(g, "q", DType::F32, {s.d, s.hq, s.tokens});
      TensorId k = leaf(g, OpKind::KvCache, "k", kv, {s.d, s.hkv, s.context});
      TensorId v = leaf(g, OpKind::KvCache, "v", kv, {s.d, s.hkv, s.context});
      TensorId pos = input(g, "pos", DType::I32, {s.tokens});
      g.attention(q, k, v, pos, float(1.0 / std::sqrt(double(s.d))));
      cat.add("attention/f32." + dt(kv) + "/d" + std::to_string(s.d) + "_hq" +
                  std::to_string(s.hq) + "_hkv" + std::to_string(s.hkv) + "_t" +
                  std::to_string(s.tokens) + "_c" + std::to_string(s.context) +
                  (s.sequential ? "" : "_scattered"),
              std::move(g),
              {{pos, s.sequential ? Fill::SequentialPositions : Fill::RandomPositions, s.context}});
    }
  }
}

void dequantize_cases(Catalog& cat) {
  for (DType d : {DType::Q8_0, DType::Q4_0, DType::F16, DType::BF16}) {
    std::vector<Shape> shapes = quantized(d) ? std::vector<Shape>{{32}, {96, 3}, {64, 5, 2}}
                                             : std::vector<Shape>{{1}, {37, 3}, {33, 5, 2}};
    if (cat.large()) shapes.push_back({4096, 64});
    for (const Shape& s : shapes) {
      Graph g;
      g.dequantize(weight(g, "x", d, s));
      cat.add("dequantize/" + dt(d) + "/" + dims(s), std::move(g));
    }
  }
  for (DType d : kKQuantDTypes) {
    std::vector<Shape> shapes{{256}, {512, 3}, {256, 5, 2}};
    if (cat.large()) shapes.push_back({4096, 64});
    for (const Shape& s : shapes) {
      Graph g;
      g.dequantize(weight(g, "x", d, s));
      cat.add("dequantize/" + dt(d) + "/" + dims(s), std::move(g));
    }
  }
}

void kv_write_cases(Catalog& cat) {
  struct S {
    int64_t d, hkv, context, tokens;
  };
  std::vector<S> shapes{{4, 1, 1, 1}, {64, 2, 37, 5}, {80, 3, 77, 1}, {6, 1, 9, 9}};
  if (cat.large()) shapes.push_back({128, 8, 1024, 33});
  for (DType kv : kCacheTypes) {
    for (const S& s : shapes) {
      Graph g;
      TensorId cache = leaf(g, OpKind::KvCache, "cache", kv, {s.d, s.hkv, s.context});
      TensorId src = input(g, "src", DType::F32, {s.d, s.hkv, s.tokens});
      TensorId pos = input(g, "pos", DType::I32, {s.tokens});
      g.kv_write(cache, src, pos);
      cat.add("kv_write/" + dt(kv) + ".f32.i32/d" + std::to_string(s.d) + "_hkv" +
                  std::to_string(s.hkv) + "_c" + std::to_string(s.context) + "_t" +
                  std::to_string(s.tokens),
              std::move(g), {{pos, Fill::SequentialPositions, s.context}});
    }
  }
}

// Mixture of experts: routing (top_k of n_expert logits per token), the chosen experts' weights,
// the expert products (ids drawn at random, repeats included) and the weighted sum.
void moe_cases(Catalog& cat) {
  struct R {
    int64_t experts, tokens, k;
  };
  std::vector<R> routes{{1, 3, 1}, {8, 1, 2}, {8, 5, 2}, {60, 7, 4}, {128, 9, 8}};
  if (cat.large()) routes.push_back({128, 512, 8});
  for (const R& r : routes) {
    const std::string shape = dims({r.experts, r.tokens}) + "_k" + std::to_string(r.k);
    {
      Graph g;
      g.moe_route(input(g, "logits", DType::F32, {r.experts, r.tokens}), int32_t(r.k));
      cat.add("moe_route/f32/" + shape, std::move(g));
    }
    for (bool normalize : {false, true}) {
      Graph g;
      TensorId logits = input(g, "logits", DType::F32, {r.experts, r.tokens});
      TensorId ids = input(g, "ids", DType::I32, {r.k, r.tokens});
      g.moe_weights(logits, ids, normalize);
      cat.add("moe_weights/f32.i32/" + shape + (normalize ? "_normalized" : ""), std::move(g),
              {{ids, Fill::RowIds, r.experts}});
    }
  }

  // n_map > 0: a map of the router's n_map experts onto a's `experts` slots, or none (-1,
  // zeros), as a layer split into its hot experts and the others.
  struct M {
    int64_t K, M, experts, b_cols, k, tokens, n_map = 0;
  };
  auto expert_matmul = [&](DType d, const std::vector<M>& shapes) {
    for (const M& s : shapes) {
      Graph g;
      TensorId a = weight(g, "a", d, {s.K, s.M, s.experts});
      TensorId b = input(g, "b", DType::F32, {s.K, s.b_cols, s.tokens});
      TensorId ids = input(g, "ids", DType::I32, {s.k, s.tokens});
      const TensorId map = s.n_map > 0 ? input(g, "map", DType::I32, {s.n_map}) : kNoTensor;
      g.expert_matmul(a, b, ids, map);
      std::vector<LeafFill> fills{{ids, Fill::RowIds, s.n_map > 0 ? s.n_map : s.experts}};
      if (s.n_map > 0) fills.push_back({map, Fill::ExpertMap, s.experts});
      cat.add("expert_matmul/" + dt(d) + (s.n_map > 0 ? ".f32.i32.i32/a" : ".f32.i32/a") +
                  dims({s.K, s.M, s.experts}) + "_b" + dims({s.K, s.b_cols, s.tokens}) + "_k" +
                  std::to_string(s.k) + (s.n_map > 0 ? "_map" + std::to_string(s.n_map) : ""),
              std::move(g), std::move(fills));
    }
  };
  for (DType d : kFloat) {
    std::vector<M> shapes{{1, 1, 1, 1, 1, 1},    {37, 17, 4, 1, 2, 1}, {37, 17, 4, 2, 2, 5},
                          {130, 33, 8, 1, 2, 9}, {64, 16, 3, 3, 3, 4}, {48, 5, 6, 1, 4, 17}};
    if (cat.large()) shapes.push_back({1024, 512, 8, 1, 2, 33});
    expert_matmul(d, shapes);
  }
  for (DType d : kQuantized) {
    // The last two give experts 16 or more pairs (the CPU's AMX tiles where it has them) and
    // M beyond one 64-row work item, not a multiple of 16.
    std::vector<M> shapes{{32, 1, 2, 1, 1, 1},     {64, 17, 4, 1, 2, 1}, {96, 33, 4, 2, 2, 5},
                          {160, 7, 8, 1, 2, 9},    {64, 16, 3, 3, 3, 4}, {32, 5, 6, 1, 4, 17},
                          {128, 100, 4, 1, 3, 40}, {64, 70, 3, 2, 2, 24}};
    if (cat.large()) shapes.push_back({1024, 512, 8, 1, 2, 33});
    expert_matmul(d, shapes);
  }
  for (DType d : kKQuantDTypes) {
    std::vector<M> shapes{
        {256, 1, 2, 1, 1, 1}, {256, 17, 4, 1, 2, 1}, {512, 33, 4, 2, 2, 5}, {256, 7, 8, 1, 2, 9}};
    if (cat.large()) shapes.push_back({1024, 128, 8, 1, 2, 33});
    expert_matmul(d, shapes);
  }
  for (DType d : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0}) {
    const int64_t K = d == DType::F32 || d == DType::F16 ? 37 : 64;
    expert_matmul(d, {{K, 17, 3, 1, 2, 1, 8}, {K, 33, 8, 2, 2, 5, 8}, {K, 16, 4, 1, 4, 24, 16}});
  }
  for (DType d : kKQuantDTypes)
    expert_matmul(d, {{256, 17, 3, 1, 2, 1, 8}, {256, 7, 4, 1, 4, 24, 16}});

  struct C {
    int64_t n, k, tokens;
  };
  std::vector<C> combines{{1, 1, 1}, {37, 2, 5}, {64, 8, 9}, {33, 3, 1}};
  if (cat.large()) combines.push_back({4096, 8, 33});
  for (const C& c : combines) {
    Graph g;
    TensorId x = input(g, "experts", DType::F32, {c.n, c.k, c.tokens});
    g.moe_combine(x, input(g, "weights", DType::F32, {c.k, c.tokens}));
    cat.add("moe_combine/f32/" + dims({c.n, c.k, c.tokens}), std::move(g));
  }
}

std::map<OpKind, CaseGenerator>& registered_generators() {
  static std::map<OpKind, CaseGenerator> generators;
  return generators;
}

std::vector<Case> builtin_cases(bool large) {
  Catalog cat(large);
  copy_cases(cat);
  get_rows_cases(cat);
  matmul_cases(cat);
  elementwise_cases(cat);
  softmax_cases(cat);
  norm_cases(cat);
  rope_cases(cat);
  rope_neox_cases(cat);
  attention_cases(cat);
  dequantize_cases(cat);
  kv_write_cases(cat);
  moe_cases(cat);
  add_edge_cases(cat);
  return cat.take();
}

}  // namespace

void register_case_generator(OpKind op, CaseGenerator generator) {
  registered_generators()[op] = generator;
}

std::vector<Case> cases_for(OpKind op, bool large) {
  std::vector<Case> out;
  if (auto it = registered_generators().find(op); it != registered_generators().end()) {
    it->second(out, large);
    return out;
  }
  for (Case& c : builtin_cases(large)) {
    if (c.node().op == op) out.push_back(std::move(c));
  }
  return out;
}

std::vector<Case> all_cases(bool large) {
  std::vector<Case> out = builtin_cases(large);
  for (const auto& [op, generator] : registered_generators()) generator(out, large);
  return out;
}

int dispatch_row(const Backend& backend, const Case& c) {
  const std::vector<OpCapability>& rows = backend.capabilities();
  for (size_t r = 0; r < rows.size(); ++r) {
    if (row_covers(rows[r], c.graph, c.node(), backend.features())) return int(r);
  }
  return -1;
}

CaseCount count_cases(const std::vector<OpCapability>& rows,
                      const std::vector<std::string>& features, const std::vector<Case>& cases) {
  CaseCount count;
  for (const Case& c : cases) {
    const bool covered = std::any_of(rows.begin(), rows.end(), [&](const OpCapability& row) {
      return row_covers(row, c.graph, c.node(), features);
    });
    ++(covered ? count.run : count.refused);
  }
  return count;
}

}  // namespace tandem::conformance
