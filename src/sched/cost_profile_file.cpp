// Cost-profile files: one JSON file per set of devices under the user's cache folder, their
// parsing and refusals, and how a command loads (or measures and saves) its cost model.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cost_model_json.h"
#include "tandem/calibration.h"
#include "tandem/error.h"
#include "tandem/hash.h"

namespace tandem {

namespace {
using nlohmann::json;
namespace fs = std::filesystem;
constexpr int kFormatVersion = 1;
constexpr const char* kFormatName = "tandem-cost-profile";
}  // namespace

// ---- cost-profile files ----

namespace {

[[noreturn]] void refuse(const std::string& source, const std::string& why) {
  throw_error(ErrorCode::Format, "cost profile", source + ": " + why);
}

json key_json(const DeviceKey& k) {
  return {{"backend", k.backend}, {"kind", k.kind},     {"host_cpu", k.host_cpu},
          {"device", k.device},   {"driver", k.driver}, {"features", k.features}};
}

DeviceKey key_from_json(const json& j, const std::string& source) {
  DeviceKey k;
  const std::pair<const char*, std::string*> fields[] = {
      {"backend", &k.backend}, {"kind", &k.kind},     {"host_cpu", &k.host_cpu},
      {"device", &k.device},   {"driver", &k.driver}, {"features", &k.features}};
  if (!j.is_object()) refuse(source, "a device entry's \"device\" is not an object");
  for (const auto& [name, field] : fields) {
    if (!j.contains(name) || !j.at(name).is_string())
      refuse(source, std::string("a device entry lacks the text field \"") + name + "\"");
    *field = j.at(name).get<std::string>();
  }
  if (k.kind != "cpu" && k.kind != "gpu") refuse(source, "device kind '" + k.kind + "'");
  return k;
}

}  // namespace

std::string default_cost_profile_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    return (fs::path(xdg) / "tandem").string();
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    return (fs::path(home) / ".cache" / "tandem").string();
  }
  return (fs::temp_directory_path() / "tandem").string();
}

std::string default_cost_profile_path(std::span<const DeviceKey> keys) {
  // FNV-1a over every key's fields: stable across builds and runs.
  uint64_t h = kFnvOffset64;
  for (const DeviceKey& k : keys) {
    for (const std::string* s :
         {&k.backend, &k.kind, &k.host_cpu, &k.device, &k.driver, &k.features}) {
      h = fnv1a("\xff", fnv1a(*s, h));  // a separator byte after each field
    }
  }
  char name[64];
  std::snprintf(name, sizeof name, "cost-profile-%016llx.json", (unsigned long long)h);
  return (fs::path(default_cost_profile_dir()) / name).string();
}

std::string cost_profile_to_json(std::span<const CalibratedDevice> devices) {
  json list = json::array();
  for (const auto& d : devices) {
    list.push_back({{"device", key_json(d.key)}, {"profile", detail::profile_to_json(d.profile)}});
  }
  return json{{"format", kFormatName}, {"version", kFormatVersion}, {"devices", list}}.dump(1);
}

std::vector<CalibratedDevice> cost_profile_from_json(std::string_view text,
                                                     const std::string& source) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) refuse(source, "not valid JSON (corrupt or truncated)");
  if (!j.is_object() || j.value("format", "") != kFormatName) {
    refuse(source,
           std::string("not a cost profile (expected \"format\": \"") + kFormatName + "\")");
  }
  if (!j.contains("version") || !j.at("version").is_number_integer() ||
      j.at("version").get<int>() != kFormatVersion) {
    refuse(source,
           "unsupported version (this build reads version " + std::to_string(kFormatVersion) + ")");
  }
  if (!j.contains("devices") || !j.at("devices").is_array()) refuse(source, "no \"devices\" list");
  std::vector<CalibratedDevice> out;
  for (const json& e : j.at("devices")) {
    if (!e.is_object() || !e.contains("device") || !e.contains("profile"))
      refuse(source, "a device entry needs \"device\" and \"profile\"");
    CalibratedDevice d;
    d.key = key_from_json(e.at("device"), source);
    const BackendKind kind = d.key.kind == "gpu" ? BackendKind::Gpu : BackendKind::Cpu;
    try {
      d.profile = detail::profile_from_json(
          e.at("profile"), CostModel::default_profile(d.key.backend, kind), d.key.backend);
    } catch (const Error& err) {
      refuse(source, err.message());
    }
    out.push_back(std::move(d));
  }
  return out;
}

void write_cost_profile(const std::string& path, std::span<const CalibratedDevice> devices) {
  std::error_code ec;
  const fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  // Written beside and renamed, so a reader never sees half a file.
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << cost_profile_to_json(devices) << "\n";
    if (!f) throw_error(ErrorCode::Io, "cost profile", "cannot write '" + tmp + "'");
  }
  fs::rename(tmp, p, ec);
  if (ec)
    throw_error(ErrorCode::Io, "cost profile", "cannot write '" + path + "': " + ec.message());
}

std::vector<CalibratedDevice> read_cost_profile(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw_error(ErrorCode::Io, "cost profile", "cannot open '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return cost_profile_from_json(ss.str(), path);
}

void apply_cost_profile(std::span<const CalibratedDevice> devices, std::span<const DeviceKey> here,
                        const std::string& source, CostModel& model) {
  size_t matched = 0;
  for (const CalibratedDevice& d : devices) {
    const auto it = std::find_if(here.begin(), here.end(),
                                 [&](const DeviceKey& k) { return k.backend == d.key.backend; });
    if (it == here.end()) continue;
    if (!(*it == d.key)) {
      refuse(source,
             "made for another device: " + d.key.describe() + "; this is " + it->describe());
    }
    ++matched;
  }
  if (matched == 0) {
    std::string ids;
    for (const auto& k : here) ids += (ids.empty() ? "" : ", ") + k.backend;
    refuse(source, "made for other devices (it has no entry for " + ids + ")");
  }
  for (const CalibratedDevice& d : devices) {
    if (std::any_of(here.begin(), here.end(),
                    [&](const DeviceKey& k) { return k.backend == d.key.backend; }))
      model.set_profile(d.key.backend, d.profile);
  }
}

LoadedCostModel load_cost_model(std::span<const std::shared_ptr<Backend>> backends,
                                const CostProfileOptions& options, std::ostream& log) {
  LoadedCostModel out;
  std::vector<Backend*> measured;
  for (const auto& b : backends) {
    if (b->backend_id() == kReferenceBackendId) continue;
    out.keys.push_back(device_key(*b));
    measured.push_back(b.get());
  }
  if (options.use_builtin || measured.empty()) {
    if (options.use_builtin) {
      log << "warning: --no-calibrate: using built-in device figures, placement estimates may "
             "be far off\n";
    }
    return out;
  }
  const bool named = !options.path.empty();
  const std::string path = named ? options.path : default_cost_profile_path(out.keys);
  std::error_code ec;
  bool stale = false;
  if (named || fs::exists(path, ec)) {
    try {
      const std::vector<CalibratedDevice> devices = read_cost_profile(path);
      // A device calibrated before calibration timed ops inside a segment lacks those figures:
      // the planner would price its ops at their times alone (an H100's 8B decode predicted at
      // 145 t/s against 400). This machine's own profile is measured again; a named one is
      // used as it is.
      stale = !named && options.calibrate_if_missing &&
              std::any_of(devices.begin(), devices.end(), [](const CalibratedDevice& d) {
                return d.key.kind == "gpu" && d.profile.calibrated &&
                       !(d.profile.segment_launch_us > 0.0);
              });
      if (!stale) {
        apply_cost_profile(devices, out.keys, path, out.model);
        out.path = path;
        out.measured = true;
        return out;
      }
    } catch (const Error& e) {
      log << "warning: " << e.what() << "; using built-in device figures\n";
      return out;
    }
  }
  if (!options.calibrate_if_missing) return out;
  if (stale) {
    log << "calibrating this machine's devices again for the cost model (" << path
        << " has no figures for a GPU's ops inside a segment; a few seconds) ...\n";
  } else {
    log << "calibrating this machine's devices for the cost model (first use, a few seconds; "
           "`tandem calibrate` measures more) ...\n";
  }
  std::vector<CalibratedDevice> devices;
  CalibrationOptions quick;
  quick.quick = true;
  for (size_t i = 0; i < measured.size(); ++i) {
    devices.push_back({out.keys[i], calibrate_backend(*measured[i], quick)});
    out.model.set_profile(out.keys[i].backend, devices.back().profile);
  }
  out.measured = true;
  try {
    write_cost_profile(path, devices);
    out.path = path;
  } catch (const Error& e) {
    log << "warning: " << e.what() << " (the calibration is used for this run only)\n";
  }
  return out;
}

void save_cost_model(const LoadedCostModel& loaded) {
  if (loaded.path.empty()) return;
  std::vector<CalibratedDevice> devices;
  for (const DeviceKey& k : loaded.keys) {
    const BackendKind kind = k.kind == "gpu" ? BackendKind::Gpu : BackendKind::Cpu;
    devices.push_back({k, loaded.model.profile(k.backend, kind)});
  }
  write_cost_profile(loaded.path, devices);
}

}  // namespace tandem
