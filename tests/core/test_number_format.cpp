// The number formats every table uses (core/number_format.hpp), by hand.
#include "kvasir/core/number_format.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using namespace kvasir;

namespace {
const double kInf = std::numeric_limits<double>::infinity();
}

TEST(NumberFormat, ScientificCosineAndRateByHand) {
    EXPECT_EQ(fmt_sci(3.456e-10), "3.46e-10");
    EXPECT_EQ(fmt_sci(0.0), "0");
    EXPECT_EQ(fmt_sci(-kInf), "-inf");
    EXPECT_EQ(fmt_sci(-std::nan("")), "nan");
    EXPECT_EQ(fmt_cosine(1.0), "1");
    EXPECT_EQ(fmt_cosine(1.0 - 2.5e-13), "1-2.5e-13");
    EXPECT_EQ(fmt_cosine(0.5), "0.5000000000");
    EXPECT_EQ(fmt_rate(0.9953), "99.5%");
    EXPECT_EQ(fmt_rate(std::nan("")), "nan");
}

// A figure computed from a NaN may carry its sign bit (0·NaN, −x on a NaN);
// the JSON report writes every NaN as "nan", and so must every table, which
// reads the same typed result.
TEST(NumberFormat, FixedAndGeneralWriteEveryNanAsTheJsonReportDoes) {
    const double negative_nan = -std::numeric_limits<double>::quiet_NaN();
    ASSERT_TRUE(std::signbit(negative_nan));
    EXPECT_EQ(fmt_fixed(negative_nan, 9), "nan");
    EXPECT_EQ(fmt_general(negative_nan, 6), "nan");
    EXPECT_EQ(fmt_fixed(std::nan(""), 4), "nan");
    EXPECT_EQ(fmt_fixed(1.0 + 1.25e-7, 9), "1.000000125");
    EXPECT_EQ(fmt_fixed(0.96875, 4), "0.9688");
    EXPECT_EQ(fmt_fixed(-kInf, 4), "-inf");
    EXPECT_EQ(fmt_general(264073.8 * (1 + 1e-9), 9), "264073.8");
    EXPECT_EQ(fmt_general(2.5e-7, 2), "2.5e-07");
    EXPECT_EQ(fmt_general(kInf, 6), "inf");
}
