// `tandem`: run, bench, synth, inspect, devices, tokenize, detokenize and logits.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <utility>

#include "commands.h"
#include "tandem/error.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem: LLM inference across a CPU and NVIDIA GPUs", "tandem"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Every subcommand's help");
  std::function<int()> run;
  tandem::cli::add_commands(app, run);
  // llama.cpp spells some flags with one dash and several letters; CLI11 wants two dashes.
  const std::pair<const char*, const char*> llama_spellings[] = {{"-ngl", "--ngl"},
                                                                 {"-fa", "--flash-attn"},
                                                                 {"-ot", "--override-tensor"},
                                                                 {"-ts", "--tensor-split"},
                                                                 {"-sm", "--split-mode"}};
  for (int i = 1; i < argc; ++i) {
    for (const auto& [llama, ours] : llama_spellings) {
      if (std::string(argv[i]) == llama) argv[i] = const_cast<char*>(ours);
    }
    // -o was run's tensor override before; llama.cpp's is -ot (bench's -o is the format).
    const std::string sub = argv[1];
    if ((sub == "run" || sub == "logits") && std::string(argv[i]) == "-o") {
      std::fprintf(stderr,
                   "tandem: error: -o: %s has no -o; the tensor override is -ot/--override-tensor "
                   "(bench's -o is the output format)\n",
                   argv[1]);
      return 2;
    }
  }
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
