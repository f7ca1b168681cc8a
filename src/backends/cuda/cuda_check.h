// Checked CUDA and cuBLAS calls. Every failure becomes a tandem::Error "[cuda:N op] ...";
// errors that poison the context mark the device lost.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <string>

namespace tandem::cuda {

// Identity and health of one device, shared by everything that checks calls on it.
struct DeviceState {
  std::string id;  // "cuda:0"
  int device = 0;
  std::atomic<bool> lost{false};
};

// True for errors after which the context is unusable (a kernel fault, an ECC error, ...).
bool is_sticky_error(cudaError_t err);

// Throws on failure: OutOfMemory for allocation failures, DeviceLost for sticky errors
// (and marks the device lost), Internal otherwise. `op` names the operation ("matmul").
void check_cuda(DeviceState& state, cudaError_t err, const char* op, const char* call);
void check_cublas(DeviceState& state, cublasStatus_t status, const char* op, const char* call);

}  // namespace tandem::cuda

#define TANDEM_CUDA_CHECK(state, op, expr) ::tandem::cuda::check_cuda(state, (expr), op, #expr)
#define TANDEM_CUBLAS_CHECK(state, op, expr) ::tandem::cuda::check_cublas(state, (expr), op, #expr)
