// Byte counts: rounding up to an alignment and printing them for people.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem {

// n rounded up to a multiple of alignment (any alignment > 0, not only powers of two).
constexpr size_t align_up(size_t n, size_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

// "512 B", "1.50 KiB", "4.00 MiB", "7.25 GiB": binary units, two decimals above bytes.
std::string format_bytes(uint64_t bytes);

}  // namespace tandem
