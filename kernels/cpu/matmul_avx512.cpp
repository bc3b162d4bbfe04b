// The f32 GEMM's micro-tile on AVX-512 (fma_kernels_impl.hpp runs the driver,
// the packing and every other path): rows 1 … 6 of a packed x panel against
// one packed 16-column w panel, one zmm a row. Per K summation block each
// element is one FMA chain in k order from +0, then stored or added to c —
// the AVX2 tile's arithmetic lane for lane, so the same bits. Everything
// here is inlined or local: no weak symbol the linker could keep for CPUs
// without AVX-512 (tests/layout/check_isa_objects.py).
#include "kernels/cpu/matmul.hpp"

#include <immintrin.h>

namespace kvasir::kernels {
namespace {

template <int M>
void block(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, bool add) {
    __m512 acc[M];
#pragma GCC unroll 6
    for (int i = 0; i < M; ++i) acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (std::int64_t k = 0; k < kc; ++k) {
        const __m512 bv = _mm512_load_ps(b + k * kGemmNR);
#pragma GCC unroll 6
        for (int i = 0; i < M; ++i) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(a[k * kGemmMR + i]), bv, acc[i]);
    }
#pragma GCC unroll 6
    for (int i = 0; i < M; ++i)
        _mm512_storeu_ps(c + i * ldc, add ? _mm512_add_ps(_mm512_loadu_ps(c + i * ldc), acc[i]) : acc[i]);
}

template <int M>
void tile(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, bool add) {
    for (std::int64_t k = 0; k < kc; k += kMatmulKBlock) {
        const std::int64_t n = kc - k < kMatmulKBlock ? kc - k : kMatmulKBlock;
        block<M>(n, a + k * kGemmMR, b + k * kGemmNR, c, ldc, add || k > 0);
    }
}

}  // namespace

void matmul_tile_avx512(int m, std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, bool add) {
    static_assert(kGemmMR == 6 && kGemmNR == 16, "one zmm a row of the 16-column panel, up to 6 rows");
    switch (m) {
        case 6: return tile<6>(kc, a, b, c, ldc, add);
        case 5: return tile<5>(kc, a, b, c, ldc, add);
        case 4: return tile<4>(kc, a, b, c, ldc, add);
        case 3: return tile<3>(kc, a, b, c, ldc, add);
        case 2: return tile<2>(kc, a, b, c, ldc, add);
        default: return tile<1>(kc, a, b, c, ldc, add);
    }
}

}  // namespace kvasir::kernels
