#include "placement_file.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tandem/error.h"

namespace tandem::cli {

namespace {
constexpr const char* kFormat = "tandem-placement";
constexpr int kVersion = 1;
}  // namespace

std::string placement_to_json(const PlacementFile& p) {
  nlohmann::json pins = nlohmann::json::array();
  for (const TensorPin& pin : p.pins)
    pins.push_back({{"pattern", pin.pattern}, {"backend", pin.backend_id}});
  nlohmann::json j = {{"format", kFormat}, {"version", kVersion},  {"label", p.label},
                      {"model", p.model},  {"n_layer", p.n_layer}, {"strategy", p.strategy},
                      {"pins", pins}};
  j["gpu_mem"] = p.gpu_memory ? nlohmann::json(*p.gpu_memory) : nlohmann::json(nullptr);
  return j.dump(2) + "\n";
}

PlacementFile placement_from_json(const std::string& text, const std::string& path) {
  auto bad = [&](const std::string& why) -> PlacementFile {
    throw_error(ErrorCode::InvalidArgument, "--placement", path + ": " + why);
  };
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("not JSON");
  // Fields of the wrong type are refused here too (json::value would throw its own exception).
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat)
    return bad(
        "not a saved placement (no \"format\": \"tandem-placement\"; tandem tune --save writes "
        "one)");
  if (!j.contains("version") || j["version"] != kVersion)
    return bad("version " + j.value("version", nlohmann::json(0)).dump() + " (this build reads " +
               std::to_string(kVersion) + ")");
  PlacementFile p;
  try {
    p.label = j.at("label").get<std::string>();
    p.model = j.at("model").get<std::string>();
    // Whole numbers only: a float converted to an integer out of its range is undefined.
    if (!j.at("n_layer").is_number_integer()) return bad("bad field: n_layer is not an integer");
    p.n_layer = j.at("n_layer").get<int64_t>();
    p.strategy = j.at("strategy").get<std::string>();
    Strategy::parse(p.strategy);
    if (const auto& mem = j.at("gpu_mem"); !mem.is_null()) {
      if (!mem.is_number_unsigned()) return bad("bad field: gpu_mem is not a byte count");
      p.gpu_memory = mem.get<uint64_t>();
    }
    for (const auto& pin : j.at("pins")) {
      p.pins.push_back(
          {pin.at("pattern").get<std::string>(), pin.at("backend").get<std::string>()});
    }
  } catch (const nlohmann::json::exception& e) {
    return bad(std::string("bad field: ") + e.what());
  } catch (const Error& e) {
    return bad(e.what());
  }
  return p;
}

PlacementFile load_placement(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw_error(ErrorCode::InvalidArgument, "--placement", "cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return placement_from_json(ss.str(), path);
}

}  // namespace tandem::cli
