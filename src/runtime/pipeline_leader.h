// Rank 0's side of the pipeline protocol (tandem/pipeline.h) for one session: opening it on
// every rank, each step's messages, and its end.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/layer_split.h"
#include "tandem/model/gguf.h"
#include "tandem/model/llama_config.h"
#include "tandem/pipeline.h"

namespace tandem {

struct SessionOptions;

class PipelineLeader {
 public:
  // Opens a session on every rank with options' strategy, context and KV type: checks that
  // every rank maps the same model, splits the layers once (options.tensor_split per rank, else
  // evenly) and tells each rank its range. Throws Error naming the rank at fault.
  PipelineLeader(std::shared_ptr<PipelineTransport> transport, const gguf::File& file,
                 const LlamaConfig& config, const SessionOptions& options);
  // Ends the session on every rank (they wait for the next one).
  ~PipelineLeader();
  PipelineLeader(const PipelineLeader&) = delete;
  PipelineLeader& operator=(const PipelineLeader&) = delete;

  LayerRange range() const { return ranges_[0]; }
  const std::vector<LayerRange>& ranges() const { return ranges_; }
  // Every rank built its part: the steps may start. Throws the first rank's error otherwise.
  void start();
  // Rank 0 could not build its part: the other ranks stop with `why`.
  void fail(const std::string& why) noexcept;

  // Throws when an error stopped the pipeline (before rank 0 computes a step for nothing).
  void check_running() const;
  // A step (its tokens, their first position) with rank 0's hidden state to rank 1 (every rank
  // learns the step from its neighbour), the last rank's logits back into `logits`.
  void step(std::span<const int32_t> tokens, int64_t start, bool all_logits,
            std::span<const float> hidden, std::span<float> logits);
  // A step failed here: the other ranks stop rather than wait.
  void abort(const std::string& why) noexcept;

 private:
  // Collects every rank's report that it built its part and sends the verdict to all.
  void settle(const std::string& failure);

  std::shared_ptr<PipelineTransport> transport_;
  std::vector<LayerRange> ranges_;
  int64_t n_embd_ = 0;
  std::vector<uint8_t> message_;  // a step's first message, reused
  bool started_ = false;
  bool stopped_ = false;
};

// A hash of the model's tensors (names, types, shapes, sizes and their first bytes): ranks
// that map different files refuse to run together.
uint64_t model_fingerprint(const gguf::File& file);

}  // namespace tandem
