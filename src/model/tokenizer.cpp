// Tokenizer: vocab validation, special-token splitting, decoding and streaming.
#include "tandem/model/tokenizer.h"

#include <algorithm>
#include <string>
#include <utility>

#include "tandem/error.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace tandem {
namespace {

constexpr const char* kWhere = "tokenizer";

std::string byte_token_text(unsigned byte) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string("<0x") + kHex[byte >> 4] + kHex[byte & 15] + ">";
}

// "<0x0A>" -> 10; -1 if the text is not a byte token.
int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    value <<= 4;
    if (c >= '0' && c <= '9') {
      value |= c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value |= c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      value |= c - 'a' + 10;
    } else {
      return -1;
    }
  }
  return value;
}

void check_id(const Vocab& vocab, int32_t id, const char* what) {
  TANDEM_CHECK_ARG(id >= -1 && id < static_cast<int32_t>(vocab.tokens.size()), kWhere,
                   std::string(what) + " id out of range (" + std::to_string(id) + ", " +
                       std::to_string(vocab.tokens.size()) + " tokens)");
}

}  // namespace

PreTokenizer pre_tokenizer_from_name(const std::string& name) {
  // The names llama.cpp maps to the same split (llama-vocab.cpp); "" is an old file without
  // tokenizer.ggml.pre, which llama.cpp then also splits GPT-2's way.
  for (const char* n : {"", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
                        "jina-v2-de", "mellum", "exaone4"}) {
    if (name == n) return PreTokenizer::Gpt2;
  }
  for (const char* n : {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral"}) {
    if (name == n) return PreTokenizer::Llama3;
  }
  throw_error(ErrorCode::Unsupported, kWhere,
              "BPE pre-tokenizer \"" + name + "\" (supported: gpt-2, llama-bpe and aliases)");
}

Tokenizer::Tokenizer(Vocab vocab) : impl_(std::make_unique<Impl>()) {
  Impl& impl = *impl_;
  const size_t n = vocab.tokens.size();
  TANDEM_CHECK_ARG(n > 0, kWhere, "empty vocabulary");
  TANDEM_CHECK_ARG(n <= static_cast<size_t>(INT32_MAX), kWhere, "vocabulary too large");
  TANDEM_CHECK_ARG(vocab.scores.empty() || vocab.scores.size() == n, kWhere,
                   "scores and tokens differ in length (" + std::to_string(vocab.scores.size()) +
                       " vs " + std::to_string(n) + ")");
  TANDEM_CHECK_ARG(vocab.types.empty() || vocab.types.size() == n, kWhere,
                   "token types and tokens differ in length (" +
                       std::to_string(vocab.types.size()) + " vs " + std::to_string(n) + ")");
  for (TokenType t : vocab.types) {
    TANDEM_CHECK_ARG(static_cast<int32_t>(t) >= 0 && static_cast<int32_t>(t) <= 6, kWhere,
                     "unknown token type (" + std::to_string(static_cast<int32_t>(t)) + ")");
  }
  check_id(vocab, vocab.bos_id, "BOS");
  check_id(vocab, vocab.eos_id, "EOS");
  check_id(vocab, vocab.unk_id, "unknown-token");
  impl.vocab = std::move(vocab);

  impl.token_ids.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    // The last of duplicate texts wins, as in llama.cpp's token_to_id map.
    impl.token_ids[impl.vocab.tokens[i]] = static_cast<int32_t>(i);
  }
  impl.byte_tokens.fill(-1);
  if (impl.vocab.kind == VocabKind::Spm) {
    for (unsigned b = 0; b < 256; ++b) impl.byte_tokens[b] = impl.find(byte_token_text(b));
  } else {
    std::string spelled;
    for (unsigned b = 0; b < 256; ++b) {
      spelled.clear();
      unicode::append_utf8(spelled, gpt2_byte_to_codepoint(static_cast<uint8_t>(b)));
      impl.byte_tokens[b] = impl.find(spelled);
    }
    impl.pre_tokenizer = pre_tokenizer_from_name(impl.vocab.pre_tokenizer);
    impl.ignore_merges = impl.pre_tokenizer == PreTokenizer::Llama3;
    impl.merge_ranks.reserve(impl.vocab.merges.size());
    for (size_t rank = 0; rank < impl.vocab.merges.size(); ++rank) {
      const std::string& merge = impl.vocab.merges[rank];
      const size_t space = merge.find(' ', 1);
      TANDEM_CHECK_ARG(space != std::string::npos && space + 1 < merge.size(), kWhere,
                       "malformed BPE merge " + std::to_string(rank) + " (\"" + merge + "\")");
      impl.merge_ranks.emplace(merge, static_cast<int32_t>(rank));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const TokenType t = impl.type(static_cast<int32_t>(i));
    const std::string& text = impl.vocab.tokens[i];
    if (text.empty()) continue;
    for (int parse_special = 0; parse_special < 2; ++parse_special) {
      if (t == TokenType::UserDefined ||
          (parse_special && (t == TokenType::Control || t == TokenType::Unknown))) {
        impl.special_tokens[parse_special].push_back(static_cast<int32_t>(i));
        impl.special_first_byte[parse_special][static_cast<uint8_t>(text[0])] = true;
      }
    }
  }
  for (auto& list : impl.special_tokens) {
    std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
      return impl.vocab.tokens[static_cast<size_t>(a)].size() >
             impl.vocab.tokens[static_cast<size_t>(b)].size();
    });
  }
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

const Vocab& Tokenizer::vocab() const {
  return impl_->vocab;
}
int32_t Tokenizer::n_tokens() const {
  return static_cast<int32_t>(impl_->vocab.tokens.size());
}
int32_t Tokenizer::bos_id() const {
  return impl_->vocab.bos_id;
}
int32_t Tokenizer::eos_id() const {
  return impl_->vocab.eos_id;
}
int32_t Tokenizer::find_token(std::string_view text) const {
  return impl_->find(text);
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  if (id < 0 || id >= n_tokens()) return false;
  if (id == impl_->vocab.eos_id) return true;
  // Chat models end a turn with control tokens such as <|eot_id|> or <|im_end|>.
  if (impl_->type(id) != TokenType::Control) return false;
  const std::string& text = impl_->vocab.tokens[static_cast<size_t>(id)];
  return text == "<|eot_id|>" || text == "<|im_end|>" || text == "<|end|>" ||
         text == "<|endoftext|>" || text == "<end_of_turn>";
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  EncodeOptions options;
  options.add_bos = impl_->vocab.add_bos;
  options.add_eos = impl_->vocab.add_eos;
  return encode(text, options);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  const Impl& impl = *impl_;
  std::vector<int32_t> out;
  if (options.add_bos && impl.vocab.bos_id >= 0) out.push_back(impl.vocab.bos_id);

  // SPM puts a space before text that starts the input or follows a special token.
  bool after_special = true;
  auto encode_text = [&](std::string_view part) {
    if (part.empty()) return;
    if (impl.vocab.kind == VocabKind::Spm) {
      if (impl.vocab.add_space_prefix && after_special) {
        spm_encode(impl, std::string(" ").append(part), out);
      } else {
        spm_encode(impl, part, out);
      }
    } else {
      bpe_encode(impl, part, out);
    }
    after_special = false;
  };

  // Split out special tokens: user-defined ones always, control and unknown ones on request.
  const int mode = options.parse_special ? 1 : 0;
  size_t plain_start = 0;
  for (size_t pos = 0; pos < text.size();) {
    if (!impl.special_first_byte[mode][static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    int32_t match = -1;
    for (int32_t id : impl.special_tokens[mode]) {
      const std::string& token_text = impl.vocab.tokens[static_cast<size_t>(id)];
      if (text.compare(pos, token_text.size(), token_text) == 0) {
        match = id;
        break;
      }
    }
    if (match < 0) {
      ++pos;
      continue;
    }
    encode_text(text.substr(plain_start, pos - plain_start));
    out.push_back(match);
    after_special = true;
    pos += impl.vocab.tokens[static_cast<size_t>(match)].size();
    plain_start = pos;
  }
  encode_text(text.substr(plain_start));

  if (options.add_eos && impl.vocab.eos_id >= 0) out.push_back(impl.vocab.eos_id);
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
  const Impl& impl = *impl_;
  TANDEM_CHECK_ARG(id >= 0 && id < n_tokens(), kWhere,
                   "token id out of range (" + std::to_string(id) + ", " +
                       std::to_string(n_tokens()) + " tokens)");
  const std::string& text = impl.vocab.tokens[static_cast<size_t>(id)];
  switch (impl.type(id)) {
    case TokenType::Control:
      return special ? text : std::string();
    case TokenType::Unused:
      return std::string();
    case TokenType::UserDefined:
      return text;
    case TokenType::Unknown:
      return "\xE2\x96\x85";  // llama.cpp prints unknown tokens as U+2585
    case TokenType::Byte: {
      const int byte = parse_byte_token(text);
      if (byte >= 0) return std::string(1, static_cast<char>(byte));
      return text;
    }
    case TokenType::Normal:
    case TokenType::Undefined:
      break;
  }
  std::string piece;
  piece.reserve(text.size());
  if (impl.vocab.kind == VocabKind::Spm) {
    for (size_t pos = 0; pos < text.size();) {
      if (text.compare(pos, 3, "\xE2\x96\x81") == 0) {
        piece += ' ';
        pos += 3;
      } else {
        piece += text[pos++];
      }
    }
    return piece;
  }
  // BPE: each character of the token stands for one byte.
  for (size_t pos = 0; pos < text.size();) {
    const unicode::Decoded d = unicode::decode_utf8(text, pos);
    const int byte = d.codepoint == unicode::kInvalid ? -1 : gpt2_codepoint_to_byte(d.codepoint);
    if (byte >= 0) {
      piece += static_cast<char>(byte);
    } else {
      piece.append(text, pos, d.length);  // not from the byte mapping: keep as written
    }
    pos += d.length;
  }
  return piece;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, const DecodeOptions& options) const {
  TokenStream stream(*this, options);
  std::string text;
  for (int32_t id : ids) text += stream.push(id);
  text += stream.flush();
  return text;
}

TokenStream::TokenStream(const Tokenizer& tokenizer)
    : TokenStream(tokenizer,
                  DecodeOptions{.render_special = false, .remove_leading_space = false}) {}

TokenStream::TokenStream(const Tokenizer& tokenizer, DecodeOptions options)
    : tokenizer_(&tokenizer), options_(options) {}

std::string TokenStream::push(int32_t id) {
  std::string piece = tokenizer_->token_to_piece(id, options_.render_special);
  const Vocab& vocab = tokenizer_->vocab();
  const bool control =
      !vocab.types.empty() && vocab.types[static_cast<size_t>(id)] == TokenType::Control;
  // The space SPM put before the text is the first text piece's leading space.
  if (first_ && !control) {
    first_ = false;
    if (vocab.kind == VocabKind::Spm && vocab.add_space_prefix && options_.remove_leading_space &&
        !piece.empty() && piece[0] == ' ') {
      piece.erase(0, 1);
    }
  }
  pending_ += piece;
  // Hold back a trailing incomplete UTF-8 character (at most 3 bytes of a 4-byte one).
  size_t keep = 0;
  for (size_t back = 1; back <= std::min<size_t>(3, pending_.size()); ++back) {
    const auto byte = static_cast<uint8_t>(pending_[pending_.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // continuation byte: look further back
    if (byte >= 0xC0 && unicode::utf8_sequence_length(byte) > back) keep = back;
    break;
  }
  std::string ready = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return ready;
}

std::string TokenStream::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace tandem
