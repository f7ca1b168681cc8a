#include "llama_flags.h"

#include <algorithm>
#include <cctype>
#include <string_view>

namespace tandem::cli {

namespace {

struct Spelling {
  std::string_view llama, tandem;
};
// One-dash spellings of flags Tandem has; the parser knows only the two-dash ones.
constexpr Spelling kSpellings[] = {{"-ngl", "--ngl"},
                                   {"-fa", "--flash-attn"},
                                   {"-ot", "--override-tensor"},
                                   {"-ts", "--tensor-split"},
                                   {"-sm", "--split-mode"}};

struct Refusal {
  std::vector<std::string_view> spellings;
  std::string_view why;
};
// llama.cpp's and llama-bench's flags that Tandem does not have, and what to do instead.
const std::vector<Refusal>& refusals() {
  static const std::vector<Refusal> table{
      {{"-ctk", "--cache-type-k", "-ctv", "--cache-type-v"},
       "separate K and V cache types are not supported; --kv-type (f16 or f32) sets both"},
      {{"-nkvo", "--no-kv-offload"},
       "not supported: KV caches are placed with the weights of their layer (see -ngl, --gpu-mem)"},
      {{"-mg", "--main-gpu"},
       "not supported: --split-mode none runs on the first GPU, --strategy only:cuda:N on GPU N"},
      {{"-dev", "--device"},
       "not supported: choose backends with --strategy (cpu, gpu, auto, only:BACKEND) or -ot"},
      {{"-tb", "--threads-batch"}, "not supported: -t sets the CPU threads of every batch"},
      {{"-b", "--batch-size", "-ub", "--ubatch-size"},
       "not supported: a prompt is evaluated as one batch"},
      {{"-cnv", "--conversation", "-no-cnv", "--no-conversation", "-i", "--interactive", "-if",
        "--interactive-first"},
       "not supported: tandem run generates once from one prompt (-p)"},
      {{"--mlock", "--no-mmap", "-mmp", "--mmap"},
       "not supported: Tandem always memory-maps the model file"},
      {{"--numa", "-C", "--cpu-mask", "-Cr", "--cpu-range", "--cpu-strict", "--poll", "--prio"},
       "not supported: CPU affinity and priority are left to the system (taskset, nice)"},
      {{"-pg"}, "not supported: run the prompt and generation tests separately with -p and -n"},
      {{"-ncmoe", "--n-cpu-moe", "-cmoe", "--cpu-moe"},
       "not supported: Tandem does not run mixture-of-experts models yet"},
      {{"-rpc", "--rpc"}, "not supported: Tandem runs on the devices of one machine"},
  };
  return table;
}

// "--flag=value" -> "--flag"
std::string_view flag_name(std::string_view arg) {
  if (arg.starts_with("--")) return arg.substr(0, arg.find('='));
  return arg;
}

// A one-dash word of two or more letters ("-ctk"): llama.cpp's spelling of a long flag, never
// Tandem's (its one-dash flags are single letters, and a number such as -1 is a value).
bool one_dash_word(std::string_view arg) {
  return arg.size() >= 3 && arg[0] == '-' && arg[1] != '-' &&
         std::all_of(arg.begin() + 1, arg.end(), [](char c) {
           return std::isalpha(static_cast<unsigned char>(c)) || c == '-';
         });
}

// Free text that may look like a flag: a prompt, an override pattern.
bool takes_free_text(std::string_view arg) {
  return arg == "-p" || arg == "--prompt" || arg == "-ot" || arg == "--override-tensor";
}

}  // namespace

std::string translate_llama_flags(std::vector<std::string>& args) {
  if (args.empty()) return "";
  const std::string sub = args[0];
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& arg = args[i];
    const std::string_view name = flag_name(arg);
    for (const auto& refusal : refusals()) {
      if (std::find(refusal.spellings.begin(), refusal.spellings.end(), name) !=
          refusal.spellings.end()) {
        return std::string(name) + ": " + std::string(refusal.why);
      }
    }
    // run and logits have no -o: llama.cpp's tensor override is -ot (bench's -o is the format).
    if ((sub == "run" || sub == "logits") && arg == "-o") {
      return "-o: " + sub +
             " has no -o; the tensor override is -ot/--override-tensor (bench's -o is the output "
             "format)";
    }
    const bool free_text_follows = takes_free_text(arg);
    const auto spelling = std::find_if(std::begin(kSpellings), std::end(kSpellings),
                                       [&](const Spelling& s) { return s.llama == arg; });
    if (spelling != std::end(kSpellings)) {
      arg = std::string(spelling->tandem);
    } else if (one_dash_word(arg)) {
      return arg +
             ": unknown flag (Tandem's one-dash flags of several letters are -ngl, -fa, "
             "-ot, -ts and -sm; see 'tandem " +
             sub + " --help')";
    }
    if (free_text_follows) ++i;
  }
  return "";
}

}  // namespace tandem::cli
