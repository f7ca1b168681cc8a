// A temporary directory of this test process: created on first use, removed with everything in it
// when the process exits. ctest runs every case in a process of its own, so a directory left
// behind per process soon makes thousands.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

namespace tandem::test {

inline const std::filesystem::path& process_temp_dir(const std::string& prefix) {
  struct Dirs {
    std::map<std::string, std::filesystem::path> paths;
    ~Dirs() {
      for (const auto& [prefix, path] : paths) {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
      }
    }
  };
  static Dirs dirs;
  auto it = dirs.paths.find(prefix);
  if (it == dirs.paths.end()) {
    auto dir = std::filesystem::temp_directory_path() / (prefix + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    it = dirs.paths.emplace(prefix, dir).first;
  }
  return it->second;
}

}  // namespace tandem::test
