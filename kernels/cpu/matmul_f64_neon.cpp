// The f64 oracle's blocked matmul (matmul_f64_impl.hpp) for AArch64 AdvSIMD:
// neon::matmul_f64. Compiled in AArch64 builds only (CMakeLists.txt).
#include "kernels/cpu/neon_load.hpp"

#include "kernels/cpu/matmul_f64_impl.hpp"
