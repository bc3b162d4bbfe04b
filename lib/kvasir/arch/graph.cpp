#include "kvasir/arch/graph.hpp"

#include "kvasir/core/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace kvasir::arch {

namespace {

std::size_t esize(const TensorView& v) { return dtype_size(v.dtype); }

const std::byte* bytes_of(const TensorView& v) { return static_cast<const std::byte*>(v.data); }
std::byte* bytes_of(Tensor& t) { return static_cast<std::byte*>(t.raw()); }

bool widens_exactly(DType from, DType to) {
    if (from == to) return true;
    if (to == DType::f64) return dtype_is_float(from);
    if (to == DType::f32) return from == DType::f16 || from == DType::bf16;
    return false;
}

}  // namespace

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

Tensor norm_scale(Backend& be, const TensorView& w, bool offset) {
    if (!offset) return Tensor::convert(w, w.dtype);
    Tensor ones(w.dtype, w.shape);
    for (std::int64_t i = 0; i < ones.numel(); ++i) ones.set(i, 1.0);  // exact in every float dtype
    return be.add(ones, w);
}

void KvLayer::init(std::int64_t h, std::int64_t d) {
    heads = h;
    dim = d;
    k.assign(static_cast<std::size_t>(h), {});
    v.assign(static_cast<std::size_t>(h), {});
    len = 0;
}

void KvLayer::append(const TensorView& kk, const TensorView& vv) {
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

void KvLayer::truncate(std::int64_t n) {
    for (auto& b : k) b.resize(static_cast<std::size_t>(n) * row_bytes());
    for (auto& b : v) b.resize(static_cast<std::size_t>(n) * row_bytes());
    len = n;
}

TensorView KvLayer::keys(std::int64_t g) const { return TensorView{dtype, k[static_cast<std::size_t>(g)].data(), {len, dim}}; }

Tensor KvLayer::values_t(std::int64_t g) const {
    Tensor out(dtype, {dim, len});
    transpose_into(bytes_of(out), v[static_cast<std::size_t>(g)].data(), len, dim, dtype_size(dtype));
    return out;
}

LayerGraph::LayerGraph(Backend& b, const Model& m) : be(b), model(m), c(m.config()) {
    rope.theta = c.rope_theta;
    rope.layout = m.rope_layout();
    router.top_k = static_cast<int>(c.top_k());
    router.scoring = c.router.scoring;
    router.renormalize = c.norm_topk_prob();
    router.scaling = c.router.routed_scaling_factor;
    router.n_group = static_cast<int>(c.router.n_group);
    router.topk_group = static_cast<int>(c.router.topk_group);
}

Tensor LayerGraph::linear(const TensorView& x, const TensorView& w, const TensorView& bias) {
    Tensor y = be.matmul(x, w);
    if (!present(bias)) return y;
    return be.add(y, broadcast_rows(bias, rows_of(y.view())));
}

Tensor LayerGraph::swiglu_mlp(const TensorView& x, const TensorView& gate, const TensorView& up, const TensorView& down) {
    const Tensor g = be.matmul(x, gate);
    const Tensor u = be.matmul(x, up);
    const Tensor a = be.swiglu(g, u);
    return be.matmul(a, down);
}

Tensor LayerGraph::attention(const LayerWeights& w, const TensorView& x, std::span<const std::int64_t> pos, KvLayer& kv) {
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

Tensor LayerGraph::feed_forward(const LayerWeights& w, const Tensor& x2, LayerIO& io) {
    Tensor m;
    if (!w.moe) {
        m = swiglu_mlp(x2, w.mlp_gate, w.mlp_up, w.mlp_down);
    } else {
        io.router_logits = be.matmul(x2, w.router);
        if (io.plan != nullptr) {
            io.routing = *io.plan;
        } else {
            RouterParams p = router;
            p.bias = present(w.router_bias) ? &w.router_bias : nullptr;
            RouterOutput ro = be.route(io.router_logits, p);
            io.routing.ids = std::move(ro.ids);
            io.routing.weights = std::move(ro.weights);
        }
        m = be.moe_block(x2, w.experts, io.routing);
        if (present(w.shared_up)) {
            Tensor s = swiglu_mlp(x2, w.shared_gate, w.shared_up, w.shared_down);
            if (present(w.shared_expert_gate)) {
                const Tensor g = be.sigmoid(be.matmul(x2, w.shared_expert_gate));  // [T, 1]
                s = be.mul(broadcast_cols(g, s.dim(1)), s);
            }
            m = be.add(m, s);
        }
    }
    if (io.mlp_input != nullptr) *io.mlp_input = x2;
    if (io.mlp_output != nullptr) *io.mlp_output = m;
    return m;
}

Tensor LayerGraph::standard_layer(std::int64_t l, const TensorView& h, LayerIO& io) {
    const LayerWeights& w = model.layer(l);
    const Tensor x = be.rmsnorm(h, w.input_norm, c.rms_norm_eps);
    const Tensor a = attention(w, x, io.positions, io.kv);
    const Tensor h1 = be.add(h, a);
    const Tensor x2 = be.rmsnorm(h1, w.post_attention_norm, c.rms_norm_eps);
    const Tensor m = feed_forward(w, x2, io);
    return be.add(h1, m);
}

}  // namespace kvasir::arch
