// Element-wise ops with the device's own exp/pow/sin/cos (OpenCL 1.2 full profile: exp ≤ 3 ulp, pow ≤ 16,
// sin/cos ≤ 4, x/y ≤ 2.5) instead of the host libm: the transcendental differences the audit must bound.
//
// Reference loops (cpu-ref, f64):
//   swiglu:  y = g / (1 + e^-g) · u
//   sigmoid: y = 1 / (1 + e^-x)
//   clamped_swiglu: y = (clamp(u, −l, l) + 1) · (g' / (1 + e^(−g'·alpha))), g' = min(g, l)
//   rope:    (a, b) → (a·cos θ − b·sin θ, b·cos θ + a·sin θ), θ = pos · theta^(−2i/d)
// Written in the same operation order as the cpu backend, so only the
// built-ins and the compiler differ.

__kernel void kv_swiglu(__global const kv_store_t* g, __global const kv_store_t* u, __global kv_store_t* y,
                        const ulong n) {
    const size_t i = get_global_id(0);
    if (i >= n) return;
    const float gv = KV_LOAD(g, i);
    KV_STORE(gv / (1.0f + exp(-gv)) * KV_LOAD(u, i), y, i);
}

// gpt-oss's clamped SwiGLU: explicit comparisons, not fmin/fmax (those drop a NaN).
__kernel void kv_clamped_swiglu(__global const kv_store_t* g, __global const kv_store_t* u, __global kv_store_t* y,
                                const ulong n, const float alpha, const float limit) {
    const size_t i = get_global_id(0);
    if (i >= n) return;
    const float gv = KV_LOAD(g, i), uv = KV_LOAD(u, i);
    const float gc = gv > limit ? limit : gv;
    const float uc = uv > limit ? limit : (uv < -limit ? -limit : uv);
    KV_STORE((uc + 1.0f) * (gc * (1.0f / (1.0f + exp(-(gc * alpha))))), y, i);
}

// The combine ops of Backend::add / mul / scale (backend.cpp), whose
// defaults compute in f64 and round to f32, then to storage: one f32
// operation rounds the exact sum or product of two f32 values once, as the
// default's f64 result (exact for a product, innocuous for a sum) rounded to
// f32 does, and KV_STORE then rounds to storage as the default does. The
// node runs them here only on operands the default would read exactly as
// they stand in the buffers (opencl_backend.cpp says when).
__kernel void kv_add(__global const kv_store_t* a, __global const kv_store_t* b, __global kv_store_t* y, const ulong n) {
    const size_t i = get_global_id(0);
    if (i >= n) return;
    KV_STORE(KV_LOAD(a, i) + KV_LOAD(b, i), y, i);
}

// kv_add with b one row broadcast over a's rows (a linear layer's bias, as
// the default adds broadcast_rows(bias) to a matmul's result): y[i] = a[i] +
// b[i mod cols], the same operation on the same values.
__kernel void kv_add_rows(__global const kv_store_t* a, __global const kv_store_t* b, __global kv_store_t* y, const ulong n,
                          const ulong cols) {
    const size_t i = get_global_id(0);
    if (i >= n) return;
    KV_STORE(KV_LOAD(a, i) + KV_LOAD(b, i % cols), y, i);
}

__kernel void kv_mul(__global const kv_store_t* a, __global const kv_store_t* b, __global kv_store_t* y, const ulong n) {
    const size_t i = get_global_id(0);
    if (i >= n) return;
    KV_STORE(KV_LOAD(a, i) * KV_LOAD(b, i), y, i);
}

__kernel void kv_scale(__global const kv_store_t* x, __global kv_store_t* y, const ulong n, const float s) {
    const size_t i = get_global_id(0);
    if (i >= n) return;
    KV_STORE(KV_LOAD(x, i) * s, y, i);
}

// A device KV cache (Backend::kv_rows): y [heads, keep + T, d] with the
// first keep rows of each head of cache [heads, s_cache, d] and then row t of
// head g of rows [T, heads, d] — stored values moved as they are.
__kernel void kv_cache_rows(__global const kv_store_t* cache, __global const kv_store_t* rows, __global kv_store_t* y,
                            const int heads, const int s_cache, const int keep, const int t_count, const int d) {
    const size_t i = get_global_id(0);
    const size_t s_out = (size_t)keep + (size_t)t_count;
    if (i >= (size_t)heads * s_out * (size_t)d) return;
    const size_t j = i % (size_t)d, s = (i / (size_t)d) % s_out, g = i / ((size_t)d * s_out);
    // Loaded and stored in the storage format: exact (a half or bf16 value
    // widens to f32 and back unchanged), and core OpenCL for half buffers.
    if (s < (size_t)keep)
        KV_STORE(KV_LOAD(cache, (g * (size_t)s_cache + s) * (size_t)d + j), y, i);
    else
        KV_STORE(KV_LOAD(rows, ((s - (size_t)keep) * (size_t)heads + g) * (size_t)d + j), y, i);
}

// Data movement (Backend::copy_columns / last_rows / join_columns /
// repeat_columns): rows × n stored values to y [*, y_cols] from row y_r0,
// column y_c0 on; value (r, c) is src [*, src_cols]'s row src_r0 + r, column
// src_c0 + c'·src_step with c' = c mod src_wrap (src_wrap 0: c' = c) —
// moved as they are.
__kernel void kv_copy_block(__global const kv_store_t* src, __global kv_store_t* y, const int rows, const int n,
                            const int src_cols, const int src_r0, const int src_c0, const int src_step, const int src_wrap,
                            const int y_cols, const int y_r0, const int y_c0) {
    const size_t i = get_global_id(0);
    if (i >= (size_t)rows * (size_t)n) return;
    const size_t r = i / (size_t)n, c = i % (size_t)n;
    const size_t cs = src_wrap > 0 ? c % (size_t)src_wrap : c;
    KV_STORE(KV_LOAD(src, ((size_t)src_r0 + r) * (size_t)src_cols + (size_t)src_c0 + cs * (size_t)src_step), y,
             ((size_t)y_r0 + r) * (size_t)y_cols + (size_t)y_c0 + c);
}

// A MoE block on the device (OpenclBackend::moe_block). The table: per
// gathered row g its token table[2g] and its row table[2g+1] in the experts'
// x buffer; then per token t its terms' start table[2G + t] (G + T + 1 words
// in all); then the terms, (y row, weight bits) each.
__kernel void kv_moe_gather(__global const kv_store_t* x, __global const uint* table, __global kv_store_t* xb,
                            const uint g_count, const uint h) {
    const size_t i = get_global_id(0);
    if (i >= (size_t)g_count * h) return;
    const size_t g = i / h, c = i % h;
    KV_STORE(KV_LOAD(x, (size_t)table[2 * g] * h + c), xb, (size_t)table[2 * g + 1] * h + c);  // moved as stored
}

// out[t, c] = Σ w·y[row, c] over token t's terms in order, from +0, every
// product and sum rounded to f32 (FP_CONTRACT OFF), then stored: the
// default's combine (backend.cpp moe_combine<float>) element by element.
__kernel void kv_moe_combine(__global const kv_store_t* y, __global const uint* table, __global kv_store_t* out,
                             const uint g_count, const uint t_count, const uint h) {
    const size_t i = get_global_id(0);
    if (i >= (size_t)t_count * h) return;
    const size_t t = i / h, c = i % h;
    __global const uint* starts = table + 2 * (size_t)g_count;
    __global const uint* terms = starts + t_count + 1;
    float acc = 0.0f;
    for (uint e = starts[t]; e < starts[t + 1]; ++e) {
        const float w = as_float(terms[2 * (size_t)e + 1]);
        const float p = w * KV_LOAD(y, (size_t)terms[2 * (size_t)e] * h + c);
        acc = acc + p;
    }
    KV_STORE(acc, out, i);
}

__kernel void kv_sigmoid(__global const kv_store_t* x, __global kv_store_t* y, const ulong n) {
    const size_t i = get_global_id(0);
    if (i >= n) return;
    KV_STORE(1.0f / (1.0f + exp(-KV_LOAD(x, i))), y, i);
}

// The plain rope's inverse frequencies theta^(−2i/d), i < d/2, in f32 on
// the device as GPU kernels compute them: evaluated once per (theta, d) into
// a table the node keeps (one pow per pair instead of one per element), the
// same expression on the same device, so the same bits as evaluating it in
// kv_rope itself.
__kernel void kv_rope_freq(__global float* freq, const int d, const float theta) {
    const int i = (int)get_global_id(0);
    if (i >= d / 2) return;
    freq[i] = pow(theta, -2.0f * (float)i / (float)d);
}

// One work-item per (pair i, head h, token t). Angle and sin/cos are
// computed in f32 on the device, as GPU kernels do, and recomputed per head
// rather than shared: cheaper than a table round trip.
// neox != 0: pairs (i, i + d/2); else adjacent pairs (2i, 2i + 1).
// freq[d/2]: the inverse frequencies — kv_rope_freq's table, or a
// frequency-scaled rope's (llama3) from the host (the model's f64 table
// rounded to f32).
__kernel void kv_rope(__global const kv_store_t* x, __global kv_store_t* y, __global const float* pos,
                      __global const float* freq, const int heads, const int d, const int neox) {
    const int i = (int)get_global_id(0);
    const int h = (int)get_global_id(1);
    const int t = (int)get_global_id(2);
    const int half_d = d / 2;
    if (i >= half_d || h >= heads) return;
    const float inv_freq = freq[i];
    const float angle = pos[t] * inv_freq;
    const float c = cos(angle);
    const float s = sin(angle);
    const size_t base = ((size_t)t * (size_t)heads + (size_t)h) * (size_t)d;
    const size_t i0 = base + (size_t)(neox ? i : 2 * i);
    const size_t i1 = base + (size_t)(neox ? i + half_d : 2 * i + 1);
    const float a = KV_LOAD(x, i0);
    const float b = KV_LOAD(x, i1);
    KV_STORE(a * c - b * s, y, i0);
    KV_STORE(b * c + a * s, y, i1);
}
