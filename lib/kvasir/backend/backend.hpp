// The backend interface: what every compute backend (cpu-ref, cpu, opencl,
// cuda, hip) implements so that the protocol can run the same op on each and
// compare the results.
//
// Conventions shared by every method:
//  * Activations arrive as TensorViews of any float dtype and are returned as
//    Tensors in the backend's *output dtype* (f64 for the cpu-ref oracle, f32
//    for everything else). A backend first rounds what it reads to its
//    *storage* dtype (f32/f16/bf16) and rounds what it writes back to it too,
//    exactly as a device that keeps tensors in that format would.
//  * Weights arrive as TensorViews too (typically pointing into a memory-mapped
//    checkpoint in the file's dtype); the same storage rounding applies.
//  * Shapes are row-major; "rows" means all leading dims flattened.
//  * Reductions run in the backend's *accumulation* dtype. An f16-accumulating
//    variant rounds its running sum to half after every add.
//  * Results must be deterministic for a fixed thread count unless the
//    capabilities say otherwise. A backend never returns partially written
//    results: it returns a whole tensor or throws kvasir::Error.
//  * Bad arguments (mismatched shapes) throw Error(bad_input); device or
//    runtime failures throw Error(backend_failure).
#pragma once

#include "kvasir/core/model_types.hpp"  // RouterScoring, RopeLayout, ExpertWeights
#include "kvasir/backend/linear_attention.hpp"
#include "kvasir/core/tensor.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

// "name[:device][:key=value[,key=value...]]", e.g. "cpu", "cpu:acc=f16,storage=bf16",
// "opencl:1", "opencl:0:storage=f16". Keys are backend specific; every backend
// accepts storage= and acc= (those it cannot honour are refused).
struct BackendSpec {
    std::string name;
    int device = 0;
    bool device_given = false;
    std::map<std::string, std::string> options;

    // Throws Error(bad_input) with the offending text on a malformed spec.
    static BackendSpec parse(std::string_view text);
    // Stable display name: options in key order, defaults omitted by the caller.
    std::string canonical() const;
};

// What a node advertises: reported in every verdict so a reader knows what
// kind of arithmetic produced the numbers.
struct Capabilities {
    std::string node;            // canonical spec: "cpu:acc=f16"
    std::string backend;         // "cpu"
    std::string device;          // human-readable device name
    std::string runtime;         // compiler / driver / runtime versions
    DType storage = DType::f32;  // what tensors are rounded to between ops
    DType accumulation = DType::f32;
    DType output = DType::f32;   // dtype of the Tensors it returns
    bool fma = false;            // products fused into sums (one rounding)
    int threads = 1;
    bool deterministic = true;   // claimed; the protocol measures it
    std::vector<std::pair<std::string, std::string>> extra;  // backend specific
};

// Counters of a device node's resident weights (weight_cache.hpp). Not part
// of any report (they describe how a run went, not what it computed): shown
// by --timings.
struct WeightCacheStats {
    std::uint64_t budget_bytes = 0;      // 0: the cache is off
    std::uint64_t hits = 0;              // weight found resident: nothing uploaded
    std::uint64_t misses = 0;            // cacheable weight uploaded and kept
    std::uint64_t uncacheable = 0;       // not in immutable memory (activations, seeded inputs) or cache off: uploaded for the call
    std::uint64_t oversized = 0;         // larger than the whole budget: uploaded for the call
    std::uint64_t declined = 0;          // not kept: the cache was full of weights asked for within the current pass (scan resistance)
    std::uint64_t bytes_uploaded = 0;    // device bytes of misses + uncacheable + oversized + declined
    std::uint64_t evictions = 0;
    std::uint64_t resident_bytes = 0;    // now
    std::uint64_t resident_entries = 0;  // now
};

// A device node's traffic with the host, counted since it was created: what
// moves between host and device memory, how often the host waits for the
// device, how many kernels it enqueued and device buffers it allocated.
// Shown by --timings and kept in captures per step (not part of any report:
// they describe how a run went, not what it computed). Weight uploads are
// counted here too (the weight cache's counters say which were weights).
struct TransferStats {
    std::uint64_t uploads = 0;         // host → device copies (buffer writes, mapped fills)
    std::uint64_t upload_bytes = 0;
    std::uint64_t downloads = 0;       // device → host copies
    std::uint64_t download_bytes = 0;
    std::uint64_t syncs = 0;           // the host waited for the device (blocking copies and maps, stream syncs)
    std::uint64_t launches = 0;        // kernels (and library calls) enqueued
    std::uint64_t allocations = 0;     // device buffers allocated
    TransferStats operator-(const TransferStats& before) const;
};

struct RopeParams {
    double theta = 1e6;
    RopeLayout layout = RopeLayout::neox;
    // A frequency-scaled rope (llama3): the inverse frequency of each rotated
    // pair i < d/2, exact in f64, computed once from the model's config
    // (model/rope_frequencies.hpp). Null: theta^(−2i/d). A node uses these
    // values in its own precision (rope_inv_freq_f32 / _f64): an f32 node
    // their f32 rounding, cpu-ref the values themselves.
    std::shared_ptr<const std::vector<double>> inv_freq;
};

// The inverse frequency of pair i of a d-dimensional rotation, as an f32 node
// computes it (std::pow(float(theta), −2i/d) in f32, or the scaled table
// rounded to f32) and as cpu-ref does (in f64).
float rope_inv_freq_f32(const RopeParams& p, std::int64_t i, std::int64_t d);
double rope_inv_freq_f64(const RopeParams& p, std::int64_t i, std::int64_t d);

struct RouterParams {
    int top_k = 8;
    RouterScoring scoring = RouterScoring::softmax;
    bool renormalize = true;         // divide the chosen weights by their sum
    double scaling = 1.0;            // routed_scaling_factor (DeepSeek)
    int n_group = 1;                 // grouped top-k (DeepSeek): groups of experts
    int topk_group = 1;              //   of which this many are kept
    const TensorView* bias = nullptr;  // per-expert selection bias [E] (e_score_correction_bias); affects selection only
};

// Router result for T tokens over E experts.
struct RouterOutput {
    Tensor scores;   // [T, E] softmax or sigmoid scores (output dtype)
    Tensor ids;      // [T, k] i32, ordered by descending selection score, ties to the lower id
    Tensor weights;  // [T, k] combine weights (output dtype)
};

// A routing decision taken by an authority and imposed on every backend.
struct RoutingPlan {
    Tensor ids;      // [T, k] i32
    Tensor weights;  // [T, k] any float dtype
};

class Backend {
public:
    virtual ~Backend() = default;

    virtual const Capabilities& capabilities() const = 0;
    // The node's weight cache, if it has one (device backends). Optional:
    // the default has none.
    virtual std::optional<WeightCacheStats> weight_cache_stats() const { return std::nullopt; }
    // The node's host↔device traffic (device nodes: opencl, cuda, hip).
    // Optional: a host node has none.
    virtual std::optional<TransferStats> transfer_stats() const { return std::nullopt; }
    // A fault-injecting node (fault.hpp): how many op outputs its fault has
    // corrupted so far, so that an audit can tell a fault that never fired
    // from one that was not caught. nullopt for every real node.
    virtual std::optional<std::int64_t> injected_faults() const { return std::nullopt; }

    // y[T, N] = x[T, K] · w[N, K]ᵀ  (the nn.Linear convention).
    virtual Tensor matmul(const TensorView& x, const TensorView& w) = 0;
    // silu(gate) · up, element-wise; silu(g) = g / (1 + e^-g).
    virtual Tensor swiglu(const TensorView& gate, const TensorView& up) = 0;
    // gpt-oss's clamped SwiGLU (transformers GptOssExperts._apply_gate),
    // element-wise: g' = min(g, limit), u' = clamp(u, −limit, limit),
    // y = (u' + 1) · (g' · σ(g'·alpha)), σ(s) = 1 / (1 + e^−s); NaN passes
    // through the clamps (no fmin/fmax). f32 nodes use alpha and limit rounded
    // to f32, as torch does with the Python floats. Optional: the default
    // refuses (Error(unsupported)).
    virtual Tensor clamped_swiglu(const TensorView& gate, const TensorView& up, double alpha, double limit);
    // Row-wise softmax over the last dim, max-subtracted.
    virtual Tensor softmax(const TensorView& x) = 0;
    // Element-wise logistic sigmoid.
    virtual Tensor sigmoid(const TensorView& x) = 0;
    // y = x / sqrt(mean(x²) + eps) · weight, row-wise over the last dim.
    virtual Tensor rmsnorm(const TensorView& x, const TensorView& weight, double eps) = 0;
    // Rotary embedding of x [T, H, D] at positions[T] (D even).
    virtual Tensor rope(const TensorView& x, std::span<const std::int64_t> positions, const RopeParams& params) = 0;

    // Router: scores from logits [T, E] with this backend's softmax/sigmoid,
    // then top-k selection and weights. Optional: the default selects on the
    // backend's own scores with exact comparisons and renormalises in the
    // backend's output precision.
    virtual RouterOutput route(const TensorView& logits, const RouterParams& params);

    // MoE block with routing pinned by `plan`: out[t] = Σ_j w[t,j] · FFN_{ids[t,j]}(x[t]),
    // FFN_e(x) = down_e(silu(gate_e x) · up_e x). Optional: the default runs
    // the experts with this backend's matmul/swiglu and combines in f32 (f64
    // on the oracle) in ascending expert order. `expert_filter`, when given,
    // restricts the sum to the experts it marks true: that is how one node of
    // a sharded deployment computes its partial sum.
    virtual Tensor moe_block(const TensorView& x, std::span<const ExpertWeights> experts, const RoutingPlan& plan,
                             const std::vector<bool>* expert_filter = nullptr);

    // Element-wise sum of partial results (the combine of a sharded MoE
    // block), in the combine precision. Optional.
    virtual Tensor add(const TensorView& a, const TensorView& b);

    // Element-wise product (shared-expert gate · shared-expert output). Optional:
    // the default multiplies in the combine precision and rounds to storage.
    virtual Tensor mul(const TensorView& a, const TensorView& b);
    // x · s (attention's 1/√d, routed_scaling_factor). Optional, as mul.
    virtual Tensor scale(const TensorView& x, double s);

    // Gated DeltaNet linear attention (qwen3_5_moe, qwen3_next; the exact
    // definitions: linear_attention.hpp). The causal depthwise conv1d over
    // the [T, C] projection with SiLU (history: the K−1 inputs before these
    // tokens, null = zeros), and the gated delta rule over [T, heads, dim]
    // q/k/v with its recurrent state. A backend without its own kernel for
    // them refuses (Error(unsupported), naming the backend and the op): the
    // host never computes on a device's behalf.
    virtual Tensor causal_conv1d_silu(const TensorView& x, const TensorView& weight, const TensorView* history);
    virtual GatedDeltaResult gated_delta_rule(const GatedDeltaInputs& inputs);

    // Causal GQA softmax attention over a KV cache: the attention core of
    // every decoder layer. q [T, nh, D] holds T new queries at cache positions
    // p0 … p0+T−1; keys[g] and values[g] [S, D] are kv head g's cache rows
    // (S = p0 + T, the same S and D for every g; nkv = keys.size() divides
    // nh, rep = nh / nkv; query head h reads kv head h / rep). Returns
    // [T, nh·D] in the output dtype, head-major within a row:
    //   out[t, h·D + i] = Σ_{s ≤ p0+t} P[h,t,s] · V_{h/rep}[s, i]
    //   P[h,t,·] = softmax over s ≤ p0+t of  scale · Σ_j q[t,h,j] · K_{h/rep}[s,j]
    // Query t never sees a key after p0+t (the causal mask).
    //
    // Optional. The default is the composition of this backend's own ops,
    // which fixes the order of roundings every fused kernel is held to:
    //   1. per kv head g: S_g = matmul(Q_g, K_g) with Q_g the rep·T rows
    //      (heads g·rep … g·rep+rep−1, T rows each) — the score is this
    //      backend's dot product, in its accumulation dtype, rounded to storage;
    //   2. one scale(·, scale) over the [nh·T, S] scores of all heads (the
    //      product in the combine dtype, rounded to storage);
    //   3. −inf written by the host at column s > p0+t of row (h, t);
    //   4. one softmax over those rows (max-subtracted exp rounded to storage,
    //      the sum of this backend's softmax, the division, rounded);
    //   5. per kv head: matmul(P_g, V_gᵀ) with V_gᵀ transposed by the host —
    //      the masked zeros of P enter the P·V sums (adding +0 changes no bit
    //      of a finite sum).
    // A fused kernel reads only the unmasked part and states where its bits
    // differ from this composition: the cpu kernel (acc=f32, AVX2;
    // kernels/cpu/attention.hpp), the opencl kernel (kernels/opencl/attention.cl)
    // and the cuda/hip kernel (attention_kernel, kernels/gpu/ops.cuh) nowhere
    // for finite inputs — a masked V row holding Inf/NaN poisons only the
    // composition (0·Inf in step 5) — and cpu-ref (the f64 textbook loop)
    // nowhere. The split-K cuda/hip variant (nondeterministic=1) runs the
    // deterministic fused kernel, so its attention matches no single run of
    // its own composition; the wrappers forward to the node they wrap.
    // Both entries run one hook, run_attention (below).
    Tensor causal_attention(const TensorView& q, std::span<const TensorView> keys, std::span<const TensorView> values,
                            double scale) {
        return run_attention(q, keys, values, scale, nullptr);
    }
    // causal_attention with attention sinks (gpt-oss; transformers'
    // eager_attention_forward with s_aux): a learned logit sinks[h] per query
    // head joins the softmax of every row of head h as one more column, and
    // its probability is dropped — the real keys' probabilities then sum to
    // less than 1. sinks is [nh]. Default: this backend's composition above
    // with the sink column written by the host after step 3 (the value in the
    // scores' dtype), so every node computes it with its own matmul, scale
    // and softmax. The fused kernels take sinks with those bits: the cpu
    // node's (kernels/cpu/attention.hpp), OpenCL's (attention.cl) and the
    // cuda/hip attention_kernel (kernels/gpu/ops.cuh).
    Tensor causal_attention_sinks(const TensorView& q, std::span<const TensorView> keys,
                                  std::span<const TensorView> values, double scale, const TensorView& sinks);
    // The composition above (sinks null: causal_attention's; else
    // causal_attention_sinks'), whatever this backend fuses: the default of
    // run_attention, and what tests and benches hold the fused kernels to.
    Tensor compose_attention(const TensorView& q, std::span<const TensorView> keys, std::span<const TensorView> values,
                             double scale, const TensorView* sinks);

    // One layer's KV cache kept on a device node (arch/graph.hpp KvLayer):
    // every kv head's rows in one [heads, S, D] tensor. Returns
    // [heads, keep + T, D] with out[g, s] = cache[g, s] for s < keep and
    // out[g, keep + t] = rows[t, g] — cache [heads, S ≥ keep, D] (null when
    // keep = 0), rows [T, heads, D], both in the output dtype: exact data
    // movement, done where the node keeps its results. Optional: nullopt (the
    // default, and a device node outside a DeviceResidency scope) leaves the
    // cache to the host.
    virtual std::optional<Tensor> kv_rows(const TensorView* cache, std::int64_t keep, const TensorView& rows);

    // Data movement inside a forward pass, exact (values moved as they are),
    // done where the node keeps its results: the default copies on the host
    // in x's dtype; a device node moves its own results on the device.
    //  copy_columns: n columns c0, c0 + step, … of every row of x [rows,
    //    cols], as [rows, n] (a fused projection's parts: Gated DeltaNet's
    //    q | k | v, gated attention's query | gate, a partial rope's rotated
    //    part; step 2: MLA's interleaved rope pairs split).
    //  last_rows: the last n rows of [prev; x] — prev [P, C] (null: zero rows
    //    in its place), x [T, C] — as [n, C] (a causal conv's history).
    //  join_columns: [rows, c0] ‖ [rows, c1] ‖ … → [rows, c0 + c1 + …], one
    //    dtype (a partial rope's rotated and passed-through parts, a fused
    //    projection's interleaved groups regrouped, MLA's per-head keys); a
    //    part with neither data nor device is zeros of its shape (padding).
    //  repeat_columns: x [rows, c] `times` over, [rows, times·c] (a shared
    //    expert's gate over its output; MLA's one rope key for every head).
    virtual Tensor copy_columns(const TensorView& x, std::int64_t c0, std::int64_t n, std::int64_t step);
    Tensor copy_columns(const TensorView& x, std::int64_t c0, std::int64_t n) { return copy_columns(x, c0, n, 1); }
    virtual Tensor last_rows(const TensorView* prev, const TensorView& x, std::int64_t n);
    virtual Tensor join_columns(std::span<const TensorView> parts);
    virtual Tensor repeat_columns(const TensorView& x, std::int64_t times);

protected:
    // dtype in which the default moe_block/add accumulate.
    DType combine_dtype() const;
    // The expert FFNs of the default moe_block, one job per expert that has
    // rows: y = down(act(gate·x + gate_bias, up·x + up_bias)) + down_bias,
    // with this backend's matmul (through linear()), add and (clamped_)
    // swiglu. The default runs the experts one after another. A backend may
    // run them together — the cpu node's decode runs every chosen expert's
    // GEMVs in two parallel regions — where every y keeps the default's bits.
    struct ExpertJob {
        const ExpertWeights* weights = nullptr;
        Tensor x;  // [rows, H]: this expert's tokens, in token order
        Tensor y;  // out: [rows, H]
    };
    virtual void expert_ffns(std::span<ExpertJob> jobs);
    // The attention of causal_attention (sinks null) and of
    // causal_attention_sinks (sinks [nh], checked): the one hook a backend
    // overrides with its fused kernel. Default: compose_attention.
    virtual Tensor run_attention(const TensorView& q, std::span<const TensorView> keys,
                                 std::span<const TensorView> values, double scale, const TensorView* sinks) {
        return compose_attention(q, keys, values, scale, sinks);
    }
};

// The precision options every backend accepts: storage=f32|f16|bf16 and
// acc=f32|f16. Returns false for any other key; throws Error(bad_input)
// naming the spec for a bad value. Sets caps.storage / caps.accumulation.
bool apply_precision_option(const BackendSpec& spec, const std::string& key, const std::string& value,
                            Capabilities& caps);

// Shape checks shared by backends; each throws Error(bad_input) naming the op.
void check_matmul_args(const TensorView& x, const TensorView& w);
void check_same_shape(const char* op, const TensorView& a, const TensorView& b);
void check_clamped_swiglu_args(const TensorView& gate, const TensorView& up, double alpha, double limit);
void check_rmsnorm_args(const TensorView& x, const TensorView& w);
void check_rope_args(const TensorView& x, std::span<const std::int64_t> positions, const RopeParams& params);
void check_moe_args(const TensorView& x, std::span<const ExpertWeights> experts, const RoutingPlan& plan);
void check_attention_args(const TensorView& q, std::span<const TensorView> keys, std::span<const TensorView> values);
// What the default expert FFN's down matmul and (clamped) SwiGLU would check
// for `rows` tokens of an expert of width `inner`: for a device node that runs
// the experts without those calls (expert_ffns overridden).
void check_expert_shapes(const ExpertWeights& ew, std::int64_t rows, std::int64_t inner);
void check_sinks_args(const TensorView& q, const TensorView& sinks);  // sinks [nh] for q [T, nh, D]
void check_copy_columns_args(const TensorView& x, std::int64_t c0, std::int64_t n, std::int64_t step);
void check_repeat_columns_args(const TensorView& x, std::int64_t times);
bool zero_part(const TensorView& part);  // join_columns' zeros: neither data nor device
// One block moved by a device node's copy kernel (OpenCL kv_copy_block,
// CUDA/HIP copy_block_kernel): rows × n values to y [*, y_cols] from row
// y_r0, column y_c0 on; value (r, c) from src [*, src_cols] row src_r0 + r,
// column src_c0 + c'·src_step, c' = c mod src_wrap (src_wrap 0: c' = c).
struct BlockCopy {
    std::int64_t rows = 0, n = 0;
    std::int64_t src_cols = 0, src_r0 = 0, src_c0 = 0, src_step = 1, src_wrap = 0;
    std::int64_t y_cols = 0, y_r0 = 0, y_c0 = 0;
};
// The blocks of each data-movement op for a device node (the default's
// result, moved block by block; a block of rows·n = 0 moves nothing):
// copy_columns and repeat_columns one; last_rows [0] from x, [1] from prev
// (its rows 0 of a null prev: zeros there); join_columns one per part (a
// zeros part moves nothing: the output is zeroed first).
BlockCopy copy_columns_block(const TensorView& x, std::int64_t c0, std::int64_t n, std::int64_t step);
std::array<BlockCopy, 2> last_rows_blocks(const TensorView* prev, const TensorView& x, std::int64_t n);
std::vector<BlockCopy> join_columns_blocks(std::span<const TensorView> parts);
BlockCopy repeat_columns_block(const TensorView& x, std::int64_t times);
void check_last_rows_args(const TensorView* prev, const TensorView& x, std::int64_t n);
// Returns the joined width; at least one part.
std::int64_t check_join_columns_args(std::span<const TensorView> parts);

// y = x·wᵀ + bias (bias [N], or absent: data null) with be's matmul and add:
// nn.Linear on one node — the decoder layer's projections and the experts'.
Tensor linear(Backend& be, const TensorView& x, const TensorView& w, const TensorView& bias);
std::int64_t rows_of(const TensorView& x);  // product of all dims but the last

// A MoE block's routing as its experts see it: per expert with rows
// (ascending id; those `expert_filter` marks false left out), its (token,
// combine weight) pairs in token order then slot order — the order of the
// default's jobs and of its combine. Checks the plan and the filter.
struct ExpertRows {
    std::size_t expert = 0;
    std::vector<std::pair<std::int64_t, double>> rows;
};
std::vector<ExpertRows> route_rows(const TensorView& x, std::span<const ExpertWeights> experts, const RoutingPlan& plan,
                                   const std::vector<bool>* expert_filter);

// The table a device node's MoE block runs on (OpenCL kv_moe_gather /
// kv_moe_combine, CUDA/HIP moe_gather_kernel / moe_combine_kernel), 32-bit
// words: [0, 2G) per gathered row its token and its row in the experts' x
// buffer (x_row0[n] + i for row i of expert n); then T + 1 term starts, one
// per token and the end; then the terms, (y row: y_row0[n] + i, the weight's
// f32 bits) each, a token's in the default's combine order. G = the rows.
std::vector<std::uint32_t> moe_device_table(std::span<const ExpertRows> routed, std::span<const std::size_t> x_row0,
                                            std::span<const std::size_t> y_row0, std::int64_t t_count);

// Where a device node's MoE block (or expert_ffns) puts each expert's rows in
// its buffers: element offsets in the x, intermediate and y buffers, each
// slice starting on a multiple of `align` elements (a sub-buffer's base
// alignment on OpenCL, 256 bytes on CUDA/HIP) and on a whole row, so a
// slice's rows are rows of the buffer (the gather/combine tables index rows).
// Checks every expert's shapes (gate/up/down agree; what the default's down
// matmul and SwiGLU would check) and that every count fits the device
// kernels' 32-bit indices.
struct ExpertSlice {
    std::size_t x = 0, mid = 0, y = 0;
    std::int64_t rows = 0, h = 0, i = 0, out = 0;
};
struct ExpertLayout {
    std::vector<ExpertSlice> slices;
    std::size_t x_total = 0, mid_total = 0, y_total = 0;
    bool empty() const { return x_total == 0 || mid_total == 0 || y_total == 0; }
    std::vector<std::size_t> x_rows() const;  // each slice's first row of the x buffer
    std::vector<std::size_t> y_rows() const;  // ... and of the y buffer
};
ExpertLayout lay_out_experts(std::span<const ExpertWeights* const> weights, std::span<const std::int64_t> rows,
                             std::int64_t h, std::size_t align);

// The experts a device MoE block runs (route_rows' order): their weights and
// rows, each checked as the default's calls would check it (gate/up against
// [rows, H], down giving H columns); g_count = all gathered rows.
struct RoutedExperts {
    std::vector<const ExpertWeights*> weights;
    std::vector<std::int64_t> rows;
    std::size_t g_count = 0;
};
RoutedExperts routed_experts(std::span<const ExpertWeights> experts, std::span<const ExpertRows> routed, std::int64_t h);
// Whether every expert has the first one's activation (SwiGLU, or the
// clamped one with the same alpha and limit): a device node then runs it
// once over the whole intermediate buffer. False for none.
bool one_activation(std::span<const ExpertWeights* const> weights);

// Views [rows, cols] that are consecutive parts of one device result, part
// g at byte g·rows·cols·size from the first (a device KV cache's heads:
// arch/graph.hpp KvLayer), as one view [n, rows, cols] of that result; else
// nullopt. A device node reads them in place instead of stacking them.
std::optional<TensorView> consecutive_parts(std::span<const TensorView> parts);

// Shared top-k selection used by the default route(): picks by (score + bias),
// grouped if n_group > 1, returns ids and (unbiased) scores of the chosen.
// Deterministic: ties go to the lower expert id.
void select_topk(const TensorView& scores, const RouterParams& params, Tensor& ids, Tensor& chosen_scores);

}  // namespace kvasir
