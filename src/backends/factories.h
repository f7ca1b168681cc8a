// Constructors of the concrete backends; only the registry includes this.
#pragma once

#include <memory>
#include <string>

#include "tandem/backend.h"

namespace tandem {

std::shared_ptr<Backend> make_reference_backend();
#ifdef TANDEM_HAVE_CPU_BACKEND
std::shared_ptr<Backend> make_cpu_backend(int threads);
#endif
#ifdef TANDEM_HAVE_CUDA_BACKEND
int cuda_device_count();  // 0 when there is no driver or no GPU; never throws
// Why cuda_device_count() is 0 (the CUDA runtime's message); never throws.
std::string cuda_absent_reason();
std::shared_ptr<Backend> make_cuda_backend(int device);
#endif

}  // namespace tandem
