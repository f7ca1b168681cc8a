// Tokenizers from GGUF metadata: SentencePiece (`llama`, with byte fallback) and GPT-2 byte-level
// BPE (`gpt2`), following llama.cpp's algorithms so token ids match llama.cpp exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

namespace gguf {
class File;
}

// tokenizer.ggml.model: `llama` is SentencePiece, `gpt2` is byte-level BPE.
enum class VocabKind { Spm, Bpe };

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

// Everything a tokenizer needs, independent of the file it came from.
struct Vocab {
  VocabKind kind = VocabKind::Spm;
  std::vector<std::string> tokens;  // token text as stored (SPM: spaces as U+2581)
  std::vector<float> scores;        // SPM merge priority; empty means all 0
  std::vector<TokenType> types;     // empty means all Normal
  std::vector<std::string> merges;  // BPE only: "left right", ranked by position
  int32_t bos_id = -1;              // -1: none
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  bool add_bos = false;          // prepend BOS when encoding with the default options
  bool add_eos = false;          // append EOS when encoding with the default options
  bool add_space_prefix = true;  // SPM: prepend one space to the text ("add dummy prefix")
  // BPE: tokenizer.ggml.pre, the word split before merging: GPT-2's ("gpt-2", or "" for old
  // files) or Llama 3's ("llama-bpe" and its aliases); others throw Unsupported.
  std::string pre_tokenizer = "gpt-2";
};

// Reads tokenizer.ggml.* from a GGUF file. Missing or inconsistent keys throw Format; a
// tokenizer model other than `llama` or `gpt2` throws Unsupported.
Vocab vocab_from_gguf(const gguf::File& file);

struct EncodeOptions {
  bool add_bos = false;        // prepend the BOS token (if the vocab has one)
  bool add_eos = false;        // append the EOS token (if the vocab has one)
  bool parse_special = false;  // text such as "<s>" becomes its control token
};

struct DecodeOptions {
  bool render_special = false;  // print control tokens (BOS, EOS) as their text
  // SPM: drop the space that encode put before the text. Right for decode() of a whole text;
  // wrong for generated tokens that continue a prompt (see TokenStream).
  bool remove_leading_space = true;
};

// Encoder and decoder over one Vocab. Immutable after construction: const members may be called
// from several threads at once.
class Tokenizer {
 public:
  // Validates the vocab (sizes agree, ids in range, BPE merges name known pieces); throws
  // InvalidArgument naming what is wrong.
  explicit Tokenizer(Vocab vocab);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  static Tokenizer from_gguf(const gguf::File& file);

  // Encodes with the vocab's own add_bos/add_eos defaults.
  std::vector<int32_t> encode(std::string_view text) const;
  // Like llama.cpp, SPM puts the space prefix before every stretch of text that follows a
  // special token too, so "a<tool>b" decodes as "a<tool> b".
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options) const;

  // The text of a token sequence. Ids out of range throw InvalidArgument.
  std::string decode(std::span<const int32_t> ids, const DecodeOptions& options = {}) const;

  // The raw bytes one token stands for: may be part of a UTF-8 character (byte tokens), so a
  // streaming printer should go through TokenStream. Control tokens give "" unless `special`.
  std::string token_to_piece(int32_t id, bool special = false) const;

  const Vocab& vocab() const;
  int32_t n_tokens() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  // End of generation: the EOS token or another control token that ends a turn.
  bool is_end_of_generation(int32_t id) const;
  // The id of a token text, or -1.
  int32_t find_token(std::string_view text) const;

  // The vocab's lookup tables; defined in src/model for the encoders.
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Turns generated tokens into printable text as they arrive: bytes of a UTF-8 character split
// over several tokens are held back until the character is complete.
class TokenStream {
 public:
  // For generated tokens that continue text already shown (a prompt): every piece keeps its
  // spaces, so "▁world" after "Hello" prints " world".
  explicit TokenStream(const Tokenizer& tokenizer);
  // With explicit options; DecodeOptions{} decodes a text from its start, as decode() does.
  TokenStream(const Tokenizer& tokenizer, DecodeOptions options);
  // Text that can be printed now (complete UTF-8 characters only).
  std::string push(int32_t id);
  // Whatever is still held back (an incomplete character at the end of generation).
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  DecodeOptions options_;
  std::string pending_;
  bool first_ = true;
};

}  // namespace tandem
