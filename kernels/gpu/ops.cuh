// The GPU kernels of kvasir, written once and compiled by nvcc (cuda) and hipcc (hip).
// What makes them different: every reduction has ONE fixed order on every vendor —
// no warp shuffles (a 64-lane wavefront would change the tree), no atomics except in
// the nondeterministic split-K variant — and every fused multiply-add is an explicit
// fmaf (the compilers are told not to contract), so cuda and hip compute the same bits.
//
// Read next to lib/kvasir/backend/cpu_ref.cpp (the f64 loops these must match):
//   matmul_kernel    y[t,n] = Σ_k x[t,k]·w[n,k]   one fmaf chain per output in ascending k
//                                                 (f32), or the exact f16-accumulation step;
//                                                 three tilings, one chain whatever the tile
//   grouped_matmul_kernel  many such matmuls (a MoE layer's experts) in one launch
//   softmax_kernel   max, then e = exp(x - max) rounded to storage, Σe by a fixed tree, e/Σ
//   rmsnorm_kernel   Σx² by a fixed tree (fmaf), x · 1/sqrt(Σx²/n + eps) · w
//   swiglu_kernel    g / (1 + e^-g) · u           (the cpu backend's formula)
//   clamped_swiglu_kernel  (clamp(u) + 1) · g'·σ(g'·alpha), g' = min(g, limit)  (gpt-oss)
//   sigmoid_kernel   1 / (1 + e^-x)
//   rope_kernel      angle = pos · inv_freq in f32 (inv_freq from the host, as transformers
//                    computes it), (a, b) → (a·c - b·s, b·c + a·s) with fmaf
//   attention_kernel causal GQA attention, one block per (query row, head) over the keys
//                    it sees: this node's matmul/scale/softmax/matmul composition bit for bit
//   store_kernel     round a buffer to the storage format (after split-K atomics)
//   copy_block_kernel  a block of rows × columns moved as it is (copy_columns, last_rows, join_columns, repeat_columns)
//   causal_conv1d_silu_kernel   y[t,c] = silu(Σ_j w[c,j]·xx[t+j,c]), one Accum chain in
//                    ascending j (linear_attention.hpp; Gated DeltaNet)
//   gated_delta_kernel          the gated delta rule, one block per value head, tokens
//                    in order, the f32 state [dk, dv] in global memory
//
// Conventions: buffers hold f32 values that are already rounded to the node's
// storage format; every kernel rounds what it writes with kg_store(·, storage).
// Sizes are checked by the host (every count < 2^31); offsets use size_t.
#pragma once

#include "kernels/gpu/math.cuh"

#include <cstddef>
#include <vector>

namespace kvasir::KG_NS {

// Block size of every reduction kernel. Fixed (not the warp size) so that the
// reduction tree — and therefore the result — is the same on every vendor.
constexpr int kReduceThreads = 256;

// Matmul tilings. A block of kMatmulThreads threads computes a TM×TN tile of
// y, each thread TMT×TNT outputs (rows ty + TM/TMT·i, columns tx + TN/TNT·j),
// with K staged through shared memory BK at a time. The tiling decides speed,
// never bits: every output is one Accum chain in ascending k whatever the
// tile (EmulatedKernels.MatmulIsOneFmaChainPerOutputInAscendingK runs all
// three). matmul_tiling picks one per launch by shape:
//   wide    128×128, 8×8 per thread, BK 8: large T and N (a 4096³ matmul, a
//           prefill's projections) — 64 fmas per 16 shared-memory reads
//   square   64×64,  4×4 per thread, BK 16: middle T, or too few wide tiles
//           to fill the device
//   skinny   16×64,  1×4 per thread, BK 16: T ≤ 16 (decode, most experts):
//           a 64-row tile there would compute 4 to 64 times what it keeps
constexpr int kMatmulThreads = 256;
template <int TM, int TN, int TMT, int TNT, int BK>
struct MatmulTiling {
    static constexpr int tm = TM, tn = TN, tmt = TMT, tnt = TNT, bk = BK;
    static constexpr int threads_x = TN / TNT, threads_y = TM / TMT;
    static_assert(threads_x * threads_y == kMatmulThreads, "a tiling fills one block of kMatmulThreads");
};
using WideTiling = MatmulTiling<128, 128, 8, 8, 8>;
using SquareTiling = MatmulTiling<64, 64, 4, 4, 16>;
using SkinnyTiling = MatmulTiling<16, 64, 1, 4, 16>;
enum class Tiling { wide, square, skinny };

// Host side: the tiling of a launch of T rows and N columns. Wide needs
// enough tiles to keep a large GPU busy (≥ 512, four per SM of an H100/H200
// or an MI300's CU), else its blocks would leave most of the device idle.
inline Tiling matmul_tiling(long long t_count, long long n_count) {
    if (t_count <= SkinnyTiling::tm) return Tiling::skinny;
    const long long wide_tiles = ((t_count + WideTiling::tm - 1) / WideTiling::tm) * ((n_count + WideTiling::tn - 1) / WideTiling::tn);
    return wide_tiles >= 512 ? Tiling::wide : Tiling::square;
}
inline int tiling_rows(Tiling t) {
    return t == Tiling::wide ? WideTiling::tm : t == Tiling::square ? SquareTiling::tm : SkinnyTiling::tm;
}
inline int tiling_cols(Tiling t) {
    return t == Tiling::wide ? WideTiling::tn : t == Tiling::square ? SquareTiling::tn : SkinnyTiling::tn;
}
// Calls f with the tiling's type (f(WideTiling{}), ...): one place maps the
// runtime choice to the kernels' template argument.
template <class F>
inline void with_tiling(Tiling t, F&& f) {
    if (t == Tiling::wide)
        f(WideTiling{});
    else if (t == Tiling::square)
        f(SquareTiling{});
    else
        f(SkinnyTiling{});
}

// Kept for the split-K chunk below: K slices are whole stages of every tiling.
constexpr int kTileK = 16;

// The K slice of each block of the split-K variant (nondeterministic=1), on
// the host: at least three slices wherever K has three elements (8 or 9 of
// about 256 on long K), whole kTileK tiles where K has three of them.
// Three because two partial sums added to a zero in either order give the
// same bits (0 + a + b = 0 + b + a): with fewer the atomics could not change
// a result, and an audit at small widths (a fixture's K = 32…192) would see a
// deterministic node. The grid has ceil(K / chunk) slices.
inline int split_k_chunk(int k_count) {
    int slices = (k_count + 255) / 256;
    slices = slices < 3 ? 3 : slices > 8 ? 8 : slices;
    const int even = k_count / slices;  // rounded down: never fewer slices than asked
    if (even >= kTileK) return even / kTileK * kTileK;
    return even > 0 ? even : 1;
}

// Accumulation step of one output element. f32: one rounding per product+sum
// (fma). f16: the running sum is rounded to half after every add; the product
// of two floats is exact in double, so this is bit-identical to the CPU
// emulation of an F16-accumulating unit (cpu:acc=f16).
template <bool kF16Acc>
struct Accum;
template <>
struct Accum<false> {
    __device__ static float step(float acc, float a, float b) { return fmaf(a, b, acc); }
    __device__ static float add(float a, float b) { return a + b; }
};
template <>
struct Accum<true> {
    __device__ static float step(float acc, float a, float b) {
        return static_cast<float>(kg_round_f16(static_cast<double>(acc) + static_cast<double>(a) * static_cast<double>(b)));
    }
    __device__ static float add(float a, float b) {
        return static_cast<float>(kg_round_f16(static_cast<double>(a) + static_cast<double>(b)));
    }
};

// One TM×TN tile of y[T, N] = x[T, K] · w[N, K]ᵀ over k in [k_begin, k_end),
// the tile's first row row0 and column col0. kAtomic (split-K, the
// nondeterministic variant): partial sums are added to y with atomicAdd, in
// whatever order the blocks finish, and y is rounded to storage afterwards by
// store_kernel. Otherwise y is written once, rounded — then, with a `bias`
// [N] (a grouped job's, gpt-oss's experts), add_rows_kernel's sum of that
// stored value and bias[c], the two launches' bits in one.
template <class Tl, bool kF16Acc, bool kAtomic>
__device__ void matmul_tile(const float* x, const float* w, float* y, int t_count, int n_count, int k_count, int k_begin,
                            int k_end, int row0, int col0, int storage, const float* bias = nullptr) {
    // Transposed tiles ([k][row]) so the inner loop reads rows of both with
    // consecutive threads on consecutive addresses; +1 breaks bank conflicts
    // on the transposing stores.
    __shared__ float xs[Tl::bk][Tl::tm + 1];
    __shared__ float ws[Tl::bk][Tl::tn + 1];
    const int tid = static_cast<int>(threadIdx.x);
    const int tx = tid % Tl::threads_x, ty = tid / Tl::threads_x;
    using A = Accum<kF16Acc>;
    float acc[Tl::tmt][Tl::tnt];
    for (int i = 0; i < Tl::tmt; ++i)
        for (int j = 0; j < Tl::tnt; ++j) acc[i][j] = 0.0f;
    for (int k0 = k_begin; k0 < k_end; k0 += Tl::bk) {
        // Consecutive threads load consecutive k of one row (coalesced).
        for (int e = tid; e < Tl::tm * Tl::bk; e += kMatmulThreads) {
            const int r = e / Tl::bk, kk = e % Tl::bk, gk = k0 + kk, gx = row0 + r;
            xs[kk][r] = gx < t_count && gk < k_end ? x[static_cast<std::size_t>(gx) * k_count + gk] : 0.0f;
        }
        for (int e = tid; e < Tl::tn * Tl::bk; e += kMatmulThreads) {
            const int r = e / Tl::bk, kk = e % Tl::bk, gk = k0 + kk, gw = col0 + r;
            ws[kk][r] = gw < n_count && gk < k_end ? w[static_cast<std::size_t>(gw) * k_count + gk] : 0.0f;
        }
        __syncthreads();
        // Padding never enters a sum: the loop stops at the real K.
        const int kk_end = min(Tl::bk, k_end - k0);
        for (int kk = 0; kk < kk_end; ++kk) {
            float a[Tl::tmt], b[Tl::tnt];
            for (int i = 0; i < Tl::tmt; ++i) a[i] = xs[kk][ty + Tl::threads_y * i];
            for (int j = 0; j < Tl::tnt; ++j) b[j] = ws[kk][tx + Tl::threads_x * j];
            for (int i = 0; i < Tl::tmt; ++i)
                for (int j = 0; j < Tl::tnt; ++j) acc[i][j] = A::step(acc[i][j], a[i], b[j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < Tl::tmt; ++i)
        for (int j = 0; j < Tl::tnt; ++j) {
            const int r = row0 + ty + Tl::threads_y * i, c = col0 + tx + Tl::threads_x * j;
            if (r >= t_count || c >= n_count) continue;
            float* dst = y + static_cast<std::size_t>(r) * n_count + c;
            if (kAtomic)
                atomicAdd(dst, acc[i][j]);
            else if (bias != nullptr)
                *dst = kg_store(kg_store(acc[i][j], storage) + bias[c], storage);
            else
                *dst = kg_store(acc[i][j], storage);
        }
}

// y[T, N] = x[T, K] · w[N, K]ᵀ: block (x, y, z) is column tile x, row tile y,
// K slice z ([z·k_chunk, +k_chunk); one slice unless split-K).
template <class Tl, bool kF16Acc, bool kAtomic>
__global__ void __launch_bounds__(kMatmulThreads)
    matmul_kernel(const float* x, const float* w, float* y, int t_count, int n_count, int k_count, int k_chunk,
                  int storage) {
    const int k_begin = static_cast<int>(blockIdx.z) * k_chunk;
    matmul_tile<Tl, kF16Acc, kAtomic>(x, w, y, t_count, n_count, k_count, k_begin, min(k_count, k_begin + k_chunk),
                                      static_cast<int>(blockIdx.y) * Tl::tm, static_cast<int>(blockIdx.x) * Tl::tn,
                                      storage);
}

// Many matmuls in one launch (a MoE layer's experts, issue #38 item 2): job j
// is y_j = x_j · w_jᵀ, its tiles blocks [first_tile_j, first_tile_j+1) of the
// grid, row-major over (row tile, column tile). Each tile is matmul_tile, so
// every output has the bits a launch of its own would give; a job with a
// bias adds it as add_rows_kernel would after that launch.
struct MatmulJob {
    const float* x;
    const float* w;
    float* y;
    int t_count, n_count, k_count;
    int first_tile;
    const float* bias = nullptr;  // [n_count], or none
};
template <class Tl, bool kF16Acc>
__global__ void __launch_bounds__(kMatmulThreads) grouped_matmul_kernel(const MatmulJob* jobs, int job_count, int storage) {
    const int tile = static_cast<int>(blockIdx.x);
    int lo = 0, hi = job_count - 1;  // the last job whose first tile is ≤ tile
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (jobs[mid].first_tile <= tile) lo = mid; else hi = mid - 1;
    }
    const MatmulJob job = jobs[lo];
    const int local = tile - job.first_tile, col_tiles = (job.n_count + Tl::tn - 1) / Tl::tn;
    matmul_tile<Tl, kF16Acc, false>(job.x, job.w, job.y, job.t_count, job.n_count, job.k_count, 0, job.k_count,
                                    local / col_tiles * Tl::tm, local % col_tiles * Tl::tn, storage, job.bias);
}

// Host side: numbers the jobs' tiles (first_tile) for a grouped launch with
// tiling `t`, drops jobs with nothing to compute, and returns the grid's
// block count. Jobs with K = 0 must be handled by the caller (their outputs
// are +0: a memset, not a launch).
inline long long number_tiles(MatmulJob* jobs, int& job_count, Tiling t) {
    long long tiles = 0;
    int kept = 0;
    for (int j = 0; j < job_count; ++j) {
        if (jobs[j].t_count == 0 || jobs[j].n_count == 0) continue;
        jobs[kept] = jobs[j];
        jobs[kept].first_tile = static_cast<int>(tiles);
        tiles += static_cast<long long>((jobs[j].t_count + tiling_rows(t) - 1) / tiling_rows(t)) *
                 ((jobs[j].n_count + tiling_cols(t) - 1) / tiling_cols(t));
        ++kept;
    }
    job_count = kept;
    return tiles;
}

// Host side: the tiling of a grouped launch whose largest job has `rows`
// rows (a MoE layer's experts: a few rows each, rarely enough for wide tiles).
inline Tiling grouped_tiling(long long rows) { return rows <= SkinnyTiling::tm ? Tiling::skinny : Tiling::square; }

// Host side: a grouped launch of `jobs` — its tiling (grouped_tiling of the
// largest job's rows), the jobs numbered for it (number_tiles: empty ones
// dropped) and its block count.
struct GroupedLaunch {
    Tiling tiling = Tiling::skinny;
    long long tiles = 0;
};
inline GroupedLaunch plan_grouped(std::vector<MatmulJob>& jobs) {
    long long max_rows = 0;
    for (const MatmulJob& j : jobs) max_rows = max_rows > j.t_count ? max_rows : j.t_count;
    GroupedLaunch out{grouped_tiling(max_rows), 0};
    int count = static_cast<int>(jobs.size());
    out.tiles = number_tiles(jobs.data(), count, out.tiling);
    jobs.resize(static_cast<std::size_t>(count));
    return out;
}

// Host side: a MoE block's experts as two grouped launches (backend.hpp
// ExpertLayout: slices with x/mid/y offsets, rows, h, i, out). gate_up gets
// every expert's gate (x → g) and up (x → u) job, down every expert's down
// (a → y) job; experts with no rows get none. Jobs with K = 0 are left out:
// their outputs are empty sums, +0, which the caller writes.
struct ExpertWeightsOnDevice {
    const float* gate;
    const float* up;
    const float* down;
    const float* gate_bias = nullptr;  // gpt-oss's, added by the grouped jobs; or none
    const float* up_bias = nullptr;
    const float* down_bias = nullptr;
};
template <class Layout>
inline void expert_matmul_jobs(const Layout& layout, const ExpertWeightsOnDevice* w, const float* x, float* g, float* u,
                               const float* a, float* y, std::vector<MatmulJob>& gate_up, std::vector<MatmulJob>& down) {
    for (std::size_t n = 0; n < layout.slices.size(); ++n) {
        const auto& sl = layout.slices[n];
        if (sl.rows == 0) continue;
        const int rows = static_cast<int>(sl.rows), h = static_cast<int>(sl.h), i = static_cast<int>(sl.i),
                  out = static_cast<int>(sl.out);
        if (h > 0 && i > 0) {
            gate_up.push_back({x + sl.x, w[n].gate, g + sl.mid, rows, i, h, 0, w[n].gate_bias});
            gate_up.push_back({x + sl.x, w[n].up, u + sl.mid, rows, i, h, 0, w[n].up_bias});
        }
        if (i > 0 && out > 0) down.push_back({a + sl.mid, w[n].down, y + sl.y, rows, out, i, 0, w[n].down_bias});
    }
}

// Sum (or max) of one value per thread over the block, by a fixed binary
// tree in shared memory: thread t adds t + 128, then t + 64, ... The result
// is returned to every thread; `red` is reusable after the call.
template <typename Op>
__device__ float block_reduce(float v, float* red, Op op) {
    const int tid = static_cast<int>(threadIdx.x);
    red[tid] = v;
    __syncthreads();
    for (int stride = kReduceThreads / 2; stride > 0; stride /= 2) {
        if (tid < stride) red[tid] = op(red[tid], red[tid + stride]);
        __syncthreads();
    }
    const float out = red[0];
    __syncthreads();
    return out;
}

struct MaxOp {
    // fmaxf drops a NaN, as the oracle's fmax does; the NaN then poisons the
    // row through exp(NaN - max).
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
template <bool kF16Acc>
struct SumOp {
    __device__ float operator()(float a, float b) const { return Accum<kF16Acc>::add(a, b); }
};

// One block per row. Thread t owns columns t, t + 256, ... and sums them in
// that order; the 256 partial sums then go through the tree.
template <bool kF16Acc>
__global__ void __launch_bounds__(kReduceThreads)
    softmax_kernel(const float* x, float* y, int cols, int storage) {
    __shared__ float red[kReduceThreads];
    const float* xr = x + static_cast<std::size_t>(blockIdx.x) * cols;
    float* yr = y + static_cast<std::size_t>(blockIdx.x) * cols;
    const int tid = static_cast<int>(threadIdx.x);
    float m = -INFINITY;
    for (int c = tid; c < cols; c += kReduceThreads) m = fmaxf(m, xr[c]);
    m = block_reduce(m, red, MaxOp{});
    float s = 0.0f;
    for (int c = tid; c < cols; c += kReduceThreads) {
        const float e = kg_store(kg_expf(xr[c] - m), storage);
        yr[c] = e;
        s = Accum<kF16Acc>::add(s, e);
    }
    s = block_reduce(s, red, SumOp<kF16Acc>{});
    for (int c = tid; c < cols; c += kReduceThreads) yr[c] = kg_store(yr[c] / s, storage);
}

template <bool kF16Acc>
__global__ void __launch_bounds__(kReduceThreads)
    rmsnorm_kernel(const float* x, const float* weight, float* y, int cols, float eps, int storage) {
    __shared__ float red[kReduceThreads];
    const float* xr = x + static_cast<std::size_t>(blockIdx.x) * cols;
    float* yr = y + static_cast<std::size_t>(blockIdx.x) * cols;
    const int tid = static_cast<int>(threadIdx.x);
    float s = 0.0f;
    for (int c = tid; c < cols; c += kReduceThreads) {
        if (kF16Acc)
            s = Accum<true>::add(s, xr[c] * xr[c]);  // the square rounded to f32, as the cpu node does
        else
            s = fmaf(xr[c], xr[c], s);
    }
    s = block_reduce(s, red, SumOp<kF16Acc>{});
    // Correctly rounded division (build flags) and square root (kg_sqrtf) on both vendors.
    const float inv = 1.0f / kg_sqrtf(s / static_cast<float>(cols) + eps);
    for (int c = tid; c < cols; c += kReduceThreads) yr[c] = kg_store(xr[c] * inv * weight[c], storage);
}

__global__ void swiglu_kernel(const float* gate, const float* up, float* y, std::size_t n, int storage) {
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const float g = gate[i];
        y[i] = kg_store(g / (1.0f + kg_expf(-g)) * up[i], storage);
    }
}

// gpt-oss's clamped SwiGLU: explicit comparisons, not fminf/fmaxf (those drop a NaN).
__global__ void clamped_swiglu_kernel(const float* gate, const float* up, float* y, std::size_t n, float alpha,
                                      float limit, int storage) {
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const float g = gate[i], u = up[i];
        const float gc = g > limit ? limit : g;
        const float uc = u > limit ? limit : (u < -limit ? -limit : u);
        y[i] = kg_store((uc + 1.0f) * (gc * (1.0f / (1.0f + kg_expf(-(gc * alpha))))), storage);
    }
}

__global__ void sigmoid_kernel(const float* x, float* y, std::size_t n, int storage) {
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
        y[i] = kg_store(1.0f / (1.0f + kg_expf(-x[i])), storage);
}

// One thread per (token, head, pair). neox pairs (i, i + d/2), normal pairs
// (2i, 2i + 1). positions are f32 (converted on the host like the cpu node).
__global__ void rope_kernel(const float* x, const float* positions, const float* inv_freq, float* y, int t_count,
                            int heads, int dim, int neox, int storage) {
    const int half = dim / 2;
    const std::size_t total = static_cast<std::size_t>(t_count) * heads * half;
    for (std::size_t g = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < total;
         g += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const int i = static_cast<int>(g % half);
        const std::size_t th = g / half;  // token · heads + head
        const int t = static_cast<int>(th / heads);
        float s, c;
        kg_sincosf(positions[t] * inv_freq[i], &s, &c);
        const std::size_t base = th * dim;
        const std::size_t i0 = base + (neox ? i : 2 * i), i1 = base + (neox ? i + half : 2 * i + 1);
        const float a = x[i0], b = x[i1];
        y[i0] = kg_store(fmaf(a, c, -(b * s)), storage);
        y[i1] = kg_store(fmaf(b, c, a * s), storage);
    }
}

// --- Gated DeltaNet (qwen3_5_moe, qwen3_next) -------------------------------------
// The definitions, and the textbook loops these must match, are
// lib/kvasir/backend/linear_attention.hpp/.cpp. Both kernels sum in f32 with
// explicit fmaf whatever the node's acc= (as the cpu node, whose acc=f16 does
// not reach inside these ops either), and the recurrent state is f32 in and
// out, never rounded to storage (transformers keeps it in float32 too).

// silu(s) = s / (1 + e^-s), the formula of swiglu_kernel.
__device__ inline float kg_silu(float s) { return s / (1.0f + kg_expf(-s)); }

// softplus as torch (beta 1, threshold 20): x above 20, else log(1 + e^x).
__device__ inline float kg_softplus(float x) { return x > 20.0f ? x : kg_log1pf(kg_expf(x)); }

// One thread per (token, channel), grid stride. Input row t' = t + j - (K-1):
// x when t' ≥ 0, else the history row K-1+t' (null history: zeros). The zero
// padding is multiplied like any input (w·0), exactly as the reference.
// Weights [C, K] (a [C, 1, K] tensor has the same layout).
// kF16Acc: the K-tap sum is an Accum<true> chain (acc=f16), else fmaf.
template <bool kF16Acc>
__global__ void causal_conv1d_silu_kernel(const float* x, const float* w, const float* history, float* y, int t_count,
                                          int channels, int k_count, int storage) {
    const std::size_t total = static_cast<std::size_t>(t_count) * channels;
    const int pad = k_count - 1;
    for (std::size_t g = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < total;
         g += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const int t = static_cast<int>(g / channels), c = static_cast<int>(g % channels);
        const float* wc = w + static_cast<std::size_t>(c) * k_count;
        float s = 0.0f;
        for (int j = 0; j < k_count; ++j) {
            const int tp = t + j - pad;
            const float xv = tp >= 0 ? x[static_cast<std::size_t>(tp) * channels + c]
                             : history != nullptr ? history[static_cast<std::size_t>(pad + tp) * channels + c]
                                                  : 0.0f;
            s = Accum<kF16Acc>::step(s, wc[j], xv);
        }
        y[g] = kg_store(kg_silu(s), storage);
    }
}

// Σ x_i² over n values by every thread of the block: thread t sums i = t,
// t + 256, ... by Accum::step (fmaf in f32), then block_reduce's tree. Same
// order on every vendor.
template <bool kF16Acc>
__device__ inline float block_sum_squares(const float* x, int n, float* red) {
    float s = 0.0f;
    for (int i = static_cast<int>(threadIdx.x); i < n; i += kReduceThreads) s = Accum<kF16Acc>::step(s, x[i], x[i]);
    return block_reduce(s, red, SumOp<kF16Acc>{});
}

// One block (kReduceThreads) per value head h, which reads key head
// h / (nv / nk); the tokens one after another. Per token:
//   q, k of the key head → `work` (this head's 2·dk floats of global scratch),
//   each times rsqrt(Σx² + 1e-6) (1/kg_sqrtf: correctly rounded), q also
//   times 1/√dk; decay = e^g, g = -e^A_log · softplus(a + dt_bias); β = σ(b)
//   (every thread computes these scalars itself: the same bits);
//   thread j (j = tid, tid + 256, ...) owns column j of the state S [dk, dv]:
//     S_ij ← S_ij·decay, m = Σ_i S_ij k_i (fmaf, ascending i),
//     δ = (v_j - m)·β, S_ij ← fmaf(k_i, δ, S_ij), out_j = Σ_i S_ij q_i.
// `state` holds the initial state (zeros when the op has none) and ends as
// the state after the last token; out is rounded to storage, state is not.
// kF16Acc (acc=f16): the sums of squares, m and out are Accum<true> chains
// (rounded to half after every add); the decay, the rank-1 update and the
// state stay f32 — they are not reductions.
template <bool kF16Acc>
__global__ void __launch_bounds__(kReduceThreads)
    gated_delta_kernel(const float* q, const float* k, const float* v, const float* a, const float* b,
                       const float* a_log, const float* dt_bias, float* state, float* out, float* work, int t_count,
                       int nk, int nv, int dk, int dv, int storage) {
    __shared__ float red[kReduceThreads];
    const int h = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x);
    const int kh = h / (nv / nk);
    float* qn = work + static_cast<std::size_t>(h) * 2 * dk;
    float* kn = qn + dk;
    float* s = state + static_cast<std::size_t>(h) * dk * dv;
    const float q_scale = 1.0f / kg_sqrtf(static_cast<float>(dk));
    const float decay_rate = kg_expf(a_log[h]);
    for (int t = 0; t < t_count; ++t) {
        const std::size_t qk_row = (static_cast<std::size_t>(t) * nk + kh) * dk;
        for (int i = tid; i < dk; i += kReduceThreads) {
            qn[i] = q[qk_row + i];
            kn[i] = k[qk_row + i];
        }
        __syncthreads();
        const float q_inv = 1.0f / kg_sqrtf(block_sum_squares<kF16Acc>(qn, dk, red) + 1e-6f);
        const float k_inv = 1.0f / kg_sqrtf(block_sum_squares<kF16Acc>(kn, dk, red) + 1e-6f);
        for (int i = tid; i < dk; i += kReduceThreads) {  // each thread rescales what it loaded
            qn[i] = qn[i] * q_inv * q_scale;
            kn[i] = kn[i] * k_inv;
        }
        __syncthreads();
        const std::size_t th = static_cast<std::size_t>(t) * nv + h;
        const float g = -decay_rate * kg_softplus(a[th] + dt_bias[h]);
        const float decay = kg_expf(g);
        const float beta = 1.0f / (1.0f + kg_expf(-b[th]));
        const float* vr = v + th * dv;
        float* outr = out + th * dv;
        for (int j = tid; j < dv; j += kReduceThreads) {
            float m = 0.0f;
            for (int i = 0; i < dk; ++i) {
                const float sij = s[static_cast<std::size_t>(i) * dv + j] * decay;
                s[static_cast<std::size_t>(i) * dv + j] = sij;
                m = Accum<kF16Acc>::step(m, sij, kn[i]);
            }
            const float delta = (vr[j] - m) * beta;
            float o = 0.0f;
            for (int i = 0; i < dk; ++i) {
                const float sij = fmaf(kn[i], delta, s[static_cast<std::size_t>(i) * dv + j]);
                s[static_cast<std::size_t>(i) * dv + j] = sij;
                o = Accum<kF16Acc>::step(o, sij, qn[i]);
            }
            outr[j] = kg_store(o, storage);
        }
        __syncthreads();  // qn/kn are rewritten by the next token
    }
}

// --- causal GQA attention (Backend::causal_attention, backend.hpp) ----------------
// One block of kReduceThreads per (query t, head h) — block r = t·heads + h —
// reading kv head h / (heads / kv_heads) rows 0 … p0+t only. The arithmetic is
// the node's default composition (matmul_kernel, the host's scale,
// softmax_kernel, matmul_kernel) with every intermediate rounded where that
// composition stores it (kg_store):
//   score = chain of Accum::step over j ascending from 0   (matmul_kernel's chain)
//   x     = kg_store(kg_store(score) · scale)   scale rounded to f32 on the host
//   m     = fmaxf over thread tid's columns tid, tid+256, …, then block_reduce
//   e     = kg_store(kg_expf(x − m)), Σ by Accum::add over the same columns + the tree
//   p     = kg_store(e / Σ);  out[i] = kg_store(chain of Accum::step over s ascending)
// The composition's masked columns are the tail of each thread's list: −inf
// leaves fmaxf's max alone, adds +0 to a sum ≥ +0, and fmaf(+0, v, a) = a in
// P·V — skipping them changes no bit for finite V (a masked V row of Inf or
// NaN poisons only the composition, through 0·Inf).
// With sinks (causal_attention_sinks, gpt-oss; `sinks` [heads] as stored, or
// null): the composition's row has S + 1 columns, the head's sink at column
// S — the last of thread S mod kReduceThreads's list — so σ joins that
// thread's max after its keys, kg_store(kg_expf(σ − m)) its sum, and the
// sink's probability is dropped.
// Rows of more than kAttnChunk keys recompute their scores in each of the
// three passes (max, sum, P·V), chunk by chunk: the same bits, three times
// the q·K work. The split-K variant (nondeterministic=1) runs this kernel
// too: there is no atomic in it.
constexpr int kAttnChunk = 2048;   // probabilities held in shared memory; a multiple of kReduceThreads
constexpr int kAttnMaxDim = 512;   // the host runs the composition beyond
constexpr int kAttnOutPerThread = (kAttnMaxDim + kReduceThreads - 1) / kReduceThreads;

template <bool kF16Acc>
__device__ inline float attention_score(const float* qs, const float* key, int dim, float scale, int storage) {
    float acc = 0.0f;
    for (int j = 0; j < dim; ++j) acc = Accum<kF16Acc>::step(acc, qs[j], key[j]);
    return kg_store(kg_store(acc, storage) * scale, storage);
}

template <bool kF16Acc>
__global__ void __launch_bounds__(kReduceThreads)
    attention_kernel(const float* q, const float* k, const float* v, float* out, int t_count, int heads, int kv_heads,
                     int dim, int s_count, float scale, int storage, const float* sinks) {
    __shared__ float qs[kAttnMaxDim];
    __shared__ float ps[kAttnChunk];  // scores, then exponentials, then one chunk's probabilities
    __shared__ float red[kReduceThreads];
    using A = Accum<kF16Acc>;
    const int tid = static_cast<int>(threadIdx.x), r = static_cast<int>(blockIdx.x);
    const int t = r / heads, h = r % heads;
    const int n = s_count - t_count + t + 1;  // keys 0 … p0 + t
    const bool cached = n <= kAttnChunk;
    const std::size_t kv_base = static_cast<std::size_t>(h / (heads / kv_heads)) * s_count * dim;
    const float* kh = k + kv_base;
    const float* vh = v + kv_base;
    for (int j = tid; j < dim; j += kReduceThreads) qs[j] = q[static_cast<std::size_t>(r) * dim + j];
    __syncthreads();

    float m = -INFINITY;
    for (int c = tid; c < n; c += kReduceThreads) {
        const float x = attention_score<kF16Acc>(qs, kh + static_cast<std::size_t>(c) * dim, dim, scale, storage);
        if (cached) ps[c] = x;
        m = fmaxf(m, x);
    }
    const bool sink_thread = sinks != nullptr && tid == s_count % kReduceThreads;  // column S ends its list
    const float sigma = sink_thread ? sinks[h] : 0.0f;
    if (sink_thread) m = fmaxf(m, sigma);
    m = block_reduce(m, red, MaxOp{});

    float sum = 0.0f;
    for (int c = tid; c < n; c += kReduceThreads) {
        const float x = cached ? ps[c] : attention_score<kF16Acc>(qs, kh + static_cast<std::size_t>(c) * dim, dim, scale, storage);
        const float e = kg_store(kg_expf(x - m), storage);
        if (cached) ps[c] = e;
        sum = A::add(sum, e);
    }
    if (sink_thread) sum = A::add(sum, kg_store(kg_expf(sigma - m), storage));
    sum = block_reduce(sum, red, SumOp<kF16Acc>{});

    float acc[kAttnOutPerThread];
    for (int j = 0; j < kAttnOutPerThread; ++j) acc[j] = 0.0f;
    for (int c0 = 0; c0 < n; c0 += kAttnChunk) {
        const int cn = min(kAttnChunk, n - c0);
        __syncthreads();  // the previous chunk's P·V is done reading ps
        for (int c = tid; c < cn; c += kReduceThreads) {
            const float e = cached ? ps[c]
                                   : kg_store(kg_expf(attention_score<kF16Acc>(qs, kh + static_cast<std::size_t>(c0 + c) * dim,
                                                                             dim, scale, storage) -
                                                      m),
                                              storage);
            ps[c] = kg_store(e / sum, storage);
        }
        __syncthreads();
        for (int j = 0; j < kAttnOutPerThread; ++j) {
            const int i = tid + j * kReduceThreads;
            if (i >= dim) break;
            const float* col = vh + static_cast<std::size_t>(c0) * dim + i;
            for (int s = 0; s < cn; ++s) acc[j] = A::step(acc[j], ps[s], col[static_cast<std::size_t>(s) * dim]);
        }
    }
    float* row = out + (static_cast<std::size_t>(t) * heads + h) * dim;
    for (int j = 0; j < kAttnOutPerThread; ++j) {
        const int i = tid + j * kReduceThreads;
        if (i < dim) row[i] = kg_store(acc[j], storage);
    }
}

// Backend::add / mul / scale with the default's bits (backend.cpp: f64,
// rounded to f32, then to storage): one f32 operation on two f32 operands
// rounds the exact sum or product once, as the default's rounding of its
// f64 result to f32 does (exact for a product, innocuous for a sum). The
// host runs them on operands the default would read as they stand in the
// buffers (gpu_backend_impl.inc says when).
__global__ void add_kernel(const float* a, const float* b, float* y, std::size_t n, int storage) {
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
        y[i] = kg_store(a[i] + b[i], storage);
}

// add_kernel with b one row broadcast over a's rows (a linear layer's bias, as
// the default adds broadcast_rows(bias)): y[i] = a[i] + b[i mod cols].
__global__ void add_rows_kernel(const float* a, const float* b, float* y, std::size_t n, std::size_t cols, int storage) {
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
        y[i] = kg_store(a[i] + b[i % cols], storage);
}

__global__ void mul_kernel(const float* a, const float* b, float* y, std::size_t n, int storage) {
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
        y[i] = kg_store(a[i] * b[i], storage);
}

__global__ void scale_kernel(const float* x, float* y, std::size_t n, float s, int storage) {
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
        y[i] = kg_store(x[i] * s, storage);
}

// A device KV cache (Backend::kv_rows): y [heads, keep + T, d] with the
// first keep rows of each head of cache [heads, s_cache, d], then row t of
// head g of rows [T, heads, d] — stored values moved as they are.
__global__ void kv_cache_rows_kernel(const float* cache, const float* rows, float* y, int heads, int s_cache, int keep,
                                     int t_count, int d) {
    const std::size_t s_out = static_cast<std::size_t>(keep) + static_cast<std::size_t>(t_count);
    const std::size_t n = static_cast<std::size_t>(heads) * s_out * static_cast<std::size_t>(d);
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t j = i % static_cast<std::size_t>(d), s = (i / static_cast<std::size_t>(d)) % s_out,
                          g = i / (static_cast<std::size_t>(d) * s_out);
        y[i] = s < static_cast<std::size_t>(keep)
                   ? cache[(g * static_cast<std::size_t>(s_cache) + s) * static_cast<std::size_t>(d) + j]
                   : rows[((s - static_cast<std::size_t>(keep)) * static_cast<std::size_t>(heads) + g) *
                              static_cast<std::size_t>(d) + j];
    }
}

// A MoE block on the device (the GPU node's moe_block; the table is
// backend.hpp moe_device_table's): gathered row g is token table[2g], put at
// row table[2g+1] of the experts' x buffer — values moved as they are.
__global__ void moe_gather_kernel(const float* x, const std::uint32_t* table, float* xb, std::size_t g_count, int h) {
    const std::size_t hs = static_cast<std::size_t>(h), n = g_count * hs;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t g = i / hs, c = i % hs;
        xb[static_cast<std::size_t>(table[2 * g + 1]) * hs + c] = x[static_cast<std::size_t>(table[2 * g]) * hs + c];
    }
}

// out[t, c] = Σ w·y[row, c] over token t's terms in order, from +0, every
// product and sum rounded to f32 (no contraction), then to storage: the
// default's combine (backend.cpp moe_combine<float>) element by element.
__global__ void moe_combine_kernel(const float* y, const std::uint32_t* table, float* out, std::size_t g_count, int t_count,
                                   int h, int storage) {
    const std::size_t hs = static_cast<std::size_t>(h), n = static_cast<std::size_t>(t_count) * hs;
    const std::uint32_t* starts = table + 2 * g_count;
    const std::uint32_t* terms = starts + t_count + 1;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t t = i / hs, c = i % hs;
        float acc = 0.0f;
        for (std::uint32_t e = starts[t]; e < starts[t + 1]; ++e) {
            const float p = kg_float(terms[2 * static_cast<std::size_t>(e) + 1]) * y[static_cast<std::size_t>(terms[2 * static_cast<std::size_t>(e)]) * hs + c];
            acc = acc + p;
        }
        out[i] = kg_store(acc, storage);
    }
}

// Data movement (Backend::copy_columns / last_rows / join_columns /
// repeat_columns): rows × n values to y [*, y_cols] from row y_r0, column
// y_c0 on; value (r, c) is src [*, src_cols]'s row src_r0 + r, column
// src_c0 + c'·src_step with c' = c mod src_wrap (src_wrap 0: c' = c) —
// moved as they are (already in storage format).
__global__ void copy_block_kernel(const float* src, float* y, int rows, int n, int src_cols, int src_r0, int src_c0,
                                  int src_step, int src_wrap, int y_cols, int y_r0, int y_c0) {
    const std::size_t count = static_cast<std::size_t>(rows) * static_cast<std::size_t>(n);
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t r = i / static_cast<std::size_t>(n), c = i % static_cast<std::size_t>(n);
        const std::size_t cs = src_wrap > 0 ? c % static_cast<std::size_t>(src_wrap) : c;
        y[(static_cast<std::size_t>(y_r0) + r) * static_cast<std::size_t>(y_cols) + static_cast<std::size_t>(y_c0) + c] =
            src[(static_cast<std::size_t>(src_r0) + r) * static_cast<std::size_t>(src_cols) + static_cast<std::size_t>(src_c0) +
                cs * static_cast<std::size_t>(src_step)];
    }
}

__global__ void store_kernel(float* y, std::size_t n, int storage) {
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
        y[i] = kg_store(y[i], storage);
}

}  // namespace kvasir::KG_NS
