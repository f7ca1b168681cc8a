// A build without NCCL: the pipeline runs between threads (make_local_transports) only.
#include "tandem/error.h"
#include "tandem/pipeline.h"

namespace tandem {

namespace {

[[noreturn]] void no_nccl() {
  throw_error(ErrorCode::Unsupported, "pipeline",
              "this build has no NCCL (configure with CUDA and NCCL found, TANDEM_NCCL=ON)");
}

}  // namespace

bool nccl_available() {
  return false;
}

std::string nccl_unique_id() {
  no_nccl();
}

std::shared_ptr<PipelineTransport> make_nccl_transport(int, int, const std::string&, int, double) {
  no_nccl();
}

}  // namespace tandem
