// Dequantisation kernels. Plain scalar loops on purpose: this runs once per
// weight load, and the value of the code is that it reads next to the format
// description. The operations follow the reference's order anyway, although
// (see quant.hpp) every product here is exact in f32, so the order cannot
// change a bit.
#include "kvasir/model/quant.hpp"
#include "kvasir/model/safetensors.hpp"

#include "kvasir/core/dtype.hpp"
#include "kvasir/core/error.hpp"

#include <array>
#include <cstring>

namespace kvasir {

namespace {

constexpr std::int64_t QK8_0 = 32;
constexpr std::int64_t QK_K = 256;
constexpr std::size_t kQ8_0Bytes = 2 + 32;
constexpr std::size_t kQ4_KBytes = 2 + 2 + 12 + 128;
constexpr std::size_t kQ6_KBytes = 128 + 64 + 16 + 2;

// Geometry of every type ggml defines today (block elements, block bytes).
// These are properties of the file format; the K-quant super-block is 256.
constexpr std::array<GgmlTypeTraits, 34> kTraits = {{
    {GgmlType::F32, "F32", 1, 4},
    {GgmlType::F16, "F16", 1, 2},
    {GgmlType::Q4_0, "Q4_0", 32, 2 + 16},
    {GgmlType::Q4_1, "Q4_1", 32, 2 + 2 + 16},
    {GgmlType::Q5_0, "Q5_0", 32, 2 + 4 + 16},
    {GgmlType::Q5_1, "Q5_1", 32, 2 + 2 + 4 + 16},
    {GgmlType::Q8_0, "Q8_0", 32, kQ8_0Bytes},
    {GgmlType::Q8_1, "Q8_1", 32, 4 + 4 + 32},
    {GgmlType::Q2_K, "Q2_K", 256, 2 + 2 + 16 + 64},
    {GgmlType::Q3_K, "Q3_K", 256, 2 + 64 + 32 + 12},
    {GgmlType::Q4_K, "Q4_K", 256, kQ4_KBytes},
    {GgmlType::Q5_K, "Q5_K", 256, 2 + 2 + 128 + 32 + 12},
    {GgmlType::Q6_K, "Q6_K", 256, kQ6_KBytes},
    {GgmlType::Q8_K, "Q8_K", 256, 4 + 256 + 32},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 2 + 64},
    {GgmlType::IQ2_XS, "IQ2_XS", 256, 2 + 64 + 8},
    {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 2 + 64 + 32},
    {GgmlType::IQ1_S, "IQ1_S", 256, 2 + 32 + 16},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 2 + 16},
    {GgmlType::IQ3_S, "IQ3_S", 256, 2 + 64 + 32 + 8 + 4},
    {GgmlType::IQ2_S, "IQ2_S", 256, 2 + 64 + 16},
    {GgmlType::IQ4_XS, "IQ4_XS", 256, 2 + 2 + 128 + 4},
    {GgmlType::I8, "I8", 1, 1},
    {GgmlType::I16, "I16", 1, 2},
    {GgmlType::I32, "I32", 1, 4},
    {GgmlType::I64, "I64", 1, 8},
    {GgmlType::F64, "F64", 1, 8},
    {GgmlType::IQ1_M, "IQ1_M", 256, 32 + 16 + 8},
    {GgmlType::BF16, "BF16", 1, 2},
    {GgmlType::TQ1_0, "TQ1_0", 256, 2 + 4 * 13},
    {GgmlType::TQ2_0, "TQ2_0", 256, 2 + 64},
    {GgmlType::MXFP4, "MXFP4", 32, 1 + 16},
    {GgmlType::NVFP4, "NVFP4", 64, 4 + 32},
    {GgmlType::Q1_0, "Q1_0", 128, 2 + 16},
}};

std::uint8_t u8_at(const std::byte* p, std::size_t i) { return std::to_integer<std::uint8_t>(p[i]); }
std::int8_t i8_at(const std::byte* p, std::size_t i) { return static_cast<std::int8_t>(u8_at(p, i)); }
std::uint16_t u16_at(const std::byte* p, std::size_t i) {
    return static_cast<std::uint16_t>(u8_at(p, i) | (u8_at(p, i + 1) << 8));
}
float f16_at(const std::byte* p, std::size_t i) { return f16_bits_to_f32(u16_at(p, i)); }

}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(std::uint32_t id) noexcept {
    for (const auto& t : kTraits)
        if (static_cast<std::uint32_t>(t.type) == id) return t;
    return std::nullopt;
}

GgmlTypeTraits ggml_traits(GgmlType type) noexcept {
    const auto t = ggml_type_traits(static_cast<std::uint32_t>(type));
    return t ? *t : GgmlTypeTraits{type, "?", 1, 1};
}

std::string_view ggml_type_name(GgmlType type) noexcept { return ggml_traits(type).name; }

bool ggml_type_dequantizable(GgmlType type) noexcept {
    switch (type) {
        case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16:
        case GgmlType::Q8_0: case GgmlType::Q5_0: case GgmlType::Q4_K: case GgmlType::Q6_K: case GgmlType::MXFP4:
            return true;
        default: return false;
    }
}

void Mxfp4Pair::row(std::int64_t r, float* dst) const noexcept {
    dequantize_mxfp4_hf(blocks + r * groups * 16, scales + r * groups, groups, dst);
}

Mxfp4Pair check_mxfp4_pair(const std::string& file, const SafetensorsTensorInfo& b, std::span<const std::byte> b_raw,
                           const SafetensorsTensorInfo& s, std::span<const std::byte> s_raw, const Shape& want) {
    KVASIR_CHECK(want.size() >= 3 && want.back() == 16, ErrorCode::internal, "check_mxfp4_pair: expected shape {}",
                 shape_str(want));
    for (const auto* t : {&b, &s})
        KVASIR_CHECK(t->dtype == SafetensorsDType::U8, ErrorCode::bad_input, "{}: MXFP4 tensor '{}' has dtype {}, expected U8",
                     file, t->name, safetensors_dtype_name(t->dtype));
    KVASIR_CHECK(b.shape == want, ErrorCode::bad_input, "{}: MXFP4 tensor '{}' has shape {}, expected {} (blocks of 32 values, "
                 "16 bytes each)", file, b.name, shape_str(b.shape), shape_str(want));
    const Shape want_scales(want.begin(), want.end() - 1);
    KVASIR_CHECK(s.shape == want_scales, ErrorCode::bad_input, "{}: MXFP4 tensor '{}' has shape {}, expected {} (one scale per "
                 "block of '{}')", file, s.name, shape_str(s.shape), shape_str(want_scales), b.name);
    const std::int64_t groups = want[want.size() - 2];
    const std::int64_t rows = shape_numel(want_scales) / std::max<std::int64_t>(groups, 1);
    KVASIR_CHECK(b_raw.size() == static_cast<std::size_t>(shape_numel(want)) &&
                     s_raw.size() == static_cast<std::size_t>(shape_numel(want_scales)),
                 ErrorCode::bad_input, "{}: MXFP4 tensors '{}' / '{}' hold {} / {} bytes for their shapes", file, b.name, s.name,
                 b_raw.size(), s_raw.size());
    return {reinterpret_cast<const std::uint8_t*>(b_raw.data()), reinterpret_cast<const std::uint8_t*>(s_raw.data()), rows,
            groups};
}

std::string_view ggml_dequantizable_types() noexcept { return "F32, F16, BF16, Q8_0, Q5_0, Q4_K, Q6_K, MXFP4"; }

// e2m1: sign, 2 exponent bits, 1 mantissa bit (OCP MX v1.0) — transformers'
// FP4_VALUES, −0 included.
constexpr float kFp4Values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// ggml_e8m0_to_fp32_half: 2^(e − 128) built from its bits (denormal for e < 2).
float e8m0_half(std::uint8_t e) noexcept {
    const std::uint32_t bits = e < 2 ? std::uint32_t{0x00200000} << e : static_cast<std::uint32_t>(e - 1) << 23;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}


// MXFP4 (ggml block_mxfp4): u8 e, u8 qs[16]; y[j] = kvalues[qs[j] & 15]·2^(e−128),
// y[j + 16] = kvalues[qs[j] >> 4]·2^(e−128) — low nibbles first, then high.
void dequantize_row_mxfp4(const std::byte* src, float* dst, std::int64_t n) noexcept {
    for (std::int64_t b = 0; b < n / 32; ++b) {
        const std::byte* blk = src + b * 17;
        const float d = e8m0_half(static_cast<std::uint8_t>(blk[0]));
        for (std::int64_t j = 0; j < 16; ++j) {
            const auto q = static_cast<std::uint8_t>(blk[1 + j]);
            dst[b * 32 + j] = kMxfp4Kvalues[q & 15] * d;
            dst[b * 32 + j + 16] = kMxfp4Kvalues[q >> 4] * d;
        }
    }
}

void dequantize_mxfp4_hf(const std::uint8_t* blocks, const std::uint8_t* scales, std::int64_t groups,
                         float* dst) noexcept {
    for (std::int64_t g = 0; g < groups; ++g) {
        // torch.ldexp(v, e − 127): exact, overflowing to ±inf only when v·2^(e−127) does (e = 255, |v| ≥ 1).
        const int e = static_cast<int>(scales[g]) - 127;
        for (std::int64_t j = 0; j < 16; ++j) {
            const std::uint8_t q = blocks[g * 16 + j];
            dst[g * 32 + 2 * j] = std::ldexp(kFp4Values[q & 15], e);
            dst[g * 32 + 2 * j + 1] = std::ldexp(kFp4Values[q >> 4], e);
        }
    }
}

// Q8_0: per 32 elements one f16 scale d and 32 signed bytes; y = q·d.
void dequantize_row_q8_0(const std::byte* src, float* dst, std::int64_t n) noexcept {
    for (std::int64_t b = 0; b < n / QK8_0; ++b) {
        const std::byte* blk = src + b * kQ8_0Bytes;
        const float d = f16_at(blk, 0);
        for (std::int64_t i = 0; i < QK8_0; ++i)
            dst[b * QK8_0 + i] = static_cast<float>(i8_at(blk, 2 + static_cast<std::size_t>(i))) * d;
    }
}

// Q5_0: per 32 elements one f16 scale d, 32 high bits qh (u32, bit j for
// element j) and 16 bytes of low nibbles (element j low, j + 16 high);
// y = (q − 16)·d with q = nibble | high bit << 4.
void dequantize_row_q5_0(const std::byte* src, float* dst, std::int64_t n) noexcept {
    for (std::int64_t b = 0; b < n / 32; ++b) {
        const std::byte* blk = src + b * 22;
        const float d = f16_at(blk, 0);
        const std::uint32_t qh = u8_at(blk, 2) | (u8_at(blk, 3) << 8) | (u8_at(blk, 4) << 16) |
                                 (static_cast<std::uint32_t>(u8_at(blk, 5)) << 24);
        for (int j = 0; j < 16; ++j) {
            const std::uint8_t q = u8_at(blk, 6 + static_cast<std::size_t>(j));
            const int x0 = ((q & 0x0f) | static_cast<int>(((qh >> j) << 4) & 0x10)) - 16;
            const int x1 = ((q >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10)) - 16;
            dst[b * 32 + j] = static_cast<float>(x0) * d;
            dst[b * 32 + j + 16] = static_cast<float>(x1) * d;
        }
    }
}

// Q4_K: 256 elements = 8 sub-blocks of 32. The 12 scale bytes q[0..11] pack
// eight 6-bit scales sc[j] and eight 6-bit mins m[j]:
//   j < 4:  sc = q[j] & 63,                          m = q[j+4] & 63
//   j ≥ 4:  sc = (q[j+4] & 15) | (q[j-4] >> 6) << 4,  m = (q[j+4] >> 4) | (q[j] >> 6) << 4
// i.e. the first four of each live in the low 6 bits of bytes 0–3 / 4–7, and
// the last four are split: low nibble/high nibble of bytes 8–11 plus the two
// spare top bits of bytes 0–3 / 4–7. Quants: 32-byte group p holds sub-block
// 2p in its low nibbles and 2p+1 in its high nibbles.
void dequantize_row_q4_k(const std::byte* src, float* dst, std::int64_t n) noexcept {
    for (std::int64_t b = 0; b < n / QK_K; ++b) {
        const std::byte* blk = src + b * kQ4_KBytes;
        const float d = f16_at(blk, 0);
        const float dmin = f16_at(blk, 2);
        const std::byte* q = blk + 4;
        const std::byte* qs = blk + 16;
        float* y = dst + b * QK_K;
        for (int j = 0; j < 8; ++j) {
            std::uint8_t sc = 0;
            std::uint8_t m = 0;
            if (j < 4) {
                sc = u8_at(q, j) & 63;
                m = u8_at(q, j + 4) & 63;
            } else {
                sc = static_cast<std::uint8_t>((u8_at(q, j + 4) & 15) | ((u8_at(q, j - 4) >> 6) << 4));
                m = static_cast<std::uint8_t>((u8_at(q, j + 4) >> 4) | ((u8_at(q, j) >> 6) << 4));
            }
            // As the reference: d' = d·sc and m' = dmin·m (both exact), then d'·q − m'.
            const float d_sub = d * static_cast<float>(sc);
            const float m_sub = dmin * static_cast<float>(m);
            const std::byte* group = qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; ++l) {
                const auto nibble = static_cast<float>((u8_at(group, l) >> shift) & 15);
                y[32 * j + l] = d_sub * nibble - m_sub;
            }
        }
    }
}

// Q6_K: 256 elements in two halves of 128. In half h, element r (0..127)
// takes its low 4 bits from ql[64h + r%64] (low nibble for r < 64, high
// nibble otherwise) and its high 2 bits from qh[32h + r%32], bit pair r/32;
// q = that 6-bit value − 32. Sixteen int8 scales, one per 16 elements; d is
// the f16 at the end of the block. y = (d·scale)·q, rounded in that order.
void dequantize_row_q6_k(const std::byte* src, float* dst, std::int64_t n) noexcept {
    for (std::int64_t b = 0; b < n / QK_K; ++b) {
        const std::byte* blk = src + b * kQ6_KBytes;
        const std::byte* ql = blk;
        const std::byte* qh = blk + 128;
        const std::byte* scales = blk + 192;
        const float d = f16_at(blk, 208);
        float* y = dst + b * QK_K;
        for (int e = 0; e < QK_K; ++e) {
            const int h = e / 128;
            const int r = e % 128;
            const int lo = (u8_at(ql, 64 * h + r % 64) >> (4 * (r / 64))) & 15;
            const int hi = (u8_at(qh, 32 * h + r % 32) >> (2 * (r / 32))) & 3;
            const int q = (lo | (hi << 4)) - 32;
            const float d_sub = d * static_cast<float>(i8_at(scales, e / 16));
            y[e] = d_sub * static_cast<float>(q);
        }
    }
}

void dequantize_row(GgmlType type, const std::byte* src, float* dst, std::int64_t n) {
    const GgmlTypeTraits tr = ggml_traits(type);
    KVASIR_CHECK(ggml_type_dequantizable(type), ErrorCode::unsupported,
                 "cannot dequantise ggml type {} (supported: {})", tr.name, ggml_dequantizable_types());
    KVASIR_ASSERT(n >= 0 && n % tr.block_size == 0);
    switch (type) {
        case GgmlType::F32:
            if (n != 0) std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);  // bit copy: keeps NaN payloads
            return;
        case GgmlType::F16:
            for (std::int64_t i = 0; i < n; ++i) dst[i] = f16_at(src, static_cast<std::size_t>(2 * i));
            return;
        case GgmlType::BF16:
            for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_f32(u16_at(src, static_cast<std::size_t>(2 * i)));
            return;
        case GgmlType::Q8_0: dequantize_row_q8_0(src, dst, n); return;
        case GgmlType::Q5_0: dequantize_row_q5_0(src, dst, n); return;
        case GgmlType::Q4_K: dequantize_row_q4_k(src, dst, n); return;
        case GgmlType::Q6_K: dequantize_row_q6_k(src, dst, n); return;
        case GgmlType::MXFP4: dequantize_row_mxfp4(src, dst, n); return;
        default: break;
    }
    KVASIR_ASSERT(false);
}

}  // namespace kvasir
