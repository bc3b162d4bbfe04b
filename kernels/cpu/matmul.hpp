// CPU matmul kernels: y[T, N] = x[T, K] · w[N, K]ᵀ in f32.
//
// Both operands are K-contiguous (activations row-major, weights in the
// nn.Linear [out, in] layout), so the kernel is a register-blocked dot
// product: 3 rows of x × 4 rows of w per tile, 8-lane partial sums folded at
// the end. Each output element is reduced by exactly one thread in a fixed
// order, so results do not depend on the thread count. The AVX2 variant fuses
// products into sums (FMA, one rounding); the generic one rounds twice.
#pragma once

#include <cstdint>

namespace kvasir::kernels {

bool cpu_has_avx2_fma() noexcept;

void matmul_f32_avx2(const float* x, const float* w, float* y, std::int64_t t_count, std::int64_t n_count,
                     std::int64_t k_count, int threads);
void matmul_f32_generic(const float* x, const float* w, float* y, std::int64_t t_count, std::int64_t n_count,
                        std::int64_t k_count, int threads);

// f16 accumulation, emulated exactly: every product is exact in double
// (24+24 bits) and the running sum is rounded to half after every add, the
// way an F16-accumulating FMA unit behaves.
void matmul_f16acc(const float* x, const float* w, float* y, std::int64_t t_count, std::int64_t n_count,
                   std::int64_t k_count, int threads);

}  // namespace kvasir::kernels
