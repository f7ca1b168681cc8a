// libFuzzer target for the command line: the input split at newlines is argv, translated from
// llama.cpp's spellings and parsed by the same CLI11 app `tandem` builds. Parsing only selects a
// command (nothing runs), so it must succeed or throw a CLI11 error, the ones main() reports.
//   cmake --preset fuzz && cmake --build build/fuzz --target cli_fuzz
//   mkdir -p /tmp/cli && cp tests/fuzz/corpus/cli/* /tmp/cli
//   ./build/fuzz/tests/fuzz/cli_fuzz -max_total_time=600 -print_final_stats=1 /tmp/cli
#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "commands.h"
#include "llama_flags.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> words{"tandem"};
  std::string word;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      words.push_back(word);
      word.clear();
    } else {
      word += static_cast<char>(data[i]);
    }
  }
  if (!word.empty()) words.push_back(word);
  // As main(): llama.cpp's spellings are translated, or refused with a message, first.
  std::vector<std::string> args(words.begin() + 1, words.end());
  if (!tandem::cli::translate_llama_flags(args).empty()) return 0;
  args.insert(args.begin(), words[0]);
  std::vector<const char*> argv;
  for (const auto& w : args) argv.push_back(w.c_str());

  CLI::App app{"tandem", "tandem"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Every subcommand's help");
  std::function<int()> run;
  tandem::cli::add_commands(app, run);
  try {
    app.parse(int(argv.size()), argv.data());
  } catch (const CLI::Error&) {
  }
  return 0;
}
