// GPT-2 byte-level BPE as llama.cpp does it: split the text with GPT-2's pre-tokenizer regex,
// spell each word's bytes as printable characters, then apply merges lowest rank first.
#include <algorithm>
#include <array>
#include <queue>
#include <string>
#include <vector>

#include "tokenizer_impl.h"
#include "unicode.h"

namespace tandem {

namespace {

// GPT-2's bytes_to_unicode: printable bytes keep their codepoint; the other 68 move to 256..
// in byte order. `to_byte` is the inverse over codepoints 0..323 (-1 where none maps).
struct ByteMapping {
  std::array<uint32_t, 256> to_codepoint{};
  std::array<int16_t, 256 + 68> to_byte{};
};

constexpr ByteMapping make_byte_mapping() {
  ByteMapping m;
  for (auto& b : m.to_byte) b = -1;
  uint32_t n = 0;
  for (unsigned b = 0; b < 256; ++b) {
    const bool printable =
        (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    m.to_codepoint[b] = printable ? b : 256 + n++;
    m.to_byte[m.to_codepoint[b]] = static_cast<int16_t>(b);
  }
  return m;
}

constexpr ByteMapping kByteMapping = make_byte_mapping();

}  // namespace

uint32_t gpt2_byte_to_codepoint(uint8_t byte) {
  return kByteMapping.to_codepoint[byte];
}

int gpt2_codepoint_to_byte(uint32_t codepoint) {
  return codepoint < kByteMapping.to_byte.size() ? kByteMapping.to_byte[codepoint] : -1;
}

namespace {

// The input as characters with their byte offsets, and the words cut from it so far.
class CharSplitter {
 public:
  explicit CharSplitter(std::string_view text) : text_(text) {
    for (size_t pos = 0; pos < text.size();) {
      const unicode::Decoded d = unicode::decode_utf8(text, pos);
      chars_.push_back({d.codepoint, pos});
      pos += d.length;
    }
  }
  size_t size() const { return chars_.size(); }
  // Past the end every class test is false and the codepoint matches nothing.
  uint32_t cp(size_t i) const { return i < size() ? chars_[i].cp : 0xFFFFFFFEu; }
  uint32_t lower_ascii(size_t i) const {
    const uint32_t c = cp(i);
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
  }
  bool letter(size_t i) const { return i < size() && unicode::is_letter(chars_[i].cp); }
  bool number(size_t i) const { return i < size() && unicode::is_number(chars_[i].cp); }
  bool space(size_t i) const { return i < size() && unicode::is_whitespace(chars_[i].cp); }
  // [^\s\p{L}\p{N}]: invalid UTF-8 bytes count here too, so no input byte is lost.
  bool other(size_t i) const { return i < size() && !letter(i) && !number(i) && !space(i); }
  bool newline(size_t i) const { return cp(i) == '\r' || cp(i) == '\n'; }

  // Ends the current word at character `end` (no-op for an empty word).
  void cut(size_t end) {
    if (end <= start_) return;
    const size_t begin_byte = chars_[start_].offset;
    const size_t end_byte = end < size() ? chars_[end].offset : text_.size();
    words_.push_back(text_.substr(begin_byte, end_byte - begin_byte));
    start_ = end;
  }
  std::vector<std::string_view> take() { return std::move(words_); }

 private:
  struct Char {
    uint32_t cp;
    size_t offset;
  };
  std::string_view text_;
  std::vector<Char> chars_;
  std::vector<std::string_view> words_;
  size_t start_ = 0;
};

// 's|'t|'re|'ve|'m|'ll|'d at `pos` (case-insensitive for Llama 3): its length, or 0.
size_t contraction(const CharSplitter& c, size_t pos, bool ignore_case) {
  if (c.cp(pos) != '\'' || pos + 1 >= c.size()) return 0;
  const uint32_t a = ignore_case ? c.lower_ascii(pos + 1) : c.cp(pos + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  const uint32_t b = ignore_case ? c.lower_ascii(pos + 2) : c.cp(pos + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// Whitespace tail shared by both regexes: \s+(?!\S)|\s+ (Llama 3 first tries \s*[\r\n]+).
size_t whitespace_end(const CharSplitter& c, size_t pos, bool newline_rule) {
  size_t spaces = 0;
  size_t after_last_newline = 0;
  while (c.space(pos + spaces)) {
    if (c.newline(pos + spaces)) after_last_newline = pos + spaces + 1;
    ++spaces;
  }
  if (newline_rule && after_last_newline > 0) return after_last_newline;
  // \s+(?!\S): leave the last space to prefix the next word.
  if (spaces > 1 && pos + spaces < c.size()) return pos + spaces - 1;
  if (spaces > 0) return pos + spaces;
  return pos + 1;  // no rule matches: a word of one character
}

}  // namespace

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::vector<std::string_view> gpt2_pre_tokenize(std::string_view text) {
  CharSplitter c(text);
  for (size_t pos = 0; pos < c.size();) {
    if (const size_t len = contraction(c, pos, false)) {
      c.cut(pos += len);
      continue;
    }
    // The optional leading space belongs to the class of the character after it.
    const size_t head = c.cp(pos) == ' ' ? pos + 1 : pos;
    if (c.letter(head)) {
      for (pos = head; c.letter(pos);) ++pos;
    } else if (c.number(head)) {
      for (pos = head; c.number(pos);) ++pos;
    } else if (c.other(head)) {
      for (pos = head; c.other(pos);) ++pos;
    } else {
      pos = whitespace_end(c, pos, false);
    }
    c.cut(pos);
  }
  return c.take();
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
std::vector<std::string_view> llama3_pre_tokenize(std::string_view text) {
  CharSplitter c(text);
  for (size_t pos = 0; pos < c.size();) {
    if (const size_t len = contraction(c, pos, true)) {
      c.cut(pos += len);
      continue;
    }
    // One optional character that is not a newline, letter or number, then letters.
    if (!c.newline(pos) && !c.number(pos) && (c.letter(pos) || c.letter(pos + 1))) {
      for (++pos; c.letter(pos);) ++pos;
      c.cut(pos);
      continue;
    }
    if (c.number(pos)) {
      // Digits in groups of at most three.
      for (size_t group_start = pos; c.number(pos);) {
        if (++pos - group_start == 3) {
          c.cut(pos);
          group_start = pos;
        }
      }
      c.cut(pos);
      continue;
    }
    const size_t head = c.cp(pos) == ' ' ? pos + 1 : pos;
    if (c.other(head) || (head != pos && head == c.size())) {
      for (pos = head; c.other(pos);) ++pos;
      while (c.newline(pos)) ++pos;
      c.cut(pos);
      continue;
    }
    c.cut(pos = whitespace_end(c, pos, true));
  }
  return c.take();
}

namespace {

struct Symbol {
  int prev;
  int next;
  const char* text;
  size_t n;
};

struct Bigram {
  int left;
  int right;
  int32_t rank;
  std::string text;
};

// Lowest rank first; equal ranks: the leftmost pair first.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

void bpe_word(const Tokenizer::Impl& impl, std::string_view word, std::vector<int32_t>& out) {
  std::vector<Symbol> symbols;
  for (size_t offset = 0; offset < word.size();) {
    const size_t len = std::min(unicode::utf8_sequence_length(static_cast<uint8_t>(word[offset])),
                                word.size() - offset);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back(
        {index - 1, offset + len == word.size() ? -1 : index + 1, word.data() + offset, len});
    offset += len;
  }
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  std::string key;
  auto add_bigram = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    key.assign(l.text, l.n);
    key += ' ';
    key.append(r.text, r.n);
    auto it = impl.merge_ranks.find(key);
    if (it == impl.merge_ranks.end()) return;
    queue.push({left, right, it->second, std::string(l.text, l.n + r.n)});
  };
  for (size_t i = 1; i < symbols.size(); ++i) {
    add_bigram(static_cast<int>(i) - 1, static_cast<int>(i));
  }
  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(bigram.left)];
    Symbol& right = symbols[static_cast<size_t>(bigram.right)];
    if (left.n == 0 || right.n == 0) continue;
    // Stale if an earlier merge changed either side.
    if (left.n + right.n != bigram.text.size() || left.text + left.n != right.text) continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = bigram.left;
    add_bigram(left.prev, bigram.left);
    add_bigram(bigram.left, left.next);
  }
  for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[static_cast<size_t>(i)].next) {
    const Symbol& s = symbols[static_cast<size_t>(i)];
    const std::string_view piece(s.text, s.n);
    const int32_t id = impl.find(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    // A piece the vocab lacks falls back to its single characters (one per input byte), and a
    // character the vocab lacks to the unknown token, if any.
    for (size_t pos = 0; pos < piece.size();) {
      const size_t len = std::min(unicode::utf8_sequence_length(static_cast<uint8_t>(piece[pos])),
                                  piece.size() - pos);
      const int32_t char_id = impl.find(piece.substr(pos, len));
      if (char_id >= 0) {
        out.push_back(char_id);
      } else if (impl.vocab.unk_id >= 0) {
        out.push_back(impl.vocab.unk_id);
      }
      pos += len;
    }
  }
}

}  // namespace

void bpe_encode(const Tokenizer::Impl& impl, std::string_view text, std::vector<int32_t>& out) {
  std::string spelled;
  const std::vector<std::string_view> words = impl.pre_tokenizer == PreTokenizer::Llama3
                                                  ? llama3_pre_tokenize(text)
                                                  : gpt2_pre_tokenize(text);
  for (std::string_view word : words) {
    spelled.clear();
    for (char c : word)
      unicode::append_utf8(spelled, gpt2_byte_to_codepoint(static_cast<uint8_t>(c)));
    if (impl.ignore_merges) {
      if (const int32_t id = impl.find(spelled); id >= 0) {
        out.push_back(id);
        continue;
      }
    }
    bpe_word(impl, spelled, out);
  }
}

}  // namespace tandem
