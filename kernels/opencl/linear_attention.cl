// Gated DeltaNet linear attention (qwen3_5_moe, qwen3_next): the causal
// depthwise conv1d with SiLU and the recurrent gated delta rule. The exact
// definitions are lib/kvasir/backend/linear_attention.hpp; every arithmetic
// operation of both ops runs here, the host only moves data.
//
// Reference loops (cpu-ref, f64; linear_attention.cpp):
//   conv:  y[t, c] = silu(Σ_{j<K} w[c, j] · xx[t + j, c]), xx = history (or K−1
//          zero rows) followed by x; silu(s) = s / (1 + e^-s)
//   delta: per value head h (key head h / (nv / nk)), token by token:
//          q, k ← x / sqrt(Σ x² + 1e-6);  q ← q · (1 / sqrt(dk))
//          g = −exp(A_log) · softplus(a + dt_bias)  (softplus(x) = x for x > 20)
//          β = 1 / (1 + e^-b)
//          S ← S · exp(g);  m_j = Σ_i S_ij k_i;  δ_j = (v_j − m_j) · β;
//          S_ij ← S_ij + k_i δ_j;  out_j = Σ_i S_ij q_i
//
// Arithmetic: f32 throughout with the device's exp/log1p/sqrt and division
// (OpenCL 1.2 full profile: exp ≤ 3 ulp, log1p ≤ 2 ulp, sqrt ≤ 3 ulp, x/y ≤
// 2.5 ulp). The dot products (the conv's K taps, the delta rule's Σ_i over
// dk, the sums of squares of the l2norm) and the rank-1 update S + k·δ are
// explicit fma() chains, as matmul's and rmsnorm's are; FP_CONTRACT is off
// (common.cl), so nothing else is fused. acc=f16: those sums (not the
// rank-1 update, which is the state's, not a reduction) are kv_acc_t chains
// of KV_ACC_FMA / KV_ACC_ADD, as matmul's and rmsnorm's, so they are rounded
// to half after every add (as on the cpu and GPU backends). Storage: activations and weights
// are read through KV_LOAD (inputs rounded to storage on upload) and results
// written through KV_STORE (rounded to storage); the recurrent state is an
// f32 buffer in every variant, read and written as plain floats.

#ifndef KV_ROW_WG
#define KV_ROW_WG 256  // a power of two: the l2norm tree halves it
#endif

// One work-item per (t, c), flattened as t · C + c. The K taps are summed in
// ascending j (the reference's order), one fma each.
__kernel void kv_causal_conv1d_silu(__global const kv_store_t* x, __global const kv_store_t* w,
                                    __global const kv_store_t* history, __global kv_store_t* y, const int t_count,
                                    const int c_count, const int k_count, const int has_history) {
    const size_t i = get_global_id(0);
    if (i >= (size_t)t_count * (size_t)c_count) return;
    const int t = (int)(i / (size_t)c_count);
    const int c = (int)(i % (size_t)c_count);
    const int pad = k_count - 1;
    kv_acc_t s = KV_ACC_ZERO;
    for (int j = 0; j < k_count; ++j) {
        const int tp = t + j - pad;  // input row; < 0: the history (or zeros) before these tokens
        float xv = 0.0f;
        if (tp >= 0)
            xv = KV_LOAD(x, (size_t)tp * (size_t)c_count + (size_t)c);
        else if (has_history)
            xv = KV_LOAD(history, (size_t)(pad + tp) * (size_t)c_count + (size_t)c);
        s = KV_ACC_FMA(KV_LOAD(w, (size_t)c * (size_t)k_count + (size_t)j), xv, s);
    }
    const float sum = KV_ACC_TO_FLOAT(s);
    KV_STORE(sum / (1.0f + exp(-sum)), y, i);
}

// One work-group of KV_ROW_WG work-items per value head h, running the token
// loop sequentially. Work-item l owns the state columns j = l, l + WG, ...
// (S[h] is [dk, dv] row-major in `state`): a column's update needs only its
// own entries and the shared q, k, g, β, so columns never synchronise. The
// normalised q and k of the token live in local memory (`qs`, `ks`, dk
// floats each); their sums of squares are folded per work-item over
// i = l, l + WG, ... and then by a power-of-two tree (the order of rows.cl).
// g and β are scalars every work-item computes identically (same
// instructions, same inputs): no broadcast needed.
//
// `state` starts as `state_in` (has_state != 0) or zeros, is updated in
// place token by token and is the op's second result (f32 in every storage
// variant: the decoder hands it back on its next call).
__kernel __attribute__((reqd_work_group_size(KV_ROW_WG, 1, 1)))
void kv_gated_delta_rule(__global const kv_store_t* q, __global const kv_store_t* k, __global const kv_store_t* v,
                         __global const kv_store_t* a, __global const kv_store_t* b,
                         __global const kv_store_t* a_log, __global const kv_store_t* dt_bias,
                         __global const float* state_in, __global float* state, __global kv_store_t* out,
                         const int t_count, const int nk, const int dk, const int nv, const int dv,
                         const int has_state, __local float* qs, __local float* ks) {
    __local kv_acc_t red_q[KV_ROW_WG];
    __local kv_acc_t red_k[KV_ROW_WG];
    const int l = (int)get_local_id(0);
    const int h = (int)get_group_id(0);
    const int kh = h / (nv / nk);
    const size_t head = (size_t)h * (size_t)dk * (size_t)dv;
    __global float* s = state + head;

    for (int j = l; j < dv; j += KV_ROW_WG)
        for (int i = 0; i < dk; ++i) s[(size_t)i * dv + j] = has_state ? state_in[head + (size_t)i * dv + j] : 0.0f;

    const float q_scale = 1.0f / sqrt((float)dk);
    const float neg_decay_rate = -exp(KV_LOAD(a_log, h));  // −exp(A_log)
    const float bias = KV_LOAD(dt_bias, h);

    for (int t = 0; t < t_count; ++t) {
        const size_t qk = ((size_t)t * (size_t)nk + (size_t)kh) * (size_t)dk;
        kv_acc_t sq = KV_ACC_ZERO, sk = KV_ACC_ZERO;
        for (int i = l; i < dk; i += KV_ROW_WG) {
            const float qv = KV_LOAD(q, qk + i);
            const float kv = KV_LOAD(k, qk + i);
            qs[i] = qv;
            ks[i] = kv;
            sq = KV_ACC_FMA(qv, qv, sq);
            sk = KV_ACC_FMA(kv, kv, sk);
        }
        red_q[l] = sq;
        red_k[l] = sk;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int w = KV_ROW_WG / 2; w > 0; w >>= 1) {
            if (l < w) {
                red_q[l] = KV_ACC_ADD(red_q[l], red_q[l + w]);
                red_k[l] = KV_ACC_ADD(red_k[l], red_k[l + w]);
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        const float inv_q = 1.0f / sqrt(KV_ACC_TO_FLOAT(red_q[0]) + 1e-6f);
        const float inv_k = 1.0f / sqrt(KV_ACC_TO_FLOAT(red_k[0]) + 1e-6f);
        // Each work-item scales the entries it loaded: (q · inv) · scale, two
        // roundings as in the reference.
        for (int i = l; i < dk; i += KV_ROW_WG) {
            qs[i] = qs[i] * inv_q * q_scale;
            ks[i] = ks[i] * inv_k;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        const size_t hv = (size_t)t * (size_t)nv + (size_t)h;
        const float x = KV_LOAD(a, hv) + bias;
        const float softplus = x > 20.0f ? x : log1p(exp(x));  // torch: beta 1, threshold 20
        const float decay = exp(neg_decay_rate * softplus);
        const float beta = 1.0f / (1.0f + exp(-KV_LOAD(b, hv)));

        for (int j = l; j < dv; j += KV_ROW_WG) {
            kv_acc_t m = KV_ACC_ZERO;
            for (int i = 0; i < dk; ++i) {
                const float sv = s[(size_t)i * dv + j] * decay;
                s[(size_t)i * dv + j] = sv;
                m = KV_ACC_FMA(sv, ks[i], m);
            }
            const float delta = (KV_LOAD(v, hv * (size_t)dv + j) - KV_ACC_TO_FLOAT(m)) * beta;
            kv_acc_t o = KV_ACC_ZERO;
            for (int i = 0; i < dk; ++i) {
                const float sv = fma(ks[i], delta, s[(size_t)i * dv + j]);  // the state's update: f32
                s[(size_t)i * dv + j] = sv;
                o = KV_ACC_FMA(sv, qs[i], o);
            }
            KV_STORE(KV_ACC_TO_FLOAT(o), out, hv * (size_t)dv + j);
        }
        // qs, ks and the trees are rewritten by the next token.
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
