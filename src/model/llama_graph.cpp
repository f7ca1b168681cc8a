#include "tandem/model/llama_graph.h"

#include <cmath>
#include <string>

#include "tandem/error.h"

namespace tandem {

namespace {

// Adds a weight leaf with the dtype and shape stored in the file.
TensorId add_weight(Graph& g, const gguf::File& file, const std::string& name) {
  const gguf::TensorInfo* t = file.find_tensor(name);
  if (!t) throw_error(ErrorCode::Format, "llama graph", "missing tensor '" + name + "'");
  return g.leaf(OpKind::Weight, make_tensor_desc(name, t->dtype, t->ne, t->n_dims));
}

std::string blk(int layer, const char* what) {  // "blk.N.what.weight"
  return "blk." + std::to_string(layer) + "." + what + ".weight";
}

}  // namespace

std::string kv_cache_name(bool key, int layer) {
  return std::string(key ? "cache_k." : "cache_v.") + std::to_string(layer);
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

  const int64_t T = options.n_tokens;
  const int64_t D = c.head_dim;
  const int64_t n_embd = c.n_embd;
  const float scale = 1.0f / std::sqrt(float(D));
  Graph& g = out.graph;

  out.tokens = g.input("tokens", DType::I32, {T});
  out.positions = g.input("positions", DType::I32, {T});
  TensorId embd = add_weight(g, file, "token_embd.weight");
  TensorId x = g.get_rows(embd, out.tokens);

  for (int l = 0; l < int(c.n_layer); ++l) {
    TensorId attn_norm = add_weight(g, file, blk(l, "attn_norm"));
    TensorId wq = add_weight(g, file, blk(l, "attn_q"));
    TensorId wk = add_weight(g, file, blk(l, "attn_k"));
    TensorId wv = add_weight(g, file, blk(l, "attn_v"));
    TensorId wo = add_weight(g, file, blk(l, "attn_output"));
    TensorId cache_k =
        g.kv_cache(kv_cache_name(true, l), options.kv_dtype, {D, c.n_head_kv, out.n_ctx});
    TensorId cache_v =
        g.kv_cache(kv_cache_name(false, l), options.kv_dtype, {D, c.n_head_kv, out.n_ctx});

    TensorId h = g.rms_norm(x, attn_norm, c.rms_eps);
    TensorId q = g.reshape(g.matmul(wq, h), {D, c.n_head, T});
    TensorId k = g.reshape(g.matmul(wk, h), {D, c.n_head_kv, T});
    TensorId v = g.reshape(g.matmul(wv, h), {D, c.n_head_kv, T});
    q = g.rope(q, out.positions, int32_t(c.n_rot), c.rope_freq_base);
    k = g.rope(k, out.positions, int32_t(c.n_rot), c.rope_freq_base);
    TensorId kc = g.kv_write(cache_k, k, out.positions);
    TensorId vc = g.kv_write(cache_v, v, out.positions);
    TensorId a = g.attention(q, kc, vc, out.positions, scale);
    a = g.reshape(a, {n_embd, T});
    x = g.add(x, g.matmul(wo, a));

    TensorId ffn_norm = add_weight(g, file, blk(l, "ffn_norm"));
    TensorId w_gate = add_weight(g, file, blk(l, "ffn_gate"));
    TensorId w_up = add_weight(g, file, blk(l, "ffn_up"));
    TensorId w_down = add_weight(g, file, blk(l, "ffn_down"));
    h = g.rms_norm(x, ffn_norm, c.rms_eps);
    TensorId s = g.swiglu(g.matmul(w_gate, h), g.matmul(w_up, h));
    x = g.add(x, g.matmul(w_down, s));
  }

  TensorId out_norm = add_weight(g, file, "output_norm.weight");
  if (!options.all_logits && T > 1) {
    // Only the last token's logits are needed: skip the vocabulary product for the rest.
    x = g.view(x, {n_embd, 1}, {4, n_embd * 4}, (T - 1) * n_embd * 4);
  }
  x = g.rms_norm(x, out_norm, c.rms_eps);
  TensorId w_out = file.find_tensor("output.weight") ? add_weight(g, file, "output.weight") : embd;
  out.logits = g.matmul(w_out, x);
  g.set_name(out.logits, "logits");
  g.mark_output(out.logits);
  return out;
}

}  // namespace tandem
