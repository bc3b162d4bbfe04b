// Portable matmul for CPUs without AVX2/FMA: per output element, 8 interleaved
// partial sums over k (the order a 256-bit SIMD dot product produces) folded
// pairwise, each product rounded before it is added. Its order differs from
// the AVX2 path's single FMA chain; both are deterministic and independent of
// the thread count (threads split the outputs, never K).
#include "kernels/cpu/matmul.hpp"

#include "kernels/cpu/f16_round.hpp"
#include "kvasir/core/dtype.hpp"

#include <vector>

namespace kvasir::kernels {

bool cpu_has_avx2_fma() noexcept { return cpu_isa() == CpuIsa::avx2 || cpu_isa() == CpuIsa::avx512; }
bool cpu_has_avx512() noexcept { return cpu_isa() == CpuIsa::avx512; }

void matmul_f16acc(const float* x, const float* w, float* y, std::int64_t t_count, std::int64_t n_count,
                   std::int64_t k_count, int threads) {
    switch (cpu_isa()) {
#if defined(__x86_64__)
        case CpuIsa::avx512: return matmul_f16acc_avx512(x, w, y, t_count, n_count, k_count, threads);
        case CpuIsa::avx2: return matmul_f16acc_avx2(x, w, y, t_count, n_count, k_count, threads);
#endif
        default: break;  // (no NEON version: the generic one gives the same bits)
    }
    matmul_f16acc_generic(x, w, y, t_count, n_count, k_count, threads);
}

void matmul_f64(const double* x, const void* w, DType w_dtype, double* y, std::int64_t t_count, std::int64_t n_count,
                std::int64_t k_count, int threads) {
    switch (cpu_isa()) {
#if defined(__x86_64__)
        case CpuIsa::avx512: return avx2::matmul_f64(x, w, w_dtype, y, t_count, n_count, k_count, threads, true);
        case CpuIsa::avx2: return avx2::matmul_f64(x, w, w_dtype, y, t_count, n_count, k_count, threads, false);
#elif defined(__aarch64__)
        case CpuIsa::neon: return neon::matmul_f64(x, w, w_dtype, y, t_count, n_count, k_count, threads, false);
#endif
        default: break;
    }
    matmul_f64_generic(x, w, w_dtype, y, t_count, n_count, k_count, threads);
}

void matmul_f32_generic(const float* x, const float* w, float* y, std::int64_t t_count, std::int64_t n_count,
                        std::int64_t k_count, int threads) {
    threads = threads_for_work(threads, 2.0 * static_cast<double>(t_count) * static_cast<double>(n_count) * static_cast<double>(k_count));
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

void matmul_f16acc_generic(const float* x, const float* w, float* y, std::int64_t t_count, std::int64_t n_count,
                           std::int64_t k_count, int threads) {
    // Each output is one serial chain of round-after-add, which is latency
    // bound; eight independent outputs are advanced together so the chains
    // overlap. The arithmetic of every single output is unchanged.
    constexpr std::int64_t kChains = 8;
    const std::int64_t n_blocks = (n_count + kChains - 1) / kChains;
    threads = threads_for_work(threads, 2.0 * static_cast<double>(t_count) * static_cast<double>(n_count) * static_cast<double>(k_count));
#pragma omp parallel for schedule(static) num_threads(threads)
    for (std::int64_t b = 0; b < n_blocks; ++b) {
        const std::int64_t n0 = b * kChains;
        const std::int64_t nn = n0 + kChains <= n_count ? kChains : n_count - n0;
        for (std::int64_t t = 0; t < t_count; ++t) {
            const float* xr = x + t * k_count;
            double acc[kChains] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (nn == kChains) {
                for (std::int64_t k = 0; k < k_count; ++k) {
                    const double xv = xr[k];
                    for (std::int64_t j = 0; j < kChains; ++j)
                        acc[j] = round_f16_fast(acc[j] + xv * static_cast<double>(w[(n0 + j) * k_count + k]));
                }
            } else {
                for (std::int64_t j = 0; j < nn; ++j)
                    for (std::int64_t k = 0; k < k_count; ++k)
                        acc[j] = round_f16_fast(acc[j] + static_cast<double>(xr[k]) * static_cast<double>(w[(n0 + j) * k_count + k]));
            }
            for (std::int64_t j = 0; j < nn; ++j) y[t * n_count + n0 + j] = static_cast<float>(acc[j]);
        }
    }
}

void matmul_f64_generic(const double* x, const void* w, DType w_dtype, double* y, std::int64_t t_count,
                        std::int64_t n_count, std::int64_t k_count, int threads) {
    threads = threads_for_work(threads, 2.0 * static_cast<double>(t_count) * static_cast<double>(n_count) * static_cast<double>(k_count));
    // One row of w widened at a time (K doubles per thread), then the
    // textbook dot product with every row of x.
#pragma omp parallel num_threads(threads)
    {
        std::vector<double> row(static_cast<std::size_t>(k_count > 0 ? k_count : 0));
#pragma omp for schedule(static)
        for (std::int64_t n = 0; n < n_count; ++n) {
            for (std::int64_t k = 0; k < k_count; ++k)
                row[static_cast<std::size_t>(k)] = load_as_f64(w_dtype, w, static_cast<std::size_t>(n * k_count + k));
            for (std::int64_t t = 0; t < t_count; ++t) {
                const double* xr = x + t * k_count;
                double s = 0.0;
                for (std::int64_t k = 0; k < k_count; ++k) s += xr[k] * row[static_cast<std::size_t>(k)];
                y[t * n_count + n] = s;
            }
        }
    }
}

}  // namespace kvasir::kernels
