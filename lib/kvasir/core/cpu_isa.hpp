// The instruction sets this program's SIMD code is dispatched on: the best
// this CPU and its OS support — on x86-64 AVX-512 (F, DQ, BW, VL with the zmm
// state enabled) > AVX2 (AVX2, FMA and F16C) > generic; on AArch64 AdvSIMD
// (neon, part of every AArch64 CPU) > generic — capped by the environment
// variable KVASIR_CPU_ISA (generic | avx2 | avx512 | neon; a cap the CPU does
// not have leaves the best) so every path can be run and compared on one
// machine. Read once. Used by the CPU kernels (kernels/cpu) and by the seeded
// input generator (core/rng.cpp).
//
// Files named *_avx2.cpp / *_avx512.cpp / *_neon.cpp are compiled for their
// ISA (CMakeLists.txt kvasir_isa_sources) and called only when cpu_isa() has it.
#pragma once

#include <cstdint>

namespace kvasir {

enum class CpuIsa : std::uint8_t { generic, avx2, avx512, neon };
CpuIsa cpu_isa() noexcept;
const char* cpu_isa_name(CpuIsa isa) noexcept;

}  // namespace kvasir
