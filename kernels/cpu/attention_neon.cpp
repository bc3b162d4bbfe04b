// The fused attention (attention_impl.hpp) for AArch64 AdvSIMD:
// neon::attention. Compiled in AArch64 builds only (CMakeLists.txt).
#include "kernels/cpu/neon_load.hpp"

#include "kernels/cpu/attention_impl.hpp"
