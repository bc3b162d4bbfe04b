// The f64 oracle's micro-tile on AVX-512 (matmul_f64_impl.hpp runs the
// driver: jobs, K blocks, panel packing): up to 8 rows of x against one
// packed panel of 8 columns, one zmm per row, a separate multiply and add per
// k ascending (never fused: the textbook loop's bits, as the AVX2 tile's).
// Everything here is inlined or local: no weak symbol the linker could pick
// for CPUs without AVX-512 (tests/layout/check_isa_objects.py).
#include "kernels/cpu/matmul.hpp"

#include <immintrin.h>

namespace kvasir::kernels {
namespace {

template <int MR>
void tile(const double* x, std::int64_t ldx, const double* bp, std::int64_t kc, double* y, std::int64_t ldy,
          std::int64_t valid, bool first) {
    const __mmask8 cols = static_cast<__mmask8>(valid >= 8 ? 0xff : (1u << valid) - 1u);
    __m512d acc[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) acc[r] = first ? _mm512_setzero_pd() : _mm512_maskz_loadu_pd(cols, y + r * ldy);
    for (std::int64_t k = 0; k < kc; ++k) {
        const __m512d b = _mm512_load_pd(bp + k * 8);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) acc[r] = _mm512_add_pd(acc[r], _mm512_mul_pd(_mm512_set1_pd(x[r * ldx + k]), b));
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) _mm512_mask_storeu_pd(y + r * ldy, cols, acc[r]);
}

}  // namespace

void matmul_f64_tile_avx512(int rows, const double* x, std::int64_t ldx, const double* bp, std::int64_t kc, double* y,
                            std::int64_t ldy, std::int64_t valid, bool first) {
    switch (rows) {
        case 8: return tile<8>(x, ldx, bp, kc, y, ldy, valid, first);
        case 7: return tile<7>(x, ldx, bp, kc, y, ldy, valid, first);
        case 6: return tile<6>(x, ldx, bp, kc, y, ldy, valid, first);
        case 5: return tile<5>(x, ldx, bp, kc, y, ldy, valid, first);
        case 4: return tile<4>(x, ldx, bp, kc, y, ldy, valid, first);
        case 3: return tile<3>(x, ldx, bp, kc, y, ldy, valid, first);
        case 2: return tile<2>(x, ldx, bp, kc, y, ldy, valid, first);
        default: return tile<1>(x, ldx, bp, kc, y, ldy, valid, first);
    }
}

}  // namespace kvasir::kernels
