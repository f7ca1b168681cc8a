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

float best_logit(const std::vector<TokenCandidate>& c) {
  float best = -INFINITY;
  for (const auto& t : c) best = std::max(best, t.logit);
  return best;
}

// The largest of n floats with eight independent maxima (one running max would wait on itself
// every element); *bad is set if any value is NaN or +inf.
float max_of(const float* x, size_t n, bool* bad = nullptr) {
  constexpr size_t kLanes = 8;
  float lane[kLanes];
  for (float& m : lane) m = -INFINITY;
  bool any_bad = false;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      any_bad |= !(x[i + j] < INFINITY);
      lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
    }
  }
  for (; i < n; ++i) {
    any_bad |= !(x[i] < INFINITY);
    lane[0] = x[i] > lane[0] ? x[i] : lane[0];
  }
  if (bad) *bad = any_bad;
  return *std::max_element(lane, lane + kLanes);
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

// The window's tokens with their counts, by id (llama.cpp's penalties sampler).
std::vector<std::pair<int32_t, int>> Sampler::penalty_counts(size_t n_vocab) const {
  const SamplerParams& p = params_;
  const bool penalize =
      p.repeat_last_n > 0 &&
      (p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f);
  std::vector<std::pair<int32_t, int>> counts;
  if (!penalize) return counts;
  std::vector<int32_t> ids;
  for (int32_t t : history_) {
    if (t >= 0 && static_cast<size_t>(t) < n_vocab) ids.push_back(t);
  }
  std::sort(ids.begin(), ids.end());
  for (int32_t t : ids) {
    if (counts.empty() || counts.back().first != t) counts.emplace_back(t, 0);
    ++counts.back().second;
  }
  return counts;
}

std::vector<TokenCandidate> Sampler::select(std::span<const float> logits, bool sorted) const {
  TANDEM_CHECK_ARG(!logits.empty(), kWhere, "empty logits");
  const SamplerParams& p = params_;
  const size_t n = logits.size();
  bool bad = false;
  const float max_logit = max_of(logits.data(), n, &bad);
  if (bad) {
    for (size_t k = 0; k < n; ++k) {
      if (!(logits[k] < INFINITY)) {
        throw_error(ErrorCode::InvalidArgument, kWhere,
                    "logit " + std::to_string(k) + " is " + std::to_string(logits[k]));
      }
    }
  }
  TANDEM_CHECK_ARG(max_logit > -INFINITY, kWhere, "every logit is -inf");

  // Walks the tokens in id order: runs of unpenalized ids go to run(begin, end) as they are,
  // each penalized token to one(id, logit after penalties).
  const std::vector<std::pair<int32_t, int>> counts = penalty_counts(n);
  auto walk = [&](auto&& run, auto&& one) {
    size_t start = 0;
    for (const auto& [id, count] : counts) {
      const auto at = static_cast<size_t>(id);
      if (at > start) run(start, at);
      float l = logits[at];
      l = l <= 0.0f ? l * p.repeat_penalty : l / p.repeat_penalty;
      l -= static_cast<float>(count) * p.frequency_penalty + p.presence_penalty;
      one(id, l);
      start = at + 1;
    }
    if (n > start) run(start, n);
  };

  if (p.temperature <= 0.0f) {
    // Greedy: ids come in increasing order, so only a strictly larger logit wins a tie-free
    // first-index argmax.
    TokenCandidate best{-1, -INFINITY, 1.0f};
    walk(
        [&](size_t begin, size_t end) {
          const float m = counts.empty() ? max_logit : max_of(logits.data() + begin, end - begin);
          if (!(m > best.logit)) return;
          const size_t at = static_cast<size_t>(
              std::find(logits.begin() + static_cast<std::ptrdiff_t>(begin), logits.end(), m) -
              logits.begin());
          best = {static_cast<int32_t>(at), m, 1.0f};
        },
        [&](int32_t id, float l) {
          if (l > best.logit) best = {id, l, 1.0f};
        });
    TANDEM_CHECK_ARG(best.id >= 0, kWhere, "every logit is -inf after penalties");
    return {best};
  }

  std::vector<TokenCandidate> c;
  size_t n_sorted = 0;
  if (p.top_k > 0) {
    // top-k in one pass: a heap whose top is the worst of the k best so far; a token enters
    // only above that threshold (ids rise, so a tie never beats an earlier token).
    const size_t k = static_cast<size_t>(p.top_k);
    c.reserve(std::min(k, n));
    float threshold = -INFINITY;
    auto admit = [&](int32_t id, float l) {
      if (!(l > threshold)) return;
      if (c.size() < k) {
        c.push_back({id, l, 0.0f});
        std::push_heap(c.begin(), c.end(), by_logit_desc);
      } else {
        std::pop_heap(c.begin(), c.end(), by_logit_desc);
        c.back() = {id, l, 0.0f};
        std::push_heap(c.begin(), c.end(), by_logit_desc);
      }
      if (c.size() == k) threshold = c.front().logit;
    };
    walk(
        [&](size_t begin, size_t end) {
          for (size_t at = begin; at < end; ++at) {
            if (logits[at] > threshold) admit(static_cast<int32_t>(at), logits[at]);
          }
        },
        admit);
    std::sort_heap(c.begin(), c.end(), by_logit_desc);
    n_sorted = c.size();
  } else {
    c.reserve(n);
    walk(
        [&](size_t begin, size_t end) {
          for (size_t at = begin; at < end; ++at) {
            if (logits[at] > -INFINITY) c.push_back({static_cast<int32_t>(at), logits[at], 0.0f});
          }
        },
        [&](int32_t id, float l) {
          if (l > -INFINITY) c.push_back({id, l, 0.0f});
        });
  }
  TANDEM_CHECK_ARG(!c.empty(), kWhere, "every logit is -inf after penalties");
  const size_t min_keep = static_cast<size_t>(p.min_keep);
  // Sorts [begin, end) of c best first, given that c[0, begin) already holds the best ones.
  auto sort_range = [&](size_t begin, size_t end) {
    const auto b = c.begin() + static_cast<std::ptrdiff_t>(begin);
    const auto e = c.begin() + static_cast<std::ptrdiff_t>(end);
    if (end < c.size()) std::nth_element(b, e, c.end(), by_logit_desc);
    std::sort(b, e, by_logit_desc);
  };

  // top-p: the smallest best-first prefix whose probability reaches top_p. Sorting grows in
  // chunks until the prefix is found, so a large vocab is rarely sorted in full.
  if (p.top_p < 1.0f) {
    const float top = best_logit(c);
    double total = 0.0;
    for (const auto& t : c) total += std::exp(t.logit - top);
    double cumulative = 0.0;
    size_t i = 0;
    for (size_t chunk = 64; i < c.size(); chunk *= 4) {
      const size_t end = std::min(c.size(), std::max(n_sorted, i + chunk));
      if (end > n_sorted) {
        sort_range(n_sorted, end);
        n_sorted = end;
      }
      for (; i < end; ++i) {
        cumulative += std::exp(c[i].logit - top) / total;
        if (cumulative >= p.top_p && i + 1 >= min_keep) break;
      }
      if (i < end) {
        c.resize(i + 1);
        n_sorted = c.size();
        break;
      }
    }
  }
  // min-p: logits within log(min_p) of the best, i.e. p >= min_p * p_max; at least min_keep.
  if (p.min_p > 0.0f) {
    const float top = best_logit(c);
    const float min_logit = top + std::log(p.min_p);
    if (n_sorted == c.size() || min_keep > 1) {
      if (n_sorted < c.size()) sort_range(n_sorted, c.size());
      n_sorted = c.size();
      size_t keep = 1;
      while (keep < c.size() && (c[keep].logit >= min_logit || keep < min_keep)) ++keep;
      c.resize(keep);
    } else {
      // Unsorted: keep what passes, in place and in order.
      std::erase_if(c, [&](const TokenCandidate& t) { return t.logit < min_logit; });
      n_sorted = 0;
    }
  }
  if (sorted && n_sorted < c.size()) std::sort(c.begin(), c.end(), by_logit_desc);

  // Temperature, then the softmax over what is kept.
  const float top = best_logit(c) / p.temperature;
  double total = 0.0;
  for (auto& t : c) {
    t.logit /= p.temperature;
    t.p = std::exp(t.logit - top);
    total += t.p;
  }
  const float scale = static_cast<float>(1.0 / total);
  for (auto& t : c) t.p *= scale;
  return c;
}

std::vector<TokenCandidate> Sampler::candidates(std::span<const float> logits) const {
  return select(logits, true);
}

int32_t Sampler::sample(std::span<const float> logits) {
  const std::vector<TokenCandidate> c = select(logits, false);
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
