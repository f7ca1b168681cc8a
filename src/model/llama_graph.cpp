#include "tandem/model/llama_graph.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "tandem/error.h"
#include "tandem/model/llama_config.h"

namespace tandem {

namespace {

// Adds a weight leaf with the dtype and shape stored in the file.
TensorId add_weight(Graph& g, const gguf::File& file, const std::string& name) {
  const gguf::TensorInfo* t = file.find_tensor(name);
  if (!t) throw_error(ErrorCode::Format, "llama graph", "missing tensor '" + name + "'");
  return g.leaf(OpKind::Weight, make_tensor_desc(name, t->dtype, t->ne, t->n_dims));
}

std::string blk(int layer, const char* what) {  // "blk.N.what.weight"
  return llama_layer_tensor(layer, std::string(what) + ".weight");
}

// Layer l's attention inputs from x ([n_embd, T]): q, k and v of rms_norm(x), rotated, and the
// output projection's weight.
struct AttentionIn {
  TensorId q, k, v, wo;
};
AttentionIn attention_in(Graph& g, const gguf::File& file, const LlamaConfig& c, int l, TensorId x,
                         TensorId positions, int64_t T) {
  const int64_t D = c.head_dim;
  TensorId attn_norm = add_weight(g, file, blk(l, "attn_norm"));
  TensorId wq = add_weight(g, file, blk(l, "attn_q"));
  TensorId wk = add_weight(g, file, blk(l, "attn_k"));
  TensorId wv = add_weight(g, file, blk(l, "attn_v"));
  AttentionIn in;
  in.wo = add_weight(g, file, blk(l, "attn_output"));
  TensorId h = g.rms_norm(x, attn_norm, c.rms_eps);
  in.q = g.reshape(g.matmul(wq, h), {D, c.n_head, T});
  in.k = g.reshape(g.matmul(wk, h), {D, c.n_head_kv, T});
  in.v = g.reshape(g.matmul(wv, h), {D, c.n_head_kv, T});
  if (c.qk_norm) {  // Qwen3: RMSNorm of each head before RoPE
    in.q = g.rms_norm(in.q, add_weight(g, file, blk(l, "attn_q_norm")), c.rms_eps);
    in.k = g.rms_norm(in.k, add_weight(g, file, blk(l, "attn_k_norm")), c.rms_eps);
  }
  auto rope = [&](TensorId t) {
    return c.rope_neox ? g.rope_neox(t, positions, int32_t(c.n_rot), c.rope_freq_base)
                       : g.rope(t, positions, int32_t(c.n_rot), c.rope_freq_base);
  };
  in.q = rope(in.q);
  in.k = rope(in.k);
  return in;
}

// The mixture-of-experts block of h ([n_embd, T]), as llama.cpp's build_moe_ffn with softmax
// gating: each token's n_expert_used best experts by the router, their softmax weights, and
// the weighted sum of down(silu(gate(h)) * up(h)) of those experts only.
TensorId moe_ffn(Graph& g, const gguf::File& file, const LlamaConfig& c, int l, TensorId h,
                 int64_t T, std::vector<LlamaGraph::Route>& routes,
                 const LlamaGraphOptions::HotExperts* hot) {
  TensorId router = add_weight(g, file, blk(l, "ffn_gate_inp"));
  TensorId w_gate = add_weight(g, file, blk(l, "ffn_gate_exps"));
  TensorId w_up = add_weight(g, file, blk(l, "ffn_up_exps"));
  TensorId w_down = add_weight(g, file, blk(l, "ffn_down_exps"));
  TensorId logits = g.matmul(router, h);  // [n_expert, T]
  TensorId ids = g.moe_route(logits, int32_t(c.n_expert_used));
  routes.push_back({l, ids});
  TensorId weights = g.moe_weights(logits, ids, c.norm_expert_weights);
  TensorId columns = g.reshape(h, {c.n_embd, 1, T});  // one column for every chosen expert
  // Gate before up, in this order whatever the compiler's order of arguments: a backend fuses
  // the pattern as it finds it in a segment.
  auto experts = [&](TensorId wg, TensorId wu, TensorId wd, TensorId map, float share) {
    TensorId gate = g.expert_matmul(wg, columns, ids, map, share);
    TensorId up = g.expert_matmul(wu, columns, ids, map, share);
    return g.expert_matmul(wd, g.swiglu(gate, up), ids, map, share);
  };
  if (!hot) return g.moe_combine(experts(w_gate, w_up, w_down, kNoTensor, 1.0f), weights);
  // Each choice reaches one of the two products; the other's column is zero, so their sum is
  // the unsplit product's, bit for bit where both run on one backend.
  auto slab = [&](const char* what) {
    const gguf::TensorInfo* t = file.find_tensor(blk(l, what));
    Dims ne = t->ne;
    ne[2] = int64_t(hot->experts.size());
    return g.leaf(OpKind::Weight, make_tensor_desc(hot_expert_name(l, what), t->dtype, ne, 3));
  };
  auto map = [&](const char* what) {
    return g.leaf(OpKind::Weight,
                  make_tensor_desc(hot_expert_name(l, what), DType::I32, {c.n_expert}));
  };
  const float share = float(std::clamp(hot->share, 1e-3, 1.0));
  const float rest = float(std::clamp(1.0 - hot->share, 1e-3, 1.0));
  TensorId hot_out = experts(slab("ffn_gate_exps"), slab("ffn_up_exps"), slab("ffn_down_exps"),
                             map("hot_map"), share);
  TensorId cold_out = experts(w_gate, w_up, w_down, map("cold_map"), rest);
  return g.moe_combine(g.add(hot_out, cold_out), weights);
}

// x + layer l's feed-forward block of x ([n_embd, T]): dense, or the mixture of experts.
TensorId add_ffn(Graph& g, const gguf::File& file, const LlamaConfig& c, int l, TensorId x,
                 int64_t T, std::vector<LlamaGraph::Route>& routes,
                 const LlamaGraphOptions::HotExperts* hot = nullptr) {
  TensorId ffn_norm = add_weight(g, file, blk(l, "ffn_norm"));
  if (c.is_moe()) {
    return g.add(x, moe_ffn(g, file, c, l, g.rms_norm(x, ffn_norm, c.rms_eps), T, routes, hot));
  }
  TensorId w_gate = add_weight(g, file, blk(l, "ffn_gate"));
  TensorId w_up = add_weight(g, file, blk(l, "ffn_up"));
  TensorId w_down = add_weight(g, file, blk(l, "ffn_down"));
  TensorId h = g.rms_norm(x, ffn_norm, c.rms_eps);
  // Gate before up, in this order whatever the compiler's order of arguments (see above).
  TensorId gate = g.matmul(w_gate, h);
  TensorId up = g.matmul(w_up, h);
  TensorId s = g.swiglu(gate, up);
  return g.add(x, g.matmul(w_down, s));
}

// The logits of x's columns (output.weight, or the token embedding where it is tied), named and
// marked as the graph's output. embd: the token embedding's leaf, or kNoTensor where the graph
// has none (a pipeline stage that does not start the model).
TensorId add_logits(Graph& g, const gguf::File& file, const LlamaConfig& c, TensorId x,
                    TensorId embd) {
  x = g.rms_norm(x, add_weight(g, file, "output_norm.weight"), c.rms_eps);
  TensorId w_out = file.find_tensor("output.weight") ? add_weight(g, file, "output.weight")
                   : embd != kNoTensor               ? embd
                                                     : add_weight(g, file, "token_embd.weight");
  TensorId logits = g.matmul(w_out, x);
  g.set_name(logits, "logits");
  g.mark_output(logits);
  return logits;
}

}  // namespace

std::string hot_expert_name(int layer, const std::string& what) {
  std::string w = what;
  if (const size_t at = w.find("_exps"); at != std::string::npos) w.replace(at, 5, "_hot");
  return llama_layer_tensor(layer, w + ".weight");
}

std::string kv_cache_name(bool key, int layer, int sequence) {
  return std::string(key ? "cache_k." : "cache_v.") + std::to_string(layer) +
         (sequence == 0 ? "" : ".s" + std::to_string(sequence));
}

LlamaGraph build_llama_graph(const LlamaConfig& c, const gguf::File& file,
                             const LlamaGraphOptions& options) {
  const std::string where = "llama graph";
  LlamaGraph out;
  out.n_ctx = options.n_ctx > 0 ? options.n_ctx : std::min<int64_t>(c.context_length, 4096);
  TANDEM_CHECK_ARG(options.n_tokens >= 1, where,
                   "n_tokens must be >= 1 (got " + std::to_string(options.n_tokens) + ")");
  TANDEM_CHECK_ARG(options.n_tokens <= out.n_ctx, where,
                   "n_tokens " + std::to_string(options.n_tokens) + " exceeds the context " +
                       std::to_string(out.n_ctx));
  TANDEM_CHECK_ARG(options.kv_dtype == DType::F16 || options.kv_dtype == DType::F32, where,
                   "the KV cache must be f16 or f32");
  TANDEM_CHECK_ARG(options.sequence >= 0, where, "sequence must be >= 0");
  const int layer_end = options.layer_end < 0 ? int(c.n_layer) : options.layer_end;
  TANDEM_CHECK_ARG(
      0 <= options.layer_begin && options.layer_begin < layer_end && layer_end <= int(c.n_layer),
      where,
      "layers [" + std::to_string(options.layer_begin) + ", " + std::to_string(layer_end) +
          ") are not a range of the model's " + std::to_string(c.n_layer) + " layers");

  const int64_t T = options.n_tokens;
  const int64_t D = c.head_dim;
  const int64_t n_embd = c.n_embd;
  const float scale = 1.0f / std::sqrt(float(D));
  Graph& g = out.graph;

  const bool first_stage = options.layer_begin == 0;
  if (first_stage) out.tokens = g.input("tokens", DType::I32, {T});
  out.positions = g.input("positions", DType::I32, {T});
  TensorId embd = kNoTensor, x = kNoTensor;
  if (first_stage) {
    embd = add_weight(g, file, "token_embd.weight");
    x = g.get_rows(embd, out.tokens);
  } else {
    out.hidden_in = x = g.input("hidden_in", DType::F32, {n_embd, T});
  }

  std::vector<const LlamaGraphOptions::HotExperts*> hot(size_t(c.n_layer), nullptr);
  for (const LlamaGraphOptions::HotExperts& h : options.hot_experts) {
    TANDEM_CHECK_ARG(
        c.is_moe() && h.layer >= 0 && h.layer < int(c.n_layer) && !hot[size_t(h.layer)], where,
        "hot experts of layer " + std::to_string(h.layer) +
            ": not a mixture-of-experts layer of the model, or given twice");
    TANDEM_CHECK_ARG(!h.experts.empty() && int64_t(h.experts.size()) < c.n_expert, where,
                     "hot experts of layer " + std::to_string(h.layer) + ": " +
                         std::to_string(h.experts.size()) + " of " + std::to_string(c.n_expert));
    for (int32_t e : h.experts) {
      TANDEM_CHECK_ARG(e >= 0 && e < c.n_expert, where,
                       "hot expert " + std::to_string(e) + " of layer " + std::to_string(h.layer) +
                           " is not in [0, " + std::to_string(c.n_expert) + ")");
    }
    hot[size_t(h.layer)] = &h;
  }
  for (int l = options.layer_begin; l < layer_end; ++l) {
    const AttentionIn in = attention_in(g, file, c, l, x, out.positions, T);
    TensorId cache_k = g.kv_cache(kv_cache_name(true, l, options.sequence), options.kv_dtype,
                                  {D, c.n_head_kv, out.n_ctx});
    TensorId cache_v = g.kv_cache(kv_cache_name(false, l, options.sequence), options.kv_dtype,
                                  {D, c.n_head_kv, out.n_ctx});
    TensorId kc = g.kv_write(cache_k, in.k, out.positions);
    TensorId vc = g.kv_write(cache_v, in.v, out.positions);
    TensorId a = g.reshape(g.attention(in.q, kc, vc, out.positions, scale), {c.n_head * D, T});
    x = add_ffn(g, file, c, l, g.add(x, g.matmul(in.wo, a)), T, out.routes, hot[size_t(l)]);
  }

  if (layer_end < c.n_layer) {
    // The next stage needs every token's hidden state, whatever logits it returns.
    g.set_name(x, "hidden_out");
    g.mark_output(x);
    out.hidden_out = x;
    return out;
  }
  if (!options.all_logits && T > 1) {
    // Only the last token's logits are needed: skip the vocabulary product for the rest.
    x = g.view(x, {n_embd, 1}, {4, n_embd * 4}, (T - 1) * n_embd * 4);
  }
  out.logits = add_logits(g, file, c, x, embd);
  return out;
}

LlamaGraph build_llama_decode_batch(const LlamaConfig& c, const gguf::File& file, int64_t n_ctx,
                                    DType kv_dtype, const std::vector<int>& sequences) {
  const std::string where = "llama decode batch";
  const int64_t S = int64_t(sequences.size());
  TANDEM_CHECK_ARG(S >= 1, where, "no sequence to decode");
  for (size_t i = 0; i < sequences.size(); ++i) {
    TANDEM_CHECK_ARG(sequences[i] >= 0, where, "sequence ids must be >= 0");
    for (size_t j = 0; j < i; ++j) {
      TANDEM_CHECK_ARG(sequences[i] != sequences[j], where,
                       "sequence " + std::to_string(sequences[i]) + " appears twice");
    }
  }
  TANDEM_CHECK_ARG(kv_dtype == DType::F16 || kv_dtype == DType::F32, where,
                   "the KV cache must be f16 or f32");
  LlamaGraph out;
  out.n_ctx = n_ctx > 0 ? n_ctx : std::min<int64_t>(c.context_length, 4096);
  const int64_t D = c.head_dim;
  const float scale = 1.0f / std::sqrt(float(D));
  Graph& g = out.graph;

  out.tokens = g.input("tokens", DType::I32, {S});
  out.positions = g.input("positions", DType::I32, {S});
  out.rows = g.input("rows", DType::I32, {S});
  // Row r's slice of a [D, heads, S] tensor, and of an [S] one.
  auto row_of = [&](TensorId t, int64_t heads, int64_t r) {
    return g.view(t, {D, heads, 1}, {4, D * 4, D * heads * 4}, r * D * heads * 4);
  };
  auto one = [&](TensorId t, int64_t r) { return g.view(t, {1}, {4}, r * 4); };
  TensorId embd = add_weight(g, file, "token_embd.weight");
  TensorId x = g.get_rows(embd, out.tokens);

  for (int l = 0; l < int(c.n_layer); ++l) {
    const AttentionIn in = attention_in(g, file, c, l, x, out.positions, S);
    // Each row attends over its own sequence's cache; the outputs are gathered into the rows
    // of a scratch tensor (a cache write at row r), so wo and the FFN run on all rows at once.
    TensorId gathered = g.kv_cache("batch_attn." + std::to_string(S) + "." + std::to_string(l),
                                   DType::F32, {D, c.n_head, S});
    for (int64_t r = 0; r < S; ++r) {
      const int seq = sequences[size_t(r)];
      TensorId pos = one(out.positions, r);
      TensorId cache_k =
          g.kv_cache(kv_cache_name(true, l, seq), kv_dtype, {D, c.n_head_kv, out.n_ctx});
      TensorId cache_v =
          g.kv_cache(kv_cache_name(false, l, seq), kv_dtype, {D, c.n_head_kv, out.n_ctx});
      TensorId kc = g.kv_write(cache_k, row_of(in.k, c.n_head_kv, r), pos);
      TensorId vc = g.kv_write(cache_v, row_of(in.v, c.n_head_kv, r), pos);
      TensorId a = g.attention(row_of(in.q, c.n_head, r), kc, vc, pos, scale);
      gathered = g.kv_write(gathered, a, one(out.rows, r));
    }
    TensorId a = g.reshape(gathered, {c.n_head * D, S});
    x = add_ffn(g, file, c, l, g.add(x, g.matmul(in.wo, a)), S, out.routes);
  }

  out.logits = add_logits(g, file, c, x, embd);
  return out;
}

}  // namespace tandem
