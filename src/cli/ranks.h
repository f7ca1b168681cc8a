// --ranks N: run, bench and logits as a pipeline of N processes (tandem/pipeline.h), one per
// GPU, through NCCL. Without TANDEM_RANK in the environment the process is the launcher: it
// starts N copies of the same command, rank r on GPU r (CUDA_VISIBLE_DEVICES), and waits for
// them; a rank that fails stops the others. With TANDEM_RANK (set by the launcher, or by hand
// for several hosts: docs/multi-gpu.md) the process is that rank.
#pragma once

#include <memory>
#include <optional>

#include "engine_flags.h"
#include "tandem/pipeline.h"
#include "tandem/runtime.h"

namespace tandem::cli {

// The command line as main() received it, for the launcher to start the ranks with.
void set_command_line(int argc, char** argv);

class RankRole {
 public:
  // Nothing without --ranks or TANDEM_RANK. The launcher starts the ranks and waits; a rank
  // above 0 serves rank 0's sessions; both are then done(). Rank 0 sets options.pipeline and
  // the command goes on. Throws InvalidArgument for a bad rank count before starting anything.
  RankRole(const EngineFlags& flags, SessionOptions& options);
  // Rank 0: the other ranks stop (their serve loop returns).
  ~RankRole();
  RankRole(const RankRole&) = delete;
  RankRole& operator=(const RankRole&) = delete;

  // This process's part is over: return exit_code() from the command.
  bool done() const { return exit_code_.has_value(); }
  int exit_code() const { return exit_code_.value_or(0); }
  // Rank 0's transport (nullptr without a pipeline), for SessionOptions::pipeline.
  const std::shared_ptr<PipelineTransport>& transport() const { return transport_; }

 private:
  std::optional<int> exit_code_;
  std::shared_ptr<PipelineTransport> transport_;
  std::string id_file_;  // rank 0 removes it at the end
};

}  // namespace tandem::cli
