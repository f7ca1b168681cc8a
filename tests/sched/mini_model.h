// A two-layer LLaMA-shaped graph with every dtype the reference runs (f32, f16, q8_0, q4_0
// weights; f32 and f16 KV caches) and random weights, for executor tests.
#pragma once

#include <map>
#include <random>
#include <string>
#include <vector>

#include "tandem/dtype.h"
#include "tandem/graph.h"

namespace tandem::test {

struct MiniModel {
  static constexpr int64_t kDim = 64, kHeads = 4, kKvHeads = 2, kHeadDim = 16, kFfn = 128,
                           kVocab = 32, kContext = 8;
  static constexpr int kLayers = 2;

  struct WeightData {
    DType dtype;
    std::vector<int64_t> ne;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, WeightData> weights;

  explicit MiniModel(std::mt19937& rng) {
    auto add = [&](const std::string& name, DType dtype, std::vector<int64_t> ne) {
      int64_t n = 1;
      for (int64_t d : ne) n *= d;
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      std::vector<float> f(static_cast<size_t>(n));
      for (float& x : f) x = u(rng) * 0.5f;
      WeightData w{dtype, ne, std::vector<uint8_t>(row_bytes(dtype, ne[0]) * size_t(n / ne[0]))};
      from_f32(dtype, f.data(), w.bytes.data(), n);
      weights[name] = std::move(w);
    };
    add("tok_embd.weight", DType::F32, {kDim, kVocab});
    const DType types[] = {DType::F16, DType::Q8_0, DType::F32, DType::Q4_0};
    for (int l = 0; l < kLayers; ++l) {
      std::string p = "blk." + std::to_string(l) + ".";
      add(p + "attn_norm.weight", DType::F32, {kDim});
      add(p + "attn_q.weight", types[l % 4], {kDim, kHeads * kHeadDim});
      add(p + "attn_k.weight", types[(l + 1) % 4], {kDim, kKvHeads * kHeadDim});
      add(p + "attn_v.weight", types[(l + 2) % 4], {kDim, kKvHeads * kHeadDim});
      add(p + "attn_output.weight", types[(l + 3) % 4], {kHeads * kHeadDim, kDim});
      add(p + "ffn_norm.weight", DType::F32, {kDim});
      add(p + "ffn_gate.weight", types[(l + 1) % 4], {kDim, kFfn});
      add(p + "ffn_up.weight", types[l % 4], {kDim, kFfn});
      add(p + "ffn_down.weight", types[(l + 2) % 4], {kFfn, kDim});
    }
    add("output_norm.weight", DType::F32, {kDim});
    add("output.weight", DType::F16, {kDim, kVocab});
  }

  static std::string cache_name(int layer, char kv) {
    return "cache." + std::to_string(layer) + "." + kv;
  }
  static DType cache_dtype(int layer) { return layer % 2 ? DType::F16 : DType::F32; }

  // tokens, positions -> logits [vocab, T]
  Graph build(int64_t tokens) const {
    Graph g;
    auto w = [&](const std::string& name) {
      const WeightData& d = weights.at(name);
      if (d.ne.size() == 1) return g.weight(name, d.dtype, {d.ne[0]});
      return g.weight(name, d.dtype, {d.ne[0], d.ne[1]});
    };
    TensorId ids = g.input("tokens", DType::I32, {tokens});
    TensorId pos = g.input("positions", DType::I32, {tokens});
    TensorId x = g.get_rows(w("tok_embd.weight"), ids);
    for (int l = 0; l < kLayers; ++l) {
      std::string p = "blk." + std::to_string(l) + ".";
      TensorId h = g.rms_norm(x, w(p + "attn_norm.weight"), 1e-5f);
      TensorId q = g.reshape(g.matmul(w(p + "attn_q.weight"), h), {kHeadDim, kHeads, tokens});
      TensorId k = g.reshape(g.matmul(w(p + "attn_k.weight"), h), {kHeadDim, kKvHeads, tokens});
      TensorId v = g.reshape(g.matmul(w(p + "attn_v.weight"), h), {kHeadDim, kKvHeads, tokens});
      q = g.rope(q, pos, int32_t(kHeadDim), 10000.0f);
      k = g.rope(k, pos, int32_t(kHeadDim), 10000.0f);
      TensorId kc = g.kv_cache(cache_name(l, 'k'), cache_dtype(l), {kHeadDim, kKvHeads, kContext});
      TensorId vc = g.kv_cache(cache_name(l, 'v'), cache_dtype(l), {kHeadDim, kKvHeads, kContext});
      TensorId kw = g.kv_write(kc, k, pos);
      TensorId vw = g.kv_write(vc, v, pos);
      TensorId a = g.attention(q, kw, vw, pos, 0.25f);
      a = g.reshape(a, {kHeads * kHeadDim, tokens});
      x = g.add(x, g.matmul(w(p + "attn_output.weight"), a));
      TensorId h2 = g.rms_norm(x, w(p + "ffn_norm.weight"), 1e-5f);
      TensorId gate = g.matmul(w(p + "ffn_gate.weight"), h2);
      TensorId up = g.matmul(w(p + "ffn_up.weight"), h2);
      x = g.add(x, g.matmul(w(p + "ffn_down.weight"), g.swiglu(gate, up)));
    }
    TensorId out = g.matmul(w("output.weight"), g.rms_norm(x, w("output_norm.weight"), 1e-5f));
    g.set_name(out, "logits");
    g.mark_output(out);
    return g;
  }
};

}  // namespace tandem::test
