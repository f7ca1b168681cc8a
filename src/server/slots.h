// The server's slots: one sequence each of one Session (its own KV cache) and a sampler per
// choice of a request. One engine thread runs the new prompts one by one, then the next token of
// every other busy slot in one batched decode graph; choices wait in a queue while every slot is
// busy. Requests never block the engine: text and logprobs are handed over through a Completion
// that the HTTP thread waits on.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "logprobs.h"
#include "tandem/model/sampler.h"
#include "tandem/runtime.h"

namespace tandem::server {

// What one request asks of the slots.
struct Job {
  std::vector<int32_t> prompt;    // token ids, checked against the vocabulary and the context
  int64_t max_tokens = 16;        // prompt + max_tokens fits in the slot's context
  SamplerParams sampling;         // choice i samples with seed + i
  std::vector<std::string> stop;  // generation ends before the first of these
  int n_choices = 1;              // continuations, each generated in its own slot
  int top_logprobs = -1;          // -1: no logprobs; else the chosen token's and this many best
};

// What one choice produced since it was last read: text, its tokens' logprobs, and its end.
struct ChoiceDelta {
  int index = 0;
  std::string text;
  std::vector<GeneratedLogprob> logprobs;
  bool finished = false;
  std::string finish_reason;  // once finished: "stop", "length", "cancelled" or "error"
  std::string error;
  int64_t completion_tokens = 0;  // once finished
};

// One request's progress, shared by the engine (writer) and the HTTP thread (reader).
class Completion {
 public:
  explicit Completion(int n_choices = 1);
  int n_choices() const { return int(choices_.size()); }
  // Waits for news of some choice and moves it into `delta` (choices in the order their news
  // came); false once every choice has finished and been read.
  bool next(ChoiceDelta& delta);
  // Waits for every choice to finish; each one's whole text and logprobs, by index.
  std::vector<ChoiceDelta> wait_all();
  // The client went away: the engine frees the slots at its next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // Engine side. finish() returns true when it ended the last choice.
  void push(int index, std::string_view text, std::vector<GeneratedLogprob> logprobs = {});
  bool finish(int index, std::string reason, int64_t completion_tokens,
              std::string error_message = {});
  // Whether some choice ended in an error (valid once every choice finished).
  bool failed() const;

 private:
  struct Choice {
    ChoiceDelta pending;
    bool queued = false;  // its index is in news_
    bool done = false;    // finished on the engine side
    bool read = false;    // its end was handed to the reader
  };
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Choice> choices_;
  std::deque<int> news_;  // choices with unread news, oldest first
  int unfinished_ = 0;
  bool failed_ = false;
  std::atomic<bool> cancelled_{false};
};

// Text generated so far, held back while its end could begin a stop string.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops = {}) : stops_(std::move(stops)) {}
  // The text that can be sent now; after a stop string is seen, only what precedes it.
  std::string push(std::string_view text);
  // Whatever is held back (no stop string came).
  std::string flush();
  bool matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
};

// Counters of one backend over every step the slots ran.
struct BackendCounters {
  uint64_t ops = 0;
  double time_s = 0.0;  // measured (segments timed on the device's queues)
  double estimated_s = 0.0;
  uint64_t transfers_in = 0;
  uint64_t transfer_bytes = 0;
};

struct EngineStats {
  std::map<std::string, BackendCounters> backends;
  uint64_t prompt_tokens = 0;
  uint64_t generated_tokens = 0;
  double prompt_s = 0.0;
  double generate_s = 0.0;
  uint64_t decode_steps = 0;  // graphs run for decoding
  uint64_t decode_rows = 0;   // tokens they decoded (rows / steps: the mean batch)
  uint64_t requests_finished = 0;
  uint64_t requests_cancelled = 0;
  uint64_t requests_failed = 0;
  int slots = 0;
  int slots_busy = 0;
  size_t queued = 0;
};

class SlotEngine {
 public:
  // A session over options.model_path with n_slots sequences of options.n_ctx positions;
  // starts the engine thread. Throws as Session does.
  SlotEngine(const SessionOptions& options, int n_slots);
  ~SlotEngine();
  SlotEngine(const SlotEngine&) = delete;
  SlotEngine& operator=(const SlotEngine&) = delete;

  const Session& model() const { return *session_; }
  int64_t n_ctx() const { return model().n_ctx(); }
  int n_slots() const { return int(slots_.size()); }

  // Queues a job's choices; nullptr once stop() was called.
  std::shared_ptr<Completion> submit(Job job);
  // Finishes the queued and running jobs, then ends the engine thread. Idempotent.
  void stop();
  EngineStats stats() const;

 private:
  struct Slot {
    int sequence = 0;  // of session_
    std::shared_ptr<Completion> completion;
    int choice = 0;  // of the completion
    Job job;
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<TokenStream> stream;
    StopMatcher stop;
    int32_t last = -1;  // the token to decode next
    bool prefilled = false;
    int64_t generated = 0;   // tokens generated
    int64_t text_bytes = 0;  // of the generated text so far, stop strings included (with logprobs)
    int64_t sent_bytes = 0;  // of the text handed over
    std::deque<GeneratedLogprob> held;  // logprobs of tokens whose text is held back
  };

  void loop();
  struct Queued {
    std::shared_ptr<Completion> completion;
    int choice = 0;
    Job job;
  };
  void start(Slot& slot, Queued queued);
  void step();
  void prefill(Slot& slot);
  // Samples from `logits`, hands the text over, and finishes the job when it is done.
  void sample(Slot& slot, std::span<const float> logits);
  // Hands `text` over with the logprobs of the tokens it begins (all of them when `last`).
  void hand_over(Slot& slot, std::string text, bool last = false);
  void finish(Slot& slot, const std::string& reason, const std::string& error = {});
  void fold_telemetry();

  std::unique_ptr<Session> session_;
  std::vector<Slot> slots_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;  // one entry per choice
  bool stopping_ = false;
  EngineStats stats_;  // under mutex_
  std::thread thread_;
};

}  // namespace tandem::server
