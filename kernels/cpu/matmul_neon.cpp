// The fused-f32 kernels (fma_kernels_impl.hpp) for AArch64 AdvSIMD:
// neon::kFmaKernels. Compiled in AArch64 builds only (CMakeLists.txt).
#include "kernels/cpu/neon_load.hpp"

#include "kernels/cpu/fma_kernels_impl.hpp"
