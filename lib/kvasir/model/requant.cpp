// The quantisers of requant.hpp, in the reference's operation order and
// with no product fused into an add (this library is built with
// -ffp-contract=off; llama.cpp's build of these functions fuses none either).
#include "kvasir/model/requant.hpp"

#include "kvasir/core/dtype.hpp"
#include "kvasir/core/error.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <vector>

namespace kvasir {

namespace {

void put_f16(std::byte* p, float x) {
    const std::uint16_t h = f32_to_f16_bits(x);
    p[0] = static_cast<std::byte>(h & 0xff);
    p[1] = static_cast<std::byte>(h >> 8);
}

// quantize_row_q8_0_ref: d = max|x| / 127, q = roundf(x · (1/d)).
void quantize_q8_0(const float* x, std::byte* y, std::int64_t n) {
    for (std::int64_t b = 0; b < n / 32; ++b, x += 32, y += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_f16(y, d);
        for (int j = 0; j < 32; ++j) y[2 + j] = static_cast<std::byte>(static_cast<std::int8_t>(std::roundf(x[j] * id)));
    }
}

// quantize_row_q5_0_ref: d = (the element of largest magnitude) / −16,
// q = min(31, (int8)(x·(1/d) + 16.5)).
void quantize_q5_0(const float* x, std::byte* y, std::int64_t n) {
    for (std::int64_t b = 0; b < n / 32; ++b, x += 32, y += 22) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; ++j)
            if (amax < std::fabs(x[j])) {
                amax = std::fabs(x[j]);
                max = x[j];
            }
        const float d = max / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_f16(y, d);
        std::uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const auto q = [&](float v) {
                return static_cast<std::uint8_t>(std::min(31, static_cast<int>(static_cast<std::int8_t>(v * id + 16.5f))));
            };
            const std::uint8_t q0 = q(x[j]), q1 = q(x[j + 16]);
            y[6 + j] = static_cast<std::byte>((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= static_cast<std::uint32_t>((q0 & 0x10u) >> 4) << j;
            qh |= static_cast<std::uint32_t>((q1 & 0x10u) >> 4) << (j + 16);
        }
        for (int k = 0; k < 4; ++k) y[2 + k] = static_cast<std::byte>((qh >> (8 * k)) & 0xff);
    }
}

// make_qkx2_quants(32, 15, x, w, L, &min, Laux, −1, 0.1, 20, false): the
// scale and (negated) min of one Q4_K sub-block, searched over 21 candidate
// inverse scales for the least weighted squared error. Returns the scale;
// *the_min receives −min.
float make_qkx2_quants(const float* x, const float* w, std::uint8_t* L, float* the_min) {
    constexpr int n = 32, nmax = 15, nstep = 20;
    constexpr float rmin = -1.0f, rdelta = 0.1f;
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        std::fill(L, L + n, std::uint8_t{0});
        *the_min = -min;
        return 0.0f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        const int l = std::clamp(ggml_nearest_int(iscale * (x[i] - min)), 0, nmax);
        L[i] = static_cast<std::uint8_t>(l);
        float diff = scale * static_cast<float>(l) + min - x[i];
        diff = diff * diff;
        best_error += w[i] * diff;
    }
    std::array<std::uint8_t, n> laux{};
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * static_cast<float>(is) + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            const int l = std::clamp(ggml_nearest_int(iscale * (x[i] - min)), 0, nmax);
            laux[i] = static_cast<std::uint8_t>(l);
            const float wl = w[i] * static_cast<float>(l);
            sum_l += wl;
            sum_l2 += wl * static_cast<float>(l);
            sum_xl += wl * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * static_cast<float>(laux[i]) + this_min - x[i];
                diff = diff * diff;
                cur_error += w[i] * diff;
            }
            if (cur_error < best_error) {
                std::copy(laux.begin(), laux.end(), L);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

// quantize_row_q4_K_ref: eight sub-blocks of 32, each fitted by
// make_qkx2_quants with weights av_x + |x|; the eight scales and mins
// quantised to 6 bits against the largest of each (f16 d and dmin), then
// every element re-quantised against its sub-block's final scale and min.
void quantize_q4_k(const float* x, std::byte* y, std::int64_t n) {
    for (std::int64_t b = 0; b < n / 256; ++b, x += 256, y += 144) {
        std::array<std::uint8_t, 256> L{};
        std::array<float, 8> scales{}, mins{};
        float weights[32];
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 8; ++j) {
            float sum_x2 = 0;
            for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
            const float av_x = std::sqrt(sum_x2 / 32);
            for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
            scales[j] = make_qkx2_quants(x + 32 * j, weights, L.data() + 32 * j, &mins[j]);
            max_scale = std::max(max_scale, scales[j]);
            max_min = std::max(max_min, mins[j]);
        }
        const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
        const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
        std::array<std::uint8_t, 12> sc{};
        for (int j = 0; j < 8; ++j) {
            const auto ls = static_cast<std::uint8_t>(std::min(63, static_cast<int>(static_cast<std::uint8_t>(
                                                                       ggml_nearest_int(inv_scale * scales[j])))));
            const auto lm = static_cast<std::uint8_t>(std::min(63, static_cast<int>(static_cast<std::uint8_t>(
                                                                       ggml_nearest_int(inv_min * mins[j])))));
            if (j < 4) {
                sc[j] = ls;
                sc[j + 4] = lm;
            } else {
                sc[j + 4] = static_cast<std::uint8_t>((ls & 0xf) | ((lm & 0xf) << 4));
                sc[j - 4] |= static_cast<std::uint8_t>((ls >> 4) << 6);
                sc[j] |= static_cast<std::uint8_t>((lm >> 4) << 6);
            }
        }
        const std::uint16_t d16 = f32_to_f16_bits(max_scale / 63.f), dmin16 = f32_to_f16_bits(max_min / 63.f);
        const float d = f16_bits_to_f32(d16), dmin = f16_bits_to_f32(dmin16);
        for (int j = 0; j < 8; ++j) {
            const int s = j < 4 ? sc[j] & 63 : (sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4);
            const int m = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
            const float ds = d * static_cast<float>(s);
            if (ds == 0.0f) continue;
            const float dm = dmin * static_cast<float>(m);
            for (int i = 0; i < 32; ++i)
                L[32 * j + i] = static_cast<std::uint8_t>(std::clamp(ggml_nearest_int((x[32 * j + i] + dm) / ds), 0, 15));
        }
        y[0] = static_cast<std::byte>(d16 & 0xff);
        y[1] = static_cast<std::byte>(d16 >> 8);
        y[2] = static_cast<std::byte>(dmin16 & 0xff);
        y[3] = static_cast<std::byte>(dmin16 >> 8);
        for (int k = 0; k < 12; ++k) y[4 + k] = static_cast<std::byte>(sc[k]);
        for (int g = 0; g < 4; ++g)
            for (int l = 0; l < 32; ++l)
                y[16 + 32 * g + l] = static_cast<std::byte>(L[64 * g + l] | (L[64 * g + l + 32] << 4));
    }
}

// quantize_row_mxfp4_ref: the shared exponent e = floor(log2 max|x|) − 2 + 127
// (e8m0; 0 for an all-zero block), d = 2^(e − 128), each element the first of
// the sixteen values kvalues·d nearest to it.

void quantize_mxfp4(const float* x, std::byte* y, std::int64_t n) {
    for (std::int64_t b = 0; b < n / 32; ++b, x += 32, y += 17) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
        const auto e = static_cast<std::uint8_t>(amax > 0.0f ? static_cast<int>(std::floor(std::log2(amax)) - 2 + 127) : 0);
        const float d = e8m0_half(e);
        const auto best = [d](float v) {
            int best_i = 0;
            float best_err = std::fabs(kMxfp4Kvalues[0] * d - v);
            for (int i = 1; i < 16; ++i)
                if (const float err = std::fabs(kMxfp4Kvalues[i] * d - v); err < best_err) {
                    best_i = i;
                    best_err = err;
                }
            return static_cast<std::uint8_t>(best_i);
        };
        y[0] = static_cast<std::byte>(e);
        for (int j = 0; j < 16; ++j) y[1 + j] = static_cast<std::byte>(best(x[j]) | (best(x[j + 16]) << 4));
    }
}

}  // namespace

bool ggml_type_quantizable(GgmlType type) noexcept {
    return type == GgmlType::Q8_0 || type == GgmlType::Q5_0 || type == GgmlType::Q4_K || type == GgmlType::MXFP4;
}

std::optional<GgmlType> parse_quant_type(std::string_view name) noexcept {
    for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::MXFP4}) {
        const std::string_view want = ggml_type_name(t);
        if (want.size() == name.size() &&
            std::equal(want.begin(), want.end(), name.begin(), [](char a, char b) {
                return std::toupper(static_cast<unsigned char>(a)) == std::toupper(static_cast<unsigned char>(b));
            }))
            return t;
    }
    return std::nullopt;
}

void quantize_row(GgmlType type, const float* src, std::byte* dst, std::int64_t n) {
    KVASIR_CHECK(ggml_type_quantizable(type), ErrorCode::unsupported, "cannot quantise to ggml type {} (supported: "
                 "Q8_0, Q5_0, Q4_K, MXFP4)", ggml_type_name(type));
    KVASIR_ASSERT(n >= 0 && n % ggml_traits(type).block_size == 0);
    switch (type) {
        case GgmlType::Q8_0: quantize_q8_0(src, dst, n); return;
        case GgmlType::Q5_0: quantize_q5_0(src, dst, n); return;
        case GgmlType::Q4_K: quantize_q4_k(src, dst, n); return;
        case GgmlType::MXFP4: quantize_mxfp4(src, dst, n); return;
        default: break;
    }
    KVASIR_ASSERT(false);
}

GgmlType quant_type_for_row(GgmlType target, std::int64_t row_length) noexcept {
    if (row_length % ggml_traits(target).block_size == 0) return target;
    const GgmlType fallback = target == GgmlType::Q4_K ? GgmlType::Q5_0 : target;
    return row_length % ggml_traits(fallback).block_size == 0 ? fallback : GgmlType::F16;
}

void requantize_rows(GgmlType target, const float* src, float* dst, std::int64_t rows, std::int64_t row_length) {
    const GgmlType type = quant_type_for_row(target, row_length);
    if (type == GgmlType::F16) {
        for (std::int64_t i = 0; i < rows * row_length; ++i) dst[i] = f16_bits_to_f32(f32_to_f16_bits(src[i]));
        return;
    }
    const GgmlTypeTraits tr = ggml_traits(type);
    std::vector<std::byte> blocks(static_cast<std::size_t>(row_length / tr.block_size) * tr.block_bytes);
    for (std::int64_t r = 0; r < rows; ++r) {
        quantize_row(type, src + r * row_length, blocks.data(), row_length);
        dequantize_row(type, blocks.data(), dst + r * row_length, row_length);
    }
}

}  // namespace kvasir
