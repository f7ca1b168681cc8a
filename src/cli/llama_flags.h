// llama.cpp's and llama-bench's flags as their users type them. The one-dash spellings of flags
// Tandem has become Tandem's (-ngl -> --ngl); the flags Tandem lacks are refused by name before
// the parser can read a one-dash word as a short flag and its value (-ctk as -c tk).
#pragma once

#include <string>
#include <vector>

namespace tandem::cli {

// Rewrites args (argv without the program name, the subcommand first) in place; returns "" or
// an error message naming the flag at fault.
std::string translate_llama_flags(std::vector<std::string>& args);

}  // namespace tandem::cli
