// model/requant.hpp: the quantisers' formats, fallbacks and identities. That
// the blocks equal llama-quantize's byte for byte is tests/cli/test_substitution.sh
// (it runs llama.cpp's own quantiser).
#include "kvasir/core/dtype.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/model/quant.hpp"
#include "kvasir/model/requant.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

using namespace kvasir;

namespace {

std::vector<float> seeded_row(std::int64_t n, const char* name, double sd = 1.0) {
    const Tensor t = seeded_normal(5, name, {n}, 0, sd);
    return {t.as<float>(), t.as<float>() + n};
}

TEST(Requant, FormatsAndTheirFallbacksAsLlamaQuantizeChoosesThem) {
    EXPECT_EQ(quant_type_for_row(GgmlType::Q4_K, 512), GgmlType::Q4_K);
    EXPECT_EQ(quant_type_for_row(GgmlType::Q4_K, 64), GgmlType::Q5_0);   // tensor_type_fallback: Q4_K → Q5_0
    EXPECT_EQ(quant_type_for_row(GgmlType::Q4_K, 80), GgmlType::F16);    // and Q5_0 does not fit 80 either
    EXPECT_EQ(quant_type_for_row(GgmlType::Q8_0, 96), GgmlType::Q8_0);
    EXPECT_EQ(quant_type_for_row(GgmlType::Q8_0, 80), GgmlType::F16);    // a 32-block type demotes to F16
    EXPECT_EQ(quant_type_for_row(GgmlType::MXFP4, 48), GgmlType::F16);
    EXPECT_EQ(parse_quant_type("q4_k"), GgmlType::Q4_K);
    EXPECT_EQ(parse_quant_type("MXFP4"), GgmlType::MXFP4);
    EXPECT_FALSE(parse_quant_type("q3_k"));
    EXPECT_FALSE(parse_quant_type("f16"));
    std::vector<std::byte> out(64);
    float x[32] = {};
    EXPECT_THROW(quantize_row(GgmlType::Q6_K, x, out.data(), 256), Error);
}

// A Q5_0 block written by hand: d = 0.5 (f16 0x3800), element j's 5-bit q
// = j (high bit from qh bit j), so y[j] = (j − 16)·0.5.
TEST(Requant, Q5_0ExpandsAsTheFormatSays) {
    std::vector<std::byte> blk(22);
    blk[0] = std::byte{0x00};
    blk[1] = std::byte{0x38};
    std::uint32_t qh = 0;
    for (int j = 0; j < 32; ++j) qh |= static_cast<std::uint32_t>((j >> 4) & 1) << j;
    for (int k = 0; k < 4; ++k) blk[2 + k] = static_cast<std::byte>((qh >> (8 * k)) & 0xff);
    for (int j = 0; j < 16; ++j) blk[6 + j] = static_cast<std::byte>((j & 15) | (((j + 16) & 15) << 4));
    float y[32];
    dequantize_row(GgmlType::Q5_0, blk.data(), y, 32);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], (j - 16) * 0.5f) << j;
    // Quantising those values gives the block back: max |y| = 8 at j = 0, d = −8/−16.
    std::vector<std::byte> again(22);
    quantize_row(GgmlType::Q5_0, y, again.data(), 32);
    EXPECT_EQ(0, std::memcmp(again.data(), blk.data(), 22));
}

// Values a format holds exactly come back unchanged: requantising a
// requantised row is the identity for Q8_0, Q5_0 and MXFP4 (their scales are
// recovered from the largest element), and every Q4_K value lies within half a
// step of its sub-block's grid.
TEST(Requant, RequantisingIsIdempotentWhereTheScaleIsRecovered) {
    for (GgmlType t : {GgmlType::Q8_0, GgmlType::MXFP4, GgmlType::Q5_0}) {
        const std::vector<float> x = seeded_row(1024, "requant/idem");
        std::vector<float> once(x.size()), twice(x.size());
        requantize_rows(t, x.data(), once.data(), 4, 256);
        requantize_rows(t, once.data(), twice.data(), 4, 256);
        EXPECT_EQ(0, std::memcmp(once.data(), twice.data(), once.size() * 4)) << ggml_type_name(t);
        EXPECT_NE(0, std::memcmp(once.data(), x.data(), once.size() * 4)) << ggml_type_name(t);
    }
    const std::vector<float> x = seeded_row(256, "requant/q4k");
    std::vector<float> y(256);
    requantize_rows(GgmlType::Q4_K, x.data(), y.data(), 1, 256);
    for (int j = 0; j < 8; ++j) {  // 4-bit grid over each sub-block's range: error ≤ range / 15 (generous: half a step + scale rounding)
        float lo = x[32 * j], hi = x[32 * j];
        for (int i = 0; i < 32; ++i) lo = std::min(lo, x[32 * j + i]), hi = std::max(hi, x[32 * j + i]);
        for (int i = 0; i < 32; ++i) EXPECT_LE(std::fabs(y[32 * j + i] - x[32 * j + i]), (hi - std::min(lo, 0.0f)) / 15) << j;
    }
}

// The 80-element rows of the F16 fallback are rounded to half, element by element.
TEST(Requant, TheF16FallbackRoundsToHalf) {
    const std::vector<float> x = seeded_row(160, "requant/f16");
    std::vector<float> y(160);
    requantize_rows(GgmlType::Q4_K, x.data(), y.data(), 2, 80);
    for (int i = 0; i < 160; ++i) EXPECT_EQ(y[i], static_cast<float>(round_to_f16(x[i]))) << i;
}

}  // namespace
