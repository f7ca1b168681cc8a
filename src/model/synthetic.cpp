// Synthetic models. Weights are drawn straight into their final format (quantized blocks are
// generated as random quants and scales, never quantized from floats), chunk by chunk with a
// per-chunk seed, so the output is identical for any thread count and an 8B Q4_0 file is
// bounded by the disk, not the generator.
#include "tandem/model/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "tandem/error.h"
#include "tandem/hash.h"
#include "tandem/model/llama_config.h"

namespace tandem {
namespace {

const std::string kWhere = "synthetic";

uint64_t mix(uint64_t a, uint64_t b) {
  return SplitMix64{a ^ (b * 0xd6e8feb86659fd93ull)}.next();
}

// Uniform in [-1, 1) from 24 random bits.
inline float signed_unit(uint64_t bits24) {
  return float(bits24) * (2.0f / 16777216.0f) - 1.0f;
}

enum class Init { Matrix, Norm };

// Fills chunk `chunk` (elements or blocks [first, first + count)) of a tensor.
struct Generator {
  DType dtype;
  Init init;
  float amplitude;  // matrices: uniform in [-amplitude, amplitude]
  uint64_t tensor_seed;
  // F32 matrices: row r (of `rows`, each row_len long) scaled by exp(-skew * r / (rows - 1)).
  float skew = 0.0f;
  int64_t row_len = 1, rows = 1;
  uint16_t scales[256];  // quantized: per-block f16 scales to draw from

  void prepare() {
    // The largest value one block reaches per unit of its f16 scale: K-quants multiply it by a
    // sub-block scale of up to 63 (Q6_K: 127) and center their quants with the min or offset.
    float q_max = 127.0f;
    switch (dtype) {
      case DType::Q4_0:
        q_max = 7.0f;
        break;
      case DType::Q4_K:
        q_max = 7.5f * 63.0f;
        break;
      case DType::Q5_K:
        q_max = 15.5f * 63.0f;
        break;
      case DType::Q6_K:
        q_max = 32.0f * 127.0f;
        break;
      default:
        break;
    }
    for (int k = 0; k < 256; ++k) {
      // Scales vary per block (0.75..1.0 of the full range) so kernels see distinct scales.
      scales[k] = f32_to_f16(amplitude / q_max * (0.75f + 0.25f * float(k) / 255.0f));
    }
  }

  static void random_bytes(SplitMix64& rng, uint8_t* dst, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
      const uint64_t r = rng.next();
      for (size_t j = 0; j < 8 && i + j < n; ++j) dst[i + j] = uint8_t(r >> (8 * j));
    }
  }

  // Q4_K / Q5_K: sub-block scales 32..63 and mins of half the scale against dmin = (levels - 1) *
  // d, which centers every sub-block's values on zero.
  template <class Block>
  void fill_k_scales(SplitMix64& rng, Block& b, int levels) const {
    b.d = scales[rng.next() >> 56];
    b.dmin = f32_to_f16(f16_to_f32(b.d) * float(levels - 1));
    std::memset(b.scales, 0, sizeof b.scales);
    const uint64_t r = rng.next();
    for (int j = 0; j < 8; ++j) {
      const auto sc = uint8_t(32 + ((r >> (8 * j)) & 31));
      k_pack_scale_min(j, sc, uint8_t(sc / 2), b.scales);
    }
  }

  void fill_chunk(uint8_t* dst, int64_t first, int64_t count, uint64_t chunk) const {
    SplitMix64 rng{mix(tensor_seed, chunk)};
    switch (dtype) {
      case DType::F32: {
        float* out = reinterpret_cast<float*>(dst) + first;
        float base = init == Init::Norm ? 1.0f : 0.0f;
        float amp = init == Init::Norm ? 0.1f : amplitude;
        for (int64_t k = 0; k < count; ++k) out[k] = base + amp * signed_unit(rng.next() >> 40);
        if (skew > 0.0f && rows > 1) {
          for (int64_t k = 0; k < count; ++k) {
            const auto row = double((first + k) / row_len % rows);
            out[k] *= float(std::exp(-double(skew) * row / double(rows - 1)));
          }
        }
        break;
      }
      case DType::F16: {
        uint16_t* out = reinterpret_cast<uint16_t*>(dst) + first;
        for (int64_t k = 0; k < count; ++k) {
          out[k] = f32_to_f16(amplitude * signed_unit(rng.next() >> 40));
        }
        break;
      }
      case DType::Q8_0: {
        BlockQ8_0* out = reinterpret_cast<BlockQ8_0*>(dst) + first;
        for (int64_t b = 0; b < count; ++b) {
          out[b].d = scales[rng.next() >> 56];
          for (int w = 0; w < 4; ++w) {
            uint64_t r = rng.next();
            for (int j = 0; j < 8; ++j) {  // -127..127, symmetric
              out[b].qs[w * 8 + j] = int8_t(int(((r >> (8 * j)) & 0xff) * 255 >> 8) - 127);
            }
          }
        }
        break;
      }
      case DType::Q4_0: {
        BlockQ4_0* out = reinterpret_cast<BlockQ4_0*>(dst) + first;
        for (int64_t b = 0; b < count; ++b) {
          out[b].d = scales[rng.next() >> 56];
          uint8_t q[32];
          for (int w = 0; w < 4; ++w) {
            uint64_t r = rng.next();
            for (int j = 0; j < 8; ++j) {  // 1..15, i.e. -7..7 after the -8 offset
              q[w * 8 + j] = uint8_t(1 + ((((r >> (8 * j)) & 0xff) * 15) >> 8));
            }
          }
          for (int j = 0; j < 16; ++j) out[b].qs[j] = uint8_t(q[j] | (q[j + 16] << 4));
        }
        break;
      }
      case DType::Q4_K: {
        BlockQ4_K* out = reinterpret_cast<BlockQ4_K*>(dst) + first;
        for (int64_t b = 0; b < count; ++b) {
          fill_k_scales(rng, out[b], 16);
          random_bytes(rng, out[b].qs, sizeof out[b].qs);
        }
        break;
      }
      case DType::Q5_K: {
        BlockQ5_K* out = reinterpret_cast<BlockQ5_K*>(dst) + first;
        for (int64_t b = 0; b < count; ++b) {
          fill_k_scales(rng, out[b], 32);
          random_bytes(rng, out[b].qh, sizeof out[b].qh);
          random_bytes(rng, out[b].qs, sizeof out[b].qs);
        }
        break;
      }
      case DType::Q6_K: {
        BlockQ6_K* out = reinterpret_cast<BlockQ6_K*>(dst) + first;
        for (int64_t b = 0; b < count; ++b) {
          random_bytes(rng, out[b].ql, sizeof out[b].ql);
          random_bytes(rng, out[b].qh, sizeof out[b].qh);
          const uint64_t r0 = rng.next(), r1 = rng.next();
          for (int j = 0; j < 16; ++j) {  // 64..127, positive as the quants are centered
            const uint64_t r = j < 8 ? r0 : r1;
            out[b].scales[j] = int8_t(64 + ((r >> (8 * (j % 8))) & 63));
          }
          out[b].d = scales[rng.next() >> 56];
        }
        break;
      }
      default:
        throw_error(ErrorCode::InvalidArgument, kWhere,
                    "cannot generate dtype " + std::string(dtype_name(dtype)));
    }
  }
};

constexpr int64_t kChunkUnits = 1 << 14;  // elements (plain) or blocks (quantized) per chunk

void generate(const Generator& gen, uint8_t* dst, int64_t units, int threads) {
  int64_t n_chunks = (units + kChunkUnits - 1) / kChunkUnits;
  auto run = [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t first = c * kChunkUnits;
      gen.fill_chunk(dst, first, std::min(kChunkUnits, units - first), uint64_t(c));
    }
  };
  int t_count = int(std::min<int64_t>(threads, n_chunks));
  if (t_count <= 1) {
    run(0, n_chunks);
    return;
  }
  std::vector<std::thread> pool;
  std::exception_ptr error;
  std::mutex error_mutex;
  for (int t = 0; t < t_count; ++t) {
    pool.emplace_back([&, t] {
      try {
        run(n_chunks * t / t_count, n_chunks * (t + 1) / t_count);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

void check_spec(const SyntheticSpec& s) {
  auto in_range = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  synthetic_file_type(s.dtype, s.mix);
  TANDEM_CHECK_ARG(in_range(s.n_vocab, 260, 1 << 22), kWhere, "n_vocab must be in [260, 4M]");
  TANDEM_CHECK_ARG(in_range(s.n_embd, 1, 1 << 16) && in_range(s.n_ff, 1, 1 << 18) &&
                       in_range(s.n_layer, 1, 1024) && in_range(s.n_head, 1, 1024) &&
                       in_range(s.n_head_kv, 1, 1024) && in_range(s.context_length, 1, 1 << 24),
                   kWhere, "a dimension is out of range");
  TANDEM_CHECK_ARG(s.arch == "llama" || s.arch == "qwen3moe", kWhere,
                   "arch must be llama or qwen3moe (got '" + s.arch + "')");
  TANDEM_CHECK_ARG(s.n_head % s.n_head_kv == 0, kWhere, "n_head_kv must divide n_head");
  TANDEM_CHECK_ARG(s.head_dim > 0 || s.n_embd % s.n_head == 0, kWhere,
                   "n_head must divide n_embd (or head_dim must be given)");
  TANDEM_CHECK_ARG(in_range(s.head_dim, 0, 1 << 12), kWhere, "head_dim must be in [0, 4096]");
  const int64_t head_dim = synthetic_head_dim(s);
  TANDEM_CHECK_ARG(head_dim % 2 == 0, kWhere, "head_dim must be even (RoPE pairs)");
  TANDEM_CHECK_ARG(in_range(s.n_expert, 0, 1024), kWhere, "n_expert must be in [0, 1024]");
  TANDEM_CHECK_ARG(s.arch != "qwen3moe" || s.n_expert > 0, kWhere, "qwen3moe needs experts");
  const int64_t n_ff_expert = s.n_ff_expert > 0 ? s.n_ff_expert : s.n_ff;
  if (s.n_expert > 0) {
    TANDEM_CHECK_ARG(in_range(s.n_expert_used, 1, s.n_expert), kWhere,
                     "n_expert_used must be in [1, n_expert] (got " +
                         std::to_string(s.n_expert_used) + " of " + std::to_string(s.n_expert) +
                         ")");
    TANDEM_CHECK_ARG(in_range(n_ff_expert, 1, 1 << 18), kWhere, "n_ff_expert is out of range");
    TANDEM_CHECK_ARG(s.arch != "llama" || n_ff_expert == s.n_ff, kWhere,
                     "llama experts have n_ff rows (n_ff_expert must be 0 or n_ff)");
  }
  TANDEM_CHECK_ARG(std::isfinite(s.moe_skew) && s.moe_skew >= 0.0f, kWhere,
                   "moe_skew must be finite and >= 0");
  if (dtype_traits(s.dtype).is_quantized) {
    const int64_t q_dim = s.n_head * head_dim;
    TANDEM_CHECK_ARG(s.n_embd % kQuantBlock == 0 && s.n_ff % kQuantBlock == 0 &&
                         q_dim % kQuantBlock == 0 && n_ff_expert % kQuantBlock == 0,
                     kWhere,
                     "n_embd, n_ff, n_head * head_dim and n_ff_expert must be multiples of 32 for "
                     "quantized weights (n_embd " +
                         std::to_string(s.n_embd) + ", n_ff " + std::to_string(s.n_ff) +
                         ", n_head * head_dim " + std::to_string(q_dim) + ", n_ff_expert " +
                         std::to_string(n_ff_expert) + ")");
  }
  TANDEM_CHECK_ARG(s.rms_eps > 0 && s.rope_freq_base > 0, kWhere,
                   "rms_eps and rope_freq_base must be positive");
}

}  // namespace

std::vector<std::string_view> synthetic_preset_names() {
  return {"tiny",     "small",         "llama-3.2-1b", "llama-3.1-8b",
          "tiny-moe", "tiny-qwen3moe", "mixtral-8x7b", "qwen3-30b-a3b"};
}

int64_t synthetic_head_dim(const SyntheticSpec& spec) {
  return spec.head_dim > 0 ? spec.head_dim : spec.n_embd / spec.n_head;
}

SyntheticSpec synthetic_preset(std::string_view preset, DType dtype, uint64_t seed,
                               SyntheticMix mix) {
  SyntheticSpec s;
  if (preset == "tiny") {
    // the defaults
  } else if (preset == "small") {
    // ~160M parameters: big enough that placement and bandwidth matter, small enough for a
    // 2-core machine's main job.
    s.name = "tandem-synthetic-small";
    s.n_vocab = 32000;
    s.n_embd = 1024;
    s.n_layer = 8;
    s.n_ff = 2816;
    s.n_head = 16;
    s.n_head_kv = 4;
    s.context_length = 4096;
  } else if (preset == "llama-3.2-1b") {
    s.name = "tandem-synthetic-llama-3.2-1b";
    s.n_vocab = 128256;
    s.n_embd = 2048;
    s.n_layer = 16;
    s.n_ff = 8192;
    s.n_head = 32;
    s.n_head_kv = 8;
    s.context_length = 131072;
    s.rope_freq_base = 500000.0f;
    s.tied_embeddings = true;
  } else if (preset == "tiny-moe") {
    // Mixtral's layout at the tiny shape: 4 experts, 2 per token.
    s.name = "tandem-synthetic-tiny-moe";
    s.n_ff = 64;
    s.n_expert = 4;
    s.n_expert_used = 2;
  } else if (preset == "tiny-qwen3moe") {
    // Qwen3-MoE's layout at a tiny shape: head_dim * n_head != n_embd, as in Qwen3.
    s.arch = "qwen3moe";
    s.name = "tandem-synthetic-tiny-qwen3moe";
    s.head_dim = 32;
    s.n_ff_expert = 32;
    s.n_expert = 8;
    s.n_expert_used = 2;
    s.rope_freq_base = 1000000.0f;
    s.rms_eps = 1e-6f;
  } else if (preset == "mixtral-8x7b") {
    s.name = "tandem-synthetic-mixtral-8x7b";
    s.n_vocab = 32000;
    s.n_embd = 4096;
    s.n_layer = 32;
    s.n_ff = 14336;
    s.n_head = 32;
    s.n_head_kv = 8;
    s.context_length = 32768;
    s.rope_freq_base = 1000000.0f;
    s.n_expert = 8;
    s.n_expert_used = 2;
  } else if (preset == "qwen3-30b-a3b") {
    s.arch = "qwen3moe";
    s.name = "tandem-synthetic-qwen3-30b-a3b";
    s.n_vocab = 151936;
    s.n_embd = 2048;
    s.n_layer = 48;
    s.n_ff = 6144;
    s.n_head = 32;
    s.n_head_kv = 4;
    s.head_dim = 128;
    s.context_length = 40960;
    s.rope_freq_base = 1000000.0f;
    s.rms_eps = 1e-6f;
    s.n_expert = 128;
    s.n_expert_used = 8;
    s.n_ff_expert = 768;
  } else if (preset == "llama-3.1-8b") {
    s.name = "tandem-synthetic-llama-3.1-8b";
    s.n_vocab = 128256;
    s.n_embd = 4096;
    s.n_layer = 32;
    s.n_ff = 14336;
    s.n_head = 32;
    s.n_head_kv = 8;
    s.context_length = 131072;
    s.rope_freq_base = 500000.0f;
  } else {
    std::string names;
    for (auto n : synthetic_preset_names()) names += (names.empty() ? "" : ", ") + std::string(n);
    throw_error(ErrorCode::InvalidArgument, kWhere,
                "unknown preset '" + std::string(preset) + "' (known: " + names + ")");
  }
  s.dtype = dtype;
  s.mix = mix;
  s.seed = seed;
  synthetic_file_type(dtype, mix);
  return s;
}

uint32_t synthetic_file_type(DType dtype, SyntheticMix mix) {
  if (mix == SyntheticMix::KQuantMedium) {
    if (dtype == DType::Q4_K) return 15;
    if (dtype == DType::Q5_K) return 17;
  } else {
    switch (dtype) {
      case DType::F32:
        return 0;
      case DType::F16:
        return 1;
      case DType::Q4_0:
        return 2;
      case DType::Q8_0:
        return 7;
      case DType::Q6_K:
        return 18;
      default:
        break;
    }
  }
  throw_error(ErrorCode::InvalidArgument, kWhere,
              "dtype " + std::string(dtype_name(dtype)) +
                  (mix == SyntheticMix::KQuantMedium ? " with the medium mix" : "") +
                  " is not a synthetic model type (f32, f16, q8_0, q4_0, q6_k; q4_k and q5_k only "
                  "as the medium mixes q4_k_m and q5_k_m)");
}

namespace {

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third between.
bool use_more_bits(int64_t layer, int64_t n_layer) {
  return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

// "blk.<n>.<suffix>" -> n, or -1.
int64_t layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  return std::strtoll(name.c_str() + 4, nullptr, 10);
}

}  // namespace

DType synthetic_tensor_dtype(const SyntheticSpec& spec, const std::string& name, int64_t n_in) {
  DType dtype = spec.dtype;
  if (spec.mix == SyntheticMix::KQuantMedium) {
    const bool output =
        name == "output.weight" || (spec.tied_embeddings && name == "token_embd.weight");
    const bool more_bits_kind = name.find("attn_v.weight") != std::string::npos ||
                                name.find("ffn_down.weight") != std::string::npos ||
                                name.find("ffn_down_exps.weight") != std::string::npos;
    if (output || (more_bits_kind && use_more_bits(layer_of(name), spec.n_layer))) {
      dtype = DType::Q6_K;
    }
  }
  if (is_k_quant(dtype) && n_in % kSuperBlock != 0) {
    // Rows that are not whole super-blocks: llama.cpp falls back to Q5_0 / Q5_1 / Q8_0; Tandem
    // has no Q5 formats, so Q4_K takes Q4_0 (the same 4.5 bits a weight) and Q5_K, Q6_K Q8_0.
    dtype = dtype == DType::Q4_K ? DType::Q4_0 : DType::Q8_0;
  }
  return dtype;
}

std::vector<std::string> synthetic_vocab(int64_t n_vocab) {
  TANDEM_CHECK_ARG(n_vocab >= 260 && n_vocab <= (1 << 22), kWhere, "n_vocab must be in [260, 4M]");
  std::vector<std::string> vocab = {"<unk>", "<s>", "</s>"};
  vocab.reserve(size_t(n_vocab));
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    vocab.emplace_back(buf);
  }
  std::unordered_set<std::string> seen(vocab.begin(), vocab.end());
  auto add = [&](std::string piece) {
    if (int64_t(vocab.size()) < n_vocab && seen.insert(piece).second)
      vocab.push_back(std::move(piece));
  };
  const std::string space = "\xE2\x96\x81";  // U+2581, SentencePiece's word boundary
  add(space);
  for (char ch = 0x21; ch <= 0x7e; ++ch) add(std::string(1, ch));
  const std::string alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  for (char ch : alnum) add(space + ch);
  // Syllables are (optional consonant) + vowel, so every word splits into them one way only.
  const std::string consonants = "bcdfghjklmnprstvwxz";
  const std::string vowels = "aeiou";
  std::vector<std::string> syllables;
  for (int c = -1; c < int(consonants.size()); ++c) {
    for (char v : vowels) syllables.push_back((c < 0 ? "" : std::string(1, consonants[c])) + v);
  }
  std::vector<std::string> words = syllables;
  while (int64_t(vocab.size()) < n_vocab) {
    for (const auto& w : words) {
      add(space + w);
      add(w);
    }
    if (int64_t(vocab.size()) >= n_vocab) break;
    std::vector<std::string> longer;
    longer.reserve(words.size() * syllables.size());
    for (const auto& w : words) {
      for (const auto& s : syllables) {
        longer.push_back(w + s);
        if (longer.size() >= size_t(n_vocab)) break;  // never more than the vocab needs
      }
      if (longer.size() >= size_t(n_vocab)) break;
    }
    words = std::move(longer);
  }
  return vocab;
}

gguf::Writer make_synthetic_writer(const SyntheticSpec& spec) {
  check_spec(spec);
  const int64_t head_dim = synthetic_head_dim(spec);
  const int64_t n_ff_expert = spec.n_ff_expert > 0 ? spec.n_ff_expert : spec.n_ff;
  auto key = [&spec](const char* k) { return spec.arch + "." + k; };
  gguf::Writer w(spec.alignment);
  w.set_string("general.architecture", spec.arch);
  w.set_string("general.name", spec.name);
  w.set_u32("general.file_type", synthetic_file_type(spec.dtype, spec.mix));
  if (dtype_traits(spec.dtype).is_quantized) w.set_u32("general.quantization_version", 2);
  w.set_u32(key("context_length"), uint32_t(spec.context_length));
  w.set_u32(key("embedding_length"), uint32_t(spec.n_embd));
  w.set_u32(key("block_count"), uint32_t(spec.n_layer));
  w.set_u32(key("feed_forward_length"), uint32_t(spec.n_ff));
  w.set_u32(key("attention.head_count"), uint32_t(spec.n_head));
  w.set_u32(key("attention.head_count_kv"), uint32_t(spec.n_head_kv));
  if (spec.head_dim > 0) {
    w.set_u32(key("attention.key_length"), uint32_t(head_dim));
    w.set_u32(key("attention.value_length"), uint32_t(head_dim));
  }
  w.set_f32(key("attention.layer_norm_rms_epsilon"), spec.rms_eps);
  w.set_f32(key("rope.freq_base"), spec.rope_freq_base);
  w.set_u32(key("rope.dimension_count"), uint32_t(head_dim));
  w.set_u32(key("vocab_size"), uint32_t(spec.n_vocab));
  if (spec.n_expert > 0) {
    w.set_u32(key("expert_count"), uint32_t(spec.n_expert));
    w.set_u32(key("expert_used_count"), uint32_t(spec.n_expert_used));
    if (spec.arch == "qwen3moe")
      w.set_u32(key("expert_feed_forward_length"), uint32_t(n_ff_expert));
  }

  std::vector<std::string> tokens = synthetic_vocab(spec.n_vocab);
  std::vector<float> scores(tokens.size(), 0.0f);
  std::vector<int32_t> types(tokens.size(), 1);  // 1 normal, 2 unknown, 3 control, 6 byte
  types[0] = 2;
  types[1] = types[2] = 3;
  for (int b = 0; b < 256; ++b) types[3 + b] = 6;
  // Earlier (shorter) pieces score higher, as SentencePiece's log-probabilities would.
  for (size_t k = 259; k < tokens.size(); ++k) scores[k] = -float(k - 259);
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string("tokenizer.ggml.pre", "default");  // as llama.cpp's converter writes for SPM
  w.set_string_array("tokenizer.ggml.tokens", std::move(tokens));
  w.set_f32_array("tokenizer.ggml.scores", std::move(scores));
  w.set_i32_array("tokenizer.ggml.token_type", std::move(types));
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);

  const int threads =
      spec.threads > 0 ? spec.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  // n_mats > 1: a stack of n_mats matrices (one per expert).
  auto add = [&](const std::string& name, Init init, int64_t n_in, int64_t n_out,
                 int64_t n_mats = 1) {
    DType dtype = init == Init::Norm ? DType::F32 : synthetic_tensor_dtype(spec, name, n_in);
    Generator gen{};
    gen.dtype = dtype;
    gen.init = init;
    gen.amplitude = 1.0f / std::sqrt(float(n_in));
    gen.tensor_seed = mix(spec.seed, fnv1a(name));
    if (dtype_traits(dtype).is_quantized) gen.prepare();
    int64_t units = n_in * n_out * n_mats / dtype_traits(dtype).block_elements;
    std::vector<int64_t> ne = {n_in};
    if (init == Init::Matrix) ne.push_back(n_out);
    if (n_mats > 1) ne.push_back(n_mats);
    w.add_tensor_lazy(name, dtype, ne, [gen, units, threads](uint8_t* dst, size_t) {
      generate(gen, dst, units, threads);
    });
  };
  // The router: F32 whatever the spec's dtype, its rows skewed by moe_skew.
  auto add_router = [&](const std::string& name) {
    Generator gen{};
    gen.dtype = DType::F32;
    gen.init = Init::Matrix;
    gen.amplitude = 1.0f / std::sqrt(float(spec.n_embd));
    gen.tensor_seed = mix(spec.seed, fnv1a(name));
    gen.skew = spec.moe_skew;
    gen.row_len = spec.n_embd;
    gen.rows = spec.n_expert;
    const int64_t units = spec.n_embd * spec.n_expert;
    const std::vector<int64_t> ne = {spec.n_embd, spec.n_expert};
    w.add_tensor_lazy(name, DType::F32, ne, [gen, units, threads](uint8_t* dst, size_t) {
      generate(gen, dst, units, threads);
    });
  };
  const int64_t q_dim = spec.n_head * head_dim;
  const int64_t kv_dim = spec.n_head_kv * head_dim;
  add("token_embd.weight", Init::Matrix, spec.n_embd, spec.n_vocab);
  for (int64_t l = 0; l < spec.n_layer; ++l) {
    add(llama_layer_tensor(l, "attn_norm.weight"), Init::Norm, spec.n_embd, 1);
    add(llama_layer_tensor(l, "attn_q.weight"), Init::Matrix, spec.n_embd, q_dim);
    add(llama_layer_tensor(l, "attn_k.weight"), Init::Matrix, spec.n_embd, kv_dim);
    add(llama_layer_tensor(l, "attn_v.weight"), Init::Matrix, spec.n_embd, kv_dim);
    add(llama_layer_tensor(l, "attn_output.weight"), Init::Matrix, q_dim, spec.n_embd);
    if (spec.arch == "qwen3moe") {
      add(llama_layer_tensor(l, "attn_q_norm.weight"), Init::Norm, head_dim, 1);
      add(llama_layer_tensor(l, "attn_k_norm.weight"), Init::Norm, head_dim, 1);
    }
    add(llama_layer_tensor(l, "ffn_norm.weight"), Init::Norm, spec.n_embd, 1);
    if (spec.n_expert > 0) {
      const int64_t E = spec.n_expert;
      add_router(llama_layer_tensor(l, "ffn_gate_inp.weight"));
      add(llama_layer_tensor(l, "ffn_gate_exps.weight"), Init::Matrix, spec.n_embd, n_ff_expert, E);
      add(llama_layer_tensor(l, "ffn_up_exps.weight"), Init::Matrix, spec.n_embd, n_ff_expert, E);
      add(llama_layer_tensor(l, "ffn_down_exps.weight"), Init::Matrix, n_ff_expert, spec.n_embd, E);
    } else {
      add(llama_layer_tensor(l, "ffn_gate.weight"), Init::Matrix, spec.n_embd, spec.n_ff);
      add(llama_layer_tensor(l, "ffn_up.weight"), Init::Matrix, spec.n_embd, spec.n_ff);
      add(llama_layer_tensor(l, "ffn_down.weight"), Init::Matrix, spec.n_ff, spec.n_embd);
    }
  }
  add("output_norm.weight", Init::Norm, spec.n_embd, 1);
  if (!spec.tied_embeddings) add("output.weight", Init::Matrix, spec.n_embd, spec.n_vocab);
  return w;
}

void write_synthetic_model(const SyntheticSpec& spec, const std::string& path,
                           const gguf::Writer::Progress& progress) {
  make_synthetic_writer(spec).write(path, progress);
}

}  // namespace tandem
