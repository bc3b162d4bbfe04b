// Row reductions as a device wants them: ONE work-group per row, each work-item folds a strided slice,
// then a power-of-two tree in local memory — a reduction order no sequential or SIMD CPU loop produces.
//
// Reference loops (cpu-ref, f64):
//   softmax: m = max_c x[c]; e[c] = exp(x[c] - m); y[c] = e[c] / Σ_c e[c]
//   rmsnorm: y[c] = x[c] / sqrt(Σ_c x[c]² / cols + eps) · w[c]
// Work-item l folds columns l, l + WG, l + 2·WG, ... in ascending order, then
// the tree adds partial l + s into partial l for s = WG/2, WG/4, ..., 1.

#ifndef KV_ROW_WG
#define KV_ROW_WG 256  // a power of two: the tree halves it
#endif
//
// Narrow rows: softmax and rmsnorm run with the group as wide as the row
// needs — the host launches WG = the smallest power of two ≥ cols when that
// is below KV_ROW_WG. Each work-item then holds at most one column, exactly
// as in a KV_ROW_WG-wide group whose extra items hold the identity (−inf for
// the max, +0 for the sums), and the wide group's first tree levels only
// combine values with those identities, which changes no bit; so the narrow
// group gives the wide group's bits without the idle items (a CPU device
// such as PoCL runs every one of them).

__kernel void kv_softmax(__global const kv_store_t* x, __global kv_store_t* y, const int cols) {
    __local float red_max[KV_ROW_WG];
    __local kv_acc_t red_sum[KV_ROW_WG];
    const int l = (int)get_local_id(0), wg = (int)get_local_size(0);
    const size_t base = (size_t)get_group_id(0) * (size_t)cols;

    float m = -INFINITY;
    for (int c = l; c < cols; c += wg) m = kv_max_nan(m, KV_LOAD(x, base + c));
    m = kv_group_max_n(red_max, m, wg);

    // e = exp(x - m) goes through y, i.e. through the storage format: a
    // half-storing device sums the rounded values it actually holds.
    kv_acc_t sum = KV_ACC_ZERO;
    for (int c = l; c < cols; c += wg) {
        KV_STORE(exp(KV_LOAD(x, base + c) - m), y, base + c);
        sum = KV_ACC_ADD(sum, KV_LOAD(y, base + c));
    }
    const float total = KV_ACC_TO_FLOAT(kv_group_sum_n(red_sum, sum, wg));

    // Each work-item rescales only the columns it wrote: no barrier needed.
    for (int c = l; c < cols; c += wg) KV_STORE(KV_LOAD(y, base + c) / total, y, base + c);
}

__kernel void kv_rmsnorm(__global const kv_store_t* x, __global const kv_store_t* w, __global kv_store_t* y,
                const int cols, const float eps) {
    __local kv_acc_t red_sum[KV_ROW_WG];
    const int l = (int)get_local_id(0), wg = (int)get_local_size(0);
    const size_t base = (size_t)get_group_id(0) * (size_t)cols;

    // Sum of squares with explicit fma, like the matmul dot products.
    kv_acc_t ss = KV_ACC_ZERO;
    for (int c = l; c < cols; c += wg) {
        const float v = KV_LOAD(x, base + c);
        ss = KV_ACC_FMA(v, v, ss);
    }
    ss = kv_group_sum_n(red_sum, ss, wg);
    // sqrt then divide (≤ 3 + 2.5 ulp by the spec) rather than rsqrt: the
    // same formula as the CPU backends, so only the sum order differs.
    const float inv = 1.0f / sqrt(KV_ACC_TO_FLOAT(ss) / (float)cols + eps);
    for (int c = l; c < cols; c += wg) KV_STORE(KV_LOAD(x, base + c) * inv * KV_LOAD(w, c), y, base + c);
}
