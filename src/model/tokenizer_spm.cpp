// SentencePiece encoding as llama.cpp does it: split into UTF-8 characters, merge the adjacent
// pair whose joined text is the highest-scoring token until none is left, then emit tokens,
// splitting pieces that are not tokens back along their merges and finally into <0xXX> bytes.
#include <algorithm>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer_impl.h"
#include "unicode.h"

namespace tandem {
namespace {

struct Symbol {
  int prev;
  int next;
  const char* text;
  size_t n;  // 0 once merged into its left neighbour
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t size;
};

// Highest score first; equal scores: the leftmost pair first.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

class SpmSession {
 public:
  explicit SpmSession(const Tokenizer::Impl& impl) : impl_(impl) {}

  void encode(std::string_view text, std::vector<int32_t>& out) {
    // Characters of valid UTF-8; each invalid byte is a symbol of its own, so it falls back to
    // its byte token and decodes unchanged (llama.cpp trusts the lead byte here instead).
    for (size_t offset = 0; offset < text.size();) {
      const size_t len = unicode::decode_utf8(text, offset).length;
      const int index = static_cast<int>(symbols_.size());
      symbols_.push_back(
          {index - 1, offset + len == text.size() ? -1 : index + 1, text.data() + offset, len});
      offset += len;
    }
    for (size_t i = 1; i < symbols_.size(); ++i) {
      try_add_bigram(static_cast<int>(i) - 1, static_cast<int>(i));
    }
    while (!queue_.empty()) {
      const Bigram bigram = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[static_cast<size_t>(bigram.left)];
      Symbol& right = symbols_[static_cast<size_t>(bigram.right)];
      // A pair made stale by an earlier merge no longer spans `size` bytes.
      if (left.n == 0 || right.n == 0 || left.n + right.n != bigram.size) continue;
      left.n += right.n;
      right.n = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[static_cast<size_t>(right.next)].prev = bigram.left;
      try_add_bigram(left.prev, bigram.left);
      try_add_bigram(bigram.left, left.next);
    }
    for (int i = symbols_.empty() ? -1 : 0; i != -1; i = symbols_[static_cast<size_t>(i)].next) {
      resegment(symbols_[static_cast<size_t>(i)], out);
    }
  }

 private:
  void try_add_bigram(int left, int right) {
    if (left == -1 || right == -1) return;
    const Symbol& l = symbols_[static_cast<size_t>(left)];
    const Symbol& r = symbols_[static_cast<size_t>(right)];
    std::string text(l.text, l.n + r.n);
    const int32_t id = impl_.find(text);
    if (id < 0) return;
    queue_.push({left, right, impl_.score(id), text.size()});
    rev_merge_[std::move(text)] = {left, right};
  }

  void resegment(const Symbol& symbol, std::vector<int32_t>& out) {
    const std::string_view text(symbol.text, symbol.n);
    const int32_t id = impl_.find(text);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
    auto it = rev_merge_.find(std::string(text));
    if (it == rev_merge_.end()) {
      for (char c : text) {
        const int32_t byte_id = impl_.byte_tokens[static_cast<uint8_t>(c)];
        // Without a byte token the vocab's unknown token stands in (SentencePiece's <unk>).
        if (byte_id >= 0) {
          out.push_back(byte_id);
        } else if (impl_.vocab.unk_id >= 0) {
          out.push_back(impl_.vocab.unk_id);
        }
      }
      return;
    }
    resegment(symbols_[static_cast<size_t>(it->second.first)], out);
    resegment(symbols_[static_cast<size_t>(it->second.second)], out);
  }

  const Tokenizer::Impl& impl_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue_;
  std::unordered_map<std::string, std::pair<int, int>> rev_merge_;
};

}  // namespace

void spm_encode(const Tokenizer::Impl& impl, std::string_view text, std::vector<int32_t>& out) {
  // SentencePiece spells spaces as U+2581.
  std::string escaped;
  escaped.reserve(text.size() + 8);
  for (char c : text) {
    if (c == ' ') {
      escaped += "\xE2\x96\x81";
    } else {
      escaped += c;
    }
  }
  SpmSession(impl).encode(escaped, out);
}

}  // namespace tandem
