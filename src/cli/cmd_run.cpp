// `tandem run` (generate text) and `tandem logits` (write logits for correctness checks).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>

#include "cli_util.h"
#include "commands_impl.h"
#include "engine.h"
#include "engine_flags.h"
#include "tandem/error.h"
#include "tandem/model/sampler.h"

namespace tandem::cli {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void add_run(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("run", "Generate text from a prompt");
  struct Opts {
    EngineFlags engine;
    std::string prompt, prompt_file, strategy = "gpu", trace;
    int n_predict = 64, learn_every = 0;
    int64_t seed = 0;
    float temp = 0.8f, top_p = 0.95f, min_p = 0.05f, repeat_penalty = 1.0f;
    int top_k = 40;
    bool stats = false, no_bos = false, greedy = false, escape = false;
  };
  auto o = std::make_shared<Opts>();
  o->engine.add(*cmd);
  auto* prompt_option = cmd->add_option("-p,--prompt", o->prompt, "Prompt text");
  cmd->add_option("-f,--file", o->prompt_file, "Read the prompt from FILE (as llama.cpp's -f)")
      ->excludes(prompt_option);
  cmd->add_flag("-e,--escape", o->escape,
                "Process escapes in the prompt like llama.cpp: \\n \\r \\t \\' \\\" \\\\ \\xHH");
  cmd->add_option("-n,--n-predict", o->n_predict,
                  "Tokens to generate (-1: until the end of sequence or the context is full)")
      ->capture_default_str();
  cmd->add_option("--strategy", o->strategy, "gpu, cpu, auto or only:BACKEND")
      ->capture_default_str();
  cmd->add_option("-s,--seed", o->seed, "Sampling seed (-1: a random seed, printed)")
      ->capture_default_str();
  cmd->add_option("--temp", o->temp, "Temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "Top-k (0: off)")->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "Top-p (1: off)")->capture_default_str();
  cmd->add_option("--min-p", o->min_p, "Min-p (0: off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", o->repeat_penalty, "Repetition penalty (1: off)")
      ->capture_default_str();
  cmd->add_flag("--greedy", o->greedy, "Greedy sampling (same as --temp 0)");
  cmd->add_flag("--no-bos", o->no_bos, "Do not add the BOS token");
  cmd->add_option(
      "--trace", o->trace,
      "Write a Chrome trace (Perfetto) to FILE: each segment and streamed copy timed on its "
      "device's queues, so overlap shows (with --stats: every op timed alone)");
  cmd->add_option("--learn-every", o->learn_every,
                  "Time every op of one step in N (without --stats) and refine the cost profile "
                  "from it (0: off)")
      ->capture_default_str();
  cmd->add_flag("--stats", o->stats,
                "Time every op (synchronizes; slower): estimated against actual per op type, "
                "learned into the cost profile");
  cmd->callback([&run, o, prompt_option]() {
    run = [o, prompt_option]() {
      TANDEM_CHECK_ARG(o->n_predict >= -1, "--n-predict",
                       "must be >= 0, or -1 to generate until the end of sequence or context "
                       "(got " +
                           std::to_string(o->n_predict) + ")");
      TANDEM_CHECK_ARG(o->seed >= -1, "--seed", "must be >= 0, or -1 for a random seed");
      TANDEM_CHECK_ARG(prompt_option->count() > 0 || !o->prompt_file.empty(), "--prompt",
                       "give a prompt with -p TEXT or -f FILE");
      std::string prompt_raw = o->prompt;
      if (!o->prompt_file.empty()) {
        // As llama.cpp: the file's text without its final newline.
        prompt_raw = read_text_file(o->prompt_file, "--file");
        if (!prompt_raw.empty() && prompt_raw.back() == '\n') prompt_raw.pop_back();
      }
      const std::string prompt_text = o->escape ? process_escapes(prompt_raw) : prompt_raw;
      EngineOptions eo = o->engine.to_options(o->strategy);
      print_gpu_flags_warning(o->engine);
      eo.calibrate_if_missing = true;
      eo.learn = o->stats;  // timed ops refine the saved cost profile
      eo.learn_every = o->learn_every;
      // --stats times each op alone; a trace alone times segments and copies on the devices'
      // queues without waiting, so overlap shows.
      eo.timing = o->stats            ? TimingMode::PerOp
                  : !o->trace.empty() ? TimingMode::Timeline
                                      : TimingMode::Off;
      SamplerParams sp;
      sp.seed = o->seed == -1 ? std::random_device{}() : uint64_t(o->seed);
      sp.temperature = o->greedy ? 0.0f : o->temp;
      sp.top_k = o->top_k;
      sp.top_p = o->top_p;
      sp.min_p = o->min_p;
      sp.repeat_penalty = o->repeat_penalty;
      Sampler sampler(sp);
      Engine engine(eo);
      EncodeOptions enc;
      enc.add_bos = !o->no_bos;
      std::vector<int32_t> prompt = engine.tokenizer().encode(prompt_text, enc);
      TANDEM_CHECK_ARG(!prompt.empty(), "--prompt", "the prompt has no tokens");
      TokenStream stream(engine.tokenizer());

      auto t0 = std::chrono::steady_clock::now();
      std::span<const float> logits = engine.eval(prompt);
      const double prompt_s = seconds_since(t0);
      // Echoed once the prompt has run: an error (e.g. --strict) leaves stdout empty.
      std::fputs(prompt_text.c_str(), stdout);
      std::fflush(stdout);
      for (int32_t t : prompt) sampler.accept(t);
      int generated = 0;
      auto t1 = std::chrono::steady_clock::now();
      const bool until_end = o->n_predict == -1;
      for (; until_end || generated < o->n_predict; ++generated) {
        int32_t next = sampler.sample(logits);
        sampler.accept(next);
        if (engine.tokenizer().is_end_of_generation(next)) break;
        std::fputs(stream.push(next).c_str(), stdout);
        std::fflush(stdout);
        if (generated + 1 == o->n_predict || engine.n_past() >= engine.n_ctx()) {
          ++generated;
          break;
        }
        logits = engine.eval(std::span<const int32_t>(&next, 1));
      }
      const double gen_s = seconds_since(t1);
      std::fputs(stream.flush().c_str(), stdout);
      std::printf("\n");
      std::fflush(stdout);
      std::fprintf(stderr, "\nprompt: %zu tokens in %.3f s (%.1f tokens/s)\n", prompt.size(),
                   prompt_s, double(prompt.size()) / prompt_s);
      std::fprintf(stderr, "generation: %d tokens in %.3f s (%.1f tokens/s)\n", generated, gen_s,
                   generated > 0 ? double(generated) / gen_s : 0.0);
      if (o->seed == -1) std::fprintf(stderr, "seed: %llu\n", (unsigned long long)sp.seed);
      std::fprintf(stderr, "placement: %s\n", engine.placement_summary().c_str());
      engine.executor().telemetry().print_debug_summary(std::cerr);
      if (o->stats || o->learn_every > 0) {
        print_estimate_report(estimate_report(engine.executor().telemetry().get_telemetry()),
                              std::cerr);
        engine.save_learned();
      }
      if (!o->trace.empty()) {
        write_file(o->trace, engine.executor().telemetry().to_chrome_trace_json(), "--trace");
        std::fprintf(stderr, "trace written to %s\n", o->trace.c_str());
      }
      return 0;
    };
  });
}

void add_logits(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("logits", "Write the float32 logits of a token sequence");
  struct Opts {
    EngineFlags engine;
    std::string tokens, out, strategy = "gpu";
    bool all = false;
  };
  auto o = std::make_shared<Opts>();
  o->engine.add(*cmd);
  cmd->add_option("--tokens", o->tokens, "Token ids, e.g. 1,2,3")->required();
  cmd->add_option("--out", o->out, "Output file (raw little-endian float32)")->required();
  cmd->add_option("--strategy", o->strategy, "gpu, cpu, auto or only:BACKEND")
      ->capture_default_str();
  cmd->add_flag("--all", o->all,
                "Logits of every position (n_tokens x n_vocab), not only the last");
  cmd->callback([&run, o]() {
    run = [o]() {
      std::vector<int32_t> ids = parse_ids(o->tokens, "--tokens");
      TANDEM_CHECK_ARG(!ids.empty(), "--tokens", "no token ids given");
      const EngineOptions eo = o->engine.to_options(o->strategy);
      print_gpu_flags_warning(o->engine);
      Engine engine(eo);
      std::span<const float> logits = engine.eval(ids, o->all);
      std::ofstream f(o->out, std::ios::binary);
      f.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size_bytes()));
      if (!f) throw_error(ErrorCode::Io, "--out", "cannot write '" + o->out + "'");
      std::printf("wrote %zu logits (%s) to %s\n", logits.size(),
                  o->all ? "every position" : "last position", o->out.c_str());
      return 0;
    };
  });
}

}  // namespace tandem::cli
