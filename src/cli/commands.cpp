#include "commands.h"

#include <CLI/CLI.hpp>

#include "commands_impl.h"

namespace tandem::cli {

void add_commands(CLI::App& app, std::function<int()>& run) {
  add_run(app, run);
  add_bench(app, run);
  add_plan(app, run);
  add_tune(app, run);
  add_calibrate(app, run);
  add_synth(app, run);
  add_inspect(app, run);
  add_devices(app, run);
  add_tokenize(app, run);
  add_detokenize(app, run);
  add_logits(app, run);
#ifdef TANDEM_HAVE_SERVER
  add_serve(app, run);
#endif
}

}  // namespace tandem::cli
