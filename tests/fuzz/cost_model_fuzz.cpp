// libFuzzer target for cost-profile JSON (CostModel::load_json). Any input must load or throw
// Error{Format}; a bad input changes nothing, and a loaded model's to_json loads back to itself.
//   cmake --preset fuzz && cmake --build build/fuzz --target cost_model_fuzz
//   mkdir -p /tmp/cost && cp tests/fuzz/corpus/cost_model/* /tmp/cost
//   ./build/fuzz/tests/fuzz/cost_model_fuzz -max_total_time=600 -print_final_stats=1 /tmp/cost
#include <cstdint>
#include <string>
#include <string_view>

#include "tandem/cost_model.h"
#include "tandem/error.h"

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  CostModel model;
  const std::string defaults = model.to_json();
  try {
    model.load_json(text);
  } catch (const Error& e) {
    require(e.code() == ErrorCode::Format);
    require(model.to_json() == defaults);
    return 0;
  }
  const std::string saved = model.to_json();
  CostModel reloaded;
  reloaded.load_json(saved);
  require(reloaded.to_json() == saved);
  return 0;
}
