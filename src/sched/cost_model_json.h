// Internal: one backend profile to and from JSON, shared by the cost model's own format and the
// calibration file.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tandem/cost_model.h"

namespace tandem::detail {

nlohmann::json profile_to_json(const BackendProfile& profile);
// Fields left out keep base's values. Throws Error{Format} naming `where` and the bad field.
BackendProfile profile_from_json(const nlohmann::json& j, BackendProfile base,
                                 const std::string& where);

}  // namespace tandem::detail
