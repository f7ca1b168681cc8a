// UTF-8 decoding and the Unicode classes behind the pre-tokenizer.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "unicode.h"

namespace tandem::unicode {
namespace {

TEST(Unicode, ClassifiesLettersNumbersAndSpaces) {
  for (uint32_t cp : std::initializer_list<uint32_t>{'a', 'Z', 0xE9u, 0x416u, 0x3042u, 0x65E5u,
                                                     0xAC00u, 0x1D400u, 0x2B5u}) {
    EXPECT_TRUE(is_letter(cp)) << std::hex << cp;
  }
  for (uint32_t cp :
       std::initializer_list<uint32_t>{'0', '9', 0x663u, 0x2167u, 0xBDu, 0xFF11u, 0x1D7CEu}) {
    EXPECT_TRUE(is_number(cp)) << std::hex << cp;
    EXPECT_FALSE(is_letter(cp)) << std::hex << cp;
  }
  for (uint32_t cp : std::initializer_list<uint32_t>{' ', '\t', '\n', '\r', 0x0Bu, 0x0Cu, 0x85u,
                                                     0xA0u, 0x2003u, 0x3000u}) {
    EXPECT_TRUE(is_whitespace(cp)) << std::hex << cp;
  }
  for (uint32_t cp :
       std::initializer_list<uint32_t>{'!', '_', 0x2581u, 0x1F999u, 0x301u, 0x200Bu, 0xE000u}) {
    EXPECT_FALSE(is_letter(cp) || is_number(cp) || is_whitespace(cp)) << std::hex << cp;
  }
  EXPECT_FALSE(is_letter(0x110000));
}

TEST(Unicode, DecodesValidAndRejectsInvalidUtf8) {
  const std::string s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\xA6\x99";
  EXPECT_EQ(decode_utf8(s, 0).codepoint, 'a');
  EXPECT_EQ(decode_utf8(s, 1).codepoint, 0xE9u);
  EXPECT_EQ(decode_utf8(s, 3).codepoint, 0x20ACu);
  const Decoded llama = decode_utf8(s, 6);
  EXPECT_EQ(llama.codepoint, 0x1F999u);
  EXPECT_EQ(llama.length, 4u);
  for (const char* bad : {"\x80", "\xC3", "\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80"}) {
    const Decoded d = decode_utf8(bad, 0);
    EXPECT_EQ(d.codepoint, kInvalid) << bad;
    EXPECT_EQ(d.length, 1u);
  }
  for (uint32_t cp : std::initializer_list<uint32_t>{0x41u, 0xE9u, 0x20ACu, 0x1F999u}) {
    std::string out;
    append_utf8(out, cp);
    EXPECT_EQ(decode_utf8(out, 0).codepoint, cp);
    EXPECT_EQ(decode_utf8(out, 0).length, out.size());
  }
}

}  // namespace
}  // namespace tandem::unicode
