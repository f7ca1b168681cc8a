// `tandem run` (generate text) and `tandem logits` (write logits for correctness checks).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli_util.h"
#include "commands_impl.h"
#include "engine_flags.h"
#include "ranks.h"
#include "tandem/error.h"
#include "tandem/model/sampler.h"
#include "tandem/runtime.h"

namespace tandem::cli {

namespace {

// The median, least and most of per-layer values, as "median M (min A, max B)".
std::string spread(const std::vector<double>& v, const char* format) {
  if (v.empty()) return "-";
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  const std::string f =
      std::string("median ") + format + " (min " + format + ", max " + format + ")";
  char buf[128];
  std::snprintf(buf, sizeof buf, f.c_str(), median(v), *lo, *hi);
  return buf;
}

void print_routing(const RoutingStats& r, const LlamaConfig& c, std::ostream& os) {
  if (!c.is_moe()) {
    os << "routing: the model has no experts\n";
    return;
  }
  if (r.layers.empty()) {
    os << "routing: no step ran\n";
    return;
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "routing: %zu layers of %lld experts (%lld a token), %lld steps, %lld choices a "
                "layer\n",
                r.layers.size(), (long long)c.n_expert, (long long)c.n_expert_used,
                (long long)r.steps, (long long)r.choices.front());
  os << line;
  const std::vector<int64_t> used = r.used();
  os << "  experts chosen at least once in a layer: "
     << spread(std::vector<double>(used.begin(), used.end()), "%.0f") << "\n";
  for (size_t n : {size_t(c.n_expert_used), size_t(2 * c.n_expert_used), size_t(c.n_expert / 4)}) {
    if (n == 0 || n >= size_t(c.n_expert)) continue;
    std::vector<double> pct = r.top_share(n);
    for (double& x : pct) x *= 100.0;
    os << "  share of a layer's choices its " << n
       << " most chosen experts took: " << spread(pct, "%.1f%%") << "\n";
  }
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
    bool stats = false, no_bos = false, greedy = false, escape = false, routing = false;
  };
  auto o = std::make_shared<Opts>();
  o->engine.add(*cmd);
  o->engine.add_ranks(*cmd);
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
  cmd->add_flag("--routing-stats", o->routing,
                "A mixture of experts: count which experts each layer's router chooses and "
                "print how concentrated the choices are (copies the choices out of every step)");
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
      SessionOptions eo = o->engine.to_options(o->strategy);
      print_gpu_flags_warning(o->engine);
      eo.calibrate_if_missing = true;
      eo.learn = o->stats;  // timed ops refine the saved cost profile
      eo.learn_every = o->learn_every;
      eo.routing_stats = o->routing;
      // --stats times each op alone; a trace alone times segments and copies on the devices'
      // queues without waiting, so overlap shows.
      eo.timing = o->stats            ? TimingMode::PerOp
                  : !o->trace.empty() ? TimingMode::Timeline
                                      : TimingMode::Off;
      GenerateOptions go;
      go.n_predict = o->n_predict;
      SamplerParams& sp = go.sampling;
      sp.seed = o->seed == -1 ? std::random_device{}() : uint64_t(o->seed);
      sp.temperature = o->greedy ? 0.0f : o->temp;
      sp.top_k = o->top_k;
      sp.top_p = o->top_p;
      sp.min_p = o->min_p;
      sp.repeat_penalty = o->repeat_penalty;
      const Sampler checked(sp);  // its parameters are checked before the model loads
      RankRole ranks(o->engine, eo);
      if (ranks.done()) return ranks.exit_code();
      Session engine(eo);
      const std::vector<int32_t> prompt = engine.tokenize(prompt_text, !o->no_bos);
      TANDEM_CHECK_ARG(!prompt.empty(), "--prompt", "the prompt has no tokens");
      // The prompt is echoed once it has run: an error (e.g. --strict) leaves stdout empty.
      bool echoed = false;
      auto echo_prompt = [&] {
        if (std::exchange(echoed, true)) return;
        std::fputs(prompt_text.c_str(), stdout);
        std::fflush(stdout);
      };
      const GenerateResult result =
          engine.generate(prompt, go, [&](int32_t, std::string_view text) {
            echo_prompt();
            std::fwrite(text.data(), 1, text.size(), stdout);
            std::fflush(stdout);
            return true;
          });
      echo_prompt();
      std::printf("\n");
      std::fflush(stdout);
      const double prompt_s = result.prompt_s, gen_s = result.generate_s;
      const int generated = int(result.tokens.size());
      std::fprintf(stderr, "\nprompt: %zu tokens in %.3f s (%.1f tokens/s)\n", prompt.size(),
                   prompt_s, double(prompt.size()) / prompt_s);
      std::fprintf(stderr, "generation: %d tokens in %.3f s (%.1f tokens/s)\n", generated, gen_s,
                   generated > 0 ? double(generated) / gen_s : 0.0);
      if (o->seed == -1) std::fprintf(stderr, "seed: %llu\n", (unsigned long long)sp.seed);
      std::fprintf(stderr, "placement: %s\n", engine.placement_summary().c_str());
      for (const Recovery& r : engine.recoveries()) {
        std::fprintf(stderr, "warning: step %lld: %s; %s %s\n", (long long)r.step, r.what.c_str(),
                     r.backend.c_str(), r.action.c_str());
      }
      engine.executor().telemetry().print_debug_summary(std::cerr);
      if (o->routing) print_routing(engine.routing(), engine.config(), std::cerr);
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
  o->engine.add_ranks(*cmd);
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
      SessionOptions eo = o->engine.to_options(o->strategy);
      print_gpu_flags_warning(o->engine);
      RankRole ranks(o->engine, eo);
      if (ranks.done()) return ranks.exit_code();
      Session engine(eo);
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
