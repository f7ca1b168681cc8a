#include <gtest/gtest.h>
TEST(Synthetic, Placeholder) {}
