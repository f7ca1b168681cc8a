// `tandem`: run, bench, synth, inspect, devices, tokenize, detokenize, logits and serve.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "llama_flags.h"
#include "ranks.h"
#include "tandem/error.h"

int main(int argc, char** argv) {
  tandem::cli::set_command_line(argc, argv);  // --ranks starts its ranks with it
  CLI::App app{"tandem: LLM inference across a CPU and NVIDIA GPUs", "tandem"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Every subcommand's help");
  std::function<int()> run;
  tandem::cli::add_commands(app, run);
  std::string known;
  bool is_known = false;
  for (const auto* sub : app.get_subcommands({})) {
    known += (known.empty() ? "" : ", ") + sub->get_name();
    is_known = is_known || (argc > 1 && sub->get_name() == argv[1]);
  }
  if (argc > 1 && argv[1][0] != '-' && !is_known) {
    std::fprintf(stderr, "tandem: error: unknown subcommand '%s' (available: %s)\n", argv[1],
                 known.c_str());
    return 2;
  }
  // llama.cpp's spellings: one-dash long flags rewritten, the flags Tandem lacks refused by name.
  std::vector<std::string> args(argv + 1, argv + argc);
  if (const std::string error = tandem::cli::translate_llama_flags(args); !error.empty()) {
    std::fprintf(stderr, "tandem: error: %s\n", error.c_str());
    return 2;
  }
  std::vector<char*> translated{argv[0]};
  for (auto& arg : args) translated.push_back(arg.data());
  argc = static_cast<int>(translated.size());  // a translation may change the count (-ctk/-ctv)
  argv = translated.data();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "tandem: error: %s (see 'tandem --help')\n", e.what());
    return 2;
  }
  try {
    return run ? run() : 0;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "tandem: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: error: %s\n", e.what());
    return 1;
  }
}
