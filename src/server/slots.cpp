#include "slots.h"

#include <algorithm>
#include <chrono>
#include <exception>

#include "tandem/error.h"

namespace tandem::server {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Completion::Completion(int n_choices)
    : choices_(size_t(std::max(1, n_choices))), unfinished_(int(choices_.size())) {
  for (size_t i = 0; i < choices_.size(); ++i) choices_[i].pending.index = int(i);
}

bool Completion::next(ChoiceDelta& delta) {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return !news_.empty() || unfinished_ == 0; });
  if (news_.empty()) return false;
  Choice& choice = choices_[size_t(news_.front())];
  news_.pop_front();
  choice.queued = false;
  delta = std::move(choice.pending);
  choice.pending = ChoiceDelta{.index = delta.index};
  return true;
}

std::vector<ChoiceDelta> Completion::wait_all() {
  std::vector<ChoiceDelta> all(choices_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i].index = int(i);
  ChoiceDelta delta;
  while (next(delta)) {
    ChoiceDelta& whole = all[size_t(delta.index)];
    whole.text += delta.text;
    for (auto& l : delta.logprobs) whole.logprobs.push_back(std::move(l));
    if (delta.finished) {
      whole.finished = true;
      whole.finish_reason = std::move(delta.finish_reason);
      whole.error = std::move(delta.error);
      whole.completion_tokens = delta.completion_tokens;
    }
  }
  return all;
}

void Completion::push(int index, std::string_view text, std::vector<GeneratedLogprob> logprobs) {
  if (text.empty() && logprobs.empty()) return;
  {
    std::lock_guard lock(mutex_);
    Choice& choice = choices_[size_t(index)];
    choice.pending.text += text;
    for (auto& l : logprobs) choice.pending.logprobs.push_back(std::move(l));
    if (!choice.queued) news_.push_back(index);
    choice.queued = true;
  }
  cv_.notify_all();
}

bool Completion::finish(int index, std::string reason, int64_t completion_tokens,
                        std::string error_message) {
  bool last = false;
  {
    std::lock_guard lock(mutex_);
    Choice& choice = choices_[size_t(index)];
    if (choice.done) return false;
    choice.done = true;
    choice.pending.finished = true;
    choice.pending.finish_reason = std::move(reason);
    choice.pending.error = std::move(error_message);
    choice.pending.completion_tokens = completion_tokens;
    if (choice.pending.finish_reason == "error") failed_ = true;
    if (!choice.queued) news_.push_back(index);
    choice.queued = true;
    last = --unfinished_ == 0;
  }
  cv_.notify_all();
  return last;
}

bool Completion::failed() const {
  std::lock_guard lock(mutex_);
  return failed_;
}

std::string StopMatcher::push(std::string_view text) {
  if (matched_) return {};
  held_ += text;
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest end of the text that begins some stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  return std::exchange(held_, {});
}

SlotEngine::SlotEngine(const SessionOptions& options, int n_slots) {
  TANDEM_CHECK_ARG(n_slots >= 1, "--parallel",
                   "must be >= 1 (got " + std::to_string(n_slots) + ")");
  SessionOptions session_options = options;
  session_options.n_sequences = n_slots;
  session_ = std::make_unique<Session>(session_options);
  slots_.resize(size_t(n_slots));
  for (int i = 0; i < n_slots; ++i) slots_[size_t(i)].sequence = i;
  stats_.slots = n_slots;
  thread_ = std::thread([this] { loop(); });
}

SlotEngine::~SlotEngine() {
  stop();
}

std::shared_ptr<Completion> SlotEngine::submit(Job job) {
  auto completion = std::make_shared<Completion>(job.n_choices);
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return nullptr;
    for (int i = 0; i < completion->n_choices(); ++i) {
      Job choice = job;
      choice.sampling.seed += uint64_t(i);  // its own continuation, reproducible for a seed
      queue_.push_back(Queued{completion, i, std::move(choice)});
    }
    stats_.queued = queue_.size();
  }
  cv_.notify_all();
  return completion;
}

void SlotEngine::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

EngineStats SlotEngine::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void SlotEngine::loop() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      auto busy = [&] {
        return std::any_of(slots_.begin(), slots_.end(),
                           [](const Slot& s) { return s.completion != nullptr; });
      };
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || busy(); });
      for (Slot& s : slots_) {
        if (queue_.empty()) break;
        if (s.completion) continue;
        Queued queued = std::move(queue_.front());
        queue_.pop_front();
        const std::shared_ptr<Completion> completion = queued.completion;
        const int choice = queued.choice;
        try {
          start(s, std::move(queued));
        } catch (const std::exception& e) {  // e.g. a sampler parameter out of range
          s.completion.reset();
          if (completion->finish(choice, "error", 0, e.what())) ++stats_.requests_failed;
        }
      }
      stats_.queued = queue_.size();
      stats_.slots_busy = int(std::count_if(slots_.begin(), slots_.end(),
                                            [](const Slot& s) { return s.completion != nullptr; }));
      // Stopping drains: every queued and running job finishes first.
      if (stopping_ && queue_.empty() && !busy()) return;
    }
    step();
  }
}

void SlotEngine::start(Slot& slot, Queued queued) {
  slot.completion = std::move(queued.completion);
  slot.choice = queued.choice;
  slot.job = std::move(queued.job);
  slot.sampler = std::make_unique<Sampler>(slot.job.sampling);  // checked by the server
  slot.stream = std::make_unique<TokenStream>(session_->tokenizer());
  slot.stop = StopMatcher(slot.job.stop);
  slot.last = -1;
  slot.prefilled = false;
  slot.generated = slot.text_bytes = slot.sent_bytes = 0;
  slot.held.clear();
}

void SlotEngine::step() {
  for (Slot& s : slots_) {
    if (s.completion && s.completion->cancelled()) finish(s, "cancelled");
  }
  // New prompts first, one graph each; then one decode step for every other busy slot.
  std::vector<Slot*> decoding;
  for (Slot& s : slots_) {
    if (!s.completion) continue;
    if (s.prefilled) {
      decoding.push_back(&s);
    } else {
      prefill(s);
    }
  }
  if (decoding.empty()) return;
  std::vector<int> sequences;
  std::vector<int32_t> tokens;
  for (const Slot* s : decoding) {
    sequences.push_back(s->sequence);
    tokens.push_back(s->last);
  }
  try {
    const auto t0 = std::chrono::steady_clock::now();
    // One row needs no gathering: the plain decode graph of its sequence.
    const std::span<const float> logits = decoding.size() == 1
                                              ? session_->eval_sequence(sequences[0], tokens)
                                              : session_->decode_batch(sequences, tokens);
    const std::vector<float> rows(logits.begin(), logits.end());
    {
      std::lock_guard lock(mutex_);
      stats_.generate_s += seconds_since(t0);
      ++stats_.decode_steps;
      stats_.decode_rows += decoding.size();
    }
    fold_telemetry();
    const size_t n_vocab = rows.size() / decoding.size();
    for (size_t r = 0; r < decoding.size(); ++r) {
      sample(*decoding[r], std::span<const float>(rows.data() + r * n_vocab, n_vocab));
    }
  } catch (const std::exception& e) {
    for (Slot* s : decoding) finish(*s, "error", e.what());
  }
}

void SlotEngine::prefill(Slot& slot) {
  try {
    const auto t0 = std::chrono::steady_clock::now();
    session_->reset(slot.sequence);
    const std::span<const float> logits = session_->eval_sequence(slot.sequence, slot.job.prompt);
    {
      std::lock_guard lock(mutex_);
      stats_.prompt_tokens += slot.job.prompt.size();
      stats_.prompt_s += seconds_since(t0);
    }
    fold_telemetry();
    for (int32_t t : slot.job.prompt) slot.sampler->accept(t);
    slot.prefilled = true;
    sample(slot, logits);
  } catch (const std::exception& e) {
    finish(slot, "error", e.what());
  }
}

void SlotEngine::sample(Slot& slot, std::span<const float> logits) {
  if (slot.generated >= slot.job.max_tokens) {
    finish(slot, "length");
    return;
  }
  const int32_t token = slot.sampler->sample(logits);
  slot.sampler->accept(token);
  const Tokenizer& tokenizer = session_->tokenizer();
  if (tokenizer.is_end_of_generation(token)) {
    finish(slot, "stop");
    return;
  }
  ++slot.generated;
  {
    std::lock_guard lock(mutex_);
    ++stats_.generated_tokens;
  }
  if (slot.job.top_logprobs >= 0) {
    GeneratedLogprob l = token_logprobs(logits, token, slot.job.top_logprobs);
    l.text_offset = slot.text_bytes;
    slot.held.push_back(std::move(l));
    slot.text_bytes += int64_t(tokenizer.token_to_piece(token).size());  // as TokenStream reads it
  }
  hand_over(slot, slot.stop.push(slot.stream->push(token)));
  if (slot.stop.matched()) {
    finish(slot, "stop");
  } else if (slot.generated >= slot.job.max_tokens ||
             session_->n_past(slot.sequence) >= session_->n_ctx()) {
    finish(slot, "length");
  } else {
    slot.last = token;
  }
}

void SlotEngine::hand_over(Slot& slot, std::string text, bool last) {
  slot.sent_bytes += int64_t(text.size());
  // A token goes with the text that begins it; after a stop string, the tokens that begin
  // within it are left out with it.
  std::vector<GeneratedLogprob> logprobs;
  while (!slot.held.empty() &&
         (slot.held.front().text_offset < slot.sent_bytes || (last && !slot.stop.matched()))) {
    logprobs.push_back(std::move(slot.held.front()));
    slot.held.pop_front();
  }
  slot.completion->push(slot.choice, text, std::move(logprobs));
}

void SlotEngine::finish(Slot& slot, const std::string& reason, const std::string& error) {
  if (!slot.completion) return;  // finished already (an error after its last token)
  Completion& c = *slot.completion;
  if (reason != "error") {
    std::string rest;
    if (!slot.stop.matched()) {
      rest = slot.stop.push(slot.stream->flush());
      if (!slot.stop.matched()) rest += slot.stop.flush();
    }
    hand_over(slot, std::move(rest), /*last=*/true);
  }
  const bool request_done = c.finish(slot.choice, reason, slot.generated, error);
  {
    std::lock_guard lock(mutex_);
    --stats_.slots_busy;
    // A request counts once, when its last choice ends.
    if (request_done) {
      if (c.failed()) {
        ++stats_.requests_failed;
      } else if (c.cancelled()) {
        ++stats_.requests_cancelled;
      } else {
        ++stats_.requests_finished;
      }
    }
  }
  slot.completion.reset();
  slot.sampler.reset();
  slot.stream.reset();
  slot.held.clear();
}

void SlotEngine::fold_telemetry() {
  // The events of this step become counters, so the telemetry of a long-running server stays
  // bounded.
  Telemetry& telemetry = session_->executor().telemetry();
  const std::vector<ExecutionEvent> events = telemetry.get_telemetry();
  telemetry.clear_telemetry();
  std::lock_guard lock(mutex_);
  for (const ExecutionEvent& e : events) {
    if (e.kind == EventKind::Graph) continue;  // wall time of a whole step, no backend
    BackendCounters& b = stats_.backends[e.backend];
    switch (e.kind) {
      case EventKind::Op:
        ++b.ops;
        b.time_s += std::max(0.0, e.actual_us) * 1e-6;
        b.estimated_s += e.estimated_us * 1e-6;
        break;
      case EventKind::Segment:
        b.ops += uint64_t(std::max(0, e.segment_ops));
        b.time_s += std::max(0.0, e.actual_us) * 1e-6;
        break;
      case EventKind::Transfer:
        ++b.transfers_in;
        b.transfer_bytes += e.transfer_bytes;
        break;
      case EventKind::Graph:
        break;
    }
  }
}

}  // namespace tandem::server
