// Synthetic LLaMA GGUF models: deterministic seeded random weights with real model shapes and
// the metadata and tokenizer keys llama.cpp needs, so one file runs in llama.cpp and Tandem.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/dtype.h"
#include "tandem/model/gguf.h"

namespace tandem {

// Which tensors get which dtype. Pure: every matrix in the spec's dtype. KQuantMedium: llama.cpp's
// Q4_K_M / Q5_K_M mix (llama_tensor_get_type) for a Q4_K or Q5_K spec: Q6_K for output.weight
// (token_embd.weight when tied) and for attn_v and ffn_down in the "more bits" layers (the first
// and last eighth, every third between), the spec's dtype elsewhere.
enum class SyntheticMix : uint8_t { Pure, KQuantMedium };

struct SyntheticSpec {
  std::string arch = "llama";                  // general.architecture: "llama" or "qwen3moe"
  std::string name = "tandem-synthetic-tiny";  // general.name
  int64_t n_vocab = 512;
  int64_t n_embd = 64;
  int64_t n_layer = 2;
  int64_t n_ff = 128;
  int64_t n_head = 4;
  int64_t n_head_kv = 2;
  int64_t head_dim = 0;  // 0: n_embd / n_head; else written as attention.key_length
  int64_t context_length = 256;
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied_embeddings = false;  // true: no output.weight (llama.cpp reuses token_embd)
  // Mixture of experts (n_expert > 0; qwen3moe needs it): ffn_gate_inp, ffn_{gate,up,down}_exps
  // of n_ff_expert rows (0: n_ff). The router ffn_gate_inp stays F32, as llama.cpp's quantizer
  // leaves it. moe_skew > 0 scales router row e by exp(-moe_skew * e / (n_expert - 1)), so the
  // low-numbered experts win the top-k far more often than the others.
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_expert = 0;
  float moe_skew = 0.0f;
  DType dtype = DType::F32;  // every matrix incl. token_embd and output; norms stay F32
  SyntheticMix mix = SyntheticMix::Pure;
  uint64_t seed = 0;
  size_t alignment = gguf::kDefaultAlignment;
  int threads = 0;  // generator threads; 0 = hardware concurrency. Output does not depend on it.
};

// Presets: "tiny", "small" (~160M parameters), "llama-3.2-1b" (tied embeddings), "llama-3.1-8b",
// and with experts "tiny-moe" (llama, 4 experts, 2 used), "tiny-qwen3moe" (8 experts, 2 used),
// "mixtral-8x7b" and "qwen3-30b-a3b".
// Throws InvalidArgument listing the presets for an unknown name, or for a dtype and mix with no
// file type (below).
SyntheticSpec synthetic_preset(std::string_view preset, DType dtype = DType::F32, uint64_t seed = 0,
                               SyntheticMix mix = SyntheticMix::Pure);
std::vector<std::string_view> synthetic_preset_names();
// The spec's head dimension: head_dim, or n_embd / n_head where it is 0.
int64_t synthetic_head_dim(const SyntheticSpec& spec);

// llama.cpp's general.file_type for a model of `dtype` and `mix` (ALL_F32=0, MOSTLY_F16=1,
// MOSTLY_Q4_0=2, MOSTLY_Q8_0=7, MOSTLY_Q4_K_M=15, MOSTLY_Q5_K_M=17, MOSTLY_Q6_K=18). Q4_K and
// Q5_K exist only as the medium mix, Q6_K only pure; other pairs throw InvalidArgument.
uint32_t synthetic_file_type(DType dtype, SyntheticMix mix = SyntheticMix::Pure);

// The dtype llama.cpp's mix gives the matrix `name` (e.g. "blk.3.attn_v.weight") of a model of
// `spec` whose rows hold n_in elements; a K-quant falls back to a 32-element format where n_in
// is not a multiple of 256.
DType synthetic_tensor_dtype(const SyntheticSpec& spec, const std::string& name, int64_t n_in);

// The SentencePiece-style vocabulary: <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>,
// then unique pieces ("▁", single characters, "▁x", syllable words) until n_vocab (>= 260).
std::vector<std::string> synthetic_vocab(int64_t n_vocab);

// A writer holding the model's metadata and lazily generated tensors (nothing is generated
// until it is written). Throws InvalidArgument for an inconsistent spec.
gguf::Writer make_synthetic_writer(const SyntheticSpec& spec);

// Generates the model straight into `path` (Io on failure; no partial file is left).
void write_synthetic_model(const SyntheticSpec& spec, const std::string& path,
                           const gguf::Writer::Progress& progress = {});

}  // namespace tandem
