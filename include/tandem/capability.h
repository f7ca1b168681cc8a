// What a backend can execute, as data: a table of OpCapability rows that can be printed,
// tested and checked against a node before anything runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/dtype.h"
#include "tandem/graph.h"

namespace tandem {

// One row: the backend runs `op` when every input dtype and the output dtype are in `dtypes`,
// the largest tensor involved has at most `max_elements` elements (0: no limit) and the
// backend has `required_feature` (empty: none). A backend may declare several rows per op.
struct OpCapability {
  OpKind op = OpKind::Add;
  std::vector<DType> dtypes;
  int64_t max_elements = 0;
  std::string required_feature;
};

// Why a backend cannot (or was not chosen to) run a node.
enum class RejectReason : uint8_t {
  None,
  UnsupportedOp,
  UnsupportedDType,
  TooLarge,
  MissingFeature,
  OutOfMemory,
  MoreExpensive,
  DeviceLost,
  NotAllowed,  // excluded by the strategy (BackendOnly, strict, a pin)
};
std::string_view reject_reason_name(RejectReason reason);

struct CapabilityCheck {
  RejectReason reason = RejectReason::None;
  std::string detail;  // e.g. "dtype q4_0 of input 0 not in [f32, f16]"
  bool ok() const { return reason == RejectReason::None; }
};

}  // namespace tandem
