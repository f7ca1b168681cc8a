// Small helpers shared by the `tandem` subcommands: sizes, lists, progress, tables.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/bytes.h"

namespace tandem::cli {

// "8GiB", "512MiB", "1.5G", "4096" (bytes). Throws InvalidArgument naming the flag.
uint64_t parse_size(std::string_view text, std::string_view flag);
// "1,2,3" or "1 2 3" -> ids. Throws InvalidArgument naming the flag.
std::vector<int32_t> parse_ids(std::string_view text, std::string_view flag);
// The whole of the file at `path`; Io error naming `flag` when it cannot be read.
std::string read_text_file(const std::string& path, const char* flag);
// Writes `text` to `path`; Io error naming `flag` when it cannot.
void write_file(const std::string& path, const std::string& text, const char* flag);
// llama.cpp's -e: \n \r \t \' \" \\ and \xHH become the characters; any other backslash
// stays as written.
std::string process_escapes(std::string_view text);

// A one-line progress bar on a terminal; silent when stderr is not a terminal.
class Progress {
 public:
  Progress(std::string label, uint64_t total);
  ~Progress();
  void update(uint64_t done);
  void finish();

 private:
  std::string label_;
  uint64_t total_;
  bool enabled_;
  bool finished_ = false;
  int last_percent_ = -1;
};

// Mean and sample standard deviation.
struct MeanStd {
  double mean = 0.0;
  double stddev = 0.0;
};
MeanStd mean_std(const std::vector<double>& values);

// Renders rows as a Markdown table with aligned columns.
std::string markdown_table(const std::vector<std::string>& header,
                           const std::vector<std::vector<std::string>>& rows);

}  // namespace tandem::cli
