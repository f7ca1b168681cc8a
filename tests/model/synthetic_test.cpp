// Synthetic models load, carry llama.cpp's metadata, are deterministic, have sane weights;
// LlamaConfig validates them and names the key or tensor when a file is wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <set>

#include "tandem/error.h"
#include "tandem/model/gguf.h"
#include "tandem/model/llama_config.h"
#include "tandem/model/synthetic.h"

namespace tandem {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("tandem_synth_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

template <class F>
std::string error_of(F&& f, ErrorCode want) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), want) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

std::vector<float> dequantized(const gguf::TensorInfo& t) {
  std::vector<float> out(size_t(t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]));
  to_f32(t.dtype, t.data, out.data(), int64_t(out.size()));
  return out;
}

class SyntheticTiny : public ::testing::TestWithParam<DType> {};

TEST_P(SyntheticTiny, LoadsWithLlamaCppMetadataAndValidates) {
  const DType dtype = GetParam();
  SyntheticSpec spec = synthetic_preset("tiny", dtype, 1234);
  std::string path = temp_path(std::string(dtype_name(dtype)) + ".gguf");
  write_synthetic_model(spec, path);
  {
    gguf::File f = gguf::File::open(path);
    LlamaConfig c = LlamaConfig::from_gguf(f);
    EXPECT_EQ(c.n_vocab, 512);
    EXPECT_EQ(c.n_embd, 64);
    EXPECT_EQ(c.n_layer, 2);
    EXPECT_EQ(c.n_ff, 128);
    EXPECT_EQ(c.n_head, 4);
    EXPECT_EQ(c.n_head_kv, 2);
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_EQ(c.n_rot, 16);
    EXPECT_EQ(c.context_length, 256);
    EXPECT_FLOAT_EQ(c.rms_eps, 1e-5f);
    EXPECT_FLOAT_EQ(c.rope_freq_base, 10000.0f);
    EXPECT_FALSE(c.tied_embeddings);
    EXPECT_EQ(c.bos_token_id, 1);
    EXPECT_EQ(c.eos_token_id, 2);
    EXPECT_EQ(c.name, "tandem-synthetic-tiny");

    // The keys llama.cpp reads for a llama model, with the types it expects.
    EXPECT_EQ(f.get_string("general.architecture"), "llama");
    EXPECT_EQ(f.get_uint("general.file_type"), synthetic_file_type(dtype));
    for (const char* key :
         {"llama.context_length", "llama.embedding_length", "llama.block_count",
          "llama.feed_forward_length", "llama.attention.head_count",
          "llama.attention.head_count_kv", "llama.rope.dimension_count", "llama.vocab_size",
          "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"}) {
      EXPECT_EQ(f.find(key)->type, gguf::ValueType::U32) << key;
    }
    EXPECT_EQ(f.find("llama.attention.layer_norm_rms_epsilon")->type, gguf::ValueType::F32);
    EXPECT_EQ(f.find("llama.rope.freq_base")->type, gguf::ValueType::F32);
    EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
    EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "default");
    EXPECT_EQ(f.get_uint("tokenizer.ggml.unknown_token_id"), 0u);
    EXPECT_TRUE(f.get_bool("tokenizer.ggml.add_bos_token"));
    EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_eos_token"));
    const auto& tokens = f.get_string_array("tokenizer.ggml.tokens");
    EXPECT_EQ(tokens.size(), 512u);
    EXPECT_EQ(std::set<std::string>(tokens.begin(), tokens.end()).size(), tokens.size());
    EXPECT_EQ(f.get_number_array("tokenizer.ggml.scores").size(), 512u);
    EXPECT_EQ(f.find("tokenizer.ggml.scores")->array_type, gguf::ValueType::F32);
    const auto& types = f.get_number_array("tokenizer.ggml.token_type");
    EXPECT_EQ(f.find("tokenizer.ggml.token_type")->array_type, gguf::ValueType::I32);
    ASSERT_EQ(types.size(), 512u);
    EXPECT_EQ(types[0], 2);
    EXPECT_EQ(types[1], 3);
    EXPECT_EQ(types[2], 3);
    EXPECT_EQ(types[3], 6);
    EXPECT_EQ(types[258], 6);
    EXPECT_EQ(types[259], 1);

    // Matrices in the model's dtype (token_embd and output too), norms in f32.
    EXPECT_EQ(f.tensors().size(), 2u + 9u * 2u + 1u);
    for (const auto& t : f.tensors()) {
      bool norm = t.name.find("norm") != std::string::npos;
      EXPECT_EQ(t.dtype, norm ? DType::F32 : dtype) << t.name;
    }
    // Weights uniform in [-a, a], a = 1/sqrt(n_in), centred; norms near 1.
    for (const char* name :
         {"token_embd.weight", "blk.1.attn_q.weight", "blk.0.ffn_down.weight", "output.weight"}) {
      const auto* t = f.find_tensor(name);
      ASSERT_NE(t, nullptr) << name;
      std::vector<float> w = dequantized(*t);
      double a = 1.0 / std::sqrt(double(t->ne[0]));
      double sum = 0, sum2 = 0;
      for (float x : w) {
        ASSERT_LE(std::fabs(x), a * 1.001) << name;
        sum += x;
        sum2 += double(x) * x;
      }
      double mean = sum / double(w.size());
      double rms = std::sqrt(sum2 / double(w.size()));
      EXPECT_LT(std::fabs(mean), 0.05 * a) << name;
      EXPECT_GT(rms, 0.45 * a) << name;  // uniform: a / sqrt(3) = 0.577 a
      EXPECT_LT(rms, 0.65 * a) << name;
    }
    for (const auto& w : dequantized(*f.find_tensor("blk.0.ffn_norm.weight"))) {
      ASSERT_GE(w, 0.9f);
      ASSERT_LE(w, 1.1f);
    }
    if (dtype_traits(dtype).is_quantized) {
      // Block scales vary, so kernels that mix up blocks would show it.
      const auto* t = f.find_tensor("blk.0.attn_v.weight");
      std::set<uint16_t> scales;
      size_t block = size_t(dtype_traits(dtype).block_bytes);
      for (size_t k = 0; k < t->bytes; k += block) {
        uint16_t d;
        std::memcpy(&d, t->data + k, 2);
        scales.insert(d);
      }
      EXPECT_GT(scales.size(), 20u);
    }
  }
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SyntheticTiny,
                         ::testing::Values(DType::F32, DType::F16, DType::Q8_0, DType::Q4_0),
                         [](const auto& param_info) {
                           return std::string(dtype_name(param_info.param));
                         });

TEST(Synthetic, DeterministicForAnyThreadCount) {
  SyntheticSpec spec = synthetic_preset("tiny", DType::Q4_0, 99);
  spec.threads = 1;
  std::vector<uint8_t> one = make_synthetic_writer(spec).to_bytes();
  spec.threads = 3;
  EXPECT_EQ(make_synthetic_writer(spec).to_bytes(), one);
  spec.seed = 100;
  std::vector<uint8_t> other = make_synthetic_writer(spec).to_bytes();
  ASSERT_EQ(other.size(), one.size());
  EXPECT_NE(other, one);
  // Same metadata, different weights.
  gguf::File a = gguf::File::parse(one), b = gguf::File::parse(other);
  EXPECT_EQ(a.data_offset(), b.data_offset());
  EXPECT_TRUE(std::equal(one.begin(), one.begin() + long(a.data_offset()), other.begin()));
}

TEST(Synthetic, TiedEmbeddingsOmitOutput) {
  SyntheticSpec spec = synthetic_preset("tiny", DType::Q8_0);
  spec.tied_embeddings = true;
  std::vector<uint8_t> bytes = make_synthetic_writer(spec).to_bytes();
  gguf::File f = gguf::File::parse(bytes);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);
  EXPECT_TRUE(LlamaConfig::from_gguf(f).tied_embeddings);
}

// llama.cpp's Q4_K_M / Q5_K_M mix: Q6_K for the output and for attn_v and ffn_down of the
// use_more_bits layers (8 layers: 0, 3, 6, 7), the base type elsewhere, norms F32; K-quants fall
// back where rows are not whole super-blocks.
TEST(Synthetic, KQuantMediumMixFollowsLlamaCpp) {
  SyntheticSpec spec = synthetic_preset("tiny", DType::Q4_K, 3, SyntheticMix::KQuantMedium);
  spec.n_embd = 256;
  spec.n_ff = 512;
  spec.n_layer = 8;
  EXPECT_EQ(synthetic_file_type(spec.dtype, spec.mix), 15u);
  EXPECT_EQ(llama_file_type_name(15), "MOSTLY_Q4_K_M");
  EXPECT_EQ(llama_file_type_name(17), "MOSTLY_Q5_K_M");
  EXPECT_EQ(llama_file_type_name(18), "MOSTLY_Q6_K");
  EXPECT_EQ(llama_file_type_name(99), "");
  const std::set<int> more_bits{0, 3, 6, 7};
  for (int l = 0; l < 8; ++l) {
    const DType want = more_bits.count(l) ? DType::Q6_K : DType::Q4_K;
    EXPECT_EQ(synthetic_tensor_dtype(spec, llama_layer_tensor(l, "attn_v.weight"), 256), want) << l;
    EXPECT_EQ(synthetic_tensor_dtype(spec, llama_layer_tensor(l, "ffn_down.weight"), 512), want)
        << l;
    EXPECT_EQ(synthetic_tensor_dtype(spec, llama_layer_tensor(l, "attn_k.weight"), 256),
              DType::Q4_K);
    EXPECT_EQ(synthetic_tensor_dtype(spec, llama_layer_tensor(l, "ffn_up.weight"), 256),
              DType::Q4_K);
  }
  EXPECT_EQ(synthetic_tensor_dtype(spec, "output.weight", 256), DType::Q6_K);
  EXPECT_EQ(synthetic_tensor_dtype(spec, "token_embd.weight", 256), DType::Q4_K);
  EXPECT_EQ(synthetic_tensor_dtype(spec, "attn_q.weight", 96), DType::Q4_0);  // fallback
  EXPECT_EQ(synthetic_tensor_dtype(spec, "output.weight", 96), DType::Q8_0);  // Q6_K's fallback
  spec.tied_embeddings = true;
  EXPECT_EQ(synthetic_tensor_dtype(spec, "token_embd.weight", 256), DType::Q6_K);
  spec.dtype = DType::Q5_K;
  EXPECT_EQ(synthetic_file_type(spec.dtype, spec.mix), 17u);
  EXPECT_EQ(synthetic_tensor_dtype(spec, llama_layer_tensor(1, "attn_v.weight"), 256), DType::Q5_K);
  EXPECT_EQ(synthetic_tensor_dtype(spec, llama_layer_tensor(7, "attn_v.weight"), 256), DType::Q6_K);
  EXPECT_EQ(synthetic_tensor_dtype(spec, "attn_q.weight", 96), DType::Q8_0);

  // Written: every tensor in the dtype the mix gives it, and the weights in range.
  spec.dtype = DType::Q4_K;
  spec.tied_embeddings = false;
  spec.n_layer = 2;
  std::vector<uint8_t> bytes = make_synthetic_writer(spec).to_bytes();
  gguf::File f = gguf::File::parse(bytes);
  EXPECT_EQ(f.get_uint("general.file_type"), 15u);
  for (const auto& t : f.tensors()) {
    if (t.n_dims == 1) {
      EXPECT_EQ(t.dtype, DType::F32) << t.name;
      continue;
    }
    EXPECT_EQ(t.dtype, synthetic_tensor_dtype(spec, t.name, t.ne[0])) << t.name;
    const std::vector<float> w = dequantized(t);
    double sum = 0, sum2 = 0;
    for (float v : w) {
      sum += v;
      sum2 += double(v) * v;
    }
    const double amplitude = 1.0 / std::sqrt(double(t.ne[0]));  // uniform in [-a, a]
    EXPECT_LT(std::fabs(sum / double(w.size())), 0.1 * amplitude) << t.name;
    EXPECT_GT(std::sqrt(sum2 / double(w.size())), 0.2 * amplitude) << t.name;
    EXPECT_LT(std::sqrt(sum2 / double(w.size())), 1.0 * amplitude) << t.name;
  }
  EXPECT_EQ(f.find_tensor("blk.1.attn_v.weight")->dtype, DType::Q6_K);
  EXPECT_EQ(f.find_tensor("blk.0.attn_v.weight")->dtype, DType::Q4_K);
  error_of([] { synthetic_preset("tiny", DType::Q4_K); }, ErrorCode::InvalidArgument);
  error_of([] { synthetic_preset("tiny", DType::Q8_0, 0, SyntheticMix::KQuantMedium); },
           ErrorCode::InvalidArgument);
  EXPECT_EQ(synthetic_preset("tiny", DType::Q6_K).dtype, DType::Q6_K);
  EXPECT_EQ(synthetic_file_type(DType::Q6_K), 18u);
}

TEST(Synthetic, PresetsHaveTheRealShapes) {
  SyntheticSpec one = synthetic_preset("llama-3.2-1b", DType::Q4_0);
  EXPECT_EQ(one.n_vocab, 128256);
  EXPECT_EQ(one.n_embd, 2048);
  EXPECT_EQ(one.n_layer, 16);
  EXPECT_EQ(one.n_ff, 8192);
  EXPECT_EQ(one.n_head, 32);
  EXPECT_EQ(one.n_head_kv, 8);
  EXPECT_EQ(one.context_length, 131072);
  EXPECT_EQ(one.rope_freq_base, 500000.0f);
  EXPECT_TRUE(one.tied_embeddings);
  SyntheticSpec eight = synthetic_preset("llama-3.1-8b", DType::Q4_0);
  EXPECT_EQ(eight.n_embd, 4096);
  EXPECT_EQ(eight.n_layer, 32);
  EXPECT_EQ(eight.n_ff, 14336);
  EXPECT_FALSE(eight.tied_embeddings);
  std::string m = error_of([] { synthetic_preset("llama-70b"); }, ErrorCode::InvalidArgument);
  EXPECT_NE(m.find("llama-3.1-8b"), std::string::npos) << m;
  error_of([] { synthetic_preset("tiny", DType::I32); }, ErrorCode::InvalidArgument);
  SyntheticSpec odd = synthetic_preset("tiny", DType::Q4_0);
  odd.n_embd = 48;
  odd.n_head = 3;
  error_of([&] { make_synthetic_writer(odd); }, ErrorCode::InvalidArgument);
}

TEST(Synthetic, OneLayerOfLlama32At1BShapesLoads) {
  // The full vocabulary and real widths; one layer keeps the file at ~170 MB.
  SyntheticSpec spec = synthetic_preset("llama-3.2-1b", DType::Q4_0, 5);
  spec.n_layer = 1;
  std::string path = temp_path("1b_one_layer.gguf");
  write_synthetic_model(spec, path);
  {
    gguf::File f = gguf::File::open(path);
    LlamaConfig c = LlamaConfig::from_gguf(f);
    EXPECT_EQ(c.n_vocab, 128256);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.n_rot, 64);
    EXPECT_TRUE(c.tied_embeddings);
    EXPECT_EQ(f.find_tensor("token_embd.weight")->bytes, size_t(128256) * 2048 / 32 * 18);
  }
  std::filesystem::remove(path);
}

TEST(Synthetic, VocabularyIsSentencePieceShaped) {
  for (int64_t n : {260, 512, 128256}) {
    auto v = synthetic_vocab(n);
    ASSERT_EQ(int64_t(v.size()), n);
    EXPECT_EQ(std::set<std::string>(v.begin(), v.end()).size(), v.size());
    EXPECT_EQ(v[0], "<unk>");
    EXPECT_EQ(v[1], "<s>");
    EXPECT_EQ(v[2], "</s>");
    EXPECT_EQ(v[3], "<0x00>");
    EXPECT_EQ(v[3 + 0x0A], "<0x0A>");
    EXPECT_EQ(v[258], "<0xFF>");
    EXPECT_EQ(v[259], "\xE2\x96\x81");
  }
  auto v = synthetic_vocab(512);
  std::set<std::string> all(v.begin(), v.end());
  for (char ch = 0x21; ch <= 0x7e; ++ch) EXPECT_TRUE(all.count(std::string(1, ch))) << ch;
  EXPECT_TRUE(
      all.count("\xE2\x96\x81"
                "a"));
  EXPECT_TRUE(
      all.count("\xE2\x96\x81"
                "ba"));
  error_of([] { synthetic_vocab(100); }, ErrorCode::InvalidArgument);
}

// A tiny llama file built by hand, so one tensor can be left out or misshapen.
std::vector<uint8_t> llama_file(const std::function<void(gguf::Writer&)>& edit_keys,
                                const std::string& skip = "", const std::string& reshape = "",
                                DType norm_dtype = DType::F32) {
  gguf::Writer w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.context_length", 128);
  w.set_u32("llama.embedding_length", 64);
  w.set_u32("llama.block_count", 2);
  w.set_u32("llama.feed_forward_length", 96);
  w.set_u32("llama.attention.head_count", 4);
  w.set_u32("llama.attention.head_count_kv", 2);
  w.set_f32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
  w.set_string_array("tokenizer.ggml.tokens", std::vector<std::string>(40, ""));  // size only
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  edit_keys(w);
  auto add = [&](const std::string& name, std::vector<int64_t> ne, bool norm = false) {
    if (name == skip) return;
    if (name == reshape) ne[0] *= 2;
    w.add_tensor_lazy(name, norm ? norm_dtype : DType::F32, ne,
                      [](uint8_t* d, size_t n) { std::memset(d, 0, n); });
  };
  add("token_embd.weight", {64, 40});
  for (int l = 0; l < 2; ++l) {
    add(llama_layer_tensor(l, "attn_norm.weight"), {64}, true);
    add(llama_layer_tensor(l, "attn_q.weight"), {64, 64});
    add(llama_layer_tensor(l, "attn_k.weight"), {64, 32});
    add(llama_layer_tensor(l, "attn_v.weight"), {64, 32});
    add(llama_layer_tensor(l, "attn_output.weight"), {64, 64});
    add(llama_layer_tensor(l, "ffn_norm.weight"), {64}, true);
    add(llama_layer_tensor(l, "ffn_gate.weight"), {64, 96});
    add(llama_layer_tensor(l, "ffn_up.weight"), {64, 96});
    add(llama_layer_tensor(l, "ffn_down.weight"), {96, 64});
  }
  add("output_norm.weight", {64}, true);
  add("output.weight", {64, 40});
  return w.to_bytes();
}

std::string config_error(const std::vector<uint8_t>& bytes, ErrorCode want = ErrorCode::Format) {
  gguf::File f = gguf::File::parse(bytes, "cfg");
  return error_of([&] { LlamaConfig::from_gguf(f); }, want);
}

TEST(LlamaConfigTest, HandBuiltFileValidatesWithDefaults) {
  auto bytes = llama_file([](gguf::Writer&) {});
  gguf::File f = gguf::File::parse(bytes);
  LlamaConfig c = LlamaConfig::from_gguf(f);
  EXPECT_EQ(c.n_vocab, 40);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.n_rot, 16);                       // no rope.dimension_count: head_dim
  EXPECT_FLOAT_EQ(c.rope_freq_base, 10000.0f);  // no rope.freq_base: llama's default
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, -1);
  EXPECT_FALSE(c.tied_embeddings);
}

TEST(LlamaConfigTest, NamesTheBadKey) {
  struct Case {
    std::function<void(gguf::Writer&)> edit;
    std::string key;
  };
  std::vector<Case> cases = {
      {[](gguf::Writer& w) { w.set_string("llama.block_count", "2"); }, "llama.block_count"},
      {[](gguf::Writer& w) { w.set_u32("llama.embedding_length", 0); }, "llama.embedding_length"},
      {[](gguf::Writer& w) {
         w.set_u32("llama.attention.head_count", 3);  // does not divide 64
         w.set_u32("llama.attention.head_count_kv", 3);
       },
       "llama.attention.head_count"},
      {[](gguf::Writer& w) { w.set_u32("llama.attention.head_count_kv", 3); },
       "llama.attention.head_count_kv"},
      {[](gguf::Writer& w) { w.set_f32("llama.attention.layer_norm_rms_epsilon", -1.0f); },
       "llama.attention.layer_norm_rms_epsilon"},
      {[](gguf::Writer& w) { w.set_u32("llama.attention.layer_norm_rms_epsilon", 1); },
       "llama.attention.layer_norm_rms_epsilon"},
      {[](gguf::Writer& w) { w.set_f32("llama.rope.freq_base", NAN); }, "llama.rope.freq_base"},
      {[](gguf::Writer& w) { w.set_u32("llama.rope.dimension_count", 15); },
       "llama.rope.dimension_count"},
      {[](gguf::Writer& w) { w.set_u32("llama.rope.dimension_count", 32); },
       "llama.rope.dimension_count"},
      {[](gguf::Writer& w) { w.set_u32("tokenizer.ggml.bos_token_id", 40); },
       "tokenizer.ggml.bos_token_id"},
      {[](gguf::Writer& w) { w.set_i32("tokenizer.ggml.eos_token_id", -2); },
       "tokenizer.ggml.eos_token_id"},
      {[](gguf::Writer& w) { w.set_u32("llama.vocab_size", 41); }, "llama.vocab_size"},
      {[](gguf::Writer& w) { w.set_u32("llama.block_count", 100000); }, "llama.block_count"},
  };
  for (const auto& c : cases) {
    std::string m = config_error(llama_file(c.edit));
    EXPECT_NE(m.find("'" + c.key + "'"), std::string::npos) << c.key << ": " << m;
    EXPECT_NE(m.find("offset"), std::string::npos) << m;
  }
  // A missing required key: named, no offset to give.
  gguf::Writer w;
  w.set_string("general.architecture", "llama");
  std::string m = config_error(w.to_bytes());
  EXPECT_NE(m.find("llama.embedding_length"), std::string::npos) << m;
  m = config_error(
      llama_file([](gguf::Writer& x) { x.set_string("general.architecture", "gpt2"); }),
      ErrorCode::Unsupported);
  EXPECT_NE(m.find("gpt2"), std::string::npos) << m;
}

TEST(LlamaConfigTest, NamesTheMissingOrMisshapenTensor) {
  auto none = [](gguf::Writer&) {};
  std::string m = config_error(llama_file(none, "blk.1.ffn_up.weight"));
  EXPECT_NE(m.find("missing tensor 'blk.1.ffn_up.weight'"), std::string::npos) << m;
  m = config_error(llama_file(none, "token_embd.weight"));
  EXPECT_NE(m.find("'token_embd.weight'"), std::string::npos) << m;
  m = config_error(llama_file(none, "output_norm.weight"));
  EXPECT_NE(m.find("'output_norm.weight'"), std::string::npos) << m;
  m = config_error(llama_file(none, "", "blk.0.attn_k.weight"));
  EXPECT_NE(m.find("'blk.0.attn_k.weight'"), std::string::npos) << m;
  EXPECT_NE(m.find("[128, 32, 1, 1], expected [64, 32, 1, 1]"), std::string::npos) << m;
  EXPECT_NE(m.find("offset"), std::string::npos) << m;
  m = config_error(llama_file(none, "", "output.weight"));
  EXPECT_NE(m.find("'output.weight'"), std::string::npos) << m;
  m = config_error(llama_file(none, "", "", DType::Q8_0));
  EXPECT_NE(m.find("attn_norm.weight"), std::string::npos) << m;
  // Without output.weight the embeddings are tied.
  auto tied = llama_file(none, "output.weight");
  EXPECT_TRUE(LlamaConfig::from_gguf(gguf::File::parse(tied)).tied_embeddings);
}

// A tiny mixture-of-experts file built by hand (llama: Mixtral's layout; qwen3moe: with per-head
// Q/K norms and expert_feed_forward_length), so one tensor can be left out or misshapen.
std::vector<uint8_t> moe_file(const std::string& arch,
                              const std::function<void(gguf::Writer&)>& edit_keys,
                              const std::string& skip = "", const std::string& reshape = "") {
  const bool qwen = arch == "qwen3moe";
  const int64_t ff = qwen ? 32 : 96;  // rows of each expert
  gguf::Writer w;
  auto key = [&](const char* k) { return arch + "." + k; };
  w.set_string("general.architecture", arch);
  w.set_u32(key("context_length"), 128);
  w.set_u32(key("embedding_length"), 64);
  w.set_u32(key("block_count"), 2);
  w.set_u32(key("feed_forward_length"), 96);
  w.set_u32(key("attention.head_count"), 4);
  w.set_u32(key("attention.head_count_kv"), 2);
  w.set_f32(key("attention.layer_norm_rms_epsilon"), 1e-6f);
  w.set_u32(key("expert_count"), 4);
  w.set_u32(key("expert_used_count"), 2);
  if (qwen) w.set_u32(key("expert_feed_forward_length"), uint32_t(ff));
  w.set_string_array("tokenizer.ggml.tokens", std::vector<std::string>(40, ""));
  edit_keys(w);
  auto add = [&](const std::string& name, std::vector<int64_t> ne) {
    if (name == skip) return;
    if (name == reshape) ne[0] *= 2;
    w.add_tensor_lazy(name, DType::F32, ne, [](uint8_t* d, size_t n) { std::memset(d, 0, n); });
  };
  add("token_embd.weight", {64, 40});
  for (int l = 0; l < 2; ++l) {
    add(llama_layer_tensor(l, "attn_norm.weight"), {64});
    add(llama_layer_tensor(l, "attn_q.weight"), {64, 64});
    add(llama_layer_tensor(l, "attn_k.weight"), {64, 32});
    add(llama_layer_tensor(l, "attn_v.weight"), {64, 32});
    add(llama_layer_tensor(l, "attn_output.weight"), {64, 64});
    if (qwen) {
      add(llama_layer_tensor(l, "attn_q_norm.weight"), {16});
      add(llama_layer_tensor(l, "attn_k_norm.weight"), {16});
    }
    add(llama_layer_tensor(l, "ffn_norm.weight"), {64});
    add(llama_layer_tensor(l, "ffn_gate_inp.weight"), {64, 4});
    add(llama_layer_tensor(l, "ffn_gate_exps.weight"), {64, ff, 4});
    add(llama_layer_tensor(l, "ffn_up_exps.weight"), {64, ff, 4});
    add(llama_layer_tensor(l, "ffn_down_exps.weight"), {ff, 64, 4});
  }
  add("output_norm.weight", {64});
  return w.to_bytes();
}

TEST(LlamaConfigTest, ReadsTheExpertLayouts) {
  LlamaConfig mixtral = LlamaConfig::from_gguf(gguf::File::parse(moe_file("llama", [](auto&) {})));
  EXPECT_EQ(mixtral.arch, "llama");
  EXPECT_TRUE(mixtral.is_moe());
  EXPECT_EQ(mixtral.n_expert, 4);
  EXPECT_EQ(mixtral.n_expert_used, 2);
  EXPECT_EQ(mixtral.n_ff_expert, 96);  // no expert_feed_forward_length: n_ff
  EXPECT_TRUE(mixtral.norm_expert_weights);
  EXPECT_FALSE(mixtral.qk_norm);
  EXPECT_FALSE(mixtral.rope_neox);
  LlamaConfig qwen = LlamaConfig::from_gguf(gguf::File::parse(moe_file("qwen3moe", [](auto&) {})));
  EXPECT_EQ(qwen.arch, "qwen3moe");
  EXPECT_EQ(qwen.n_expert, 4);
  EXPECT_EQ(qwen.n_ff_expert, 32);
  EXPECT_TRUE(qwen.norm_expert_weights);
  EXPECT_TRUE(qwen.qk_norm);
  EXPECT_TRUE(qwen.rope_neox);
  // A dense llama file has no experts.
  EXPECT_FALSE(LlamaConfig::from_gguf(gguf::File::parse(llama_file([](auto&) {}))).is_moe());
}

TEST(LlamaConfigTest, NamesTheBadExpertKeyOrTensor) {
  struct Case {
    std::string arch;
    std::function<void(gguf::Writer&)> edit;
    std::string skip, reshape, expect;
  };
  std::vector<Case> cases = {
      {"llama", [](gguf::Writer& w) { w.set_u32("llama.expert_used_count", 5); }, "", "",
       "'llama.expert_used_count'"},
      {"llama", [](gguf::Writer& w) { w.set_u32("llama.expert_used_count", 0); }, "", "",
       "'llama.expert_used_count'"},
      {"llama", [](gguf::Writer& w) { w.set_u32("llama.expert_count", 100000); }, "", "",
       "'llama.expert_count'"},
      {"qwen3moe", [](gguf::Writer& w) { w.set_u32("qwen3moe.expert_count", 0); }, "", "",
       "'qwen3moe.expert_count'"},
      {"qwen3moe", [](gguf::Writer& w) { w.set_u32("qwen3moe.expert_feed_forward_length", 0); }, "",
       "", "'qwen3moe.expert_feed_forward_length'"},
      // Experts declared but the dense tensors expected: 0 experts reads as a dense model.
      {"llama", [](gguf::Writer& w) { w.set_u32("llama.expert_count", 0); }, "", "",
       "missing tensor 'blk.0.ffn_gate.weight'"},
      {"llama", [](gguf::Writer&) {}, "blk.1.ffn_down_exps.weight", "",
       "missing tensor 'blk.1.ffn_down_exps.weight'"},
      {"llama", [](gguf::Writer&) {}, "blk.0.ffn_gate_inp.weight", "",
       "missing tensor 'blk.0.ffn_gate_inp.weight'"},
      {"llama", [](gguf::Writer&) {}, "", "blk.0.ffn_up_exps.weight", "'blk.0.ffn_up_exps.weight'"},
      {"qwen3moe", [](gguf::Writer&) {}, "blk.1.attn_k_norm.weight", "",
       "missing tensor 'blk.1.attn_k_norm.weight'"},
      {"qwen3moe", [](gguf::Writer&) {}, "", "blk.0.attn_q_norm.weight",
       "'blk.0.attn_q_norm.weight'"},
  };
  for (const auto& c : cases) {
    std::string m = config_error(moe_file(c.arch, c.edit, c.skip, c.reshape));
    EXPECT_NE(m.find(c.expect), std::string::npos) << c.expect << ": " << m;
  }
  std::string m =
      config_error(moe_file("llama", [](gguf::Writer& w) { w.set_u32("llama.expert_count", 5); }));
  EXPECT_NE(m.find("[64, 4, 1, 1], expected [64, 5, 1, 1]"), std::string::npos) << m;
}

TEST(Synthetic, ExpertPresetsHaveTheRealShapes) {
  SyntheticSpec mixtral = synthetic_preset("mixtral-8x7b", DType::Q4_0);
  EXPECT_EQ(mixtral.arch, "llama");
  EXPECT_EQ(mixtral.n_embd, 4096);
  EXPECT_EQ(mixtral.n_layer, 32);
  EXPECT_EQ(mixtral.n_ff, 14336);
  EXPECT_EQ(mixtral.n_expert, 8);
  EXPECT_EQ(mixtral.n_expert_used, 2);
  SyntheticSpec qwen = synthetic_preset("qwen3-30b-a3b", DType::Q4_0);
  EXPECT_EQ(qwen.arch, "qwen3moe");
  EXPECT_EQ(qwen.n_embd, 2048);
  EXPECT_EQ(qwen.n_layer, 48);
  EXPECT_EQ(qwen.n_head, 32);
  EXPECT_EQ(qwen.n_head_kv, 4);
  EXPECT_EQ(synthetic_head_dim(qwen), 128);
  EXPECT_EQ(qwen.n_expert, 128);
  EXPECT_EQ(qwen.n_expert_used, 8);
  EXPECT_EQ(qwen.n_ff_expert, 768);
  // The writers are lazy: building them validates the specs without generating anything.
  EXPECT_NO_THROW(make_synthetic_writer(mixtral));
  EXPECT_NO_THROW(make_synthetic_writer(qwen));
  SyntheticSpec bad = synthetic_preset("tiny-moe");
  bad.n_expert_used = 5;
  error_of([&] { make_synthetic_writer(bad); }, ErrorCode::InvalidArgument);
  bad = synthetic_preset("tiny-moe");
  bad.moe_skew = -1.0f;
  error_of([&] { make_synthetic_writer(bad); }, ErrorCode::InvalidArgument);
  bad = synthetic_preset("tiny-qwen3moe");
  bad.n_expert = 0;
  error_of([&] { make_synthetic_writer(bad); }, ErrorCode::InvalidArgument);
}

TEST(Synthetic, TinyExpertModelsLoad) {
  for (const char* preset : {"tiny-moe", "tiny-qwen3moe"}) {
    for (DType dtype : {DType::F32, DType::Q4_0}) {
      SyntheticSpec spec = synthetic_preset(preset, dtype, 3);
      spec.threads = 1;
      const std::vector<uint8_t> bytes = make_synthetic_writer(spec).to_bytes();
      gguf::File f = gguf::File::parse(bytes);  // reads `bytes` in place
      LlamaConfig c = LlamaConfig::from_gguf(f);
      EXPECT_EQ(c.arch, spec.arch) << preset;
      EXPECT_EQ(c.n_expert, spec.n_expert) << preset;
      EXPECT_EQ(c.n_expert_used, spec.n_expert_used) << preset;
      EXPECT_EQ(c.head_dim, synthetic_head_dim(spec)) << preset;
      // The router stays F32 in every file type; the experts take the file's type.
      EXPECT_EQ(f.find_tensor("blk.0.ffn_gate_inp.weight")->dtype, DType::F32);
      EXPECT_EQ(f.find_tensor("blk.1.ffn_up_exps.weight")->dtype, dtype);
      EXPECT_EQ(f.find_tensor("blk.1.ffn_up_exps.weight")->n_dims, 3);
    }
  }
}

// How often each expert is among a token's top k under the router of layer 0, for random
// normalized hidden states.
std::vector<int> expert_wins(const SyntheticSpec& spec, int tokens) {
  const std::vector<uint8_t> bytes = make_synthetic_writer(spec).to_bytes();
  gguf::File f = gguf::File::parse(bytes);  // reads `bytes` in place
  const gguf::TensorInfo* router = f.find_tensor("blk.0.ffn_gate_inp.weight");
  std::vector<float> w(static_cast<size_t>(spec.n_embd * spec.n_expert));
  std::memcpy(w.data(), router->data, w.size() * sizeof(float));
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<int> wins(static_cast<size_t>(spec.n_expert));
  std::vector<float> h(static_cast<size_t>(spec.n_embd));
  std::vector<std::pair<float, int>> logits(static_cast<size_t>(spec.n_expert));
  for (int t = 0; t < tokens; ++t) {
    for (float& v : h) v = normal(rng);
    for (int64_t e = 0; e < spec.n_expert; ++e) {
      float acc = 0.0f;
      for (int64_t i = 0; i < spec.n_embd; ++i)
        acc += w[size_t(e * spec.n_embd + i)] * h[size_t(i)];
      logits[size_t(e)] = {acc, int(e)};
    }
    std::partial_sort(logits.begin(), logits.begin() + spec.n_expert_used, logits.end(),
                      std::greater<>());
    for (int64_t j = 0; j < spec.n_expert_used; ++j) ++wins[size_t(logits[size_t(j)].second)];
  }
  return wins;
}

TEST(Synthetic, MoeSkewMakesSomeExpertsWinFarMoreOften) {
  SyntheticSpec spec = synthetic_preset("tiny-moe", DType::F32, 9);
  spec.n_expert = 8;
  spec.threads = 1;
  const auto ratio = [](const std::vector<int>& wins) {
    const auto [lo, hi] = std::minmax_element(wins.begin(), wins.end());
    return double(*hi) / double(std::max(1, *lo));
  };
  const std::vector<int> even = expert_wins(spec, 2000);
  spec.moe_skew = 6.0f;
  const std::vector<int> skewed = expert_wins(spec, 2000);
  EXPECT_LT(ratio(even), 2.0);
  EXPECT_GT(ratio(skewed), 5.0);
  EXPECT_GT(skewed[0], skewed[7]);  // the low-numbered experts are the favoured ones
}

}  // namespace
}  // namespace tandem
