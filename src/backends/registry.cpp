#include "tandem/registry.h"

#include <string>

#include "factories.h"
#include "tandem/error.h"

namespace tandem {

std::vector<std::string> available_backend_ids() {
  std::vector<std::string> ids{"reference"};
#ifdef TANDEM_HAVE_CPU_BACKEND
  ids.push_back("cpu");
#endif
#ifdef TANDEM_HAVE_CUDA_BACKEND
  int n = cuda_device_count();
  for (int i = 0; i < n; ++i) ids.push_back("cuda:" + std::to_string(i));
#endif
  return ids;
}

std::vector<AbsentBackend> absent_backends() {
  std::vector<AbsentBackend> out;
#ifndef TANDEM_HAVE_CPU_BACKEND
  out.push_back({"cpu", "not built: this build has only the reference backend"});
#endif
#ifdef TANDEM_HAVE_CUDA_BACKEND
  if (cuda_device_count() == 0) {
    out.push_back({"cuda", "built, but no GPU found: " + cuda_absent_reason()});
  }
#else
  out.push_back({"cuda",
                 "not built in this CPU-only build; configure with -DTANDEM_CUDA=ON where the "
                 "CUDA toolkit is installed"});
#endif
  return out;
}

std::shared_ptr<Backend> create_backend(std::string_view id, const BackendOptions& options) {
  (void)options;
  if (id == "reference") return make_reference_backend();
#ifdef TANDEM_HAVE_CPU_BACKEND
  if (id == "cpu") return make_cpu_backend(options.cpu_threads);
#endif
#ifdef TANDEM_HAVE_CUDA_BACKEND
  if (id.starts_with("cuda:")) {
    std::string index(id.substr(5));
    int n = cuda_device_count();
    if (!index.empty() && index.find_first_not_of("0123456789") == std::string::npos &&
        index.size() < 4 && std::stoi(index) < n) {
      return make_cuda_backend(std::stoi(index));
    }
  }
#endif
  std::string known;
  for (const auto& k : available_backend_ids()) known += (known.empty() ? "" : ", ") + k;
  throw_error(ErrorCode::InvalidArgument, "registry",
              "unknown backend '" + std::string(id) + "' (available: " + known + ")");
}

std::vector<std::shared_ptr<Backend>> available_backends(const BackendOptions& options) {
  std::vector<std::shared_ptr<Backend>> out;
  for (const auto& id : available_backend_ids()) {
    if (id != "reference") out.push_back(create_backend(id, options));
  }
  return out;
}

}  // namespace tandem
