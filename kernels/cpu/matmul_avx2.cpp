// The fused-f32 kernels (fma_kernels_impl.hpp) for AVX2 + FMA + F16C, with
// AVX-512's tile where the CPU has it: avx2::kFmaKernels.
#include "kernels/cpu/avx2_load.hpp"

#include "kernels/cpu/fma_kernels_impl.hpp"
