// Runs the `tandem` binary for the cli tests: a command line in, exit code, stdout and stderr
// out; and a tiny synthetic model shared by the tests of one process.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "../temp_dir.h"

namespace cli_test {

namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string out, err;
};

// The whole file at `path` ("" when there is none).
inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Runs the tandem binary with a shell command line; captures stdout and stderr separately.
inline Result tandem(const std::string& args) {
  static int counter = 0;
  const fs::path& dir = tandem::test::process_temp_dir("tandem_cli_test_");
  std::string out = (dir / ("out" + std::to_string(counter))).string();
  std::string err = (dir / ("err" + std::to_string(counter++))).string();
  std::string cmd = std::string(TANDEM_BIN) + " " + args + " >" + out + " 2>" + err + " </dev/null";
  int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

inline size_t lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n + (!s.empty() && s.back() != '\n');
}

// The tiny model of this test process, generated once and removed when the process exits (ctest
// runs every case in a process of its own: a thousand runs left a thousand files behind).
inline const std::string& tiny_model() {
  static std::string path;
  if (path.empty()) {
    path = (tandem::test::process_temp_dir("tandem_cli_test_") / "tiny.gguf").string();
    Result r = tandem("synth --preset tiny --type f32 --seed 3 -o " + path);
    EXPECT_EQ(r.code, 0) << r.err;
  }
  return path;
}

}  // namespace cli_test
