// libFuzzer target for the tokenizers: arbitrary bytes (invalid UTF-8 included) are encoded by
// the synthetic model's SentencePiece vocab or a byte-level BPE vocab, then decoded. Byte-level
// BPE must give the input back exactly; every decode must agree with a TokenStream of the ids.
//   cmake --preset fuzz && cmake --build build/fuzz --target tokenizer_fuzz
//   mkdir -p /tmp/tok && cp tests/fuzz/corpus/tokenizer/* /tmp/tok
//   ./build/fuzz/tests/fuzz/tokenizer_fuzz -max_total_time=600 -print_final_stats=1 /tmp/tok
// The first input byte picks the vocab and the encode options; the rest is the text.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/error.h"
#include "tandem/model/gguf.h"
#include "tandem/model/synthetic.h"
#include "tandem/model/tokenizer.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace {

using namespace tandem;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

// The vocab exactly as a synthetic model stores it (512 pieces, byte fallback).
Tokenizer synthetic_tokenizer() {
  SyntheticSpec spec = synthetic_preset("tiny");
  spec.threads = 1;
  const std::vector<uint8_t> bytes = make_synthetic_writer(spec).to_bytes();
  return Tokenizer::from_gguf(gguf::File::parse(bytes, "synthetic"));
}

// All 256 byte pieces, a few merges and one control token, with GPT-2's or Llama 3's word split.
Tokenizer bpe_tokenizer(std::string pre_tokenizer) {
  Vocab v;
  v.kind = VocabKind::Bpe;
  v.add_space_prefix = false;
  v.pre_tokenizer = std::move(pre_tokenizer);
  for (unsigned b = 0; b < 256; ++b) {
    std::string s;
    unicode::append_utf8(s, gpt2_byte_to_codepoint(static_cast<uint8_t>(b)));
    v.tokens.push_back(s);
  }
  for (const char* t : {"he", "ll", "hell", "hello", "\xC4\xA0h", "el"}) v.tokens.push_back(t);
  v.tokens.push_back("<|endoftext|>");
  v.types.assign(v.tokens.size(), TokenType::Normal);
  v.types.back() = TokenType::Control;
  v.merges = {"h e", "l l", "he ll", "hell o", "\xC4\xA0 h", "e l"};
  v.bos_id = v.eos_id = int32_t(v.tokens.size()) - 1;
  return Tokenizer(std::move(v));
}

std::string stream_decode(const Tokenizer& t, const std::vector<int32_t>& ids,
                          const DecodeOptions& options) {
  TokenStream stream(t, options);
  std::string out;
  for (int32_t id : ids) out += stream.push(id);
  return out + stream.flush();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizer spm = synthetic_tokenizer();
  static const Tokenizer gpt2 = bpe_tokenizer("gpt-2");
  static const Tokenizer llama3 = bpe_tokenizer("llama-bpe");
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const Tokenizer& t = (mode & 3) == 0 ? spm : (mode & 3) == 1 ? gpt2 : llama3;
  EncodeOptions eo;
  eo.add_bos = mode & 4;
  eo.add_eos = mode & 8;
  eo.parse_special = mode & 16;
  DecodeOptions dopt;
  dopt.render_special = mode & 32;
  dopt.remove_leading_space = !(mode & 64);

  const std::vector<int32_t> ids = t.encode(text, eo);
  for (int32_t id : ids) require(id >= 0 && id < t.n_tokens());
  const std::string decoded = t.decode(ids, dopt);
  require(stream_decode(t, ids, dopt) == decoded);
  if (&t != &spm && !eo.add_bos && !eo.add_eos && !eo.parse_special) require(decoded == text);
  for (int32_t id : ids) t.token_to_piece(id, dopt.render_special);
  return 0;
}
