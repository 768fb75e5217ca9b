// JSON text (common/json.h): numbers are the shortest text that reads back exactly.
#include "common/json.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/numbers.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

TEST(JsonNumber, IsShortAndReadsBackExactly) {
  EXPECT_EQ(JsonNumber(0), "0");
  EXPECT_EQ(JsonNumber(0.5), "0.5");
  EXPECT_EQ(JsonNumber(5e-05), "5e-05");
  EXPECT_EQ(JsonNumber(-3), "-3");
  for (double value :
       {1.0 / 3, std::nextafter(0.1, 1.0), 123456789.123456789, 6.02214076e23,
        std::numeric_limits<double>::denorm_min(), std::numeric_limits<double>::max()}) {
    double back = 0;
    ASSERT_TRUE(absl::SimpleAtod(JsonNumber(value), &back)) << JsonNumber(value);
    EXPECT_EQ(back, value) << JsonNumber(value);
  }
}

TEST(JsonNumber, WhatJsonCannotHoldIsNull) {
  EXPECT_EQ(JsonNumber(std::numeric_limits<double>::infinity()), "null");
  EXPECT_EQ(JsonNumber(std::nan("")), "null");
}

}  // namespace
}  // namespace trainyard
