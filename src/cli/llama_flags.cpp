#include "llama_flags.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::cli {

namespace {

struct Spelling {
  std::string_view llama, tandem;
};
// One-dash spellings of flags Tandem has; the parser knows only the two-dash ones.
constexpr Spelling kSpellings[] = {
    {"-ngl", "--ngl"},         {"-fa", "--flash-attn"}, {"-ot", "--override-tensor"},
    {"-ts", "--tensor-split"}, {"-sm", "--split-mode"}, {"-np", "--parallel"},
    {"-ncmoe", "--n-cpu-moe"}, {"-cmoe", "--cpu-moe"}};

struct Refusal {
  std::vector<std::string_view> spellings;
  std::string_view why;
};
// llama.cpp's and llama-bench's flags that Tandem does not have, and what to do instead.
const std::vector<Refusal>& refusals() {
  static const std::vector<Refusal> table{
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

// llama.cpp's KV cache types, -ctk/-ctv TYPE (--cache-type-k/-v[=TYPE]), each f16 unless given.
// Tandem has one type for both (--kv-type f16|f32): equal types become it; other types, a type
// list (llama-bench sweeps them) or two different types are refused by name.
std::string map_cache_types(std::vector<std::string>& args) {
  std::optional<std::string> k, v;
  std::vector<std::string> out{args[0]};
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (takes_free_text(arg)) {
      out.push_back(arg);
      if (i + 1 < args.size()) out.push_back(args[++i]);
      continue;
    }
    const std::string_view name = flag_name(arg);
    const bool is_k = name == "-ctk" || name == "--cache-type-k";
    if (!is_k && name != "-ctv" && name != "--cache-type-v") {
      out.push_back(arg);
      continue;
    }
    std::string type;
    if (arg.size() > name.size()) {
      type = arg.substr(name.size() + 1);
    } else if (i + 1 < args.size()) {
      type = args[++i];
    } else {
      return std::string(name) + ": needs a cache type (f16 or f32)";
    }
    if (type != "f16" && type != "f32") {
      return std::string(name) + ": cache type '" + type +
             "' is not supported; Tandem's KV caches are f16 or f32 (--kv-type sets both)";
    }
    (is_k ? k : v) = type;
  }
  if (!k && !v) return "";
  const std::string kt = k.value_or("f16"), vt = v.value_or("f16");
  if (kt != vt) {
    return "-ctk/-ctv: separate K and V cache types (" + kt + ", " + vt +
           ") are not supported; --kv-type sets both";
  }
  out.push_back("--kv-type");
  out.push_back(kt);
  args = std::move(out);
  return "";
}

}  // namespace

std::string translate_llama_flags(std::vector<std::string>& args) {
  if (args.empty()) return "";
  if (std::string error = map_cache_types(args); !error.empty()) return error;
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
             "-ot, -ts, -sm, -np, -ncmoe and -cmoe; see 'tandem " +
             sub + " --help')";
    }
    if (free_text_follows) ++i;
  }
  return "";
}

}  // namespace tandem::cli
