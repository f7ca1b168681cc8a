// UTF-8 decoding and the few Unicode properties the pre-tokenizers need (\p{L}, \p{N}, \s).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::unicode {

// One decoded character: its codepoint and its length in bytes. An invalid or truncated
// sequence decodes as one byte with codepoint kInvalid, so no input byte is ever lost.
struct Decoded {
  uint32_t codepoint;
  size_t length;
};
inline constexpr uint32_t kInvalid = 0xFFFFFFFFu;

Decoded decode_utf8(std::string_view text, size_t pos);
// Length of the sequence a lead byte announces (1 for continuation or invalid bytes).
size_t utf8_sequence_length(uint8_t lead);
void append_utf8(std::string& out, uint32_t codepoint);

bool is_letter(uint32_t codepoint);      // general category L*
bool is_number(uint32_t codepoint);      // general category N*
bool is_whitespace(uint32_t codepoint);  // the White_Space property

}  // namespace tandem::unicode
