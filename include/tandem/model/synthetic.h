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

struct SyntheticSpec {
  std::string name = "tandem-synthetic-tiny";  // general.name
  int64_t n_vocab = 512;
  int64_t n_embd = 64;
  int64_t n_layer = 2;
  int64_t n_ff = 128;
  int64_t n_head = 4;
  int64_t n_head_kv = 2;
  int64_t context_length = 256;
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied_embeddings = false;  // true: no output.weight (llama.cpp reuses token_embd)
  DType dtype = DType::F32;      // every matrix incl. token_embd and output; norms stay F32
  uint64_t seed = 0;
  size_t alignment = gguf::kDefaultAlignment;
  int threads = 0;  // generator threads; 0 = hardware concurrency. Output does not depend on it.
};

// Presets: "tiny", "small" (~160M parameters), "llama-3.2-1b" (tied embeddings) and "llama-3.1-8b". Throws InvalidArgument
// listing the presets for an unknown name, or for a dtype other than F32, F16, Q8_0, Q4_0.
SyntheticSpec synthetic_preset(std::string_view preset, DType dtype = DType::F32,
                               uint64_t seed = 0);
std::vector<std::string_view> synthetic_preset_names();

// llama.cpp's general.file_type for a pure model of `dtype` (ALL_F32=0, MOSTLY_F16=1,
// MOSTLY_Q4_0=2, MOSTLY_Q8_0=7).
uint32_t synthetic_file_type(DType dtype);

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
