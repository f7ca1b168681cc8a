// The hashing shared by graph signatures, plan and residency keys, captured-segment keys,
// seeded generators and stable name hashes: one definition of each, so equal inputs hash alike
// everywhere.
#pragma once

#include <cstdint>
#include <string_view>

namespace tandem {

// 2^64 / golden ratio: the odd constant of Fibonacci hashing and splitmix64.
inline constexpr uint64_t kGoldenRatio64 = 0x9E3779B97F4A7C15ull;

// Folds v into h (the boost hash_combine recipe, widened to 64 bits).
constexpr uint64_t hash_combine(uint64_t h, uint64_t v) {
  return h ^ (v + kGoldenRatio64 + (h << 6) + (h >> 2));
}

// FNV-1a (64-bit) of `bytes`, continuing from `h`: a hash of names that stays the same across
// builds and runs, as seeds and file names need (synthetic weights seed by tensor name).
inline constexpr uint64_t kFnvOffset64 = 0xcbf29ce484222325ull;
inline constexpr uint64_t kFnvPrime64 = 0x100000001b3ull;
constexpr uint64_t fnv1a(std::string_view bytes, uint64_t h = kFnvOffset64) {
  for (char c : bytes) h = (h ^ uint64_t(static_cast<unsigned char>(c))) * kFnvPrime64;
  return h;
}

// splitmix64 (Steele, Lea, Flood): a fast 64-bit generator, good enough to fill test data and
// synthetic weights, and reproducible from its seed.
struct SplitMix64 {
  uint64_t state = 0;
  constexpr uint64_t next() {
    uint64_t z = (state += kGoldenRatio64);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

}  // namespace tandem
