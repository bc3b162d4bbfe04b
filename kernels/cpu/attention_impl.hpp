// The fused causal attention (the contract is in attention.hpp), written once
// in the kernels' 8-lane SIMD vocabulary (avx2_load.hpp, neon_load.hpp) and
// compiled per ISA like fma_kernels_impl.hpp: attention_avx2.cpp and
// attention_neon.cpp include their vocabulary, define KVASIR_FMA_ISA and then
// this file, which defines ISA::attention. Vector lanes run over different
// keys (scores) or different output dims (P·V), never along a sum, so every
// sum keeps the matmul contract's order on every ISA.
#ifndef KVASIR_FMA_ISA
#error "include the ISA's vocabulary (avx2_load.hpp, neon_load.hpp) first: it defines KVASIR_FMA_ISA"
#endif

#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/matmul.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>
#include <vector>

namespace kvasir::kernels::KVASIR_FMA_ISA {
namespace {

constexpr i64 kBlock = kMatmulKBlock;  // summation block of every dot product
constexpr int kRows = 8;               // query heads sharing one transposed key block
constexpr int kHeadLanesMin = 6;       // decoding with ≥ 6 of a unit's heads: the heads in the lanes (below)

// 32-byte aligned storage (the rows of 8 lanes the decode path loads).
template <typename T>
struct AlignedAllocator {
    using value_type = T;
    AlignedAllocator() = default;
    template <typename U>
    AlignedAllocator(const AlignedAllocator<U>&) {}
    T* allocate(std::size_t n) {
        void* p = std::aligned_alloc(32, (n * sizeof(T) + 31) / 32 * 32);
        if (p == nullptr) throw std::bad_alloc();
        return static_cast<T*>(p);
    }
    void deallocate(T* p, std::size_t) noexcept { std::free(p); }
    template <typename U>
    bool operator==(const AlignedAllocator<U>&) const { return true; }
};

template <WeightRounding R>
inline float round1(float v) {
    if constexpr (R == WeightRounding::none) return v;
    else return vfirst(round_w<R>(vset1(v)));
}

// Scores of m query rows q[r] (dim floats each) against keys 0 … n−1 of k
// [S, dim]: sc[r·ld + s] = R(dot), for s < n (and up to the next multiple of
// 8 when those keys exist; they are computed and never used).
template <WeightRounding R>
void scores(const float* const* q, int m, const float* k, i64 dim, i64 s_count, i64 n, float* sc, i64 ld, bool prefetch) {
    i64 s0 = 0;
    for (; s0 < n && s0 + 8 <= s_count; s0 += 8) {
        // Decoding: the next block's 8 key rows, while this one is summed — a decode step finds
        // the cache evicted by the weights it streamed, and 8 interleaved row streams defeat the
        // hardware prefetchers (~4 % of a 1-thread decode at 512 cached tokens, BENCHMARKS.md).
        // No effect on the bits.
        if (prefetch && s0 + 8 < n)
            for (i64 i = 0; i < 8 && s0 + 8 + i < s_count; ++i)
                for (i64 d = 0; d < dim; d += 16) __builtin_prefetch(reinterpret_cast<const char*>(k + (s0 + 8 + i) * dim + d), 0, 3);
        vf8 tot[kRows], acc[kRows];
        for (i64 d0 = 0; d0 < dim; d0 += kBlock) {
            for (int r = 0; r < m; ++r) acc[r] = vzero();
            const i64 d1 = std::min(dim, d0 + kBlock);
            i64 d = d0;
            for (; d + 8 <= d1; d += 8) {
                vf8 kt[8];
                load_transposed8<WeightFormat::f32, R>(k, s0, dim, d, kt);  // kt[j] = K[s0 … s0+7, d+j]
#pragma GCC unroll 8
                for (int j = 0; j < 8; ++j)
                    for (int r = 0; r < m; ++r) acc[r] = vfma(vbroadcast(q[r] + d + j), kt[j], acc[r]);
            }
            for (; d < d1; ++d) {
                alignas(32) float col[8];
                for (int i = 0; i < 8; ++i) col[i] = load1<WeightFormat::f32, R>(k, (s0 + i) * dim + d);
                const vf8 c = vload(col);
                for (int r = 0; r < m; ++r) acc[r] = vfma(vbroadcast(q[r] + d), c, acc[r]);
            }
            for (int r = 0; r < m; ++r) tot[r] = d0 == 0 ? acc[r] : vadd(tot[r], acc[r]);
        }
        for (int r = 0; r < m; ++r) vstore(sc + r * ld + s0, round_w<R>(tot[r]));
    }
    for (; s0 < n; ++s0)  // the last keys of a cache whose length is not a multiple of 8
        for (int r = 0; r < m; ++r) {
            float total = 0.0f, s = 0.0f;
            for (i64 d = 0; d < dim; ++d) {
                if (d > 0 && d % kBlock == 0) {
                    total = d == kBlock ? s : total + s;
                    s = 0.0f;
                }
                s = fma1(q[r][d], load1<WeightFormat::f32, R>(k, s0 * dim + d), s);
            }
            sc[r * ld + s0] = round1<R>(dim <= kBlock ? s : total + s);
        }
}

// Row x [n] of scores → probabilities, in place (the cpu softmax of the
// scaled, masked row of S columns; see attention.hpp). x has room for n
// rounded up to 8.
template <WeightRounding R>
void softmax_row(float* x, i64 n, i64 s_count, float scale, const float* sink) {
    const vf8 sv = vset1(scale);
    i64 c = 0;
    for (; c + 8 <= n; c += 8) vstore(x + c, round_w<R>(vmul(vload(x + c), sv)));
    for (; c < n; ++c) x[c] = round1<R>(x[c] * scale);
    // m = fmax over the row, 8 lanes at a time: vmax(x, m) = x > m ? x : m keeps m where x is
    // NaN, as fmax does (a max is exact: its order cannot change its value,
    // and a zero's sign cannot reach the result: exp(±0) = 1 and s − (±0) = s).
    vf8 mv = vset1(-INFINITY);
    for (c = 0; c + 8 <= n; c += 8) mv = vmax(vload(x + c), mv);
    alignas(32) float ml[8];
    vstore(ml, mv);
    float m = -INFINITY;
    for (int l = 0; l < 8; ++l) m = ml[l] > m ? ml[l] : m;
    for (; c < n; ++c) m = x[c] > m ? x[c] : m;
    // The sink: column s_count of the composition's widened row (attention.hpp).
    const float sigma = sink != nullptr ? round1<R>(*sink) : 0.0f;
    if (sink != nullptr) m = std::fmax(m, sigma);
    for (c = 0; c < n; ++c) x[c] = round1<R>(std::exp(x[c] - m));
    const float e_sink = sink != nullptr ? round1<R>(std::exp(sigma - m)) : 0.0f;
    const i64 cols = s_count + (sink != nullptr ? 1 : 0);
    const i64 lanes_end = cols / 8 * 8;  // the composition's lanes cover columns below this
    const i64 lim = std::min((n + 7) / 8 * 8, lanes_end);
    for (c = n; c < lim; ++c) x[c] = 0.0f;  // masked columns: +0
    const bool sink_in_lanes = sink != nullptr && s_count < lanes_end;
    if (sink_in_lanes && s_count < lim) x[s_count] = e_sink;  // in the last chunk read below (x has room: ld ≥ lim)
    vf8 lanes = vzero();
    for (c = 0; c < lim; c += 8) lanes = vadd(lanes, vload(x + c));
    alignas(32) float l[8];
    vstore(l, lanes);
    if (sink_in_lanes && s_count >= lim) l[s_count % 8] += e_sink;  // its chunk: zeros but for the sink
    float sum = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    for (c = lanes_end; c < n; ++c) sum += x[c];
    if (sink != nullptr && !sink_in_lanes) sum += e_sink;  // the tail's last column
    const vf8 sumv = vset1(sum);
    for (c = 0; c + 8 <= n; c += 8) vstore(x + c, round_w<R>(vdiv(vload(x + c), sumv)));
    for (; c < n; ++c) x[c] = round1<R>(x[c] / sum);
}

// o[i0 … i0 + 8·NV) = Σ_{s < n} p[s]·V[s, i] in the matmul contract's order.
template <WeightRounding R, int NV>
[[gnu::always_inline]] inline void pv_chunk(const float* p, i64 n, const float* v, i64 dim, i64 i0, float* o, bool prefetch) {
    vf8 tot[NV], acc[NV];
    for (i64 s0 = 0; s0 < n; s0 += kBlock) {
        for (int j = 0; j < NV; ++j) acc[j] = vzero();
        const i64 s1 = std::min(n, s0 + kBlock);
        for (i64 s = s0; s < s1; ++s) {
            if (prefetch && s + 4 < n)  // decoding: the value row 4 keys ahead (as the scores' keys above)
                for (int j = 0; j < NV; j += 2) __builtin_prefetch(reinterpret_cast<const char*>(v + (s + 4) * dim + i0 + 8 * j), 0, 3);
            const vf8 pv = vbroadcast(p + s);
#pragma GCC unroll 8
            for (int j = 0; j < NV; ++j)
                acc[j] = vfma(pv, load8<WeightFormat::f32, R>(v, s * dim + i0 + 8 * j), acc[j]);
        }
        for (int j = 0; j < NV; ++j) tot[j] = s0 == 0 ? acc[j] : vadd(tot[j], acc[j]);
    }
    for (int j = 0; j < NV; ++j) vstore(o + i0 + 8 * j, round_w<R>(tot[j]));
}

template <WeightRounding R>
void pv_row(const float* p, i64 n, const float* v, i64 dim, float* o, bool prefetch) {
    i64 i0 = wide_pv_row(R, p, n, v, dim, o, prefetch);  // the dims a wider ISA did, the same chains
    for (; i0 + 64 <= dim; i0 += 64) pv_chunk<R, 8>(p, n, v, dim, i0, o, prefetch);
    for (; i0 + 8 <= dim; i0 += 8) pv_chunk<R, 1>(p, n, v, dim, i0, o, prefetch);
    for (; i0 < dim; ++i0) {
        float total = 0.0f, s = 0.0f;
        for (i64 k = 0; k < n; ++k) {
            if (k > 0 && k % kBlock == 0) {
                total = k == kBlock ? s : total + s;
                s = 0.0f;
            }
            s = fma1(p[k], load1<WeightFormat::f32, R>(v, k * dim + i0), s);
        }
        o[i0] = round1<R>(n <= kBlock ? s : total + s);
    }
}

// ---- decoding with the query heads in the lanes ----------------------------------------------
//
// A decode unit has one query row per head (m ≤ 8 heads of one kv head) and
// a long cache. Above, lanes run over keys, so every 8×8 block of K is
// transposed at every step, and each head reads V again. Here lanes run over
// the unit's heads instead: the scores' accumulator of key s holds
// (q_0·K[s], …, q_7·K[s]), fed by one broadcast of K[s][d] per d, and P·V's
// accumulator of dim i holds (p_0·V[·][i], …), fed by one broadcast of
// V[s][i] per s — K and V are each read once, in row order, and only the
// finished sums are transposed. Every output is the same FMA chain as above
// (fma(q, k, acc) over d in blocks of 64 from +0, block sums added in order;
// the same for p·v over s), so the same bits.

template <WeightRounding R>
inline vf8 bcast(const float* p) {
    if constexpr (R == WeightRounding::none) return vbroadcast(p);
    else return round_w<R>(vbroadcast(p));
}

// lanes[j][r] → rows[r·ld + j] for r < m, j < cnt (rounded with R).
template <WeightRounding R>
inline void store_lanes(const vf8* lanes, int cnt, int m, float* rows, i64 ld) {
    alignas(32) float t[8][8];
    for (int j = 0; j < cnt; ++j) vstore(t[j], round_w<R>(lanes[j]));
    for (int r = 0; r < m; ++r)
        for (int j = 0; j < cnt; ++j) rows[r * ld + j] = t[j][r];
}

// sc[r·ld + s] = R(q_r · K[s]) for s < n; qt[d·8 + r] = q_r[d] (zero lanes past m).
template <WeightRounding R>
void scores_heads(const float* qt, int m, const float* k, i64 dim, i64 n, float* sc, i64 ld) {
    for (i64 s0 = 0; s0 < n; s0 += 8) {
        const int cnt = static_cast<int>(std::min<i64>(8, n - s0));
        if (s0 + 8 < n)  // the next block's key rows (the cache comes from DRAM; see scores())
            for (i64 i = 0; i < 8 && s0 + 8 + i < n; ++i)
                for (i64 d = 0; d < dim; d += 16) __builtin_prefetch(reinterpret_cast<const char*>(k + (s0 + 8 + i) * dim + d), 0, 3);
        vf8 tot[8], acc[8];
        for (i64 d0 = 0; d0 < dim; d0 += kBlock) {
            for (int i = 0; i < 8; ++i) acc[i] = vzero();
            const i64 d1 = std::min(dim, d0 + kBlock);
            if (cnt == 8) {
                for (i64 d = d0; d < d1; ++d) {
                    const vf8 qv = vload(qt + d * 8);
#pragma GCC unroll 8
                    for (int i = 0; i < 8; ++i) acc[i] = vfma(qv, bcast<R>(k + (s0 + i) * dim + d), acc[i]);
                }
            } else {
                for (i64 d = d0; d < d1; ++d) {
                    const vf8 qv = vload(qt + d * 8);
                    for (int i = 0; i < cnt; ++i) acc[i] = vfma(qv, bcast<R>(k + (s0 + i) * dim + d), acc[i]);
                }
            }
            for (int i = 0; i < cnt; ++i) tot[i] = d0 == 0 ? acc[i] : vadd(tot[i], acc[i]);
        }
        store_lanes<R>(tot, cnt, m, sc + s0, ld);
    }
}

// out_r[i] = R(Σ_{s<n} p_r[s]·V[s][i]); pt[s·8 + r] = p_r[s] (zero lanes past m).
template <WeightRounding R>
void pv_heads(const float* pt, int m, i64 n, const float* v, i64 dim, float* out, i64 out_ld) {
    for (i64 i0 = 0; i0 < dim; i0 += 8) {
        const int cnt = static_cast<int>(std::min<i64>(8, dim - i0));
        vf8 tot[8], acc[8];
        for (i64 s0 = 0; s0 < n; s0 += kBlock) {
            for (int j = 0; j < 8; ++j) acc[j] = vzero();
            const i64 s1 = std::min(n, s0 + kBlock);
            for (i64 s = s0; s < s1; ++s) {
                if (i0 == 0 && s + 4 < n)  // the first pass streams V from DRAM: its rows 4 ahead
                    for (i64 d = 0; d < dim; d += 16) __builtin_prefetch(reinterpret_cast<const char*>(v + (s + 4) * dim + d), 0, 3);
                const vf8 pv = vload(pt + s * 8);
                const float* vr = v + s * dim + i0;
                if (cnt == 8) {
#pragma GCC unroll 8
                    for (int j = 0; j < 8; ++j) acc[j] = vfma(pv, bcast<R>(vr + j), acc[j]);
                } else {
                    for (int j = 0; j < cnt; ++j) acc[j] = vfma(pv, bcast<R>(vr + j), acc[j]);
                }
            }
            for (int j = 0; j < cnt; ++j) tot[j] = s0 == 0 ? acc[j] : vadd(tot[j], acc[j]);
        }
        store_lanes<R>(tot, cnt, m, out + i0, out_ld);
    }
}

template <WeightRounding R>
void run(const AttentionArgs& a) {
    const i64 rep = a.heads / a.kv_heads, chunks = (rep + kRows - 1) / kRows;
    const i64 p0 = a.s_count - a.t_count, ld = (a.s_count + 7) / 8 * 8;
    const i64 units = a.kv_heads * a.t_count * chunks;
    const bool decoding = a.t_count <= 3;  // the cache comes from DRAM: prefetch it
    // Work: QKᵀ and PV over the causal keys of every query row, plus the
    // read of the cache, which a decode step streams from DRAM (each byte
    // about two of the GEMM's flops; fma_kernels_impl.hpp's GEMV counts the
    // same): a decode over 128 cached keys of the bench GGUF's 4 kv heads
    // reads 0.5 MiB and splits over two threads.
    const double flops = 4.0 * static_cast<double>(a.heads) * static_cast<double>(a.dim) * static_cast<double>(a.t_count) *
                         static_cast<double>(a.s_count - a.t_count / 2);
    const double cache_bytes = 2.0 * static_cast<double>(a.kv_heads) * static_cast<double>(a.s_count) * static_cast<double>(a.dim) *
                               static_cast<double>(sizeof(float));
    const int threads = threads_for_work(a.threads, flops + 2 * cache_bytes);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        thread_local std::vector<float> scratch;  // kRows rows of S scores (OpenMP reuses its threads)
        if (static_cast<i64>(scratch.size()) < kRows * ld) scratch.resize(static_cast<std::size_t>(kRows * ld));
        float* sc = scratch.data();
        // Decoding: q, then P, with the heads in the lanes (32-byte aligned rows of kRows floats).
        thread_local std::vector<float, AlignedAllocator<float>> heads;
        if (decoding && static_cast<i64>(heads.size()) < kRows * std::max(a.dim, a.s_count))
            heads.resize(static_cast<std::size_t>(kRows * std::max(a.dim, a.s_count)));
#pragma omp for schedule(dynamic)
        for (i64 u = 0; u < units; ++u) {
            // Latest queries first: they have the most keys, so the dynamic
            // schedule ends with the cheap ones.
            const i64 t = a.t_count - 1 - u / (a.kv_heads * chunks);
            const i64 g = u / chunks % a.kv_heads, r0 = u % chunks * kRows;
            const int m = static_cast<int>(std::min<i64>(kRows, rep - r0));
            const i64 n = p0 + t + 1;
            const float* q[kRows];
            for (int r = 0; r < m; ++r) q[r] = a.q + (t * a.heads + g * rep + r0 + r) * a.dim;
            const auto softmax_rows = [&] {
                for (int r = 0; r < m; ++r)
                    softmax_row<R>(sc + r * ld, n, a.s_count, a.scale, a.sinks != nullptr ? a.sinks + g * rep + r0 + r : nullptr);
            };
            if (decoding && m >= kHeadLanesMin) {
                // lanes: qt [dim][8], then pt [n][8] (heads in the lanes, zero past m)
                float* lanes = heads.data();
                for (i64 d = 0; d < a.dim; ++d)
                    for (int r = 0; r < kRows; ++r) lanes[d * kRows + r] = r < m ? q[r][d] : 0.0f;
                scores_heads<R>(lanes, m, a.keys[g], a.dim, n, sc, ld);
                softmax_rows();
                for (i64 s = 0; s < n; ++s)
                    for (int r = 0; r < kRows; ++r) lanes[s * kRows + r] = r < m ? sc[r * ld + s] : 0.0f;
                pv_heads<R>(lanes, m, n, a.values[g], a.dim, a.out + (t * a.heads + g * rep + r0) * a.dim, a.dim);
                continue;
            }
            scores<R>(q, m, a.keys[g], a.dim, a.s_count, n, sc, ld, decoding);
            softmax_rows();
            for (int r = 0; r < m; ++r)
                pv_row<R>(sc + r * ld, n, a.values[g], a.dim, a.out + (t * a.heads + g * rep + r0 + r) * a.dim, decoding);
        }
    }
}

}  // namespace

void attention(const AttentionArgs& a) {
    if (a.t_count == 0) return;
    switch (a.rounding) {
        case WeightRounding::none: run<WeightRounding::none>(a); break;
        case WeightRounding::f16: run<WeightRounding::f16>(a); break;
        case WeightRounding::bf16: run<WeightRounding::bf16>(a); break;
    }
}

}  // namespace kvasir::kernels::KVASIR_FMA_ISA
