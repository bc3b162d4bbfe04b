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
// With sinks (Backend::causal_attention_sinks, gpt-oss): the composition's
// row has S + 1 columns, the head's sink σ = R(sink) at column S, which is
// the last column of work-item S mod WG's list: σ joins that item's max after
// its keys, R(exp(σ − m)) its sum, and the sink's probability is dropped.
// (`sinks` [heads] as stored; with_sinks = 0: none, the buffer unread.)
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
                         const float scale, __global const kv_store_t* sinks, const int with_sinks) {
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
    const bool sink_item = with_sinks && l == s_count % KV_ROW_WG;  // column S is the last of its list
    const float sigma = sink_item ? KV_LOAD(sinks, (size_t)h) : 0.0f;
    if (sink_item) m = kv_max_nan(m, sigma);
    m = kv_group_max(red_max, m);

    // Pass 2: exponentials and their sum.
    kv_acc_t sum = KV_ACC_ZERO;
    for (int c = l; c < n; c += KV_ROW_WG) {
        const float x = cached ? ps[c] : kv_attn_score(qs, k, kv_base + (size_t)c * (size_t)d, d, scale);
        const float e = kv_round_storage(exp(x - m));
        if (cached) ps[c] = e;
        sum = KV_ACC_ADD(sum, e);
    }
    if (sink_item) sum = KV_ACC_ADD(sum, kv_round_storage(exp(sigma - m)));
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

// ---- kv_causal_attention_panels: the same bits, for CPU devices ------------------------------
//
// kv_causal_attention above runs 256 work-items per row, each with ONE scalar
// fma chain. A CPU device (PoCL) runs a work-group's items one after another
// on one core, so that is one chain in flight (latency-bound, ~3 GFLOP/s) and
// a loop over 256 items at every barrier of the trees: slower than the node's
// own composition (BENCHMARKS.md, "OpenCL attention for CPU devices"). Here
// ONE work-item computes a whole (query row, head) — the same values, each by
// the same operations in the same order:
//
//   scores  the host lays each kv head's keys out in panels of 16 keys,
//           d-major — kp[((g·P + p)·d + j)·16 + i] = K_g[16p + i][j], zero
//           past S — so key i of a panel is lane i of one float16 fma chain
//           over j ascending from +0 (kv_attn_score's chain, 16 keys at a
//           time), KV_ATTN_KEY_PANELS panels in flight;
//   softmax the row's 256 partial maxima and sums (column c goes to partial
//           c mod KV_ROW_WG, ascending: work-item l's columns above) kept in
//           local memory, then the trees of common.cl walked level by level
//           (kv_seq_max / kv_seq_sum: the same pairs in the same order);
//   P·V     output i is lane i mod 16 of one float16 chain over s ascending
//           from +0, KV_ATTN_PV_VECS vectors in flight; V as stored.
//
// OpenCL's fma is correctly rounded per lane, so a lane's chain is the scalar
// chain bit for bit. Needs f32 accumulation and d a multiple of 16; the host
// runs kv_causal_attention otherwise and on GPU devices, whose items do run
// side by side.

#if !KV_ACC_HALF
#ifndef KV_ATTN_KEY_PANELS
#define KV_ATTN_KEY_PANELS 4
#endif
#ifndef KV_ATTN_PV_VECS
#define KV_ATTN_PV_VECS 8
#endif

// kv_group_max / kv_group_sum's trees on partials red[0 … KV_ROW_WG−1], by one work-item.
inline float kv_seq_max(__local float* red) {
    for (int s = KV_ROW_WG / 2; s > 0; s >>= 1)
        for (int l = 0; l < s; ++l) red[l] = kv_max_nan(red[l], red[l + s]);
    return red[0];
}
inline float kv_seq_sum(__local float* red) {
    for (int s = KV_ROW_WG / 2; s > 0; s >>= 1)
        for (int l = 0; l < s; ++l) red[l] = KV_ACC_ADD(red[l], red[l + s]);
    return red[0];
}

// Scores of keys c0 … c0+cn−1 into ps[0 … cn−1] (c0 a multiple of 16).
// `kp_head`: the kv head's first panel, in 16-element vectors.
inline void kv_attn_panel_scores(__local float* ps, __local const float* qs, __global const kv_store_t* kp,
                                 const size_t kp_head, const int c0, const int cn, const int d, const float scale) {
    const int np = (cn + 15) / 16;
    for (int pb = 0; pb < np; pb += KV_ATTN_KEY_PANELS) {
        size_t panel[KV_ATTN_KEY_PANELS];  // panels past the chunk repeat its last one (computed, never stored)
        float16 acc[KV_ATTN_KEY_PANELS];
        for (int i = 0; i < KV_ATTN_KEY_PANELS; ++i) {
            panel[i] = kp_head + (size_t)(c0 / 16 + min(pb + i, np - 1)) * (size_t)d;
            acc[i] = (float16)(0.0f);
        }
        for (int j = 0; j < d; ++j) {
            const float16 qj = (float16)(qs[j]);
            for (int i = 0; i < KV_ATTN_KEY_PANELS; ++i) acc[i] = fma(qj, KV_LOAD16(kp, panel[i] + (size_t)j), acc[i]);
        }
        for (int i = 0; i < KV_ATTN_KEY_PANELS && pb + i < np; ++i) {
            float s[16];
            vstore16(acc[i], 0, s);
            const int c = (pb + i) * 16;
            for (int lane = 0; lane < 16 && c + lane < cn; ++lane)
                ps[c + lane] = kv_round_storage(kv_round_storage(s[lane]) * scale);
        }
    }
}

// Work-item r = t·heads + h (work-groups of one); kp as above, v [kv_heads, S, D].
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void kv_causal_attention_panels(__global const kv_store_t* q,   // [T, heads, D]
                                __global const kv_store_t* kp,  // [kv_heads, ⌈S/16⌉, D, 16]
                                __global const kv_store_t* v,   // [kv_heads, S, D]
                                __global kv_store_t* out,       // [T, heads·D]
                                const int t_count, const int heads, const int kv_heads, const int d, const int s_count,
                                const float scale, __global const kv_store_t* sinks, const int with_sinks) {
    __local float qs[KV_ATTN_MAX_DIM];
    __local float ps[KV_ATTN_CHUNK];  // scores, then exponentials, then probabilities of one chunk
    __local float red[KV_ROW_WG];     // the partial maxima, then the partial sums
    const int r = (int)get_global_id(0);
    const int t = r / heads, h = r % heads;
    const int n = s_count - t_count + t + 1;  // keys 0 … p0 + t
    const bool cached = n <= KV_ATTN_CHUNK;
    const int g = h / (heads / kv_heads);
    const int dv = d / 16;  // 16-output vectors of a row
    const size_t kp_head = (size_t)g * (size_t)((s_count + 15) / 16) * (size_t)d;
    const size_t v_head = (size_t)g * (size_t)s_count * (size_t)dv;

    for (int j = 0; j < d; ++j) qs[j] = KV_LOAD(q, (size_t)r * (size_t)d + (size_t)j);

    // Pass 1: scores and their max.
    for (int l = 0; l < KV_ROW_WG; ++l) red[l] = -INFINITY;
    for (int c0 = 0; c0 < n; c0 += KV_ATTN_CHUNK) {
        const int cn = min(KV_ATTN_CHUNK, n - c0);
        kv_attn_panel_scores(ps, qs, kp, kp_head, c0, cn, d, scale);
        for (int c = 0; c < cn; ++c) red[c % KV_ROW_WG] = kv_max_nan(red[c % KV_ROW_WG], ps[c]);
    }
    const int sink_part = s_count % KV_ROW_WG;  // the partial that holds column S, the sink's, last
    const float sigma = with_sinks ? KV_LOAD(sinks, (size_t)h) : 0.0f;
    if (with_sinks) red[sink_part] = kv_max_nan(red[sink_part], sigma);
    const float m = kv_seq_max(red);

    // Pass 2: exponentials and their sum (held in ps when the row fits).
    for (int l = 0; l < KV_ROW_WG; ++l) red[l] = KV_ACC_ZERO;
    for (int c0 = 0; c0 < n; c0 += KV_ATTN_CHUNK) {
        const int cn = min(KV_ATTN_CHUNK, n - c0);
        if (!cached) kv_attn_panel_scores(ps, qs, kp, kp_head, c0, cn, d, scale);
        for (int c = 0; c < cn; ++c) ps[c] = kv_round_storage(exp(ps[c] - m));
        for (int c = 0; c < cn; ++c) red[c % KV_ROW_WG] = KV_ACC_ADD(red[c % KV_ROW_WG], ps[c]);
    }
    if (with_sinks) red[sink_part] = KV_ACC_ADD(red[sink_part], kv_round_storage(exp(sigma - m)));
    const float total = KV_ACC_TO_FLOAT(kv_seq_sum(red));

    // Pass 3: probabilities chunk by chunk, and P·V, KV_ATTN_PV_VECS output vectors at a time.
    const size_t out_row = (size_t)r * (size_t)d;  // (t·heads + h)·d
    for (int u0 = 0; u0 < dv; u0 += KV_ATTN_PV_VECS) {
        float16 acc[KV_ATTN_PV_VECS];
        for (int i = 0; i < KV_ATTN_PV_VECS; ++i) acc[i] = (float16)(0.0f);
        for (int c0 = 0; c0 < n; c0 += KV_ATTN_CHUNK) {
            const int cn = min(KV_ATTN_CHUNK, n - c0);
            if (!cached || u0 == 0) {  // the probabilities of this chunk into ps (once when the row fits)
                if (!cached) {
                    kv_attn_panel_scores(ps, qs, kp, kp_head, c0, cn, d, scale);
                    for (int c = 0; c < cn; ++c) ps[c] = kv_round_storage(exp(ps[c] - m));
                }
                for (int c = 0; c < cn; ++c) ps[c] = kv_round_storage(ps[c] / total);
            }
            for (int s = 0; s < cn; ++s) {
                const float16 p = (float16)(ps[s]);
                const size_t row = v_head + (size_t)(c0 + s) * (size_t)dv;
                for (int i = 0; i < KV_ATTN_PV_VECS; ++i)  // vectors past the row repeat its last one (never stored)
                    acc[i] = fma(p, KV_LOAD16(v, row + (size_t)min(u0 + i, dv - 1)), acc[i]);
            }
        }
        for (int i = 0; i < KV_ATTN_PV_VECS && u0 + i < dv; ++i) {
            float o[16];
            vstore16(acc[i], 0, o);
            for (int lane = 0; lane < 16; ++lane) KV_STORE(o[lane], out, out_row + (size_t)(u0 + i) * 16 + (size_t)lane);
        }
    }
}
#endif  // !KV_ACC_HALF

// kv_causal_attention_panels' keys from a device KV cache (the host's
// key_panels, on the device): out [heads, ⌈S/16⌉, D, 16] with
// out[g][p][j][i] = keys[g][16p + i][j], +0 past S — stored values moved as
// they are (KV_LOAD/KV_STORE are exact on a stored value).
__kernel void kv_key_panels(__global const kv_store_t* keys, __global kv_store_t* out, const int heads, const int s_count,
                            const int d) {
    const size_t i = get_global_id(0);
    const size_t np = ((size_t)s_count + 15) / 16;
    if (i >= (size_t)heads * np * (size_t)d * 16) return;
    const size_t lane = i % 16, j = (i / 16) % (size_t)d, p = (i / (16 * (size_t)d)) % np, g = i / (16 * (size_t)d * np);
    const size_t s = p * 16 + lane;
    if (s < (size_t)s_count)
        KV_STORE(KV_LOAD(keys, (g * (size_t)s_count + s) * (size_t)d + j), out, i);
    else
        KV_STORE(0.0f, out, i);
}
