// Causal GQA attention (Backend::causal_attention) fused: one work-group per (query row, head) reads only the
// keys that row sees and keeps its probabilities in local memory; no [heads·T, S] score tensor exists anywhere.
//
// Reference loop (cpu-ref, f64; backend.hpp):
//   x[s] = scale · Σ_j q[j]·K[s][j]  for s ≤ p0+t;  p = softmax(x);  out[i] = Σ_s p[s]·V[s][i]
//
// The arithmetic is this device's default composition (matmul.cl, the host's
// scale, rows.cl's softmax, matmul.cl again) bit for bit, R = kv_round_storage:
//   score  = R(one KV_ACC_FMA chain over j ascending from 0)   matmul.cl's chain
//   x      = R(score · scale)            scale rounded to f32 on the host, one f32 product
//   m      = kv_max_nan over work-item l's columns l, l+WG, … then rows.cl's tree
//   e      = R(exp(x − m)),  Σ = KV_ACC_ADD over the same columns, then the tree
//   p      = R(e / Σ)
//   out[i] = R(one KV_ACC_FMA chain over s ascending from 0)   matmul.cl's chain
// The composition's masked columns (s > p0+t, −inf after the scale) are the
// tail of every work-item's column list: they leave the max unchanged, add
// exp(−inf) = +0 to a sum that is ≥ +0, and add fma(+0, v, a) = a to P·V —
// so skipping them changes no bit for finite V. (A masked V row holding Inf
// or NaN poisons the composition's P·V through 0·Inf, never this kernel.)
//
// Rows longer than KV_ATTN_CHUNK keys do not fit the local probabilities:
// their scores are computed again in each of the three passes (max, sum,
// P·V), chunk by chunk in ascending order — the same operations on the same
// values, so the same bits, at three times the q·K work.

#ifndef KV_ROW_WG
#define KV_ROW_WG 256  // a power of two: the trees halve it; the same WG as rows.cl's softmax
#endif
#ifndef KV_ATTN_CHUNK
#define KV_ATTN_CHUNK 2048  // keys whose probabilities are held in local memory at once; a multiple of KV_ROW_WG
#endif
#ifndef KV_ATTN_MAX_DIM
#define KV_ATTN_MAX_DIM 512  // the host runs the composition for larger head dims
#endif
#define KV_ATTN_OUT_PER_ITEM ((KV_ATTN_MAX_DIM + KV_ROW_WG - 1) / KV_ROW_WG)

// R(R(q·K[s]) · scale): the stored score, then the stored scaled score.
inline float kv_attn_score(__local const float* qs, __global const kv_store_t* k, size_t row, int d, float scale) {
    kv_acc_t acc = KV_ACC_ZERO;
    for (int j = 0; j < d; ++j) acc = KV_ACC_FMA(qs[j], KV_LOAD(k, row + (size_t)j), acc);
    return kv_round_storage(kv_round_storage(KV_ACC_TO_FLOAT(acc)) * scale);
}

// Work-group r = t·heads + h (query t at cache position s_count − T + t,
// head h, kv head h / (heads / kv_heads)); k and v are [kv_heads, S, D].
__kernel __attribute__((reqd_work_group_size(KV_ROW_WG, 1, 1)))
void kv_causal_attention(__global const kv_store_t* q,  // [T, heads, D]
                         __global const kv_store_t* k,  // [kv_heads, S, D]
                         __global const kv_store_t* v,  // [kv_heads, S, D]
                         __global kv_store_t* out,      // [T, heads·D]
                         const int t_count, const int heads, const int kv_heads, const int d, const int s_count,
                         const float scale) {
    __local float qs[KV_ATTN_MAX_DIM];
    __local float ps[KV_ATTN_CHUNK];  // scores, then exponentials, then probabilities of one chunk
    __local float red_max[KV_ROW_WG];
    __local kv_acc_t red_sum[KV_ROW_WG];
    const int l = (int)get_local_id(0);
    const int r = (int)get_group_id(0);
    const int t = r / heads, h = r % heads;
    const int n = s_count - t_count + t + 1;  // keys 0 … p0 + t
    const bool cached = n <= KV_ATTN_CHUNK;
    const size_t kv_base = (size_t)(h / (heads / kv_heads)) * (size_t)s_count * (size_t)d;

    for (int j = l; j < d; j += KV_ROW_WG) qs[j] = KV_LOAD(q, (size_t)r * (size_t)d + (size_t)j);
    barrier(CLK_LOCAL_MEM_FENCE);

    // Pass 1: scores and their max.
    float m = -INFINITY;
    for (int c = l; c < n; c += KV_ROW_WG) {
        const float x = kv_attn_score(qs, k, kv_base + (size_t)c * (size_t)d, d, scale);
        if (cached) ps[c] = x;
        m = kv_max_nan(m, x);
    }
    m = kv_group_max(red_max, m);

    // Pass 2: exponentials and their sum.
    kv_acc_t sum = KV_ACC_ZERO;
    for (int c = l; c < n; c += KV_ROW_WG) {
        const float x = cached ? ps[c] : kv_attn_score(qs, k, kv_base + (size_t)c * (size_t)d, d, scale);
        const float e = kv_round_storage(exp(x - m));
        if (cached) ps[c] = e;
        sum = KV_ACC_ADD(sum, e);
    }
    const float total = KV_ACC_TO_FLOAT(kv_group_sum(red_sum, sum));

    // Pass 3: probabilities chunk by chunk, and P·V; work-item l owns outputs
    // l, l + WG, … (one chain each, continued across chunks).
    kv_acc_t acc[KV_ATTN_OUT_PER_ITEM];
    for (int j = 0; j < KV_ATTN_OUT_PER_ITEM; ++j) acc[j] = KV_ACC_ZERO;
    for (int c0 = 0; c0 < n; c0 += KV_ATTN_CHUNK) {
        const int cn = min(KV_ATTN_CHUNK, n - c0);
        barrier(CLK_LOCAL_MEM_FENCE);  // the previous chunk's P·V is done reading ps
        for (int c = l; c < cn; c += KV_ROW_WG) {
            const float e = cached ? ps[c]
                                   : kv_round_storage(exp(kv_attn_score(qs, k, kv_base + (size_t)(c0 + c) * (size_t)d, d,
                                                                        scale) - m));
            ps[c] = kv_round_storage(e / total);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int j = 0; j < KV_ATTN_OUT_PER_ITEM; ++j) {
            const int i = l + j * KV_ROW_WG;
            if (i >= d) break;
            const size_t col = kv_base + (size_t)c0 * (size_t)d + (size_t)i;
            for (int s = 0; s < cn; ++s) acc[j] = KV_ACC_FMA(ps[s], KV_LOAD(v, col + (size_t)s * (size_t)d), acc[j]);
        }
    }
    const size_t out_row = (size_t)t * (size_t)heads * (size_t)d + (size_t)h * (size_t)d;
    for (int j = 0; j < KV_ATTN_OUT_PER_ITEM; ++j) {
        const int i = l + j * KV_ROW_WG;
        if (i < d) KV_STORE(KV_ACC_TO_FLOAT(acc[j]), out, out_row + (size_t)i);
    }
}
