// Tensor-pin patterns, compiled once. <regex> stays in one file (GCC 12 warns falsely inside
// it under -O2 with sanitizers; see CMakeLists.txt).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

class PinMatcher {
 public:
  // Throws InvalidArgument naming a pattern that is not a valid ECMAScript regex.
  explicit PinMatcher(const std::vector<std::string>& patterns);
  ~PinMatcher();
  PinMatcher(PinMatcher&&) noexcept;
  PinMatcher& operator=(PinMatcher&&) noexcept;
  // Index of the first pattern found in `name` (std::regex_search), or -1.
  int match(const std::string& name) const;
  size_t size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
