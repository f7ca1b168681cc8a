// describe_capabilities: a backend's capability table as text and as JSON.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "tandem/scheduler.h"

namespace tandem {

namespace {
std::string dtype_list(const std::vector<DType>& dtypes) {
  std::string s;
  for (DType d : dtypes) s += (s.empty() ? "" : ", ") + std::string(dtype_name(d));
  return s;
}
}  // namespace

std::string describe_capabilities(const Backend& backend) {
  std::string s = "backend " + backend.backend_id() + " (" +
                  std::string(backend_kind_name(backend.kind())) + "), features: ";
  std::string features;
  for (const std::string& f : backend.features()) features += (features.empty() ? "" : ", ") + f;
  s += (features.empty() ? "none" : features) + "\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-18s %-32s %14s  %s\n", "op", "dtypes", "max_elements",
                "feature");
  s += line;
  for (const OpCapability& c : backend.capabilities()) {
    std::string max = c.max_elements > 0 ? std::to_string(c.max_elements) : "-";
    std::snprintf(line, sizeof line, "  %-18s %-32s %14s  %s\n", std::string(op_name(c.op)).c_str(),
                  dtype_list(c.dtypes).c_str(), max.c_str(),
                  c.required_feature.empty() ? "-" : c.required_feature.c_str());
    s += line;
  }
  return s;
}

std::string describe_capabilities_json(const Backend& backend) {
  using nlohmann::json;
  json caps = json::array();
  for (const OpCapability& c : backend.capabilities()) {
    json dtypes = json::array();
    for (DType d : c.dtypes) dtypes.push_back(std::string(dtype_name(d)));
    caps.push_back({{"op", std::string(op_name(c.op))},
                    {"dtypes", dtypes},
                    {"max_elements", c.max_elements},
                    {"required_feature", c.required_feature}});
  }
  return json{{"backend", backend.backend_id()},
              {"kind", std::string(backend_kind_name(backend.kind()))},
              {"host_accessible", backend.host_accessible()},
              {"features", backend.features()},
              {"capabilities", caps}}
      .dump(2);
}

}  // namespace tandem
