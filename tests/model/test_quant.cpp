// Dequantisation from first principles: blocks are packed here by the inverse
// of the documented layout (independently of quant.cpp) from chosen scales and
// quants, and the expected values are computed by hand. The cross-check
// against the gguf package lives in test_gguf.cpp.
#include "kvasir/core/dtype.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/model/gguf.hpp"
#include "kvasir/model/quant.hpp"
#include "kvasir/model/safetensors.hpp"

#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

using namespace kvasir;

namespace {

void put_f16(std::vector<std::byte>& b, std::size_t at, float v) {
    const std::uint16_t h = f32_to_f16_bits(v);
    b[at] = std::byte{static_cast<std::uint8_t>(h)};
    b[at + 1] = std::byte{static_cast<std::uint8_t>(h >> 8)};
}

std::uint8_t& byte_at(std::vector<std::byte>& b, std::size_t i) { return reinterpret_cast<std::uint8_t&>(b[i]); }

}  // namespace

TEST(QuantTraits, Geometry) {
    const auto q4k = ggml_type_traits(12);
    ASSERT_TRUE(q4k);
    EXPECT_EQ(q4k->type, GgmlType::Q4_K);
    EXPECT_EQ(q4k->name, "Q4_K");
    EXPECT_EQ(q4k->block_size, 256u);
    EXPECT_EQ(q4k->block_bytes, 144u);
    EXPECT_EQ(ggml_traits(GgmlType::Q6_K).block_bytes, 210u);
    EXPECT_EQ(ggml_traits(GgmlType::Q8_0).block_bytes, 34u);
    EXPECT_EQ(ggml_traits(GgmlType::Q8_0).block_size, 32u);
    EXPECT_EQ(ggml_traits(GgmlType::BF16).block_bytes, 2u);
    EXPECT_EQ(ggml_traits(GgmlType::F32).block_size, 1u);
    EXPECT_EQ(ggml_type_name(GgmlType::IQ2_XXS), "IQ2_XXS");
    // Removed or never-assigned ids are unknown.
    for (std::uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 42u, 1000u, 0xffffffffu})
        EXPECT_FALSE(ggml_type_traits(id)) << id;
    for (auto t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K})
        EXPECT_TRUE(ggml_type_dequantizable(t));
    for (auto t : {GgmlType::Q4_0, GgmlType::Q5_K, GgmlType::F64, GgmlType::I32, GgmlType::IQ4_XS})
        EXPECT_FALSE(ggml_type_dequantizable(t));
}

TEST(QuantRow, Q8_0FromHandPackedBlock) {
    // Two blocks, the second starting at an odd address inside the buffer:
    // the kernels must not assume alignment.
    std::vector<std::byte> b(1 + 2 * 34);
    put_f16(b, 1, 0.5f);
    put_f16(b, 1 + 34, -0.125f);
    for (int i = 0; i < 32; ++i) {
        byte_at(b, 1 + 2 + i) = static_cast<std::uint8_t>(i - 16);
        byte_at(b, 1 + 34 + 2 + i) = static_cast<std::uint8_t>(i == 0 ? -128 : 127 - i);
    }
    std::array<float, 64> y{};
    dequantize_row_q8_0(b.data() + 1, y.data(), 64);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], static_cast<float>(i - 16) * 0.5f) << i;
    EXPECT_EQ(y[32], 16.0f);  // -128 × -0.125
    for (int i = 1; i < 32; ++i) EXPECT_EQ(y[32 + i], static_cast<float>(127 - i) * -0.125f) << i;
}

TEST(QuantRow, Q4_KFromHandPackedBlock) {
    // Eight 6-bit scales and mins, every one different and using the top bits,
    // so a mix-up of the packing shows.
    std::array<std::uint8_t, 8> sc{}, mn{};
    for (int j = 0; j < 8; ++j) {
        sc[j] = static_cast<std::uint8_t>(3 + 8 * j);   // 3 .. 59
        mn[j] = static_cast<std::uint8_t>(63 - 7 * j);  // 63 .. 14
    }
    auto q_of = [](int e) { return (e * 7 + e / 32) % 16; };
    std::vector<std::byte> b(144);
    put_f16(b, 0, 0.5f);
    put_f16(b, 2, 0.25f);
    // Inverse of the documented packing.
    for (int j = 0; j < 4; ++j) {
        byte_at(b, 4 + j) = static_cast<std::uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
        byte_at(b, 4 + j + 4) = static_cast<std::uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
        byte_at(b, 4 + j + 8) = static_cast<std::uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
    for (int e = 0; e < 256; ++e) {
        const int sub = e / 32, l = e % 32;
        byte_at(b, 16 + 32 * (sub / 2) + l) |= static_cast<std::uint8_t>(q_of(e) << (4 * (sub % 2)));
    }
    std::array<float, 256> y{};
    dequantize_row_q4_k(b.data(), y.data(), 256);
    for (int e = 0; e < 256; ++e) {
        const int j = e / 32;
        const float expect = (0.5f * static_cast<float>(sc[j])) * static_cast<float>(q_of(e)) -
                             0.25f * static_cast<float>(mn[j]);
        EXPECT_EQ(y[e], expect) << "element " << e;
    }
}

TEST(QuantRow, Q6_KFromHandPackedBlock) {
    auto q_of = [](int e) { return (e * 5 + e / 64) % 64 - 32; };  // −32 .. 31
    std::vector<std::byte> b(210);
    for (int s = 0; s < 16; ++s) byte_at(b, 192 + s) = static_cast<std::uint8_t>(static_cast<std::int8_t>(3 * s - 24));
    put_f16(b, 208, 0.25f);
    for (int e = 0; e < 256; ++e) {
        const int h = e / 128, r = e % 128;
        const int q6 = q_of(e) + 32;
        byte_at(b, 64 * h + r % 64) |= static_cast<std::uint8_t>((q6 & 15) << (4 * (r / 64)));
        byte_at(b, 128 + 32 * h + r % 32) |= static_cast<std::uint8_t>((q6 >> 4) << (2 * (r / 32)));
    }
    std::array<float, 256> y{};
    dequantize_row_q6_k(b.data(), y.data(), 256);
    for (int e = 0; e < 256; ++e) {
        const float scale = static_cast<float>(3 * (e / 16) - 24);
        EXPECT_EQ(y[e], (0.25f * scale) * static_cast<float>(q_of(e))) << "element " << e;
    }
}

TEST(QuantRow, PlainFloatsAreExactIncludingSpecials) {
    // F32: a bit copy, signalling-NaN payload included.
    const std::array<std::uint32_t, 4> f32_bits = {0x7f800001u, 0x80000000u, 0x00000001u, 0x3f800000u};
    std::array<float, 4> y{};
    dequantize_row(GgmlType::F32, reinterpret_cast<const std::byte*>(f32_bits.data()), y.data(), 4);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(std::bit_cast<std::uint32_t>(y[i]), f32_bits[i]);
    // F16: ±inf, NaN payload, subnormal, largest finite.
    const std::array<std::uint16_t, 5> f16_bits = {0x7c00u, 0xfc00u, 0x7e01u, 0x0001u, 0x7bffu};
    std::array<float, 5> h{};
    dequantize_row(GgmlType::F16, reinterpret_cast<const std::byte*>(f16_bits.data()), h.data(), 5);
    EXPECT_EQ(h[0], INFINITY);
    EXPECT_EQ(h[1], -INFINITY);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(h[2]), 0x7fc02000u);
    EXPECT_EQ(h[3], std::ldexp(1.0f, -24));
    EXPECT_EQ(h[4], 65504.0f);
    // BF16: the top half of an f32.
    const std::array<std::uint16_t, 3> bf_bits = {0xff81u, 0x3f80u, 0x0001u};
    std::array<float, 3> g{};
    dequantize_row(GgmlType::BF16, reinterpret_cast<const std::byte*>(bf_bits.data()), g.data(), 3);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(g[0]), 0xff810000u);
    EXPECT_EQ(g[1], 1.0f);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(g[2]), 0x00010000u);
}

TEST(QuantRow, UnsupportedTypeAndBadLengthAreRefused) {
    std::array<std::byte, 64> src{};
    std::array<float, 64> y{};
    try {
        dequantize_row(GgmlType::Q5_K, src.data(), y.data(), 256);
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::unsupported);
        EXPECT_NE(std::string(e.what()).find("Q5_K"), std::string::npos);
    }
    EXPECT_THROW(dequantize_row(GgmlType::Q8_0, src.data(), y.data(), 31), Error);
}

// ---- MXFP4 -------------------------------------------------------------------------------
// fixtures/mxfp4/ (scripts/make_fixtures.py write_mxfp4_vectors): every e8m0 scale 0..255 and every nibble,
// in both layouts, with the public references' own expansions: transformers' _convert_moe_packed_tensors
// (float32) for the Hugging Face blocks/scales, gguf.quants.dequantize for ggml's block_mxfp4.
namespace {

const std::string kMxfp4 = std::string(KVASIR_SOURCE_DIR) + "/fixtures/mxfp4/";

bool same_float_bits(float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); }

TEST(Mxfp4, HuggingFaceLayoutIsTransformersBitForBit) {
    const kvasir::SafetensorsFile f = kvasir::SafetensorsFile::open(kMxfp4 + "vectors.safetensors");
    const auto& bi = f.info("hf.blocks");
    ASSERT_EQ(bi.shape, (kvasir::Shape{2, 256, 2, 16}));
    const auto* blocks = reinterpret_cast<const std::uint8_t*>(f.raw("hf.blocks").data());
    const auto* scales = reinterpret_cast<const std::uint8_t*>(f.raw("hf.scales").data());
    const kvasir::TensorView ref = f.view("hf.transformers");  // [2, 64, 256]: transformers transposes to [E, G·32, R]
    ASSERT_EQ(ref.shape, (kvasir::Shape{2, 64, 256}));
    std::int64_t infinite = 0, denormal = 0, mismatched = 0;
    std::vector<float> row(64);
    for (std::int64_t e = 0; e < 2; ++e)
        for (std::int64_t r = 0; r < 256; ++r) {
            kvasir::dequantize_mxfp4_hf(blocks + (e * 256 + r) * 32, scales + (e * 256 + r) * 2, 2, row.data());
            for (std::int64_t c = 0; c < 64; ++c) {
                const float want = static_cast<float>(ref.at((e * 64 + c) * 256 + r));
                mismatched += !same_float_bits(row[static_cast<std::size_t>(c)], want);
                infinite += std::isinf(want);
                denormal += want != 0 && std::fabs(want) < 0x1p-126f;
            }
        }
    EXPECT_EQ(mismatched, 0);
    EXPECT_GT(infinite, 0);  // scale 255 overflows for |v| ≥ 1, as torch.ldexp does
    EXPECT_GT(denormal, 0);  // scales 0..2 reach f32 denormals exactly
    // By hand: byte 0x71 at scale 128 → low nibble 1 (0.5) then high nibble 7 (6.0), times 2^1.
    const std::uint8_t b[16] = {0x71}, s[1] = {128};
    float y[32];
    kvasir::dequantize_mxfp4_hf(b, s, 1, y);
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[1], 12.0f);
    EXPECT_EQ(y[2], 0.0f);
}

TEST(Mxfp4, GgufBlocksAreTheGgufPackageBitForBit) {
    const kvasir::GgufFile g = kvasir::GgufFile::open(kMxfp4 + "vectors.gguf");
    const kvasir::GgufTensor* t = g.find_tensor("mxfp4");
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->type, GgmlType::MXFP4);
    const kvasir::Tensor got = kvasir::dequantize(*t);
    ASSERT_EQ(got.shape(), (kvasir::Shape{256, 64}));
    const kvasir::SafetensorsFile f = kvasir::SafetensorsFile::open(kMxfp4 + "vectors.safetensors");
    const kvasir::TensorView want = f.view("gguf.values");
    std::int64_t mismatched = 0;
    for (std::int64_t i = 0; i < want.numel(); ++i) {
        const bool bad = !same_float_bits(got.as<float>()[i], static_cast<float>(want.at(i)));
        if (bad && mismatched < 5) ADD_FAILURE() << "element " << i << ": " << got.as<float>()[i] << " vs " << want.at(i);
        mismatched += bad;
    }
    EXPECT_EQ(mismatched, 0);
    // By hand: ggml orders a block's low nibbles first, then the high ones (unlike the HF layout).
    std::array<std::byte, 17> blk{};
    blk[0] = std::byte{128};  // 2^(128−128) = 1, times the doubled e2m1 value
    blk[1] = std::byte{0x71};
    std::array<float, 32> y{};
    kvasir::dequantize_row_mxfp4(blk.data(), y.data(), 32);
    EXPECT_EQ(y[0], 1.0f);   // kvalues[1] = 1
    EXPECT_EQ(y[16], 12.0f); // kvalues[7] = 12
    EXPECT_EQ(y[1], 0.0f);
}

TEST(Mxfp4, MalformedPairsAreRefusedNamingTheTensor) {
    std::vector<std::byte> blocks(2 * 3 * 2 * 16), scales(2 * 3 * 2);
    kvasir::SafetensorsTensorInfo b{"l.gate_up_proj_blocks", kvasir::SafetensorsDType::U8, {2, 3, 2, 16}, 0, blocks.size()};
    kvasir::SafetensorsTensorInfo s{"l.gate_up_proj_scales", kvasir::SafetensorsDType::U8, {2, 3, 2}, 0, scales.size()};
    const kvasir::Shape want{2, 3, 2, 16};
    const kvasir::Mxfp4Pair ok = kvasir::check_mxfp4_pair("f", b, blocks, s, scales, want);
    EXPECT_EQ(ok.rows, 6);
    EXPECT_EQ(ok.groups, 2);
    const auto refused = [&](const kvasir::SafetensorsTensorInfo& bb, std::span<const std::byte> braw,
                             const kvasir::SafetensorsTensorInfo& ss, std::span<const std::byte> sraw, const std::string& needle) {
        try {
            (void)kvasir::check_mxfp4_pair("f", bb, braw, ss, sraw, want);
            ADD_FAILURE() << "accepted; wanted: " << needle;
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::bad_input) << e.what();
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    auto fewer_blocks = b;  // wrong block count
    fewer_blocks.shape = {2, 3, 1, 16};
    refused(fewer_blocks, std::span(blocks).first(96), s, scales, "'l.gate_up_proj_blocks' has shape [2, 3, 1, 16], expected [2, 3, 2, 16]");
    auto truncated = s;  // truncated scales
    truncated.shape = {2, 3, 1};
    refused(b, blocks, truncated, std::span(scales).first(6), "'l.gate_up_proj_scales' has shape [2, 3, 1], expected [2, 3, 2]");
    auto wrong_type = s;
    wrong_type.dtype = kvasir::SafetensorsDType::I8;
    refused(b, blocks, wrong_type, scales, "'l.gate_up_proj_scales' has dtype I8, expected U8");
    refused(b, std::span(blocks).first(100), s, scales, "hold 100 / 12 bytes");
}

}  // namespace
