// libFuzzer target for saved placements (`tandem tune --save`, read by `--placement`): any input
// must load or throw Error{InvalidArgument}, and a loaded placement written back loads to itself.
//   cmake --preset fuzz && cmake --build build/fuzz --target placement_fuzz
//   mkdir -p /tmp/placement && cp tests/fuzz/corpus/placement/* /tmp/placement
//   ./build/fuzz/tests/fuzz/placement_fuzz -max_total_time=600 -print_final_stats=1 /tmp/placement
#include <cstdint>
#include <string>

#include "placement_file.h"
#include "tandem/error.h"

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

bool same(const tandem::cli::PlacementFile& a, const tandem::cli::PlacementFile& b) {
  if (a.label != b.label || a.model != b.model || a.n_layer != b.n_layer ||
      a.strategy != b.strategy || a.gpu_memory != b.gpu_memory || a.pins.size() != b.pins.size())
    return false;
  for (size_t i = 0; i < a.pins.size(); ++i) {
    if (a.pins[i].pattern != b.pins[i].pattern || a.pins[i].backend_id != b.pins[i].backend_id)
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  const std::string text(reinterpret_cast<const char*>(data), size);
  cli::PlacementFile p;
  try {
    p = cli::placement_from_json(text, "fuzz.json");
  } catch (const Error& e) {
    require(e.code() == ErrorCode::InvalidArgument);
    return 0;
  }
  const cli::PlacementFile back = cli::placement_from_json(cli::placement_to_json(p), "saved.json");
  require(same(p, back));
  return 0;
}
