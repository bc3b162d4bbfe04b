// y = x·wᵀ as a device wants it: a work-group stages a KV_TILE-row slice of x and a KV_TILE·KV_WN-row slice
// of w in local memory, KV_TILE columns of k at a time; every output is ONE fma chain over k (not SIMD lanes).
//
// Reference loop (cpu-ref, f64):  y[t][n] = Σ_k x[t][k]·w[n][k]
// Here: acc(t,n) = fma(x[t][k], w[n][k], acc) for k = 0, 1, ..., K-1, in that
// order, rounded to the accumulation type at every step. The order depends
// only on K — never on the tile sizes or the device — so results are
// deterministic and identical across work-group shapes.

#ifndef KV_TILE
#define KV_TILE 16  // work-items per work-group side; also the k chunk (TILE_K)
#endif
#ifndef KV_WN
#define KV_WN 8     // consecutive outputs per work-item along n (independent chains)
#endif
#define KV_BN (KV_TILE * KV_WN)  // n extent of a work-group's output tile

// Work-item (ln, lt) = (get_local_id(0), get_local_id(1)) owns the KV_WN
// consecutive outputs (t0 + lt, n0 + ln·KV_WN + j), j < KV_WN: KV_WN
// independent fma chains that hide the latency of one chain, fed by KV_WN
// contiguous floats of local memory per step — which device compilers turn
// into vector loads and one SIMD fma (PoCL emits a ymm vfmadd231ps for the j
// loop). Each output's own chain is untouched by this blocking.
__kernel __attribute__((reqd_work_group_size(KV_TILE, KV_TILE, 1)))
void kv_matmul(__global const kv_store_t* x,  // [T, K]
               __global const kv_store_t* w,  // [N, K]
               __global kv_store_t* y,        // [T, N]
               const int T, const int N, const int K) {
    // +1 column of padding: the transposed store into ws would otherwise hit
    // one local bank KV_TILE times.
    __local float xs[KV_TILE][KV_TILE + 1];  // xs[t][k]
    __local float ws[KV_TILE][KV_BN + 1];    // ws[k][n]: transposed on the way in

    const int ln = (int)get_local_id(0);
    const int lt = (int)get_local_id(1);
    const int n0 = (int)get_group_id(0) * KV_BN;
    const int t0 = (int)get_group_id(1) * KV_TILE;

    kv_acc_t acc[KV_WN];
    for (int j = 0; j < KV_WN; ++j) acc[j] = KV_ACC_ZERO;

    for (int k0 = 0; k0 < K; k0 += KV_TILE) {
        // Reads run along k (contiguous in memory) across local id 0.
        // Out-of-range elements are never added (kn below); the zero only
        // keeps local memory defined.
        const int k = k0 + ln;
        const int tx = t0 + lt;
        xs[lt][ln] = (tx < T && k < K) ? KV_LOAD(x, (size_t)tx * (size_t)K + (size_t)k) : 0.0f;
        for (int j = 0; j < KV_WN; ++j) {
            const int nw = n0 + lt + KV_TILE * j;
            ws[ln][lt + KV_TILE * j] = (nw < N && k < K) ? KV_LOAD(w, (size_t)nw * (size_t)K + (size_t)k) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        const int kn = min(KV_TILE, K - k0);
        for (int kk = 0; kk < kn; ++kk) {
            const float xv = xs[lt][kk];
            for (int j = 0; j < KV_WN; ++j) acc[j] = KV_ACC_FMA(xv, ws[kk][ln * KV_WN + j], acc[j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);  // the tiles are overwritten next round
    }

    const int t = t0 + lt;
    for (int j = 0; j < KV_WN; ++j) {
        const int n = n0 + ln * KV_WN + j;
        if (t < T && n < N) KV_STORE(KV_ACC_TO_FLOAT(acc[j]), y, (size_t)t * (size_t)N + (size_t)n);
    }
}

// ---- kv_matmul_packed_R: the same sums on weights packed for them -------------------------------
//
// The weight as the node's cache keeps it for matmul: panels of 16 outputs,
// k-major — wp[(p·K + k)·16 + j] = w[16p + j][k], zero past N (the host packs
// it once per resident weight), in f32, half or bf16 (below). A work-item owns R rows × the 16 outputs of
// one panel: per k it loads the panel's 16 weights as one vector and adds
// x[t][k]·w to R float16 accumulators, lane j of accumulator r being output
// (t0 + r, 16p + j). Every output is still ONE fma chain over k = 0 … K−1 in
// order, rounded to f32 at every step: the bits of kv_matmul above, on
// every device. What changes is the speed on CPU devices: no local memory,
// no barriers, and a 16-wide fma per weight vector, which PoCL compiles to
// AVX-512 (BENCHMARKS.md, "OpenCL matmul on packed weights"). f32
// accumulation only (acc=f16 nodes run kv_matmul). Work-groups of one
// work-item; global id 0 runs over the row blocks, so consecutive groups
// share a panel.
// The panels hold each weight in the narrowest format that represents its
// value as stored exactly (the host decides: a bf16 checkpoint's weights
// stay bf16 on an f32 or bf16 node, half on a half node): widening them
// here is exact, so the format changes the bytes moved, never a bit.
#define KV_PANEL_F32(p, i) vload16((size_t)(i), (__global const float*)(p))
#define KV_PANEL_F16(p, i) vload_half16((size_t)(i), (__global const half*)(p))
#define KV_PANEL_BF16(p, i) as_float16(convert_uint16(vload16((size_t)(i), (__global const ushort*)(p))) << 16)

#define KV_MATMUL_PACKED(NAME, R, PANEL)                                                                 \
    __kernel __attribute__((reqd_work_group_size(1, 1, 1)))                                              \
    void NAME(__global const kv_store_t* x, __global const uchar* wp, __global kv_store_t* y,           \
              const int T, const int N, const int K) {                                                   \
        const int t0 = (int)get_global_id(0) * R;                                                        \
        const int p = (int)get_global_id(1);                                                             \
        if (t0 >= T || p * 16 >= N) return;                                                              \
        size_t xrow[R]; /* rows past T read row T-1 (computed, never stored) */                         \
        for (int r = 0; r < R; ++r) xrow[r] = (size_t)min(t0 + r, T - 1) * (size_t)K;                    \
        const size_t panel = (size_t)p * (size_t)K; /* in 16-element vectors */                         \
        float16 acc[R];                                                                                  \
        for (int r = 0; r < R; ++r) acc[r] = (float16)(0.0f);                                            \
        for (int k = 0; k < K; ++k) {                                                                    \
            const float16 wv = PANEL(wp, panel + (size_t)k);                                             \
            for (int r = 0; r < R; ++r) acc[r] = fma((float16)(KV_LOAD(x, xrow[r] + (size_t)k)), wv, acc[r]); \
        }                                                                                                \
        for (int r = 0; r < R && t0 + r < T; ++r) {                                                      \
            float out[16];                                                                               \
            vstore16(acc[r], 0, out);                                                                    \
            const size_t base = (size_t)(t0 + r) * (size_t)N + (size_t)p * 16;                           \
            for (int j = 0; j < 16 && p * 16 + j < N; ++j) KV_STORE(out[j], y, base + (size_t)j);        \
        }                                                                                                \
    }

#define KV_MATMUL_PACKED_ROWS(R)                                   \
    KV_MATMUL_PACKED(kv_matmul_packed##R##_f32, R, KV_PANEL_F32)   \
    KV_MATMUL_PACKED(kv_matmul_packed##R##_f16, R, KV_PANEL_F16)   \
    KV_MATMUL_PACKED(kv_matmul_packed##R##_bf16, R, KV_PANEL_BF16)

KV_MATMUL_PACKED_ROWS(1)
KV_MATMUL_PACKED_ROWS(2)
KV_MATMUL_PACKED_ROWS(4)
KV_MATMUL_PACKED_ROWS(8)
