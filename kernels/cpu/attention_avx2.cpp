// The fused attention (attention_impl.hpp) for AVX2 + FMA + F16C: avx2::attention.
#include "kernels/cpu/avx2_load.hpp"

#include "kernels/cpu/attention_impl.hpp"
