// What the kernels build from the SIMD vocabulary the same way on every ISA,
// defined in the ISA's namespace: included at the end of avx2_load.hpp and
// neon_load.hpp, which define KVASIR_FMA_ISA (one ISA per translation unit).
#pragma once

#include "kernels/cpu/matmul.hpp"

namespace kvasir::kernels::KVASIR_FMA_ISA {

// The 8×8 block w[row … row+7, k … k+7] transposed into r[0..7] (r[j] =
// column k+j, lane i = row+i), converted and rounded: f32 as two 8×4 blocks
// (load_transposed4_f32, the ISA's cheapest transpose), f16/bf16 as eight
// converted rows and one 8×8 transpose.
template <WeightFormat F, WeightRounding R>
[[gnu::always_inline]] inline void load_transposed8(const void* w, i64 row, i64 k_count, i64 k, vf8 r[8]) {
    if constexpr (F == WeightFormat::f32) {
        load_transposed4_f32<R>(static_cast<const float*>(w), row, k_count, k, r);
        load_transposed4_f32<R>(static_cast<const float*>(w), row, k_count, k + 4, r + 4);
    } else {
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) r[i] = load8<F, R>(w, (row + i) * k_count + k);
        transpose8(r);
    }
}

}  // namespace kvasir::kernels::KVASIR_FMA_ISA
