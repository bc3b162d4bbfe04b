// The fused kernels' entry points (matmul.hpp): the ISA's kernels that
// cpu_isa() picks, and what every ISA shares (the packed GEMV's layout).
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/matmul.hpp"

#include <cstdlib>

namespace kvasir::kernels {

namespace {

const FmaKernels& fma_kernels() {
    static const FmaKernels* const chosen = []() -> const FmaKernels* {
#if defined(__x86_64__)
        if (cpu_has_avx2_fma()) return &avx2::kFmaKernels;
#elif defined(__aarch64__)
        if (cpu_isa() == CpuIsa::neon) return &neon::kFmaKernels;
#endif
        return nullptr;
    }();
    if (chosen == nullptr) std::abort();  // a caller's bug: cpu_has_fma_kernels() is false
    return *chosen;
}

}  // namespace

bool cpu_has_fma_kernels() noexcept { return cpu_isa() != CpuIsa::generic; }

void matmul_fma(const float* x, const void* w, WeightFormat format, WeightRounding rounding, float* y,
                std::int64_t t_count, std::int64_t n_count, std::int64_t k_count, int threads, WeightRounding io_rounding) {
    fma_kernels().matmul(x, w, format, rounding, y, t_count, n_count, k_count, threads, io_rounding);
}

void matmul_f32_fma(const float* x, const float* w, float* y, std::int64_t t_count, std::int64_t n_count,
                    std::int64_t k_count, int threads) {
    matmul_fma(x, w, WeightFormat::f32, WeightRounding::none, y, t_count, n_count, k_count, threads);
}

void pack_gemv(const void* w, WeightFormat format, WeightRounding rounding, std::int64_t n_count, std::int64_t k_count,
               void* packed, int threads) {
    fma_kernels().pack_gemv(w, format, rounding, n_count, k_count, packed, threads);
}

void gemv_packed(const float* x, const void* packed, WeightFormat panel, float* y, std::int64_t t_count,
                 std::int64_t n_count, std::int64_t k_count, int threads, WeightRounding io_rounding) {
    fma_kernels().gemv_packed(x, packed, panel, y, t_count, n_count, k_count, threads, io_rounding);
}

void gemv_packed_batch(std::span<const PackedGemvJob> jobs, int threads, WeightRounding io_rounding) {
    fma_kernels().gemv_packed_batch(jobs, threads, io_rounding);
}

void convert_rounded(const void* src, WeightFormat format, WeightRounding rounding, float* dst, std::int64_t n) {
    fma_kernels().convert(src, format, rounding, dst, n);
}

WeightFormat gemv_panel_format(WeightFormat format, WeightRounding rounding) {
    switch (effective_rounding(format, rounding)) {
        case WeightRounding::f16: return WeightFormat::f16;   // R(w) is a half value
        case WeightRounding::bf16: return WeightFormat::bf16; // R(w) is a bf16 value
        case WeightRounding::none: break;
    }
    return format;  // w as stored
}

std::int64_t gemv_packed_bytes(std::int64_t n_count, std::int64_t k_count, WeightFormat panel) {
    return (n_count + kGemvPackRows - 1) / kGemvPackRows * kGemvPackRows * k_count * gemv_panel_bytes(panel);
}

void attention(const AttentionArgs& a) {
#if defined(__x86_64__)
    if (cpu_has_avx2_fma()) return avx2::attention(a);
#elif defined(__aarch64__)
    if (cpu_isa() == CpuIsa::neon) return neon::attention(a);
#endif
    (void)a;
    std::abort();  // a caller's bug: cpu_has_fma_kernels() is false
}

}  // namespace kvasir::kernels
