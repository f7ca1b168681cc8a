// Helpers for unit tests: run a whole graph on the reference with host storage, random
// inputs, and checks of tandem::Error's code and "[where] what (values)" message.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "reference_backend.h"
#include "tandem/error.h"
#include "tandem/graph.h"

namespace tandem::test {

// IEEE half conversions that do not share f32_to_f16's or f16_to_f32's code: the compiler's
// _Float16 where it has one, else (clang before 15 on x86) arithmetic in double. Rounding to
// nearest, ties to even; NaN stays NaN.
inline uint16_t oracle_f32_to_f16(float f) {
#if defined(__FLT16_MAX__)
  const auto h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
#else
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return uint16_t(sign | 0x7e00);
  const double a = std::fabs(double(f));
  if (a >= 65520.0) return uint16_t(sign | 0x7c00);  // at or past the midpoint to 2^16
  if (a == 0.0) return sign;
  int e = 0;
  std::frexp(a, &e);                      // a = m 2^e, m in [0.5, 1)
  const int ulp = std::max(e - 11, -24);  // a half's unit in the last place there
  const double units = std::nearbyint(std::ldexp(a, -ulp));  // exact; ties to even
  const double v = std::ldexp(units, ulp);                   // the rounded value
  if (v == 0.0) return sign;
  std::frexp(v, &e);
  const int biased = e + 14;  // the half's exponent field
  if (biased <= 0) return uint16_t(sign | uint16_t(std::ldexp(v, 24)));  // subnormal
  const double mantissa = std::ldexp(v, 11 - e) - 1024.0;                // 10 bits, exact
  return uint16_t(sign | (biased << 10) | uint16_t(mantissa));
#endif
}
inline float oracle_f16_to_f32(uint16_t h) {
#if defined(__FLT16_MAX__)
  _Float16 v;
  std::memcpy(&v, &h, 2);
  return float(v);
#else
  const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 31) return float(mantissa ? std::nan("") : sign * INFINITY);
  if (exponent == 0) return float(sign * std::ldexp(double(mantissa), -24));
  return float(sign * std::ldexp(double(1024 + mantissa), exponent - 25));
#endif
}

// Host storage for every storage tensor of a graph; views and aliases point into it.
class HostRun {
 public:
  explicit HostRun(const Graph& g) : graph_(g) {
    for (const Node& n : g.nodes()) {
      if (g.storage_of(n.id) == n.id) storage_[n.id].assign(g.tensor(n.id).bytes(), 0);
    }
  }
  void* data(TensorId id) {
    return storage_.at(graph_.storage_of(id)).data() + graph_.tensor(id).view_offset;
  }
  template <typename T>
  T* as(TensorId id) {
    return reinterpret_cast<T*>(data(id));
  }
  void set_f32(TensorId id, const std::vector<float>& v) {
    ASSERT_EQ(int64_t(v.size()), graph_.tensor(id).elements());
    from_f32(graph_.tensor(id).dtype, v.data(), data(id), int64_t(v.size()));
  }
  void set_i32(TensorId id, const std::vector<int32_t>& v) {
    ASSERT_EQ(graph_.tensor(id).dtype, DType::I32);
    std::memcpy(data(id), v.data(), v.size() * 4);
  }
  std::vector<float> get_f32(TensorId id) {
    const TensorDesc& d = graph_.tensor(id);
    std::vector<float> v(static_cast<size_t>(d.elements()));
    to_f32(d.dtype, data(id), v.data(), d.elements());
    return v;
  }
  // Executes every compute node in order on the reference.
  void run() {
    ReferenceBackend ref;
    for (const Node& n : graph_.nodes()) {
      if (!is_compute(n.op)) continue;
      ref.execute(graph_, execution_of(graph_, n, [&](TensorId id) { return data(id); }));
    }
  }

 private:
  const Graph& graph_;
  std::map<TensorId, std::vector<uint8_t>> storage_;
};

inline uint64_t test_seed() {
  static const uint64_t seed = []() -> uint64_t {
    if (const char* s = std::getenv("TANDEM_TEST_SEED"); s && *s) {
      return std::strtoull(s, nullptr, 10);
    }
    std::random_device rd;
    return (uint64_t(rd()) << 32) | rd();
  }();
  return seed;
}

// Uniform in [-1, 1], never zero.
inline std::vector<float> random_values(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) {
    do {
      x = dist(rng);
    } while (x == 0.0f);
  }
  return v;
}

// Runs fn, expects a tandem::Error with `code` and `where`, whose what() is
// "[where] message" and whose message contains every fragment.
inline void expect_error(const std::function<void()>& fn, ErrorCode code, const std::string& where,
                         std::initializer_list<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected an error at [" << where << "]";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_EQ(e.where(), where) << e.what();
    EXPECT_EQ(std::string(e.what()), "[" + e.where() + "] " + e.message());
    for (const std::string& f : fragments) {
      EXPECT_NE(e.message().find(f), std::string::npos) << "'" << f << "' not in: " << e.what();
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected tandem::Error, got: " << e.what();
  }
}

}  // namespace tandem::test
