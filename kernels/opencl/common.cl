// Prelude of every kvasir OpenCL program: one switchboard for storage format and accumulator type,
// so each kernel is written once and the host picks the variant with -D flags (KV_STORAGE_*, KV_ACC_HALF).

// Contraction off: a*b+c is rounded twice unless a kernel asks for fma()
// explicitly. Left on, the device compiler could fuse whatever it likes and
// the "fma" capability would be a guess.
#pragma OPENCL FP_CONTRACT OFF

#ifndef KV_STORAGE_HALF
#define KV_STORAGE_HALF 0
#endif
#ifndef KV_STORAGE_BF16
#define KV_STORAGE_BF16 0
#endif
#ifndef KV_ACC_HALF
#define KV_ACC_HALF 0
#endif

// Storage. Half buffers go through vload_half/vstore_half_rte, which are core
// OpenCL (no cl_khr_fp16 needed): half is only a memory format, values are
// f32 in registers. vstore_half_rte rounds to nearest even, as the host does.
#if KV_STORAGE_HALF
typedef half kv_store_t;
#define KV_LOAD(p, i) vload_half((size_t)(i), (p))
#define KV_STORE(v, p, i) vstore_half_rte((v), (size_t)(i), (p))
#elif KV_STORAGE_BF16
// OpenCL has no bf16: buffers hold f32 values that are bf16-representable
// (the host rounds the inputs), and every store rounds to bf16 here, so the
// intermediates a kernel writes and reads back (softmax's exponentials) are
// what a bf16-storing device would hold.
typedef float kv_store_t;
inline float kv_round_bf16(float v) {
    const uint u = as_uint(v);
    if (isnan(v)) return as_float(u | 0x00400000u);  // stays a (quiet) NaN, never turns into inf
    // Round to nearest even on the upper 16 bits; a carry into the exponent
    // rounds to the next binade or to inf, as IEEE rounding does.
    return as_float((u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u);
}
#define KV_LOAD(p, i) ((p)[(i)])
#define KV_STORE(v, p, i) ((p)[(i)] = kv_round_bf16(v))
#else
typedef float kv_store_t;
#define KV_LOAD(p, i) ((p)[(i)])
#define KV_STORE(v, p, i) ((p)[(i)] = (v))
#endif

// 16 consecutive stored values as float16: elements 16·i … 16·i + 15.
#if KV_STORAGE_HALF
#define KV_LOAD16(p, i) vload_half16((size_t)(i), (p))
#else
#define KV_LOAD16(p, i) vload16((size_t)(i), (p))
#endif

// What KV_STORE then KV_LOAD gives back, for a value a fused kernel keeps in
// local memory or registers where the unfused kernels would have stored it.
inline float kv_round_storage(float v) {
#if KV_STORAGE_HALF
    // A private ushort as the half slot: declaring a half VARIABLE needs
    // cl_khr_fp16, a half POINTER does not.
    ushort slot;
    vstore_half_rte(v, 0, (__private half*)&slot);
    return vload_half(0, (__private const half*)&slot);
#elif KV_STORAGE_BF16
    return kv_round_bf16(v);
#else
    return v;
#endif
}

// max that lets NaN win, so a NaN anywhere in a row poisons the whole row as
// it does on the oracle (fmax would silently drop it).
inline float kv_max_nan(float a, float b) { return (b > a || isnan(b)) ? b : a; }

// Accumulation. In f16 the running sum is a half variable: each step is
// evaluated in f32 (one fma) and rounded to half, so the sum is rounded to
// half after every add — the contract in backend.hpp. Needs cl_khr_fp16.
#if KV_ACC_HALF
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
typedef half kv_acc_t;
#define KV_ACC_ZERO ((half)0.0f)
#define KV_ACC_FMA(a, b, acc) convert_half_rte(fma((a), (b), convert_float(acc)))
#define KV_ACC_ADD(acc, v) convert_half_rte(convert_float(acc) + convert_float(v))
#define KV_ACC_TO_FLOAT(acc) convert_float(acc)
#else
typedef float kv_acc_t;
#define KV_ACC_ZERO 0.0f
#define KV_ACC_FMA(a, b, acc) fma((a), (b), (acc))
#define KV_ACC_ADD(acc, v) ((acc) + (v))
#define KV_ACC_TO_FLOAT(acc) (acc)
#endif

// The work-group reductions the row kernels share (softmax, rmsnorm, fused
// attention). Every work-item of the group calls them with its partial; the
// tree pairs item l with l + s, halving s — the order the bits depend on —
// and every item gets the result. A barrier follows the read, so `red` may
// be reused at once.
#ifndef KV_ROW_WG
#define KV_ROW_WG 256  // a power of two: the trees halve it
#endif
// Trees over the first n work-items (n a power of two, the group's width:
// kv_group_max / kv_group_sum take KV_ROW_WG).
inline float kv_group_max_n(__local float* red, const float v, const int n) {
    const int l = (int)get_local_id(0);
    red[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = n / 2; s > 0; s >>= 1) {
        if (l < s) red[l] = kv_max_nan(red[l], red[l + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
inline float kv_group_max(__local float* red, const float v) { return kv_group_max_n(red, v, KV_ROW_WG); }
inline kv_acc_t kv_group_sum_n(__local kv_acc_t* red, const kv_acc_t v, const int n) {
    const int l = (int)get_local_id(0);
    red[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = n / 2; s > 0; s >>= 1) {
        if (l < s) red[l] = KV_ACC_ADD(red[l], red[l + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const kv_acc_t r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
inline kv_acc_t kv_group_sum(__local kv_acc_t* red, const kv_acc_t v) { return kv_group_sum_n(red, v, KV_ROW_WG); }
