// The seeded fill's block kernel (rng_math.hpp) compiled for AVX2.
#include "kvasir/core/rng_math.hpp"

namespace kvasir::rng_detail {

void draw_blocks_avx2(std::uint64_t seed, std::uint64_t stream, bool normal, double a, double scale, std::uint64_t b0,
                      std::uint64_t count, double* out) noexcept {
    draw_blocks_kernel(seed, stream, normal, a, scale, b0, count, out);
}

}  // namespace kvasir::rng_detail
