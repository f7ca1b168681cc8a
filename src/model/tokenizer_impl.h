// Private state shared by the tokenizer's translation units.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tandem/model/tokenizer.h"

namespace tandem {

// How BPE text is cut into words before merging (llama.cpp's pre-tokenizer types).
enum class PreTokenizer { Gpt2, Llama3 };

// The pre-tokenizer for a tokenizer.ggml.pre name; throws Unsupported for others.
PreTokenizer pre_tokenizer_from_name(const std::string& name);

struct Tokenizer::Impl {
  Vocab vocab;
  PreTokenizer pre_tokenizer = PreTokenizer::Gpt2;
  bool ignore_merges = false;  // BPE: a word that is a token as a whole skips merging
  std::unordered_map<std::string, int32_t> token_ids;
  // BPE: "left right" -> rank (position in tokenizer.ggml.merges).
  std::unordered_map<std::string, int32_t> merge_ranks;
  // SPM: the <0xXX> token of each byte (-1 if missing). BPE: the token of each byte's
  // single-character GPT-2 spelling.
  std::array<int32_t, 256> byte_tokens{};
  // Tokens matched in the input before encoding, longest text first: user-defined ones always
  // ([0]), with control and unknown ones as well when parsing special tokens ([1]); and the
  // first bytes those texts can start with, to skip most positions at once.
  std::array<std::vector<int32_t>, 2> special_tokens;
  std::array<std::array<bool, 256>, 2> special_first_byte{};

  TokenType type(int32_t id) const {
    return vocab.types.empty() ? TokenType::Normal : vocab.types[static_cast<size_t>(id)];
  }
  float score(int32_t id) const {
    return vocab.scores.empty() ? 0.0f : vocab.scores[static_cast<size_t>(id)];
  }
  int32_t find(std::string_view text) const {
    auto it = token_ids.find(std::string(text));
    return it == token_ids.end() ? -1 : it->second;
  }
};

// Encode one stretch of plain text (no special tokens inside), appending ids to `out`.
// `text` for SPM already carries the space prefix where one belongs.
void spm_encode(const Tokenizer::Impl& impl, std::string_view text, std::vector<int32_t>& out);
void bpe_encode(const Tokenizer::Impl& impl, std::string_view text, std::vector<int32_t>& out);

// GPT-2's reversible byte <-> printable character mapping (bytes_to_unicode).
uint32_t gpt2_byte_to_codepoint(uint8_t byte);
int gpt2_codepoint_to_byte(uint32_t codepoint);  // -1 if the codepoint is not in the mapping
// Pre-tokenizer splits (GPT-2's and Llama 3's regexes): the words' byte ranges, in order.
std::vector<std::string_view> gpt2_pre_tokenize(std::string_view text);
std::vector<std::string_view> llama3_pre_tokenize(std::string_view text);

}  // namespace tandem
