// Token sampling with llama.cpp's semantics: repetition penalties over the last N tokens, then
// top-k, top-p, min-p, temperature, and a draw from the softmax. Reproducible for a seed on any
// platform: its own PRNG (mt19937_64) and its own uniform-to-token code.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace tandem {

struct SamplerParams {
  uint64_t seed = 0;
  float temperature = 0.8f;        // <= 0 is greedy (the highest logit, first on ties)
  int32_t top_k = 40;              // 0 keeps every token
  float top_p = 0.95f;             // 1 keeps every token; in (0, 1]
  float min_p = 0.05f;             // 0 keeps every token; keeps p >= min_p * p_max; in [0, 1]
  float repeat_penalty = 1.0f;     // 1 is off; > 0: logits of recent tokens / (or * if <= 0) it
  float frequency_penalty = 0.0f;  // subtracted once per occurrence in the window
  float presence_penalty = 0.0f;   // subtracted once if present in the window
  int32_t repeat_last_n = 64;      // window for the penalties; 0 is off
  int32_t min_keep = 1;            // top-p and min-p keep at least this many tokens

  static SamplerParams greedy() {
    SamplerParams p;
    p.temperature = 0.0f;
    return p;
  }
};

// One candidate after penalties and truncation, for inspection and tests.
struct TokenCandidate {
  int32_t id;
  float logit;  // after penalties and temperature
  float p;      // softmax probability among the kept candidates
};

class Sampler {
 public:
  // Throws InvalidArgument naming the parameter that is out of range.
  explicit Sampler(SamplerParams params);

  // Picks the next token from one row of logits (one per vocab entry). Does not record it:
  // call accept() with the token actually used (the penalties read that history).
  int32_t sample(std::span<const float> logits);
  // The candidates sample() would draw from, best first, probabilities summing to 1.
  std::vector<TokenCandidate> candidates(std::span<const float> logits) const;

  void accept(int32_t token);
  // Clears the history and restarts the random stream from the seed.
  void reset();

  const SamplerParams& params() const { return params_; }
  const std::deque<int32_t>& history() const { return history_; }

 private:
  // Penalties and truncation; `sorted` asks for best-first order (sample() does not need it).
  std::vector<TokenCandidate> select(std::span<const float> logits, bool sorted) const;
  std::vector<std::pair<int32_t, int>> penalty_counts(size_t n_vocab) const;

  SamplerParams params_;
  std::mt19937_64 rng_;
  std::deque<int32_t> history_;  // at most repeat_last_n tokens, oldest first
};

}  // namespace tandem
