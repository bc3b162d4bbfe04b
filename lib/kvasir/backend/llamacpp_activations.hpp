// llama.cpp's CPU backend does not multiply a quantised weight by f32
// activations: each matmul first converts the activation rows to the weight
// type's "vec_dot_type" (ggml-cpu.c type_traits_cpu), then takes integer (or
// f16 / bf16) block dot products scaled in f32. What it multiplies is
// therefore the dequantised weight by the *dequantised activation* — which
// is what cpu:qdot=llamacpp computes, so that an audit separates the
// quantisation of the arithmetic from the node's hardware. Per weight origin
// (what the model expanded the weight from, core/immutable_memory.hpp):
//
//   f16 / bf16 weights     activations rounded to f16 / bf16 (RNE)
//   Q8_0, Q4_0, Q4_1,      activations in Q8_0 blocks of 32, as its x86 (AVX)
//   Q5_0, Q5_1, MXFP4      quantize_row_q8_0: amax = max|x|, d = amax/127
//                          stored as f16, q = round-half-even(x · 127/amax),
//                          value f16(d)·q (Q8_1 for Q4_1/Q5_1 has the same values)
//   Q2_K … Q6_K            activations in Q8_K blocks of 256 (quantize_row_q8_K_ref):
//                          m = the value of largest magnitude (first one),
//                          iscale = −127/m, q = min(127, nearest_int(iscale·x)),
//                          value (1/iscale)·q in f32
//   anything else          unchanged (F32 weights: an f32 dot)
//
// The block dot's own f32 summation order differs from llama.cpp's SIMD one
// (rounding-level differences); everything else is its arithmetic.
#pragma once

#include "kvasir/core/immutable_memory.hpp"
#include "kvasir/core/tensor.hpp"

namespace kvasir {

// What a weight at `w` was expanded from: its dtype for f16/bf16 views, else
// the registration holding it (WeightOrigin::none when unregistered).
WeightOrigin weight_origin_of(const TensorView& w);

// x [.., K] (any float dtype) as llama.cpp's CPU backend feeds it to a dot
// with a weight of that origin, in f32. Error(internal) when K is not a
// multiple of the block size the origin implies (a weight row always is).
Tensor llamacpp_activations(const TensorView& x, WeightOrigin origin);

}  // namespace kvasir
