// Internal: where a graph's intermediates live in an arena, offsets from liveness. Shared by the
// executor's plans and calibration's decode layer, which lays out its activations as a run does.
#pragma once

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "tandem/graph.h"

namespace tandem {

inline constexpr size_t kSlotAlignment = 256;

// An intermediate's bytes in its group's arena.
struct Slot {
  int group = 0;
  size_t bytes = 0;
  int start = 0;  // first node index (inclusive) during which the slot is live
  int end = 0;    // last node index (inclusive)
  size_t offset = 0;
};

// Per node, the index of the last node that reads its storage (INT_MAX for the graph's outputs,
// -1 where none does).
std::vector<int> last_readers(const Graph& graph);

// The lowest offset at which `bytes` overlap no slot of `placed` in `group` that is live during
// one of `spans` (first and last node, inclusive).
size_t first_fit(std::span<const Slot> placed, int group, size_t bytes,
                 std::span<const std::pair<int, int>> spans);

// First-fit offsets per group, largest slots first, against slots whose lifetimes overlap: an
// intermediate takes memory whose earlier tenants' readers have run. Returns each group's bytes.
std::vector<size_t> assign_offsets(std::vector<Slot>& slots, int n_groups);

}  // namespace tandem
