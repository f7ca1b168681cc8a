// Tokenizer and sampler throughput: encode/decode on synthetic SentencePiece and GPT-2 style
// vocabs of real sizes, and one sampling step over a Llama-3-sized logit row.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "tandem/model/sampler.h"
#include "tandem/model/tokenizer.h"

namespace tandem {
namespace {

// A prose-like text of about `bytes` bytes, words drawn from a small fixed list.
std::string sample_text(size_t bytes) {
  static const char* kWords[] = {
      "the",    "model", "runs", "on",       "a",       "GPU",    "and",    "CPU,", "with",    "12",
      "layers", "in",    "1.5",  "seconds.", "Überall", "日本語", "tokens", "per",  "second\n"};
  std::mt19937 rng(7);
  std::string text;
  while (text.size() < bytes) {
    text += kWords[rng() % (sizeof kWords / sizeof kWords[0])];
    text += ' ';
  }
  return text;
}

// SentencePiece-style: byte tokens, then pieces for every prefix of the words above with and
// without the word-start mark, scored shorter-first.
Vocab spm_vocab(size_t n_pieces) {
  Vocab v;
  v.kind = VocabKind::Spm;
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.types = {TokenType::Unknown, TokenType::Control, TokenType::Control};
  for (unsigned b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    v.tokens.push_back(buf);
    v.types.push_back(TokenType::Byte);
  }
  const std::string text = sample_text(1 << 16);
  for (size_t len = 1; v.tokens.size() < n_pieces && len < 12; ++len) {
    for (size_t i = 0; i + len <= text.size() && v.tokens.size() < n_pieces; i += 3) {
      std::string piece;
      for (char c : text.substr(i, len))
        piece += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
      v.tokens.push_back(piece);
      v.types.push_back(TokenType::Normal);
    }
  }
  v.scores.resize(v.tokens.size());
  for (size_t i = 0; i < v.scores.size(); ++i) v.scores[i] = -static_cast<float>(i);
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  return v;
}

void BM_SpmEncode(benchmark::State& state) {
  const Tokenizer tokenizer(spm_vocab(32000));
  const std::string text = sample_text(static_cast<size_t>(state.range(0)));
  size_t n_tokens = 0;
  for (auto _ : state) {
    const auto ids = tokenizer.encode(text, EncodeOptions{});
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(n_tokens);
}
BENCHMARK(BM_SpmEncode)->Arg(1 << 10)->Arg(1 << 16);

void BM_SpmDecode(benchmark::State& state) {
  const Tokenizer tokenizer(spm_vocab(32000));
  const std::string text = sample_text(1 << 16);
  const auto ids = tokenizer.encode(text, EncodeOptions{});
  for (auto _ : state) benchmark::DoNotOptimize(tokenizer.decode(ids));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_SpmDecode);

void BM_SampleStep(benchmark::State& state) {
  std::vector<float> logits(128256);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& l : logits) l = normal(rng);
  SamplerParams params;  // defaults: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8
  switch (state.range(0)) {
    case 0:
      params = SamplerParams::greedy();
      break;
    case 2:
      params.top_k = 0;  // top-p over the whole vocab
      break;
    default:
      break;
  }
  params.repeat_penalty = 1.1f;
  Sampler sampler(params);
  for (auto _ : state) {
    const int32_t token = sampler.sample(logits);
    sampler.accept(token);
    benchmark::DoNotOptimize(token);
  }
  state.SetLabel(state.range(0) == 0 ? "greedy" : state.range(0) == 1 ? "defaults" : "top_k=0");
}
BENCHMARK(BM_SampleStep)->Arg(0)->Arg(1)->Arg(2);

}  // namespace
}  // namespace tandem
