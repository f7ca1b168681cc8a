// The `tandem` subcommands. Each registers its flags on the CLI11 app and returns the exit code.
#pragma once

#include <functional>

namespace CLI {
class App;
}

namespace tandem::cli {

// Adds every subcommand to `app`; the chosen one sets `run` to its action.
void add_commands(CLI::App& app, std::function<int()>& run);

}  // namespace tandem::cli
