#include "cli_util.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "tandem/error.h"

namespace tandem::cli {

uint64_t parse_size(std::string_view text, std::string_view flag) {
  const std::string where(flag);
  std::string s(text);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  std::string number = s.substr(0, i), unit = s.substr(i);
  for (char& ch : unit) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  double value = 0.0;
  try {
    size_t used = 0;
    value = number.empty() ? -1.0 : std::stod(number, &used);
    if (used != number.size()) value = -1.0;
  } catch (const std::exception&) {
    value = -1.0;
  }
  double mult = -1.0;
  if (unit.empty() || unit == "b")
    mult = 1.0;
  else if (unit == "k" || unit == "kb" || unit == "kib")
    mult = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib")
    mult = 1024.0 * 1024.0;
  else if (unit == "g" || unit == "gb" || unit == "gib")
    mult = 1024.0 * 1024.0 * 1024.0;
  else if (unit == "t" || unit == "tb" || unit == "tib")
    mult = 1024.0 * 1024.0 * 1024.0 * 1024.0;
  if (value < 0.0 || mult < 0.0 || !std::isfinite(value * mult) || value * mult > 1.8e19) {
    throw_error(ErrorCode::InvalidArgument, where,
                "cannot read size '" + s + "' (expected e.g. 512MiB, 8GiB or a byte count)");
  }
  return uint64_t(value * mult);
}

std::vector<int32_t> parse_ids(std::string_view text, std::string_view flag) {
  std::vector<int32_t> ids;
  std::string cur;
  auto flush = [&]() {
    if (cur.empty()) return;
    try {
      size_t used = 0;
      long long v = std::stoll(cur, &used);
      if (used != cur.size() || v < 0 || v > INT32_MAX) throw std::out_of_range("id");
      ids.push_back(int32_t(v));
    } catch (const std::exception&) {
      throw_error(ErrorCode::InvalidArgument, std::string(flag),
                  "cannot read token id '" + cur + "' (expected non-negative integers)");
    }
    cur.clear();
  };
  for (char ch : text) {
    if (ch == ',' || ch == ' ' || ch == '\n' || ch == '\t' || ch == '[' || ch == ']') {
      flush();
    } else {
      cur += ch;
    }
  }
  flush();
  return ids;
}

Progress::Progress(std::string label, uint64_t total)
    : label_(std::move(label)), total_(std::max<uint64_t>(total, 1)), enabled_(isatty(2) == 1) {}

Progress::~Progress() {
  finish();
}

void Progress::update(uint64_t done) {
  if (!enabled_ || finished_) return;
  int percent = int(std::min<uint64_t>(100, done * 100 / total_));
  if (percent == last_percent_) return;
  last_percent_ = percent;
  const int width = 30;
  int filled = percent * width / 100;
  std::fprintf(stderr, "\r%s [%s%s] %3d%%", label_.c_str(),
               std::string(size_t(filled), '#').c_str(),
               std::string(size_t(width - filled), ' ').c_str(), percent);
  std::fflush(stderr);
}

void Progress::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  if (last_percent_ >= 0)
    std::fprintf(stderr, "\r%s\r", std::string(label_.size() + 40, ' ').c_str());
}

std::string process_escapes(std::string_view text) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\' || i + 1 == text.size()) {
      out += text[i];
      continue;
    }
    const char c = text[++i];
    switch (c) {
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case '\'':
      case '"':
      case '\\':
        out += c;
        break;
      case 'x':
        if (i + 2 < text.size() && hex(text[i + 1]) >= 0 && hex(text[i + 2]) >= 0) {
          out += char(hex(text[i + 1]) * 16 + hex(text[i + 2]));
          i += 2;
          break;
        }
        [[fallthrough]];
      default:
        out += '\\';
        out += c;
    }
  }
  return out;
}

MeanStd mean_std(const std::vector<double>& values) {
  MeanStd r;
  if (values.empty()) return r;
  for (double v : values) r.mean += v;
  r.mean /= double(values.size());
  if (values.size() > 1) {
    double ss = 0.0;
    for (double v : values) ss += (v - r.mean) * (v - r.mean);
    r.stddev = std::sqrt(ss / double(values.size() - 1));
  }
  return r;
}

std::string markdown_table(const std::vector<std::string>& header,
                           const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size() && c < width.size(); ++c)
      width[c] = std::max(width[c], row[c].size());
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s = "|";
    for (size_t c = 0; c < width.size(); ++c) {
      std::string cell = c < cells.size() ? cells[c] : "";
      s += " " + cell + std::string(width[c] - cell.size(), ' ') + " |";
    }
    return s + "\n";
  };
  std::string out = line(header);
  out += "|";
  for (size_t w : width) out += std::string(w + 2, '-') + "|";
  out += "\n";
  for (const auto& row : rows) out += line(row);
  return out;
}

std::string read_text_file(const std::string& path, const char* flag) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw_error(ErrorCode::Io, flag, "'" + path + "' is a directory");
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) throw_error(ErrorCode::Io, flag, "cannot read '" + path + "'");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw_error(ErrorCode::Io, flag, "cannot read '" + path + "'");
  return text;
}

void write_file(const std::string& path, const std::string& text, const char* flag) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) throw_error(ErrorCode::Io, flag, "cannot write '" + path + "'");
}

}  // namespace tandem::cli
