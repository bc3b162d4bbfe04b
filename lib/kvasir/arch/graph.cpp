#include "kvasir/arch/graph.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/model/rope_frequencies.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

namespace kvasir::arch {

namespace {

std::size_t esize(const TensorView& v) { return dtype_size(v.dtype); }

// The host bytes of v (a device result's fetched now: host data movement).
const std::byte* bytes_of(const TensorView& v) { return static_cast<const std::byte*>(v.host_data()); }
std::byte* bytes_of(Tensor& t) { return static_cast<std::byte*>(t.raw()); }

bool widens_exactly(DType from, DType to) {
    if (from == to) return true;
    if (to == DType::f64) return dtype_is_float(from);
    if (to == DType::f32) return from == DType::f16 || from == DType::bf16;
    return false;
}

}  // namespace

// Rows [r0, r0 + n) of a tensor viewed as [rows, last dim]: zero copy (of
// a device result too: the slice stays on the device until read).
TensorView row_slice(const TensorView& v, std::int64_t r0, std::int64_t n) {
    const std::int64_t cols = v.shape.back();
    return v.part(static_cast<std::size_t>(r0 * cols) * esize(v), {n, cols});
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
    kd = Tensor();
    vd = Tensor();
    on_device = false;
    len = 0;
}

void KvLayer::append(Backend& be, const TensorView& kk, const TensorView& vv) {
    KVASIR_ASSERT(kk.dtype == vv.dtype && kk.numel() == vv.numel());
    if (len == 0) dtype = kk.dtype;
    KVASIR_CHECK(kk.dtype == dtype, ErrorCode::backend_failure,
                 "KV cache: the backend returned {} keys after {} ones", dtype_name(kk.dtype), dtype_name(dtype));
    const std::int64_t t_count = kk.shape[0];
    if (len == 0 && !on_device) on_device = true;  // a fresh cache: try the node first
    if (on_device) {
        const TensorView vrows = vv.part(0, {t_count, heads, dim});
        const TensorView kc = kd.view(), vc = vd.view();
        std::optional<Tensor> nk = be.kv_rows(len > 0 ? &kc : nullptr, len, kk);
        std::optional<Tensor> nv = nk ? be.kv_rows(len > 0 ? &vc : nullptr, len, vrows) : std::nullopt;
        if (nk && nv) {
            kd = std::move(*nk);
            vd = std::move(*nv);
            len += t_count;
            return;
        }
        // The node keeps no cache (a host node, or outside a residency
        // scope): the rows so far move to the host, and stay there.
        k.assign(static_cast<std::size_t>(heads), {});
        v.assign(static_cast<std::size_t>(heads), {});
        const std::size_t rb = row_bytes();
        for (std::int64_t g = 0; g < heads; ++g)
            for (auto [dst, src] : {std::pair{&k, &kd}, std::pair{&v, &vd}}) {
                auto& head = (*dst)[static_cast<std::size_t>(g)];
                head.resize(static_cast<std::size_t>(len) * rb);
                if (len > 0)
                    std::memcpy(head.data(), static_cast<const std::byte*>(src->raw()) + static_cast<std::size_t>(g * src->dim(1)) * rb,
                                head.size());
            }
        kd = Tensor();
        vd = Tensor();
        on_device = false;
    }
    const std::size_t rb = row_bytes();
    const std::byte* kb_src = bytes_of(kk);
    const std::byte* vb_src = bytes_of(vv);
    for (std::int64_t g = 0; g < heads; ++g) {
        auto& kb = k[static_cast<std::size_t>(g)];
        auto& vb = v[static_cast<std::size_t>(g)];
        kb.resize(static_cast<std::size_t>(len + t_count) * rb);
        vb.resize(static_cast<std::size_t>(len + t_count) * rb);
        for (std::int64_t t = 0; t < t_count; ++t) {
            const std::size_t src = static_cast<std::size_t>(t * heads + g) * rb;
            std::memcpy(kb.data() + static_cast<std::size_t>(len + t) * rb, kb_src + src, rb);
            std::memcpy(vb.data() + static_cast<std::size_t>(len + t) * rb, vb_src + src, rb);
        }
    }
    len += t_count;
}

void KvLayer::truncate(std::int64_t n) {
    if (!on_device) {
        for (auto& b : k) b.resize(static_cast<std::size_t>(n) * row_bytes());
        for (auto& b : v) b.resize(static_cast<std::size_t>(n) * row_bytes());
    }
    // On the device the rows past n stay where they are, unread: the next
    // append keeps each head's first n (Backend::kv_rows).
    len = std::min(len, n);
    seen = n;
}

TensorView KvLayer::keys(std::int64_t g) const {
    if (on_device) return kd.view().part(static_cast<std::size_t>(g * kd.dim(1)) * row_bytes(), {len, dim});
    return TensorView{dtype, k[static_cast<std::size_t>(g)].data(), {len, dim}};
}

TensorView KvLayer::values(std::int64_t g) const {
    if (on_device) return vd.view().part(static_cast<std::size_t>(g * vd.dim(1)) * row_bytes(), {len, dim});
    return TensorView{dtype, v[static_cast<std::size_t>(g)].data(), {len, dim}};
}

LayerGraph::LayerGraph(Backend& b, const Model& m) : be(b), model(m), c(m.config()) {
    rope.theta = c.rope_theta;
    rope.layout = m.rope_layout();
    if (std::vector<double> f = rope_inverse_frequencies(c); !f.empty())
        rope.inv_freq = std::make_shared<const std::vector<double>>(std::move(f));
    attention_factor = rope_attention_factor(c);
    attention_scale = kvasir::attention_scale(c);
    router.top_k = static_cast<int>(c.top_k());
    router.scoring = c.router.scoring;
    router.renormalize = c.norm_topk_prob();
    router.scaling = c.router.routed_scaling_factor;
    router.n_group = static_cast<int>(c.router.n_group);
    router.topk_group = static_cast<int>(c.router.topk_group);
}

Tensor LayerGraph::linear(const TensorView& x, const TensorView& w, const TensorView& bias) {
    return kvasir::linear(be, x, w, bias);
}

Tensor LayerGraph::swiglu_mlp(const TensorView& x, const TensorView& gate, const TensorView& up, const TensorView& down) {
    const Tensor g = be.matmul(x, gate);
    const Tensor u = be.matmul(x, up);
    const Tensor a = be.swiglu(g, u);
    return be.matmul(a, down);
}

Tensor LayerGraph::attention(const LayerWeights& w, const TensorView& x, std::span<const std::int64_t> pos,
                             std::span<const Segment> segs) {
    const std::int64_t t_count = x.shape[0], nh = c.num_heads, nkv = c.num_kv_heads, d = c.head_dim;
    Tensor q = linear(x, w.q_proj, w.q_bias);
    Tensor k = linear(x, w.k_proj, w.k_bias);
    const Tensor v = linear(x, w.v_proj, w.v_bias);
    if (c.qk_norm_full) {  // olmoe: over the whole projection, before the split into heads
        q = be.rmsnorm(q, w.q_norm, c.rms_norm_eps);
        k = be.rmsnorm(k, w.k_norm, c.rms_norm_eps);
    }
    q = std::move(q).reshaped({t_count, nh, d});
    k = std::move(k).reshaped({t_count, nkv, d});
    if (!c.qk_norm_full && present(w.q_norm)) q = be.rmsnorm(q, w.q_norm, c.rms_norm_eps);
    if (!c.qk_norm_full && present(w.k_norm)) k = be.rmsnorm(k, w.k_norm, c.rms_norm_eps);
    q = rope_partial(q, pos);
    k = rope_partial(k, pos);
    return linear(attend_each(q, k, v, segs, c.attention_window(w.index), present(w.sinks) ? &w.sinks : nullptr), w.o_proj,
                  w.o_bias);
}


Tensor LayerGraph::mla_attention(const LayerWeights& w, const TensorView& x, std::span<const std::int64_t> pos,
                                 std::span<const Segment> segs) {
    const auto& m = c.mla;
    const std::int64_t t = x.shape[0], nh = c.num_heads, dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim,
                       dv = m.v_head_dim, d = c.head_dim, width = c.attention_width(), r = m.kv_lora_rank;
    const TensorView none;
    // Queries: q_b(rmsnorm(q_a(x))) or q_proj(x), per head [nope | rope].
    const Tensor q = std::move(present(w.q_a_proj)
                                   ? linear(be.rmsnorm(linear(x, w.q_a_proj, w.q_a_bias), w.q_a_norm, m.latent_norm_eps),
                                            w.q_b_proj, none)
                                   : linear(x, w.q_proj, none))
                         .reshaped({t * nh, d});
    // The latent and the one shared rope key: kv_a_proj_with_mqa(x) = [latent (r) | k_rot (dr)].
    const Tensor kv_a = linear(x, w.kv_a_proj, w.kv_a_bias);
    const Tensor latent = be.rmsnorm(be.copy_columns(kv_a, 0, r), w.kv_a_norm, m.latent_norm_eps);
    // The rope dims; with interleaved pairs (x0, x1), (x2, x3), … they go to the halves layout
    // [x0, x2, … | x1, x3, …] that a NEOX (rotate_half) rope turns pair by pair: transformers'
    // apply_rotary_pos_emb_interleave returns cat(even′, odd′), exactly this layout after the rotation.
    const auto rope_dims = [&](const Tensor& from, std::int64_t c0) {
        if (!m.rope_interleave) return be.copy_columns(from, c0, dr);
        const Tensor even = be.copy_columns(from, c0, dr / 2, 2), odd = be.copy_columns(from, c0 + 1, dr / 2, 2);
        const TensorView halves[] = {even.view(), odd.view()};
        return be.join_columns(halves);
    };
    Tensor q_rot = rope_dims(q, d - dr), k_rot = rope_dims(kv_a, r);
    q_rot = be.rope(std::move(q_rot).reshaped({t, nh, dr}), pos, rope);
    k_rot = be.rope(std::move(k_rot).reshaped({t, 1, dr}), pos, rope);
    if (attention_factor != 1.0) {  // yarn's cos/sin scale, on the rope part only
        q_rot = be.scale(q_rot, attention_factor);
        k_rot = be.scale(k_rot, attention_factor);
    }
    // Per head keys [k_nope | k_rot] (the one rope key repeated for every head) and values from
    // kv_b_proj(latent) = [k_nope (dn) | v (dv)].
    const Tensor kv = std::move(linear(latent, w.kv_b_proj, none)).reshaped({t * nh, dn + dv});
    const Tensor k_nope = be.copy_columns(kv, 0, dn), q_nope = be.copy_columns(q, 0, dn);
    Tensor v = be.copy_columns(kv, dn, dv);
    const Tensor k_rot_heads = be.repeat_columns(k_rot.view().part(0, {t, dr}), nh);  // [t, nh·dr]
    // The narrower of q·k (d) and v (dv) is zero-padded to `width`: zeros add nothing to a dot product and
    // give zero output columns, exactly, in any order of summation — every backend's own kernel runs it.
    const TensorView qk_pad{q.dtype(), nullptr, {t * nh, width - d}}, v_pad{v.dtype(), nullptr, {t * nh, width - dv}};
    const auto joined = [&](std::initializer_list<TensorView> parts) {
        std::vector<TensorView> kept;
        for (const TensorView& p : parts)
            if (p.shape.back() > 0) kept.push_back(p);
        return be.join_columns(kept);
    };
    Tensor qq = joined({q_nope.view(), q_rot.view().part(0, {t * nh, dr}), qk_pad});
    Tensor kk = joined({k_nope.view(), k_rot_heads.view().part(0, {t * nh, dr}), qk_pad});
    Tensor vv = width > dv ? joined({v.view(), v_pad}) : std::move(v);

    const Tensor o = attend_each(std::move(qq).reshaped({t, nh, width}), std::move(kk).reshaped({t, nh, width}),
                                 std::move(vv).reshaped({t, nh * width}), segs);
    const Tensor heads = std::move(be.copy_columns(o.view().part(0, {t * nh, width}), 0, dv)).reshaped({t, nh * dv});
    return linear(heads, w.o_proj, w.o_bias);
}

Tensor LayerGraph::attend_each(const Tensor& q, const Tensor& k, const Tensor& v, std::span<const Segment> segs,
                               std::int64_t window, const TensorView* sinks) {
    KVASIR_ASSERT(!segs.empty());
    if (segs.size() == 1) return attend(q, k, v, *segs.front().kv, window, sinks);
    std::vector<Tensor> outs;
    outs.reserve(segs.size());
    for (const Segment& s : segs)
        outs.push_back(attend(leading_rows(q, s.row0, s.rows), leading_rows(k, s.row0, s.rows),
                              leading_rows(v, s.row0, s.rows), *s.kv, window, sinks));
    return stack_rows(outs);
}

Tensor LayerGraph::attend(const Tensor& q, const Tensor& k, const Tensor& v, KvLayer& kv, std::int64_t window,
                          const TensorView* sinks) {
    KVASIR_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype(), ErrorCode::backend_failure,
                 "attention: the backend returned q/k/v in different dtypes ({}, {}, {})", dtype_name(q.dtype()),
                 dtype_name(k.dtype()), dtype_name(v.dtype()));
    kv.append(be, k, v);
    const double scale = attention_scale;
    std::vector<TensorView> keys, values;
    for (std::int64_t g = 0; g < kv.heads; ++g) {
        keys.push_back(kv.keys(g));
        values.push_back(kv.values(g));
    }
    return windowed_attention(be, q, keys, values, scale, window, sinks);
}

Tensor windowed_attention(Backend& be, const TensorView& q, std::span<const TensorView> keys,
                          std::span<const TensorView> values, double scale, std::int64_t window, const TensorView* sinks) {
    KVASIR_CHECK(!keys.empty() && keys.size() == values.size() && q.rank() == 3, ErrorCode::bad_input,
                 "attention: q {} with {} key / {} value caches", shape_str(q.shape), keys.size(), values.size());
    const std::int64_t len = keys[0].dim(0);
    // A device KV cache (Backend::kv_rows: the heads one after another in one
    // result): a window of it is moved on the device into a result of its
    // own, [heads, k1 − k0, D] — the heads' rows [k0, k1) are columns
    // [k0·D, k1·D) of the cache seen as [heads, S·D] — which attention then
    // reads in place (with or without sinks: the device nodes fuse both);
    // anywhere else the window is views into the cache.
    const std::optional<TensorView> kall = consecutive_parts(keys);
    const std::optional<TensorView> vall = consecutive_parts(values);
    const auto attend_rows = [&](const TensorView& qr, std::int64_t k0, std::int64_t k1) {
        std::vector<TensorView> ks, vs;
        Tensor kw, vw;
        if (kall && vall && (k0 > 0 || k1 < len)) {
            const std::int64_t heads = kall->dim(0), dk = kall->dim(2), dv = vall->dim(2);
            kw = be.copy_columns(kall->part(0, {heads, len * dk}), k0 * dk, (k1 - k0) * dk);
            vw = be.copy_columns(vall->part(0, {heads, len * dv}), k0 * dv, (k1 - k0) * dv);
            for (std::int64_t g = 0; g < heads; ++g) {
                ks.push_back(kw.view().part(static_cast<std::size_t>(g * (k1 - k0) * dk) * esize(kw.view()), {k1 - k0, dk}));
                vs.push_back(vw.view().part(static_cast<std::size_t>(g * (k1 - k0) * dv) * esize(vw.view()), {k1 - k0, dv}));
            }
        } else {
            for (std::size_t g = 0; g < keys.size(); ++g) {
                ks.push_back(row_slice(keys[g], k0, k1 - k0));
                vs.push_back(row_slice(values[g], k0, k1 - k0));
            }
        }
        return sinks != nullptr ? be.causal_attention_sinks(qr, ks, vs, scale, *sinks) : be.causal_attention(qr, ks, vs, scale);
    };
    const std::int64_t t_count = q.dim(0), first = len - t_count;  // cache position of row 0
    KVASIR_CHECK(first >= 0, ErrorCode::bad_input, "attention: {} queries over {} cached keys", t_count, len);
    if (window <= 0 || len <= window) return attend_rows(q, 0, len);
    // Rows r < window − first see their whole prefix; each later row p = first + r its last `window` keys.
    // Rows of q are views (zero copy; a device result's rows stay where they are).
    const std::size_t q_row = static_cast<std::size_t>(q.dim(1) * q.dim(2)) * esize(q);
    const auto q_rows = [&](std::int64_t r, std::int64_t n) { return q.part(static_cast<std::size_t>(r) * q_row, {n, q.dim(1), q.dim(2)}); };
    const std::int64_t full_rows = std::clamp<std::int64_t>(window - first, 0, t_count);
    std::vector<Tensor> parts;
    if (full_rows > 0) parts.push_back(attend_rows(q_rows(0, full_rows), 0, first + full_rows));
    for (std::int64_t r = full_rows; r < t_count; ++r) {
        const std::int64_t p = first + r;
        parts.push_back(attend_rows(q_rows(r, 1), p - window + 1, p + 1));
    }
    return parts.size() == 1 ? std::move(parts.front()) : stack_rows(parts);
}

Tensor LayerGraph::feed_forward(const LayerWeights& w, const Tensor& own_input, LayerIO& io) {
    const Tensor& x2 = io.mlp_anchor != nullptr ? *io.mlp_anchor : own_input;
    Tensor m;
    if (!w.moe) {
        m = swiglu_mlp(x2, w.mlp_gate, w.mlp_up, w.mlp_down);
    } else {
        io.router_logits = linear(x2, w.router, w.router_logit_bias);  // gpt_oss: logits with a bias
        if (io.plan != nullptr) {
            io.routing = *io.plan;
        } else {
            RouterParams p = router;
            p.bias = present(w.router_bias) ? &w.router_bias : nullptr;
            RouterOutput ro = be.route(io.router_logits, p);
            io.routing.ids = std::move(ro.ids);
            io.routing.weights = std::move(ro.weights);
        }
        if (model.streams_weights()) {  // the chosen experts' pages, read ahead in one request each
            std::vector<bool> chosen(w.experts.size(), false);
            const std::int32_t* ids = io.routing.ids.as<std::int32_t>();
            for (std::int64_t i = 0; i < io.routing.ids.numel(); ++i)
                if (ids[i] >= 0 && static_cast<std::size_t>(ids[i]) < chosen.size() && !chosen[static_cast<std::size_t>(ids[i])]) {
                    const ExpertWeights& e = w.experts[static_cast<std::size_t>(ids[i])];
                    chosen[static_cast<std::size_t>(ids[i])] = true;
                    for (const TensorView* v : {&e.gate, &e.up, &e.down}) model.will_read(*v);
                }
        }
        m = be.moe_block(x2, w.experts, io.routing);
        if (present(w.shared_up)) {
            Tensor s = swiglu_mlp(x2, w.shared_gate, w.shared_up, w.shared_down);
            if (present(w.shared_expert_gate)) {
                const Tensor g = be.sigmoid(be.matmul(x2, w.shared_expert_gate));  // [T, 1]
                s = be.mul(be.repeat_columns(g, s.dim(1)), s);
            }
            m = be.add(m, s);
        }
    }
    if (io.mlp_input != nullptr) *io.mlp_input = own_input;
    if (io.mlp_output != nullptr) *io.mlp_output = m;
    return m;
}

Tensor leading_rows(const TensorView& x, std::int64_t r0, std::int64_t n) {
    KVASIR_ASSERT(x.rank() >= 1 && r0 >= 0 && n >= 0 && r0 + n <= x.shape[0]);
    Shape shape = x.shape;
    shape[0] = n;
    Tensor out(x.dtype, shape);
    const std::size_t per = out.nbytes() / static_cast<std::size_t>(std::max<std::int64_t>(n, 1));
    if (n > 0) std::memcpy(bytes_of(out), bytes_of(x) + static_cast<std::size_t>(r0) * per, out.nbytes());
    return out;
}

Tensor stack_rows(const std::vector<Tensor>& parts) {
    KVASIR_ASSERT(!parts.empty());
    Shape shape = parts.front().shape();
    std::int64_t rows = 0;
    for (const Tensor& p : parts) {
        KVASIR_CHECK(p.dtype() == parts.front().dtype() && p.view().rank() == static_cast<int>(shape.size()),
                     ErrorCode::backend_failure, "stacking sequences: the backend returned mixed dtypes or ranks");
        for (std::size_t d = 1; d < shape.size(); ++d)
            KVASIR_CHECK(p.shape()[d] == shape[d], ErrorCode::backend_failure, "stacking sequences: {} vs {}",
                         shape_str(p.shape()), shape_str(shape));
        rows += p.dim(0);
    }
    shape[0] = rows;
    Tensor out(parts.front().dtype(), shape);
    std::size_t at = 0;
    for (const Tensor& p : parts) {
        if (p.nbytes() > 0) std::memcpy(bytes_of(out) + at, p.raw(), p.nbytes());
        at += p.nbytes();
    }
    return out;
}

Tensor LayerGraph::rope_partial(const Tensor& x, std::span<const std::int64_t> pos) {
    const std::int64_t d = x.dim(2), rd = c.rotary_dims();
    if (rd == d) return be.rope(x, pos, rope);
    // Rotate the first rd dimensions of every head (transformers'
    // apply_rotary_pos_emb with rotary_dim < head_dim); the rest pass through.
    const std::int64_t t_count = x.dim(0), heads = x.dim(1);
    Tensor rot = be.rope(std::move(be.copy_columns(x, 0, rd)).reshaped({t_count, heads, rd}), pos, rope);
    rot = std::move(rot).reshaped({t_count * heads, rd});
    Tensor pass = be.copy_columns(x, rd, d - rd);  // [T·heads, d − rd], x's dtype
    if (pass.dtype() != rot.dtype()) pass = Tensor::convert(pass, rot.dtype());
    const TensorView both[] = {rot.view(), pass.view()};
    return std::move(be.join_columns(both)).reshaped({t_count, heads, d});
}

Tensor LayerGraph::gated_attention(const LayerWeights& w, const TensorView& x, std::span<const std::int64_t> pos,
                                   std::span<const Segment> segs) {
    const std::int64_t t_count = x.shape[0], nh = c.num_heads, nkv = c.num_kv_heads, d = c.head_dim;
    // q_proj yields, per head, D query values then D gate values.
    const Tensor qg = std::move(linear(x, w.q_proj, w.q_bias)).reshaped({t_count * nh, 2 * d});
    Tensor q = std::move(be.copy_columns(qg, 0, d)).reshaped({t_count, nh, d});
    const Tensor gate = std::move(be.copy_columns(qg, d, d)).reshaped({t_count, nh * d});
    Tensor k = std::move(linear(x, w.k_proj, w.k_bias)).reshaped({t_count, nkv, d});
    const Tensor v = linear(x, w.v_proj, w.v_bias);
    q = be.rmsnorm(q, scale_of(w.q_norm), c.rms_norm_eps);
    k = be.rmsnorm(k, scale_of(w.k_norm), c.rms_norm_eps);
    q = rope_partial(q, pos);
    k = rope_partial(k, pos);
    const Tensor a = be.mul(attend_each(q, k, v, segs, c.attention_window(w.index)), be.sigmoid(gate));
    return linear(a, w.o_proj, w.o_bias);
}

Tensor LayerGraph::gated_deltanet(const LayerWeights& w, const TensorView& x, std::span<const Segment> segs) {
    const auto& la = c.linear;
    const std::int64_t t_count = x.shape[0], nk = la.key_heads, nv = la.value_heads, dk = la.key_head_dim,
                       dv = la.value_head_dim, vd = la.value_dim();
    Tensor qkv, z, b, a;
    if (present(w.in_proj_qkv)) {
        qkv = be.matmul(x, w.in_proj_qkv);  // [T, 2·kd + vd]: q | k | v
        z = be.matmul(x, w.in_proj_z);
        b = be.matmul(x, w.in_proj_b);
        a = be.matmul(x, w.in_proj_a);
    } else {
        // qwen3_next: in_proj_qkvz / in_proj_ba interleave per key head
        // (Qwen3NextGatedDeltaNet.fix_query_key_value_ordering): for each of
        // the nk groups, [q dk | k dk | v rep·dv | z rep·dv] and [b rep | a rep].
        const std::int64_t rep = nv / nk;
        const Tensor qkvz = be.matmul(x, w.in_proj_qkvz), ba = be.matmul(x, w.in_proj_ba);
        const std::int64_t gq = 2 * dk + 2 * rep * dv, gb = 2 * rep;
        std::vector<Tensor> qs, ks, vs, zs, bs, as;
        for (std::int64_t g = 0; g < nk; ++g) {
            qs.push_back(be.copy_columns(qkvz, g * gq, dk));
            ks.push_back(be.copy_columns(qkvz, g * gq + dk, dk));
            vs.push_back(be.copy_columns(qkvz, g * gq + 2 * dk, rep * dv));
            zs.push_back(be.copy_columns(qkvz, g * gq + 2 * dk + rep * dv, rep * dv));
            bs.push_back(be.copy_columns(ba, g * gb, rep));
            as.push_back(be.copy_columns(ba, g * gb + rep, rep));
        }
        const auto cat = [&](const std::vector<Tensor>& parts) {  // concatenate along columns
            std::vector<TensorView> views;
            for (const Tensor& p : parts) views.push_back(p.view());
            return be.join_columns(views);
        };
        std::vector<Tensor> all = qs;
        all.insert(all.end(), ks.begin(), ks.end());
        all.insert(all.end(), vs.begin(), vs.end());
        qkv = cat(all);
        z = cat(zs);
        b = cat(bs);
        a = cat(as);
    }
    KVASIR_ASSERT(!segs.empty());
    Tensor out;  // [T, nv, dv]: each sequence with its own conv history and recurrent state
    if (segs.size() == 1) {
        out = deltanet_core(w, qkv, a, b, *segs.front().kv);
    } else {
        std::vector<Tensor> parts;
        for (const Segment& s : segs)
            parts.push_back(deltanet_core(w, leading_rows(qkv, s.row0, s.rows), leading_rows(a, s.row0, s.rows),
                                          leading_rows(b, s.row0, s.rows), *s.kv));
        out = stack_rows(parts);
    }
    // Gated RMSNorm per value head: rmsnorm(out, w) · silu(z) (plain weight).
    const Tensor normed = be.rmsnorm(std::move(out).reshaped({t_count * nv, dv}), w.linear_norm, c.rms_norm_eps);
    Tensor gated = be.swiglu(std::move(z).reshaped({t_count * nv, dv}), normed);
    return be.matmul(std::move(gated).reshaped({t_count, vd}), w.out_proj);
}

Tensor LayerGraph::deltanet_core(const LayerWeights& w, const Tensor& qkv, const Tensor& a, const Tensor& b,
                                 KvLayer& state) {
    const auto& la = c.linear;
    const std::int64_t t_count = qkv.dim(0), nk = la.key_heads, nv = la.value_heads, dk = la.key_head_dim,
                       dv = la.value_head_dim, kd = la.key_dim(), vd = la.value_dim();
    // Causal depthwise conv with SiLU over q|k|v, continuing from the
    // previous call's last K−1 inputs (the decode cache).
    const std::int64_t kk = la.conv_kernel, conv_dim = la.conv_dim();
    const TensorView conv_w{w.conv1d.dtype, w.conv1d.data, {conv_dim, kk}};
    const TensorView hist = state.conv_history.view();
    const Tensor conv = be.causal_conv1d_silu(qkv, conv_w, state.seen > 0 ? &hist : nullptr);
    // Keep the last K−1 inputs (data movement, where the node keeps them).
    state.conv_history = be.last_rows(state.seen > 0 ? &hist : nullptr, qkv, kk - 1);
    GatedDeltaInputs in;
    const Tensor q = std::move(be.copy_columns(conv, 0, kd)).reshaped({t_count, nk, dk});
    const Tensor k = std::move(be.copy_columns(conv, kd, kd)).reshaped({t_count, nk, dk});
    const Tensor v = std::move(be.copy_columns(conv, 2 * kd, vd)).reshaped({t_count, nv, dv});
    in.q = q;
    in.k = k;
    in.v = v;
    in.a = a;
    in.b = b;
    in.a_log = w.a_log;
    in.dt_bias = w.dt_bias;
    const TensorView prev = state.recurrent.view();
    in.state = state.seen > 0 ? &prev : nullptr;
    GatedDeltaResult r = be.gated_delta_rule(in);
    state.recurrent = std::move(r.state);
    return std::move(r.out).reshaped({t_count, nv, dv});
}

TensorView LayerGraph::scale_of(const TensorView& w) {
    if (!c.norm_weight_offset) return w;
    // Computed once per weight and kept: the same bits every call, and the
    // decode loop does not redo it at every token.
    auto it = scales_.find(w.data);
    if (it == scales_.end()) it = scales_.emplace(w.data, norm_scale(be, w, true)).first;
    return it->second.view();
}

Tensor LayerGraph::hybrid_layer(std::int64_t l, const TensorView& h, LayerIO& io) {
    const LayerWeights& w = model.layer(l);
    const Tensor x = be.rmsnorm(h, scale_of(w.input_norm), c.rms_norm_eps);
    const Tensor a = w.linear_attention ? gated_deltanet(w, x, io.segments) : gated_attention(w, x, io.positions, io.segments);
    if (io.mixer_output != nullptr) *io.mixer_output = a;
    const Tensor h1 = be.add(h, a);
    const Tensor x2 = be.rmsnorm(h1, scale_of(w.post_attention_norm), c.rms_norm_eps);
    const Tensor m = feed_forward(w, x2, io);
    return be.add(h1, m);
}

Tensor LayerGraph::standard_layer(std::int64_t l, const TensorView& h, LayerIO& io) {
    return pre_norm_layer(l, h, io, &LayerGraph::attention);
}

Tensor LayerGraph::mla_layer(std::int64_t l, const TensorView& h, LayerIO& io) {
    return pre_norm_layer(l, h, io, &LayerGraph::mla_attention);
}

Tensor LayerGraph::pre_norm_layer(std::int64_t l, const TensorView& h, LayerIO& io, Mixer mixer) {
    const LayerWeights& w = model.layer(l);
    const Tensor x = be.rmsnorm(h, w.input_norm, c.rms_norm_eps);
    const Tensor a = (this->*mixer)(w, x, io.positions, io.segments);
    const Tensor h1 = be.add(h, a);
    const Tensor x2 = be.rmsnorm(h1, w.post_attention_norm, c.rms_norm_eps);
    const Tensor m = feed_forward(w, x2, io);
    return be.add(h1, m);
}

}  // namespace kvasir::arch
