// Generates text with Tandem's C++ runtime and prints where the ops ran.
//   tandem-generate-cpp MODEL.gguf [PROMPT] [N_TOKENS] [STRATEGY]
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include "tandem/error.h"
#include "tandem/runtime.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [PROMPT] [N_TOKENS] [STRATEGY]\n", argv[0]);
    return 2;
  }
  try {
    tandem::SessionOptions options;
    options.model_path = argv[1];
    options.strategy = argc > 4 ? argv[4] : "auto";
    options.n_ctx = 256;
    tandem::Session session(options);

    const std::string prompt = argc > 2 ? argv[2] : "Once upon a time";
    tandem::GenerateOptions generate;
    generate.n_predict = argc > 3 ? std::stoi(argv[3]) : 16;
    generate.sampling = tandem::SamplerParams::greedy();
    std::cout << prompt << std::flush;
    const tandem::GenerateResult result =
        session.generate(session.tokenize(prompt), generate, [](int32_t, std::string_view text) {
          std::cout << text << std::flush;
          return true;  // false would stop the generation
        });
    std::cout << "\n";
    std::cerr << "generated " << result.tokens.size() << " tokens in " << result.generate_s
              << " s\nplacement: " << session.placement_summary() << "\n";
    session.telemetry().print_debug_summary(std::cerr);
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
