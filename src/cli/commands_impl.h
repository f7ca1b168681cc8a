// Internal: one function per subcommand, and option helpers shared between them.
#pragma once

#include <functional>
#include <string>

#include "tandem/dtype.h"

namespace CLI {
class App;
}

namespace tandem::cli {

DType parse_dtype(const std::string& text, const std::string& flag);

void add_synth(CLI::App& app, std::function<int()>& run);
void add_inspect(CLI::App& app, std::function<int()>& run);
void add_devices(CLI::App& app, std::function<int()>& run);
void add_tokenize(CLI::App& app, std::function<int()>& run);
void add_detokenize(CLI::App& app, std::function<int()>& run);
void add_run(CLI::App& app, std::function<int()>& run);
void add_logits(CLI::App& app, std::function<int()>& run);
void add_bench(CLI::App& app, std::function<int()>& run);
void add_plan(CLI::App& app, std::function<int()>& run);
void add_tune(CLI::App& app, std::function<int()>& run);
void add_calibrate(CLI::App& app, std::function<int()>& run);
#ifdef TANDEM_HAVE_SERVER
void add_serve(CLI::App& app, std::function<int()>& run);
#endif

}  // namespace tandem::cli
