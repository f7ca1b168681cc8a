#include "pin_matcher.h"

#include <mutex>
#include <regex>
#include <unordered_map>

#include "tandem/error.h"

namespace tandem {

struct PinMatcher::Impl {
  std::vector<std::regex> regexes;
  // Each plan asks again for every weight of its graph, and a regex search costs about a
  // microsecond per pattern (tens of patterns for --ngl): answers are kept by name.
  std::mutex mutex;
  std::unordered_map<std::string, int> seen;
};

PinMatcher::PinMatcher(const std::vector<std::string>& patterns) : impl_(std::make_unique<Impl>()) {
  for (const std::string& p : patterns) {
    try {
      impl_->regexes.emplace_back(p, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw_error(ErrorCode::InvalidArgument, "scheduler builder",
                  "pin_tensor pattern '" + p + "' is not a valid regex (" + e.what() + ")");
    }
  }
}

PinMatcher::~PinMatcher() = default;
PinMatcher::PinMatcher(PinMatcher&&) noexcept = default;
PinMatcher& PinMatcher::operator=(PinMatcher&&) noexcept = default;

int PinMatcher::match(const std::string& name) const {
  std::lock_guard lock(impl_->mutex);
  if (auto it = impl_->seen.find(name); it != impl_->seen.end()) return it->second;
  int found = -1;
  for (size_t i = 0; i < impl_->regexes.size() && found < 0; ++i) {
    if (std::regex_search(name, impl_->regexes[i])) found = int(i);
  }
  impl_->seen.emplace(name, found);
  return found;
}

size_t PinMatcher::size() const {
  return impl_->regexes.size();
}

}  // namespace tandem
