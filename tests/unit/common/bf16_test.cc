#include "common/bf16.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

TEST(Bf16Test, RoundTripIsExactForBf16Values) {
  for (float v : {0.0f, -0.0f, 1.0f, -2.5f, 0.00390625f, 3.0e38f, 1.0e-30f}) {
    const float bf = Bf16BitsToFloat(FloatToBf16Bits(v));
    EXPECT_EQ(Bf16BitsToFloat(FloatToBf16Bits(bf)), bf) << v;
  }
  EXPECT_EQ(FloatToBf16Bits(1.0f), 0x3F80);
  EXPECT_EQ(Bf16BitsToFloat(0xC020), -2.5f);
}

TEST(Bf16Test, RoundsToNearestTiesToEven) {
  // bf16 values near 1 are 2^-7 apart; 1 + 2^-8 is halfway between 0x3F80 (even) and 0x3F81.
  EXPECT_EQ(FloatToBf16Bits(1.0f + 0.00390625f), 0x3F80);
  // 1 + 3·2^-8 is halfway between 0x3F81 (odd) and 0x3F82 (even).
  EXPECT_EQ(FloatToBf16Bits(1.0f + 3 * 0.00390625f), 0x3F82);
  // Just above a tie rounds up.
  EXPECT_EQ(FloatToBf16Bits(std::nextafter(1.0f + 0.00390625f, 2.0f)), 0x3F81);
  EXPECT_EQ(FloatToBf16Bits(-(1.0f + 0.00390625f)), 0xBF80);
}

TEST(Bf16Test, OverflowAndSpecialValues) {
  EXPECT_EQ(FloatToBf16Bits(std::numeric_limits<float>::max()), 0x7F80);  // rounds to +inf
  EXPECT_EQ(FloatToBf16Bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(FloatToBf16Bits(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_TRUE(std::isnan(Bf16BitsToFloat(FloatToBf16Bits(std::nanf("")))));
  // A NaN whose payload sits in the low bits must not round into an infinity.
  uint32_t low_payload_nan = 0x7F800001u;
  float f;
  std::memcpy(&f, &low_payload_nan, sizeof(f));
  EXPECT_TRUE(std::isnan(Bf16BitsToFloat(FloatToBf16Bits(f))));
}

}  // namespace
}  // namespace trainyard
