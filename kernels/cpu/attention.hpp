// CPU causal GQA attention (Backend::causal_attention of the cpu node), fused:
// per query row only the unmasked keys 0 … p0+t are read, the scores live in
// a per-thread scratch row, and no [heads·T, S] tensor is ever formed.
//
// The arithmetic is the default composition of backend.hpp on the cpu node
// (acc=f32, AVX2 + FMA), bit for bit on finite inputs, with R = rounding to
// the storage format (identity for f32):
//   score[s] = R(dot(q, K[s]))   the matmul contract (matmul.hpp): d cut into
//                                blocks of 64, one FMA chain per block from +0,
//                                block sums added in order; q, K read through R
//   x[s]     = R(score[s] · scale)          scale rounded to f32, one f32 product
//   m        = fmax over s ≤ p0+t of x[s]
//   e[s]     = R(expf(x[s] − m))
//   Σ        = the cpu softmax's sum over the whole cache row of S columns, the
//              masked ones being +0: 8 interleaved lanes over columns
//              c < ⌊S/8⌋·8, folded ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)), then
//              the columns ⌊S/8⌋·8 … S−1 one by one (only c ≤ p0+t is read:
//              +0 changes no partial sum)
//   p[s]     = R(e[s] / Σ)
//   out[i]   = R(Σ_s p[s]·V[s, i])  the matmul contract over s (blocks of 64,
//                                   FMA chains), V read through R; the
//                                   composition's masked terms are fma(+0, v, a) = a
// With sinks (Backend::causal_attention_sinks): the composition's row has S + 1
// columns, the head's sink σ = R(sink) at column S; m takes it in, e_σ =
// R(expf(σ − m)) joins Σ where column S falls — lane S mod 8 when S < ⌊(S+1)/8⌋·8,
// else last in the tail —, and its probability is dropped.
// Where it differs: a masked key whose V row holds Inf or NaN poisons the
// composition's P·V (0·Inf = NaN) but is never read here.
//
// Threads: one work unit is (kv head, query position, up to 8 of its query
// heads), computed start to finish by one thread (schedule dynamic): the
// result does not depend on the thread count.
#pragma once

#include "kernels/cpu/matmul.hpp"

#include <cstdint>

namespace kvasir::kernels {

struct AttentionArgs {
    const float* q = nullptr;              // [T, heads, dim], already rounded to storage
    const float* const* keys = nullptr;    // per kv head: [s_count, dim] f32
    const float* const* values = nullptr;  // per kv head: [s_count, dim] f32
    float* out = nullptr;                  // [T, heads·dim]
    std::int64_t t_count = 0, heads = 0, kv_heads = 0, dim = 0, s_count = 0;
    float scale = 1.0f;
    const float* sinks = nullptr;          // [heads] sink logits (gpt-oss), or null
    WeightRounding rounding = WeightRounding::none;  // storage rounding R of everything read and written
    int threads = 1;
};

// The fused attention of this CPU (attention_impl.hpp, compiled per ISA:
// avx2::attention on x86-64 with AVX2 + FMA + F16C, neon::attention on
// AArch64); none on other CPUs, whose cpu node runs the composition.
void attention(const AttentionArgs& a);  // only where cpu_has_fma_kernels()
namespace avx2 {
void attention(const AttentionArgs& a);
}
namespace neon {
void attention(const AttentionArgs& a);
}

}  // namespace kvasir::kernels
