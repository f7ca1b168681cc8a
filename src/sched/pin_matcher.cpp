#include "pin_matcher.h"

#include <regex>

#include "tandem/error.h"

namespace tandem {

struct PinMatcher::Impl {
  std::vector<std::regex> regexes;
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
  for (size_t i = 0; i < impl_->regexes.size(); ++i) {
    if (std::regex_search(name, impl_->regexes[i])) return int(i);
  }
  return -1;
}

size_t PinMatcher::size() const {
  return impl_->regexes.size();
}

}  // namespace tandem
