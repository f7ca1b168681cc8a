// A tiny synthetic LLaMA GGUF, written once per test process into a temporary directory.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "../temp_dir.h"
#include "tandem/model/synthetic.h"

namespace tandem::test {

inline const std::string& tiny_model_path() {
  static const std::string path = [] {
    const std::string p = (process_temp_dir("tandem_runtime_test_") / "tiny_f32.gguf").string();
    SyntheticSpec spec = synthetic_preset("tiny", DType::F32, 11);
    spec.threads = 1;
    write_synthetic_model(spec, p);
    return p;
  }();
  return path;
}

}  // namespace tandem::test
