// Vocab from GGUF metadata (tokenizer.ggml.*). Kept apart from the tokenizer so it is the only
// part that needs the GGUF reader.
#include <cmath>
#include <string>
#include <utility>

#include "tandem/error.h"
#include "tandem/model/gguf.h"
#include "tandem/model/tokenizer.h"
#include "tokenizer_impl.h"

namespace tandem {
namespace {

[[noreturn]] void format_error(const gguf::File& file, const std::string& message) {
  throw_error(ErrorCode::Format, "tokenizer " + file.path(), message);
}

int32_t read_id(const gguf::File& file, const char* key, int32_t fallback, size_t n_tokens) {
  if (!file.has(key)) return fallback;
  // Some converters write -1 for "none"; anything else must name a token.
  const int64_t id = file.get_int(key);
  if (id == -1) return -1;
  if (id < 0 || static_cast<uint64_t>(id) >= n_tokens) {
    format_error(file, std::string(key) + " out of range (" + std::to_string(id) + ", " +
                           std::to_string(n_tokens) + " tokens)");
  }
  return static_cast<int32_t>(id);
}

}  // namespace

Vocab vocab_from_gguf(const gguf::File& file) {
  if (!file.has("tokenizer.ggml.model")) format_error(file, "missing tokenizer.ggml.model");
  const std::string model = file.get_string("tokenizer.ggml.model");
  Vocab vocab;
  if (model == "llama") {
    vocab.kind = VocabKind::Spm;
  } else if (model == "gpt2") {
    vocab.kind = VocabKind::Bpe;
  } else {
    throw_error(ErrorCode::Unsupported, "tokenizer " + file.path(),
                "tokenizer model \"" + model + "\" (supported: llama, gpt2)");
  }
  if (!file.has("tokenizer.ggml.tokens")) format_error(file, "missing tokenizer.ggml.tokens");
  vocab.tokens = file.get_string_array("tokenizer.ggml.tokens");
  const size_t n = vocab.tokens.size();
  if (n == 0) format_error(file, "tokenizer.ggml.tokens is empty");

  if (file.has("tokenizer.ggml.scores")) {
    const std::vector<double>& scores = file.get_number_array("tokenizer.ggml.scores");
    if (scores.size() != n) {
      format_error(file, "tokenizer.ggml.scores has " + std::to_string(scores.size()) +
                             " entries for " + std::to_string(n) + " tokens");
    }
    vocab.scores.assign(scores.begin(), scores.end());
  }
  if (file.has("tokenizer.ggml.token_type")) {
    const std::vector<double>& types = file.get_number_array("tokenizer.ggml.token_type");
    if (types.size() != n) {
      format_error(file, "tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                             " entries for " + std::to_string(n) + " tokens");
    }
    vocab.types.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const double t = types[i];
      if (!(t >= 0 && t <= 6) || t != std::floor(t)) {
        format_error(file, "tokenizer.ggml.token_type[" + std::to_string(i) + "] is " +
                               std::to_string(t) + " (valid: 0..6)");
      }
      vocab.types.push_back(static_cast<TokenType>(static_cast<int32_t>(t)));
    }
  }

  if (vocab.kind == VocabKind::Spm) {
    // llama.cpp's defaults for SentencePiece vocabs.
    vocab.bos_id = read_id(file, "tokenizer.ggml.bos_token_id", n > 1 ? 1 : -1, n);
    vocab.eos_id = read_id(file, "tokenizer.ggml.eos_token_id", n > 2 ? 2 : -1, n);
    vocab.unk_id = read_id(file, "tokenizer.ggml.unknown_token_id", 0, n);
    vocab.add_bos = true;
    vocab.add_space_prefix = true;
  } else {
    if (!file.has("tokenizer.ggml.merges")) format_error(file, "missing tokenizer.ggml.merges");
    vocab.merges = file.get_string_array("tokenizer.ggml.merges");
    vocab.bos_id = read_id(file, "tokenizer.ggml.bos_token_id", -1, n);
    vocab.eos_id = read_id(file, "tokenizer.ggml.eos_token_id", -1, n);
    vocab.unk_id = read_id(file, "tokenizer.ggml.unknown_token_id", -1, n);
    vocab.add_space_prefix = false;
    vocab.pre_tokenizer =
        file.has("tokenizer.ggml.pre") ? file.get_string("tokenizer.ggml.pre") : std::string();
    PreTokenizer pre = PreTokenizer::Gpt2;
    try {
      pre = pre_tokenizer_from_name(vocab.pre_tokenizer);
    } catch (const Error& e) {
      throw_error(e.code(), "tokenizer " + file.path(), e.message());
    }
    // Llama 3 style vocabs start every prompt with BOS (llama.cpp's default for them).
    vocab.add_bos = pre == PreTokenizer::Llama3;
  }
  if (file.has("tokenizer.ggml.add_bos_token")) {
    vocab.add_bos = file.get_bool("tokenizer.ggml.add_bos_token");
  }
  if (file.has("tokenizer.ggml.add_eos_token")) {
    vocab.add_eos = file.get_bool("tokenizer.ggml.add_eos_token");
  }
  if (file.has("tokenizer.ggml.add_space_prefix")) {
    vocab.add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix");
  }
  return vocab;
}

Tokenizer Tokenizer::from_gguf(const gguf::File& file) {
  Vocab vocab = vocab_from_gguf(file);
  try {
    return Tokenizer(std::move(vocab));
  } catch (const Error& e) {
    // An inconsistent vocab in a file is a malformed file.
    if (e.code() != ErrorCode::InvalidArgument) throw;
    format_error(file, e.message());
  }
}

}  // namespace tandem
