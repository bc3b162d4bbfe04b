#include "kvasir/core/dtype.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>

namespace kvasir {

std::size_t dtype_size(DType t) noexcept {
    switch (t) {
        case DType::f64: return 8;
        case DType::f32: return 4;
        case DType::f16: return 2;
        case DType::bf16: return 2;
        case DType::i32: return 4;
    }
    return 0;
}

const char* dtype_name(DType t) noexcept {
    switch (t) {
        case DType::f64: return "f64";
        case DType::f32: return "f32";
        case DType::f16: return "f16";
        case DType::bf16: return "bf16";
        case DType::i32: return "i32";
    }
    return "?";
}

std::optional<DType> parse_dtype(std::string_view s) {
    std::string lower(s);
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    for (DType t : {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i32})
        if (lower == dtype_name(t)) return t;
    return std::nullopt;
}

bool dtype_is_float(DType t) noexcept { return t != DType::i32; }

// Round a finite double to a binary format with `mantissa_bits` explicit
// fraction bits and minimum normal exponent `emin`; values whose rounded
// magnitude reaches 2^(emax+1) overflow to infinity. A single rounding: the
// quantum (ulp) is a power of two, so x/quantum is exact and nearbyint() does
// the only rounding (the default mode is round-to-nearest-even).
static double round_binary(double x, int mantissa_bits, int emin, int emax) noexcept {
    if (!std::isfinite(x) || x == 0.0) return x;
    int e = std::ilogb(x);
    if (e < emin) e = emin;  // subnormal range: fixed quantum
    const double quantum = std::ldexp(1.0, e - mantissa_bits);
    const double r = std::nearbyint(x / quantum) * quantum;
    const double overflow = std::ldexp(1.0, emax + 1);
    if (std::fabs(r) >= overflow) return std::copysign(std::numeric_limits<double>::infinity(), x);
    return r;
}

double round_to_f16(double x) noexcept {
    if (std::isnan(x)) return x;
    return round_binary(x, 10, -14, 15);
}

namespace {
int mantissa_int(float v) noexcept {
    std::int32_t i = 0;
    std::memcpy(&i, &v, sizeof(i));
    return (i & 0x007fffff) - 0x00400000;
}
}  // namespace

double round_to_fp8_e4m3(double x) noexcept {
    if (std::isnan(x)) return x;
    const double a = std::fabs(x);
    if (a >= 448.0) return std::copysign(448.0, x);
    // The spacing of e4m3 values around a: 2^(e − 3) in the binade [2^e, 2^(e+1)),
    // 2^−9 below the smallest normal 2^−6. a / spacing is exact (a power of two);
    // nearbyint rounds it to even, which is the even mantissa.
    int e = 0;
    std::frexp(a, &e);  // a = m·2^e, m in [0.5, 1): the binade is 2^(e−1)
    const double spacing = std::ldexp(1.0, std::max(e - 1, -6) - 3);
    return std::copysign(std::nearbyint(a / spacing) * spacing, x);
}

int ggml_nearest_int(float f) noexcept { return mantissa_int(f + 12582912.f); }
int ggml_nearest_int_of_product(float a, float b) noexcept { return mantissa_int(std::fma(a, b, 12582912.f)); }

double round_to_bf16(double x) noexcept {
    if (std::isnan(x)) return x;
    return round_binary(x, 7, -126, 127);
}

double round_to(DType t, double x) noexcept {
    switch (t) {
        case DType::f64: return x;
        case DType::f32: return static_cast<double>(static_cast<float>(x));
        case DType::f16: return round_to_f16(x);
        case DType::bf16: return round_to_bf16(x);
        case DType::i32: return std::nearbyint(x);
    }
    return x;
}

std::uint16_t f32_to_f16_bits(float x) noexcept {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
    const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
    if (std::isnan(x)) return static_cast<std::uint16_t>(sign | 0x7e00u | ((bits >> 13) & 0x3ffu));
    const double r = round_to_f16(static_cast<double>(x));  // exact single rounding
    if (std::isinf(r)) return static_cast<std::uint16_t>(sign | 0x7c00u);
    const double a = std::fabs(r);
    if (a == 0.0) return sign;
    int e = std::ilogb(a);
    if (e < -14) {  // subnormal: a = m · 2^-24
        return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::ldexp(a, 24)));
    }
    const auto mant = static_cast<std::uint16_t>(std::ldexp(a, 10 - e) - 1024.0);
    return static_cast<std::uint16_t>(sign | ((e + 15) << 10) | mant);
}

float f16_bits_to_f32(std::uint16_t h) noexcept {
    const std::uint32_t sign = (h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    const std::uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        const float v = std::ldexp(static_cast<float>(mant), -24);
        return sign ? -v : v;
    }
    return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

std::uint16_t f32_to_bf16_bits(float x) noexcept {
    std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
    if (std::isnan(x)) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
    const std::uint32_t lsb = (bits >> 16) & 1u;
    bits += 0x7fffu + lsb;  // RNE on the dropped 16 bits; overflow carries into inf correctly
    return static_cast<std::uint16_t>(bits >> 16);
}

float bf16_bits_to_f32(std::uint16_t h) noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

double load_as_f64(DType t, const void* data, std::size_t i) noexcept {
    switch (t) {
        case DType::f64: return static_cast<const double*>(data)[i];
        case DType::f32: return static_cast<const float*>(data)[i];
        case DType::f16: return f16_bits_to_f32(static_cast<const std::uint16_t*>(data)[i]);
        case DType::bf16: return bf16_bits_to_f32(static_cast<const std::uint16_t*>(data)[i]);
        case DType::i32: return static_cast<const std::int32_t*>(data)[i];
    }
    return 0.0;
}

void store_from_f64(DType t, void* data, std::size_t i, double x) noexcept {
    switch (t) {
        case DType::f64: static_cast<double*>(data)[i] = x; return;
        case DType::f32: static_cast<float*>(data)[i] = static_cast<float>(x); return;
        case DType::f16:
            static_cast<std::uint16_t*>(data)[i] = f32_to_f16_bits(static_cast<float>(round_to_f16(x)));
            return;
        case DType::bf16:
            static_cast<std::uint16_t*>(data)[i] = f32_to_bf16_bits(static_cast<float>(round_to_bf16(x)));
            return;
        case DType::i32: {
            double r = std::nearbyint(x);
            if (std::isnan(r)) r = 0;
            r = std::clamp(r, -2147483648.0, 2147483647.0);
            static_cast<std::int32_t*>(data)[i] = static_cast<std::int32_t>(r);
            return;
        }
    }
}

}  // namespace kvasir
