// Fast exact rounding of a double to f16 precision, for the inner loop of
// f16-accumulation emulation. Normal-range values are rounded on the bit
// pattern (round-to-nearest-even on the 42 dropped fraction bits; a carry
// correctly bumps the exponent); zeros, subnormals, overflow and non-finite
// values take the general path in kvasir::round_to_f16. Tests pin the two
// together.
#pragma once

#include "kvasir/core/dtype.hpp"

#include <bit>
#include <cstdint>
#include <limits>

namespace kvasir::kernels {

inline double round_f16_fast(double x) noexcept {
    std::uint64_t bits = std::bit_cast<std::uint64_t>(x);
    const int e = static_cast<int>((bits >> 52) & 0x7ffu) - 1023;
    if (e < -14 || e > 15) return round_to_f16(x);
    constexpr std::uint64_t drop = 42;
    constexpr std::uint64_t mask = (std::uint64_t{1} << drop) - 1;
    bits += (mask >> 1) + ((bits >> drop) & 1u);
    bits &= ~mask;
    const double r = std::bit_cast<double>(bits);
    // 65504 is the largest half; anything that rounded past it overflows.
    if (r > 65504.0 || r < -65504.0) return x > 0 ? std::numeric_limits<double>::infinity()
                                                  : -std::numeric_limits<double>::infinity();
    return r;
}

}  // namespace kvasir::kernels
