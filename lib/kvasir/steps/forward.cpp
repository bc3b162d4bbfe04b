#include "kvasir/steps/forward.hpp"

#include "kvasir/core/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

namespace kvasir {

namespace {

// ---------------------------------------------------------------------------
// Exact host data movement
// ---------------------------------------------------------------------------

std::size_t esize(const TensorView& v) { return dtype_size(v.dtype); }

const std::byte* bytes_of(const TensorView& v) { return static_cast<const std::byte*>(v.data); }
std::byte* bytes_of(Tensor& t) { return static_cast<std::byte*>(t.raw()); }

// Rows [r0, r0 + n) of a tensor viewed as [rows, last dim]: zero copy.
TensorView row_slice(const TensorView& v, std::int64_t r0, std::int64_t n) {
    const std::int64_t cols = v.shape.back();
    return TensorView{v.dtype, bytes_of(v) + static_cast<std::size_t>(r0 * cols) * esize(v), {n, cols}};
}

// A vector [N] repeated as `rows` rows [rows, N] (bias / gate broadcast), same dtype.
Tensor broadcast_rows(const TensorView& vec, std::int64_t rows) {
    const std::int64_t n = vec.numel();
    Tensor out(vec.dtype, {rows, n});
    const std::size_t row_bytes = static_cast<std::size_t>(n) * esize(vec);
    for (std::int64_t r = 0; r < rows; ++r) std::memcpy(bytes_of(out) + static_cast<std::size_t>(r) * row_bytes, vec.data, row_bytes);
    return out;
}

// out[r, c] = col[r] for c < cols: a [rows, 1] column repeated along the row.
Tensor broadcast_cols(const TensorView& col, std::int64_t cols) {
    const std::int64_t rows = col.numel();
    Tensor out(col.dtype, {rows, cols});
    const std::size_t es = esize(col);
    for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c)
            std::memcpy(bytes_of(out) + static_cast<std::size_t>(r * cols + c) * es, bytes_of(col) + static_cast<std::size_t>(r) * es, es);
    return out;
}

// row[j] = −inf for j in [from, to) of the row starting at flat index `base`.
void fill_neg_inf(Tensor& t, std::int64_t base, std::int64_t from, std::int64_t to) {
    if (from >= to) return;
    switch (t.dtype()) {
        case DType::f64:
            std::fill(t.as<double>() + base + from, t.as<double>() + base + to, -std::numeric_limits<double>::infinity());
            return;
        case DType::f32:
            std::fill(t.as<float>() + base + from, t.as<float>() + base + to, -std::numeric_limits<float>::infinity());
            return;
        default:
            for (std::int64_t j = from; j < to; ++j) t.set(base + j, -std::numeric_limits<double>::infinity());
    }
}

// dst[c·rows + r] = src[r·cols + c] for elements of `es` bytes.
void transpose_into(std::byte* dst, const std::byte* src, std::int64_t rows, std::int64_t cols, std::size_t es) {
    auto run = [&](auto tag) {
        using E = decltype(tag);
        for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t c = 0; c < cols; ++c) {
                E v;
                std::memcpy(&v, src + static_cast<std::size_t>(r * cols + c) * sizeof(E), sizeof(E));
                std::memcpy(dst + static_cast<std::size_t>(c * rows + r) * sizeof(E), &v, sizeof(E));
            }
    };
    switch (es) {
        case 8: run(std::uint64_t{}); return;
        case 4: run(std::uint32_t{}); return;
        case 2: run(std::uint16_t{}); return;
        default: KVASIR_ASSERT(false);
    }
}

bool widens_exactly(DType from, DType to) {
    if (from == to) return true;
    if (to == DType::f64) return dtype_is_float(from);
    if (to == DType::f32) return from == DType::f16 || from == DType::bf16;
    return false;
}

// The embedding rows of `tokens`, widened (exactly) to `out` when possible.
Tensor gather_embeddings(const TensorView& table, std::span<const std::int32_t> tokens, DType out) {
    const std::int64_t t_count = static_cast<std::int64_t>(tokens.size());
    const std::int64_t h = table.shape[1];
    Tensor rows(table.dtype, {t_count, h});
    const std::size_t row_bytes = static_cast<std::size_t>(h) * esize(table);
    for (std::int64_t t = 0; t < t_count; ++t)
        std::memcpy(bytes_of(rows) + static_cast<std::size_t>(t) * row_bytes,
                    bytes_of(table) + static_cast<std::size_t>(tokens[static_cast<std::size_t>(t)]) * row_bytes, row_bytes);
    if (table.dtype == out || !widens_exactly(table.dtype, out)) return rows;
    return Tensor::convert(rows.view(), out);
}

// ---------------------------------------------------------------------------
// KV cache of one layer: K and V per kv head, contiguous [S, D] rows, in the
// backend's output dtype, so K_g is a zero-copy matmul "weight" [S, D].
// ---------------------------------------------------------------------------
struct KvLayer {
    DType dtype = DType::f32;
    std::int64_t heads = 0, dim = 0, len = 0;
    std::vector<std::vector<std::byte>> k, v;  // per kv head: len·dim elements

    void init(std::int64_t h, std::int64_t d) {
        heads = h;
        dim = d;
        k.assign(static_cast<std::size_t>(h), {});
        v.assign(static_cast<std::size_t>(h), {});
        len = 0;
    }
    std::size_t row_bytes() const { return static_cast<std::size_t>(dim) * dtype_size(dtype); }

    // Append T rows: kk [T, heads, dim], vv [T, heads·dim] (same dtype).
    void append(const TensorView& kk, const TensorView& vv) {
        KVASIR_ASSERT(kk.dtype == vv.dtype && kk.numel() == vv.numel());
        if (len == 0) dtype = kk.dtype;
        KVASIR_CHECK(kk.dtype == dtype, ErrorCode::backend_failure,
                     "KV cache: the backend returned {} keys after {} ones", dtype_name(kk.dtype), dtype_name(dtype));
        const std::int64_t t_count = kk.shape[0];
        const std::size_t rb = row_bytes();
        for (std::int64_t g = 0; g < heads; ++g) {
            auto& kb = k[static_cast<std::size_t>(g)];
            auto& vb = v[static_cast<std::size_t>(g)];
            kb.resize(static_cast<std::size_t>(len + t_count) * rb);
            vb.resize(static_cast<std::size_t>(len + t_count) * rb);
            for (std::int64_t t = 0; t < t_count; ++t) {
                const std::size_t src = static_cast<std::size_t>(t * heads + g) * rb;
                std::memcpy(kb.data() + static_cast<std::size_t>(len + t) * rb, bytes_of(kk) + src, rb);
                std::memcpy(vb.data() + static_cast<std::size_t>(len + t) * rb, bytes_of(vv) + src, rb);
            }
        }
        len += t_count;
    }
    void truncate(std::int64_t n) {
        for (auto& b : k) b.resize(static_cast<std::size_t>(n) * row_bytes());
        for (auto& b : v) b.resize(static_cast<std::size_t>(n) * row_bytes());
        len = n;
    }
    TensorView keys(std::int64_t g) const { return TensorView{dtype, k[static_cast<std::size_t>(g)].data(), {len, dim}}; }
    // V_gᵀ [dim, len]: the "weight" of P·V in the x·wᵀ convention.
    Tensor values_t(std::int64_t g) const {
        Tensor out(dtype, {dim, len});
        transpose_into(bytes_of(out), v[static_cast<std::size_t>(g)].data(), len, dim, dtype_size(dtype));
        return out;
    }
};

// ---------------------------------------------------------------------------
// The layer computation
// ---------------------------------------------------------------------------
struct Runner {
    Backend& be;
    const Model& model;
    const ModelConfig& c;
    RopeParams rope;
    RouterParams router;

    Runner(Backend& b, const Model& m) : be(b), model(m), c(m.config()) {
        KVASIR_CHECK(c.full_forward_supported(), ErrorCode::unsupported,
                     "{}: the full forward pass of {} is not implemented (its MLA attention is not modelled); "
                     "use the layer-level steps", c.source, architecture_name(c.architecture));
        KVASIR_CHECK(c.rope_type == "default", ErrorCode::unsupported,
                     "{}: rope type '{}' is not implemented by the forward pass (only 'default')", c.source, c.rope_type);
        KVASIR_CHECK(c.sliding_window == 0, ErrorCode::unsupported,
                     "{}: sliding-window attention ({}) is not implemented by the forward pass", c.source,
                     c.sliding_window);
        rope.theta = c.rope_theta;
        rope.layout = m.rope_layout();
        router.top_k = static_cast<int>(c.top_k());
        router.scoring = c.router.scoring;
        router.renormalize = c.norm_topk_prob();
        router.scaling = c.router.routed_scaling_factor;
        router.n_group = static_cast<int>(c.router.n_group);
        router.topk_group = static_cast<int>(c.router.topk_group);
    }

    Tensor linear(const TensorView& x, const TensorView& w, const TensorView& bias) {
        Tensor y = be.matmul(x, w);
        if (!present(bias)) return y;
        return be.add(y, broadcast_rows(bias, rows_of(y.view())));
    }

    Tensor swiglu_mlp(const TensorView& x, const TensorView& gate, const TensorView& up, const TensorView& down) {
        const Tensor g = be.matmul(x, gate);
        const Tensor u = be.matmul(x, up);
        const Tensor a = be.swiglu(g, u);
        return be.matmul(a, down);
    }

    Tensor attention(const LayerWeights& w, const TensorView& x, std::span<const std::int64_t> pos, KvLayer& kv) {
        const std::int64_t t_count = x.shape[0], nh = c.num_heads, nkv = c.num_kv_heads, d = c.head_dim;
        const std::int64_t rep = nh / nkv;
        Tensor q = std::move(linear(x, w.q_proj, w.q_bias)).reshaped({t_count, nh, d});
        Tensor k = std::move(linear(x, w.k_proj, w.k_bias)).reshaped({t_count, nkv, d});
        const Tensor v = linear(x, w.v_proj, w.v_bias);
        if (present(w.q_norm)) q = be.rmsnorm(q, w.q_norm, c.rms_norm_eps);
        if (present(w.k_norm)) k = be.rmsnorm(k, w.k_norm, c.rms_norm_eps);
        q = be.rope(q, pos, rope);
        k = be.rope(k, pos, rope);
        KVASIR_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype(), ErrorCode::backend_failure,
                     "attention: the backend returned q/k/v in different dtypes ({}, {}, {})", dtype_name(q.dtype()),
                     dtype_name(k.dtype()), dtype_name(v.dtype()));
        kv.append(k, v);
        const std::int64_t s_count = kv.len, p0 = s_count - t_count;
        const std::size_t es = dtype_size(q.dtype());
        const std::size_t head_bytes = static_cast<std::size_t>(d) * es;

        // Scores of every head, [nh·T, S]; rows of kv group g are contiguous
        // (heads g·rep … g·rep+rep−1, each T rows).
        Tensor scores;
        for (std::int64_t g = 0; g < nkv; ++g) {
            Tensor qg(q.dtype(), {rep * t_count, d});
            for (std::int64_t r = 0; r < rep; ++r)
                for (std::int64_t t = 0; t < t_count; ++t)
                    std::memcpy(bytes_of(qg) + static_cast<std::size_t>(r * t_count + t) * head_bytes,
                                bytes_of(q.view()) + static_cast<std::size_t>(t * nh + g * rep + r) * head_bytes, head_bytes);
            const Tensor sg = be.matmul(qg, kv.keys(g));
            if (g == 0) scores = Tensor(sg.dtype(), {nh * t_count, s_count});
            KVASIR_CHECK(sg.dtype() == scores.dtype(), ErrorCode::backend_failure, "attention: mixed score dtypes");
            std::memcpy(bytes_of(scores) + static_cast<std::size_t>(g * rep * t_count * s_count) * dtype_size(sg.dtype()),
                        sg.raw(), sg.nbytes());
        }
        Tensor scaled = be.scale(scores, std::pow(static_cast<double>(d), -0.5));
        // Causal mask, written exactly (see the header): row (h, t) sees 0 … p0 + t.
        for (std::int64_t h = 0; h < nh; ++h)
            for (std::int64_t t = 0; t < t_count; ++t) fill_neg_inf(scaled, (h * t_count + t) * s_count, p0 + t + 1, s_count);
        const Tensor probs = be.softmax(scaled);

        Tensor out;  // [T, nh·D], head-major within a row (transformers' transpose + reshape)
        for (std::int64_t g = 0; g < nkv; ++g) {
            const TensorView pg = row_slice(probs.view(), g * rep * t_count, rep * t_count);
            const Tensor og = be.matmul(pg, kv.values_t(g));  // [rep·T, D]
            if (g == 0) out = Tensor(og.dtype(), {t_count, nh * d});
            KVASIR_CHECK(og.dtype() == out.dtype(), ErrorCode::backend_failure, "attention: mixed output dtypes");
            const std::size_t ob = static_cast<std::size_t>(d) * dtype_size(og.dtype());
            for (std::int64_t r = 0; r < rep; ++r)
                for (std::int64_t t = 0; t < t_count; ++t)
                    std::memcpy(bytes_of(out) + static_cast<std::size_t>(t * nh + g * rep + r) * ob,
                                bytes_of(og.view()) + static_cast<std::size_t>(r * t_count + t) * ob, ob);
        }
        return linear(out, w.o_proj, w.o_bias);
    }

    // One decoder layer on input h [T, H]. Fills the per-layer outputs.
    Tensor layer(std::int64_t l, const TensorView& h, std::span<const std::int64_t> pos, KvLayer& kv,
                 const RoutingPlan* plan, Tensor& router_logits, RoutingPlan& used, Tensor* mlp_in, Tensor* mlp_out) {
        const LayerWeights& w = model.layer(l);
        const Tensor x = be.rmsnorm(h, w.input_norm, c.rms_norm_eps);
        const Tensor a = attention(w, x, pos, kv);
        const Tensor h1 = be.add(h, a);
        const Tensor x2 = be.rmsnorm(h1, w.post_attention_norm, c.rms_norm_eps);
        Tensor m;
        if (!w.moe) {
            m = swiglu_mlp(x2, w.mlp_gate, w.mlp_up, w.mlp_down);
        } else {
            router_logits = be.matmul(x2, w.router);
            if (plan != nullptr) {
                used = *plan;
            } else {
                RouterParams p = router;
                p.bias = present(w.router_bias) ? &w.router_bias : nullptr;
                RouterOutput ro = be.route(router_logits, p);
                used.ids = std::move(ro.ids);
                used.weights = std::move(ro.weights);
            }
            m = be.moe_block(x2, w.experts, used);
            if (present(w.shared_up)) {
                Tensor s = swiglu_mlp(x2, w.shared_gate, w.shared_up, w.shared_down);
                if (present(w.shared_expert_gate)) {
                    const Tensor g = be.sigmoid(be.matmul(x2, w.shared_expert_gate));  // [T, 1]
                    s = be.mul(broadcast_cols(g, s.dim(1)), s);
                }
                m = be.add(m, s);
            }
        }
        if (mlp_in != nullptr) *mlp_in = x2;
        if (mlp_out != nullptr) *mlp_out = m;
        return be.add(h1, m);
    }
};

void check_tokens(const ModelConfig& c, std::span<const std::int32_t> tokens) {
    KVASIR_CHECK(!tokens.empty(), ErrorCode::bad_input, "forward: no tokens");
    for (std::size_t i = 0; i < tokens.size(); ++i)
        KVASIR_CHECK(tokens[i] >= 0 && tokens[i] < c.vocab_size, ErrorCode::bad_input,
                     "forward: token {} at position {} is outside the vocabulary [0, {})", tokens[i], i, c.vocab_size);
}

void check_plans(const ModelConfig& c, const std::vector<RoutingPlan>* routing, std::int64_t t_count) {
    if (routing == nullptr) return;
    KVASIR_CHECK(static_cast<std::int64_t>(routing->size()) == c.num_layers, ErrorCode::bad_input,
                 "routing plan: {} layer entries for a model of {} layers", routing->size(), c.num_layers);
    for (std::int64_t l = 0; l < c.num_layers; ++l) {
        if (!c.is_moe(l)) continue;
        const RoutingPlan& p = (*routing)[static_cast<std::size_t>(l)];
        KVASIR_CHECK(p.ids.dtype() == DType::i32 && p.ids.view().rank() == 2 && p.ids.dim(0) == t_count &&
                         p.ids.dim(1) >= 1 && p.weights.shape() == p.ids.shape() && dtype_is_float(p.weights.dtype()),
                     ErrorCode::bad_input,
                     "routing plan of layer {}: ids {} ({}) / weights {} ({}) do not fit {} tokens (expected i32 ids "
                     "[T, k] and float weights of the same shape)",
                     l, shape_str(p.ids.shape()), dtype_name(p.ids.dtype()), shape_str(p.weights.shape()),
                     dtype_name(p.weights.dtype()), t_count);
        const std::int32_t* ids = p.ids.as<std::int32_t>();
        for (std::int64_t i = 0; i < p.ids.numel(); ++i)
            KVASIR_CHECK(ids[i] >= 0 && ids[i] < c.num_experts(), ErrorCode::bad_input,
                         "routing plan of layer {}: expert id {} outside [0, {})", l, ids[i], c.num_experts());
    }
}

// Runs tokens at positions p0 … through every layer with `cache`; fills `out`.
void run(Runner& r, std::vector<KvLayer>& cache, std::span<const std::int32_t> tokens, const ForwardOptions& opt,
         ForwardResult& out) {
    const ModelConfig& c = r.c;
    const std::int64_t t_count = static_cast<std::int64_t>(tokens.size());
    const std::int64_t L = c.num_layers;
    check_tokens(c, tokens);
    check_plans(c, opt.routing, t_count);
    if (opt.anchor_inputs != nullptr) {
        KVASIR_CHECK(static_cast<std::int64_t>(opt.anchor_inputs->size()) >= L, ErrorCode::bad_input,
                     "anchor inputs: {} entries for {} layers", opt.anchor_inputs->size(), L);
        for (std::int64_t l = 0; l < L; ++l) {
            const Tensor& a = (*opt.anchor_inputs)[static_cast<std::size_t>(l)];
            KVASIR_CHECK(a.shape() == Shape({t_count, c.hidden_size}) && dtype_is_float(a.dtype()), ErrorCode::bad_input,
                         "anchor input of layer {}: {} {} is not [{}, {}] float", l, dtype_name(a.dtype()),
                         shape_str(a.shape()), t_count, c.hidden_size);
        }
    }
    const std::int64_t p0 = cache.empty() ? 0 : cache.front().len;
    std::vector<std::int64_t> pos(static_cast<std::size_t>(t_count));
    for (std::int64_t t = 0; t < t_count; ++t) pos[static_cast<std::size_t>(t)] = p0 + t;

    out = ForwardResult{};
    out.router_logits.resize(static_cast<std::size_t>(L));
    out.routing.resize(static_cast<std::size_t>(L));
    if (opt.keep_mlp_io) {
        out.mlp_input.resize(static_cast<std::size_t>(L));
        out.mlp_output.resize(static_cast<std::size_t>(L));
    }
    Tensor h = gather_embeddings(r.model.embed(), tokens, r.be.capabilities().output);
    if (opt.keep_hidden) out.hidden.push_back(h);
    for (std::int64_t l = 0; l < L; ++l) {
        const auto li = static_cast<std::size_t>(l);
        const TensorView input = opt.anchor_inputs != nullptr ? (*opt.anchor_inputs)[li].view() : h.view();
        const RoutingPlan* plan = opt.routing != nullptr && c.is_moe(l) ? &(*opt.routing)[li] : nullptr;
        Tensor next = r.layer(l, input, pos, cache[li], plan, out.router_logits[li], out.routing[li],
                              opt.keep_mlp_io ? &out.mlp_input[li] : nullptr,
                              opt.keep_mlp_io ? &out.mlp_output[li] : nullptr);
        h = std::move(next);
        if (opt.keep_hidden) out.hidden.push_back(h);
    }
    out.final_hidden = r.be.rmsnorm(h, r.model.final_norm(), c.rms_norm_eps);
    out.logits = r.be.matmul(out.final_hidden, r.model.lm_head());
}

std::vector<KvLayer> fresh_cache(const ModelConfig& c) {
    std::vector<KvLayer> cache(static_cast<std::size_t>(c.num_layers));
    for (auto& k : cache) k.init(c.num_kv_heads, c.head_dim);
    return cache;
}

// Bits of two tensors equal (dtype, shape and bytes).
bool same_bits(const Tensor& a, const Tensor& b) {
    return a.dtype() == b.dtype() && a.shape() == b.shape() &&
           (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}
bool same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (!same_bits(a[i], b[i])) return false;
    return true;
}

// max |a − b| over positions; NaN when the non-finite patterns differ.
double max_abs_delta(const Tensor& a, const Tensor& b, const char* what) {
    KVASIR_CHECK(a.shape() == b.shape(), ErrorCode::bad_input, "run-to-run: {} shapes {} and {} differ", what,
                 shape_str(a.shape()), shape_str(b.shape()));
    double worst = 0.0;
    for (std::int64_t i = 0; i < a.numel(); ++i) {
        const double x = a.at(i), y = b.at(i);
        if (std::isnan(x) || std::isnan(y)) {
            if (std::isnan(x) != std::isnan(y)) return std::numeric_limits<double>::quiet_NaN();
            continue;
        }
        if (std::isinf(x) || std::isinf(y)) {
            if (x != y) return std::numeric_limits<double>::quiet_NaN();
            continue;
        }
        const double d = std::fabs(x - y);
        if (d > worst) worst = d;
    }
    return worst;
}

}  // namespace

// ---------------------------------------------------------------------------

ForwardResult forward(Backend& backend, const Model& model, std::span<const std::int32_t> tokens,
                      const ForwardOptions& options) {
    Runner r(backend, model);
    std::vector<KvLayer> cache = fresh_cache(model.config());
    ForwardResult out;
    run(r, cache, tokens, options, out);
    return out;
}

struct Decoder::Impl {
    Runner runner;
    std::vector<KvLayer> cache;
    std::vector<RoutingPlan> last_routing;
    Impl(Backend& b, const Model& m) : runner(b, m), cache(fresh_cache(m.config())) {}
};

Decoder::Decoder(Backend& backend, const Model& model) : impl_(std::make_unique<Impl>(backend, model)) {}
Decoder::~Decoder() = default;
Decoder::Decoder(Decoder&&) noexcept = default;
Decoder& Decoder::operator=(Decoder&&) noexcept = default;

Tensor Decoder::step(std::span<const std::int32_t> new_tokens, const std::vector<RoutingPlan>* routing) {
    const std::int64_t before = position();
    ForwardOptions opt;
    opt.routing = routing;
    opt.keep_hidden = false;
    ForwardResult out;
    try {
        run(impl_->runner, impl_->cache, new_tokens, opt, out);
    } catch (...) {
        for (auto& k : impl_->cache) k.truncate(before);  // layers already appended to roll back
        throw;
    }
    impl_->last_routing = std::move(out.routing);
    return std::move(out.logits);
}

std::int64_t Decoder::position() const { return impl_->cache.empty() ? 0 : impl_->cache.front().len; }
const std::vector<RoutingPlan>& Decoder::last_routing() const { return impl_->last_routing; }
void Decoder::reset() {
    for (auto& k : impl_->cache) k.truncate(0);
    impl_->last_routing.clear();
}

GenerateResult greedy_generate(Backend& backend, const Model& model, std::span<const std::int32_t> prompt, int n,
                               const std::vector<std::int32_t>* pinned_tokens,
                               const std::vector<std::vector<RoutingPlan>>* step_routing) {
    KVASIR_CHECK(n >= 1, ErrorCode::bad_input, "generate: {} steps (need at least 1)", n);
    KVASIR_CHECK(!prompt.empty(), ErrorCode::bad_input, "generate: empty prompt");
    if (pinned_tokens != nullptr)
        KVASIR_CHECK(static_cast<int>(pinned_tokens->size()) >= n - 1, ErrorCode::bad_input,
                     "generate: {} pinned tokens for {} steps (need {})", pinned_tokens->size(), n, n - 1);
    if (step_routing != nullptr)
        KVASIR_CHECK(static_cast<int>(step_routing->size()) >= n, ErrorCode::bad_input,
                     "generate: {} routing steps for {} steps", step_routing->size(), n);
    Decoder dec(backend, model);
    GenerateResult res;
    const std::int64_t v_count = model.config().vocab_size;
    std::int32_t next = 0;
    for (int i = 0; i < n; ++i) {
        const std::span<const std::int32_t> in = i == 0 ? prompt : std::span<const std::int32_t>(&next, 1);
        const Tensor lg = dec.step(in, step_routing != nullptr ? &(*step_routing)[static_cast<std::size_t>(i)] : nullptr);
        if (i == 0) res.logits = Tensor(lg.dtype(), {n, v_count});
        const std::int64_t last = lg.dim(0) - 1;
        const std::size_t row_bytes = static_cast<std::size_t>(v_count) * dtype_size(lg.dtype());
        std::memcpy(static_cast<std::byte*>(res.logits.raw()) + static_cast<std::size_t>(i) * row_bytes,
                    static_cast<const std::byte*>(lg.raw()) + static_cast<std::size_t>(last) * row_bytes, row_bytes);
        // Argmax: ties to the lower id, NaN never wins.
        std::int64_t best = -1;
        double top1 = -std::numeric_limits<double>::infinity(), top2 = top1;
        for (std::int64_t j = 0; j < v_count; ++j) {
            const double x = lg.at(last * v_count + j);
            if (std::isnan(x)) continue;
            if (best < 0 || x > top1) {
                top2 = best < 0 ? top2 : top1;
                top1 = x;
                best = j;
            } else if (x > top2) {
                top2 = x;
            }
        }
        KVASIR_CHECK(best >= 0, ErrorCode::backend_failure, "generate: step {} produced only NaN logits", i);
        const auto own = static_cast<std::int32_t>(best);
        res.tokens.push_back(own);
        res.margins.push_back(top1 - top2);
        res.routing.push_back(dec.last_routing());
        next = pinned_tokens != nullptr && i < static_cast<int>(pinned_tokens->size())
                   ? (*pinned_tokens)[static_cast<std::size_t>(i)]
                   : own;
        res.fed.push_back(next);
    }
    return res;
}

bool bit_identical(const ForwardResult& a, const ForwardResult& b) {
    if (!same_bits(a.hidden, b.hidden) || !same_bits(a.router_logits, b.router_logits) ||
        !same_bits(a.mlp_input, b.mlp_input) || !same_bits(a.mlp_output, b.mlp_output) ||
        !same_bits(a.final_hidden, b.final_hidden) || !same_bits(a.logits, b.logits) ||
        a.routing.size() != b.routing.size())
        return false;
    for (std::size_t l = 0; l < a.routing.size(); ++l)
        if (!same_bits(a.routing[l].ids, b.routing[l].ids) || !same_bits(a.routing[l].weights, b.routing[l].weights))
            return false;
    return true;
}

RunToRunDelta run_to_run_delta(const ForwardResult& a, const ForwardResult& b) {
    KVASIR_CHECK(a.hidden.size() == b.hidden.size() && a.router_logits.size() == b.router_logits.size() &&
                     a.routing.size() == b.routing.size(),
                 ErrorCode::bad_input, "run-to-run: the two results have different layouts ({} / {} hidden states)",
                 a.hidden.size(), b.hidden.size());
    RunToRunDelta d;
    d.bit_identical = bit_identical(a, b);
    d.logits_max_abs = max_abs_delta(a.logits, b.logits, "logits");
    d.final_max_abs = max_abs_delta(a.final_hidden, b.final_hidden, "final hidden");
    // A NaN (non-finite mismatch) sticks: nothing after it can look better.
    for (std::size_t i = 0; i < a.hidden.size() && !std::isnan(d.hidden_max_abs); ++i) {
        const double x = max_abs_delta(a.hidden[i], b.hidden[i], "hidden");
        if (std::isnan(x) || x > d.hidden_max_abs) {
            d.hidden_max_abs = x;
            d.hidden_worst = static_cast<std::int64_t>(i);
        }
    }
    for (std::size_t l = 0; l < a.router_logits.size() && !std::isnan(d.router_logits_max_abs); ++l) {
        if (a.router_logits[l].empty() && b.router_logits[l].empty()) continue;
        const double x = max_abs_delta(a.router_logits[l], b.router_logits[l], "router logits");
        if (std::isnan(x) || x > d.router_logits_max_abs) d.router_logits_max_abs = x;
    }
    for (std::size_t l = 0; l < a.routing.size(); ++l) {
        const Tensor& ia = a.routing[l].ids;
        const Tensor& ib = b.routing[l].ids;
        if (ia.empty() && ib.empty()) continue;
        KVASIR_CHECK(ia.shape() == ib.shape(), ErrorCode::bad_input, "run-to-run: routing shapes {} and {} differ at layer {}",
                     shape_str(ia.shape()), shape_str(ib.shape()), l);
        const std::int64_t rows = ia.dim(0), k = ia.dim(1);
        for (std::int64_t t = 0; t < rows; ++t) {
            std::multiset<std::int32_t> sa(ia.as<std::int32_t>() + t * k, ia.as<std::int32_t>() + (t + 1) * k);
            std::multiset<std::int32_t> sb(ib.as<std::int32_t>() + t * k, ib.as<std::int32_t>() + (t + 1) * k);
            if (sa != sb) ++d.routing_rows_differing;
        }
    }
    return d;
}

}  // namespace kvasir
