// The f16-accumulation matmul (matmul.hpp, matmul_f16acc) on SIMD lanes, for
// the ISA files that include it (matmul_f16acc_avx2.cpp, _avx512.cpp) with
// their own 8-lane double vector type V.
//
// The arithmetic of every output is the scalar kernel's, bit for bit: one
// chain in ascending k, acc = round_f16(acc + x·w) in double, from +0. Lanes
// run over 8 different outputs (columns), never over k; R rows of x advance
// together so R independent chains hide the chain's latency. w's 8 rows of a
// column block are widened to double and interleaved k-major once per block
// (the packing moves operands, never the order of a sum).
//
// round_f16 in lanes, as kvasir::round_to_f16 defines it:
//   |a| < 2^-14 (f16 subnormals, zeros): nearbyint(a·2^24)·2^-24, exact scalings
//   otherwise: round to nearest even on the 42 dropped fraction bits (the
//     bit pattern, as round_f16_fast), a carry bumping the exponent
//   |a| ≥ 65520 (rounds past 65504): ±inf with a's sign
//   NaN: itself.
// x·w of two floats is exact in double, so fma(x, w, acc) is acc + x·w
// rounded once, as the scalar code computes it.
#pragma once

#include "kernels/cpu/matmul.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace kvasir::kernels::f16acc {

constexpr std::int64_t kLanes = 8;   // outputs per column block
constexpr std::int64_t kRows = 4;    // rows of x per tile
constexpr std::int64_t kBlocks = 4;  // column blocks per job (32 outputs, packed together)

// V: load(const double*) (8 aligned doubles), broadcast(double), fma(a, b, c)
// = a·b + c, round_normal(v) (the bit-pattern rounding, right where
// normal_mask says so), normal_mask(v) (an int, bit i for lane i in
// [2^-14, 65520)), kAll (every lane's bit), round_f16(v) (every range),
// store_f32(float*, v) (8 floats), zero().
//
// A tile is R rows × C column blocks: R·C independent chains (≥ 4 where the
// shape allows, to hide the chain's latency). Every step takes the cheap
// rounding and checks that each lane was in the normal range; the rare step
// where one was not (a sum near 0 or past 65504, NaN) is rounded again with
// every range handled, from the same unrounded sums.
template <class V, int R, int C>
inline void tile(const float* x, std::int64_t k_count, const double* wp, float* out /* [R][C·8] */) {
    using T = typename V::type;
    T acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = V::zero();
    for (std::int64_t k = 0; k < k_count; ++k) {
        T wv[C];
        for (int c = 0; c < C; ++c) wv[c] = V::load(wp + (c * k_count + k) * kLanes);
        T sum[R][C];
        int normal = V::kAll;
        for (int r = 0; r < R; ++r) {
            const T xv = V::broadcast(static_cast<double>(x[r * k_count + k]));
            for (int c = 0; c < C; ++c) {
                sum[r][c] = V::fma(xv, wv[c], acc[r][c]);
                acc[r][c] = V::round_normal(sum[r][c]);
                normal &= V::normal_mask(sum[r][c]);
            }
        }
        if (normal != V::kAll) [[unlikely]]
            for (int r = 0; r < R; ++r)
                for (int c = 0; c < C; ++c) acc[r][c] = V::round_f16(sum[r][c]);
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) V::store_f32(out + (r * C + c) * kLanes, acc[r][c]);
}

// Rows [t, t + R) of x against the job's C packed blocks, into y.
template <class V, int R, int C>
inline void rows(const float* x, const double* wp, float* y, std::int64_t t, std::int64_t n0, std::int64_t nn,
                 std::int64_t n_count, std::int64_t k_count) {
    alignas(64) float out[R * C * kLanes];
    tile<V, R, C>(x + t * k_count, k_count, wp, out);
    for (int r = 0; r < R; ++r) {
        const std::int64_t m = std::min<std::int64_t>(nn, C * kLanes);
        for (int c = 0; c < C; ++c)
            for (std::int64_t j = 0; j < kLanes && c * kLanes + j < m; ++j)
                y[(t + r) * n_count + n0 + c * kLanes + j] = out[(r * C + c) * kLanes + j];
    }
}

template <class V>
void matmul(const float* x, const float* w, float* y, std::int64_t t_count, std::int64_t n_count, std::int64_t k_count,
            int threads) {
    if (t_count <= 0 || n_count <= 0) return;
    if (k_count <= 0) {
        std::fill(y, y + t_count * n_count, 0.0f);
        return;
    }
    constexpr std::int64_t group = kBlocks * kLanes;
    const std::int64_t jobs = (n_count + group - 1) / group;
    threads = threads_for_work(threads, 2.0 * static_cast<double>(t_count) * static_cast<double>(n_count) *
                                            static_cast<double>(k_count));
    // Jobs handed out dynamically: a preempted thread takes fewer; every
    // output is computed whole by one job, so the schedule never shows.
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        std::vector<double> packed(static_cast<std::size_t>(kBlocks * k_count * kLanes + 8));
        double* wp = packed.data();  // 64-byte aligned inside the vector (AVX-512 aligned loads)
        while (reinterpret_cast<std::uintptr_t>(wp) % 64 != 0) ++wp;
#pragma omp for schedule(dynamic, 1)
        for (std::int64_t job = 0; job < jobs; ++job) {
            const std::int64_t n0 = job * group, nn = std::min(group, n_count - n0);
            const std::int64_t blocks = (nn + kLanes - 1) / kLanes;
            // Block c, k-major: wp[(c·K + k)·8 + j] = w[n0 + 8c + j, k] widened (0 past N).
            for (std::int64_t c = 0; c < blocks; ++c)
                for (std::int64_t k = 0; k < k_count; ++k)
                    for (std::int64_t j = 0; j < kLanes; ++j) {
                        const std::int64_t n = n0 + c * kLanes + j;
                        wp[(c * k_count + k) * kLanes + j] = n < n_count ? static_cast<double>(w[n * k_count + k]) : 0.0;
                    }
            std::int64_t t = 0;
            for (; t + kRows <= t_count; t += kRows)
                for (std::int64_t c = 0; c < blocks; ++c)
                    rows<V, 4, 1>(x, wp + c * k_count * kLanes, y, t, n0 + c * kLanes, nn - c * kLanes, n_count, k_count);
            const std::int64_t left = t_count - t;
            if (left == 0) continue;
            // The last 1-3 rows: more blocks per tile, so at least 4 chains run together where the job has them.
            for (std::int64_t c = 0; c < blocks;) {
                const std::int64_t more = blocks - c;
                const double* wc = wp + c * k_count * kLanes;
                const std::int64_t nc = nn - c * kLanes;
                if (left == 1 && more >= 4) {
                    rows<V, 1, 4>(x, wc, y, t, n0 + c * kLanes, nc, n_count, k_count);
                    c += 4;
                } else if (left <= 2 && more >= 2) {
                    if (left == 1) rows<V, 1, 2>(x, wc, y, t, n0 + c * kLanes, nc, n_count, k_count);
                    else rows<V, 2, 2>(x, wc, y, t, n0 + c * kLanes, nc, n_count, k_count);
                    c += 2;
                } else {
                    if (left == 1) rows<V, 1, 1>(x, wc, y, t, n0 + c * kLanes, nc, n_count, k_count);
                    else if (left == 2) rows<V, 2, 1>(x, wc, y, t, n0 + c * kLanes, nc, n_count, k_count);
                    else rows<V, 3, 1>(x, wc, y, t, n0 + c * kLanes, nc, n_count, k_count);
                    c += 1;
                }
            }
        }
    }
}

}  // namespace kvasir::kernels::f16acc
