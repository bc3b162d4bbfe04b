// Portable matmul for CPUs without AVX2/FMA: same tiling and lane structure
// as the AVX2 kernel, but each product is rounded before it is added.
#include "kernels/cpu/matmul.hpp"

#include "kernels/cpu/f16_round.hpp"
#include "kvasir/core/dtype.hpp"

namespace kvasir::kernels {

bool cpu_has_avx2_fma() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

void matmul_f32_generic(const float* x, const float* w, float* y, std::int64_t t_count, std::int64_t n_count,
                        std::int64_t k_count, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (std::int64_t n = 0; n < n_count; ++n) {
        const float* wr = w + n * k_count;
        for (std::int64_t t = 0; t < t_count; ++t) {
            const float* xr = x + t * k_count;
            float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            const std::int64_t k_vec = k_count & ~std::int64_t{7};
            for (std::int64_t k = 0; k < k_vec; k += 8)
                for (int l = 0; l < 8; ++l) lanes[l] += xr[k + l] * wr[k + l];
            float s = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
            for (std::int64_t k = k_vec; k < k_count; ++k) s += xr[k] * wr[k];
            y[t * n_count + n] = s;
        }
    }
}

void matmul_f16acc(const float* x, const float* w, float* y, std::int64_t t_count, std::int64_t n_count,
                   std::int64_t k_count, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (std::int64_t n = 0; n < n_count; ++n) {
        const float* wr = w + n * k_count;
        for (std::int64_t t = 0; t < t_count; ++t) {
            const float* xr = x + t * k_count;
            double acc = 0.0;
            for (std::int64_t k = 0; k < k_count; ++k)
                acc = round_f16_fast(acc + static_cast<double>(xr[k]) * static_cast<double>(wr[k]));
            y[t * n_count + n] = static_cast<float>(acc);
        }
    }
}

}  // namespace kvasir::kernels
