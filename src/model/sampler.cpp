// Sampling pipeline in llama.cpp's default order: penalties, top-k, top-p, min-p, temperature,
// draw. top-p and min-p look at the logits before temperature, as llama.cpp's chain does.
#include "tandem/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>

#include "tandem/error.h"

namespace tandem {
namespace {

constexpr const char* kWhere = "sampler";

bool by_logit_desc(const TokenCandidate& a, const TokenCandidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Fills p with the softmax of the logits; candidates must be sorted best first.
void softmax(std::vector<TokenCandidate>& c) {
  const float max_logit = c.front().logit;
  double sum = 0.0;
  for (auto& t : c) {
    t.p = std::exp(t.logit - max_logit);
    sum += t.p;
  }
  for (auto& t : c) t.p = static_cast<float>(t.p / sum);
}

// A uniform double in [0, 1) from the top 53 bits: the same on every standard library.
double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

}  // namespace

Sampler::Sampler(SamplerParams params) : params_(params), rng_(params.seed) {
  auto bad = [](const char* name, double value, const char* valid) {
    throw_error(
        ErrorCode::InvalidArgument, kWhere,
        std::string(name) + " out of range (" + std::to_string(value) + ", valid " + valid + ")");
  };
  const SamplerParams& p = params_;
  if (std::isnan(p.temperature) || std::isinf(p.temperature)) {
    bad("temperature", p.temperature, "finite, <= 0 for greedy");
  }
  if (p.top_k < 0) bad("top_k", p.top_k, ">= 0, 0 = off");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) bad("top_p", p.top_p, "(0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) bad("min_p", p.min_p, "[0, 1]");
  if (!(p.repeat_penalty > 0.0f) || std::isinf(p.repeat_penalty)) {
    bad("repeat_penalty", p.repeat_penalty, "> 0, 1 = off");
  }
  if (!std::isfinite(p.frequency_penalty)) bad("frequency_penalty", p.frequency_penalty, "finite");
  if (!std::isfinite(p.presence_penalty)) bad("presence_penalty", p.presence_penalty, "finite");
  if (p.repeat_last_n < 0) bad("repeat_last_n", p.repeat_last_n, ">= 0, 0 = off");
  if (p.min_keep < 1) bad("min_keep", p.min_keep, ">= 1");
}

std::vector<TokenCandidate> Sampler::candidates(std::span<const float> logits) const {
  TANDEM_CHECK_ARG(!logits.empty(), kWhere, "empty logits");
  const SamplerParams& p = params_;
  std::vector<TokenCandidate> c(logits.size());
  bool any_finite = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float l = logits[i];
    if (std::isnan(l) || l == INFINITY) {
      throw_error(ErrorCode::InvalidArgument, kWhere,
                  "logit " + std::to_string(i) + " is " + std::to_string(l));
    }
    any_finite = any_finite || std::isfinite(l);
    c[i] = {static_cast<int32_t>(i), l, 0.0f};
  }
  TANDEM_CHECK_ARG(any_finite, kWhere, "every logit is -inf");

  // Repetition penalties over the window (llama.cpp's penalties sampler).
  const bool penalize =
      p.repeat_last_n > 0 &&
      (p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f);
  if (penalize && !history_.empty()) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : history_) ++counts[t];
    for (const auto& [id, count] : counts) {
      if (id < 0 || static_cast<size_t>(id) >= c.size()) continue;
      float& l = c[static_cast<size_t>(id)].logit;
      l = l <= 0.0f ? l * p.repeat_penalty : l / p.repeat_penalty;
      l -= static_cast<float>(count) * p.frequency_penalty + p.presence_penalty;
    }
  }

  if (p.temperature <= 0.0f) {
    const auto best = std::min_element(c.begin(), c.end(), by_logit_desc);
    return {{best->id, best->logit, 1.0f}};
  }

  // top-k (sorts the kept candidates), or a full sort when off.
  const size_t k = p.top_k > 0 ? std::min(c.size(), static_cast<size_t>(p.top_k)) : c.size();
  std::partial_sort(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(k), c.end(), by_logit_desc);
  c.resize(k);
  // Drop -inf entries (masked tokens): they can never be drawn.
  while (c.size() > 1 && std::isinf(c.back().logit)) c.pop_back();
  const size_t min_keep = static_cast<size_t>(p.min_keep);

  // top-p: the smallest prefix whose probability reaches top_p.
  if (p.top_p < 1.0f) {
    softmax(c);
    double cumulative = 0.0;
    for (size_t i = 0; i < c.size(); ++i) {
      cumulative += c[i].p;
      if (cumulative >= p.top_p && i + 1 >= min_keep) {
        c.resize(i + 1);
        break;
      }
    }
  }
  // min-p: logits within log(min_p) of the best, i.e. p >= min_p * p_max.
  if (p.min_p > 0.0f) {
    const float min_logit = c.front().logit + std::log(p.min_p);
    size_t keep = 1;
    while (keep < c.size() && (c[keep].logit >= min_logit || keep < min_keep)) ++keep;
    c.resize(keep);
  }
  for (auto& t : c) t.logit /= p.temperature;
  softmax(c);
  return c;
}

int32_t Sampler::sample(std::span<const float> logits) {
  const std::vector<TokenCandidate> c = candidates(logits);
  if (c.size() == 1) return c.front().id;
  // Inverse CDF over the kept candidates, in double so the sums do not drift.
  double total = 0.0;
  for (const auto& t : c) total += t.p;
  const double target = uniform01(rng_) * total;
  double cumulative = 0.0;
  for (const auto& t : c) {
    cumulative += t.p;
    if (target < cumulative) return t.id;
  }
  return c.back().id;
}

void Sampler::accept(int32_t token) {
  if (params_.repeat_last_n == 0) return;
  history_.push_back(token);
  while (history_.size() > static_cast<size_t>(params_.repeat_last_n)) history_.pop_front();
}

void Sampler::reset() {
  history_.clear();
  rng_.seed(params_.seed);
}

}  // namespace tandem
