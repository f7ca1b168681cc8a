#include "cuda_check.h"

#include "tandem/error.h"

namespace tandem::cuda {

bool is_sticky_error(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorHardwareStackError:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
    case cudaErrorContextIsDestroyed:
    case cudaErrorDevicesUnavailable:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

void check_cuda(DeviceState& state, cudaError_t err, const char* op, const char* call) {
  if (err == cudaSuccess) return;
  const bool sticky = is_sticky_error(err);
  if (sticky) {
    state.lost = true;
  } else {
    (void)cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  }
  ErrorCode code = sticky                             ? ErrorCode::DeviceLost
                   : err == cudaErrorMemoryAllocation ? ErrorCode::OutOfMemory
                                                      : ErrorCode::Internal;
  throw_error(code, state.id + " " + op,
              std::string(call) + " failed: " + cudaGetErrorString(err) + " (" +
                  cudaGetErrorName(err) + (sticky ? "; device marked lost)" : ")"));
}

void check_cublas(DeviceState& state, cublasStatus_t status, const char* op, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  // cuBLAS reports kernel faults as execution failures; the runtime tells whether they stick.
  cudaError_t runtime = cudaPeekAtLastError();
  if (is_sticky_error(runtime)) check_cuda(state, runtime, op, call);
  ErrorCode code = status == CUBLAS_STATUS_ALLOC_FAILED    ? ErrorCode::OutOfMemory
                   : status == CUBLAS_STATUS_NOT_SUPPORTED ? ErrorCode::Unsupported
                                                           : ErrorCode::Internal;
  throw_error(code, state.id + " " + op,
              std::string(call) + " failed: " + cublasGetStatusString(status) + " (" +
                  cublasGetStatusName(status) + ")");
}

}  // namespace tandem::cuda
