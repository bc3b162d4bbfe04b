// The f64 oracle's blocked matmul (matmul_f64_impl.hpp) for AVX2, with
// AVX-512's 8-row tiles where asked: avx2::matmul_f64.
#include "kernels/cpu/avx2_load.hpp"

#include "kernels/cpu/matmul_f64_impl.hpp"
