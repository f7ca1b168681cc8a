// Backends are found here, so nothing above src/backends names a concrete backend.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/backend.h"

namespace tandem {

struct BackendOptions {
  int cpu_threads = 0;  // 0: the number of physical cores
};

// "reference", "cpu" (when built) and "cuda:N" for every GPU found. A CPU-only build or a
// machine without a GPU simply lists no CUDA backend.
std::vector<std::string> available_backend_ids();
// Creates one backend by id; throws InvalidArgument naming the unknown id and the known ones.
std::shared_ptr<Backend> create_backend(std::string_view id, const BackendOptions& options = {});
// A backend kind this build knows of that no available backend id stands for, and why: not
// built ("cuda" in a CPU-only build), or built with no device found (the driver's reason).
struct AbsentBackend {
  std::string name;  // "cpu", "cuda"
  std::string reason;
};
std::vector<AbsentBackend> absent_backends();
// Every available backend except the reference, in the order cpu, cuda:0, cuda:1, ...
std::vector<std::shared_ptr<Backend>> available_backends(const BackendOptions& options = {});

}  // namespace tandem
