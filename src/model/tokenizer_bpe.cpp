// GPT-2 byte-level BPE as llama.cpp does it: split the text with GPT-2's pre-tokenizer regex,
// spell each word's bytes as printable characters, then apply merges lowest rank first.
#include <algorithm>
#include <queue>
#include <string>
#include <vector>

#include "tokenizer_impl.h"
#include "unicode.h"

namespace tandem {

uint32_t gpt2_byte_to_codepoint(uint8_t byte) {
  // Printable bytes keep their codepoint; the other 68 move to 256.. in byte order.
  auto printable = [](unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  if (printable(byte)) return byte;
  uint32_t n = 0;
  for (unsigned b = 0; b < byte; ++b) n += printable(b) ? 0 : 1;
  return 256 + n;
}

int gpt2_codepoint_to_byte(uint32_t codepoint) {
  if (codepoint < 256)
    return gpt2_byte_to_codepoint(static_cast<uint8_t>(codepoint)) == codepoint
               ? static_cast<int>(codepoint)
               : -1;
  if (codepoint >= 256 + 68) return -1;
  for (unsigned b = 0; b < 256; ++b) {
    if (gpt2_byte_to_codepoint(static_cast<uint8_t>(b)) == codepoint) return static_cast<int>(b);
  }
  return -1;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// by hand over decoded characters; invalid UTF-8 bytes count as "other" (neither letter,
// number nor space), so every input byte lands in exactly one word.
std::vector<std::string_view> gpt2_pre_tokenize(std::string_view text) {
  struct Char {
    uint32_t cp;
    size_t offset;
  };
  std::vector<Char> chars;
  for (size_t pos = 0; pos < text.size();) {
    const unicode::Decoded d = unicode::decode_utf8(text, pos);
    chars.push_back({d.codepoint, pos});
    pos += d.length;
  }
  const size_t n = chars.size();
  constexpr uint32_t kEnd = 0xFFFFFFFEu;  // past the end: matches no class
  auto cp_at = [&](size_t i) { return i < n ? chars[i].cp : kEnd; };
  auto letter = [&](size_t i) { return i < n && unicode::is_letter(chars[i].cp); };
  auto number = [&](size_t i) { return i < n && unicode::is_number(chars[i].cp); };
  auto space = [&](size_t i) { return i < n && unicode::is_whitespace(chars[i].cp); };
  auto other = [&](size_t i) { return i < n && !letter(i) && !number(i) && !space(i); };

  std::vector<std::string_view> words;
  size_t start = 0;
  auto add_word = [&](size_t end) {
    const size_t begin_byte = chars[start].offset;
    const size_t end_byte = end < n ? chars[end].offset : text.size();
    words.push_back(text.substr(begin_byte, end_byte - begin_byte));
    start = end;
  };

  for (size_t pos = 0; pos < n;) {
    const uint32_t cp = cp_at(pos);
    if (cp == '\'' && pos + 1 < n) {
      const uint32_t next = cp_at(pos + 1);
      if (next == 's' || next == 't' || next == 'm' || next == 'd') {
        pos += 2;
        add_word(pos);
        continue;
      }
      const uint32_t next2 = cp_at(pos + 2);
      if ((next == 'r' && next2 == 'e') || (next == 'v' && next2 == 'e') ||
          (next == 'l' && next2 == 'l')) {
        pos += 3;
        add_word(pos);
        continue;
      }
    }
    // The optional leading space belongs to the class of the character after it.
    const size_t head = cp == ' ' ? pos + 1 : pos;
    if (letter(head)) {
      pos = head;
      while (letter(pos)) ++pos;
      add_word(pos);
      continue;
    }
    if (number(head)) {
      pos = head;
      while (number(pos)) ++pos;
      add_word(pos);
      continue;
    }
    if (other(head)) {
      pos = head;
      while (other(pos)) ++pos;
      add_word(pos);
      continue;
    }
    size_t spaces = 0;
    while (space(pos + spaces)) ++spaces;
    if (spaces > 1 && pos + spaces < n) {
      // \s+(?!\S): leave the last space to prefix the next word.
      pos += spaces - 1;
      add_word(pos);
      continue;
    }
    if (spaces > 0) {
      pos += spaces;
      add_word(pos);
      continue;
    }
    add_word(++pos);
  }
  return words;
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
  for (std::string_view word : gpt2_pre_tokenize(text)) {
    spelled.clear();
    for (char c : word)
      unicode::append_utf8(spelled, gpt2_byte_to_codepoint(static_cast<uint8_t>(c)));
    bpe_word(impl, spelled, out);
  }
}

}  // namespace tandem
