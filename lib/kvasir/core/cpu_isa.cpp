#include "kvasir/core/cpu_isa.hpp"

#include <cstdlib>
#include <string_view>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace kvasir {

namespace {

CpuIsa detect_isa() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports
    // does not know "f16c"; AVX2's check already covers the OS's AVX state,
    // and libgcc's AVX-512 checks the OS's zmm state (XCR0).
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c)) return CpuIsa::generic;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        return CpuIsa::avx512;
    return CpuIsa::avx2;
#elif defined(__aarch64__)
    return CpuIsa::neon;  // AdvSIMD with FMLA and FCVTL/FCVTN is part of every AArch64 CPU
#else
    return CpuIsa::generic;
#endif
}

}  // namespace

CpuIsa cpu_isa() noexcept {
    // Asked once: CPUID traps to the hypervisor in a VM (microseconds each),
    // and callers ask per tensor row (BENCHMARKS.md, "OpenCL matmul on packed weights").
    static const CpuIsa isa = [] {
        CpuIsa best = detect_isa();
        if (const char* cap = std::getenv("KVASIR_CPU_ISA"); cap != nullptr && *cap != 0) {
            const std::string_view v(cap);
            // A cap lowers the x86 level (avx512 → avx2 → generic) or turns
            // any ISA off (generic); it never picks an ISA the CPU lacks.
            if (v == "generic") best = CpuIsa::generic;
            else if (v == "avx2" && best == CpuIsa::avx512) best = CpuIsa::avx2;
        }
        return best;
    }();
    return isa;
}

const char* cpu_isa_name(CpuIsa isa) noexcept {
    switch (isa) {
        case CpuIsa::avx512: return "avx512";
        case CpuIsa::avx2: return "avx2";
        case CpuIsa::neon: return "neon";
        case CpuIsa::generic: break;
    }
    return "generic";
}

}  // namespace kvasir
