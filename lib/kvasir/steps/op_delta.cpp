#include "kvasir/steps/op_delta.hpp"

#include "kvasir/arch/graph.hpp"
#include "kvasir/backend/linear_attention.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/metrics/error_bound.hpp"
#include "kvasir/backend/capabilities_json.hpp"
#include "kvasir/core/tool_info.hpp"
#include "kvasir/model/rope_frequencies.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>

namespace kvasir {

OpsConfig OpsConfig::resolved() const {
    if (model == nullptr) return *this;
    const ModelConfig& m = model->config();
    KVASIR_CHECK(layer >= 0 && layer < m.num_layers, ErrorCode::bad_input, "--layer {} is outside 0..{} of {}", layer,
                 m.num_layers - 1, model->path());
    OpsConfig c = *this;
    c.hidden = m.hidden_size;
    c.heads = m.num_heads;
    // Partial rotary (qwen3_5_moe, qwen3_next): rope turns the first
    // head_dim·partial_rotary_factor dimensions of a head, the rest pass
    // through untouched — the rope op is tested on the part it turns.
    // MLA (deepseek_v3): the qk_rope_head_dim rope part of a head.
    c.head_dim = m.rotary_dims();
    c.rope_theta = m.rope_theta;
    c.rms_eps = m.rms_norm_eps;
    c.vocab = m.vocab_size;
    if (m.is_moe(layer)) {
        c.intermediate = m.moe_intermediate_size;
        c.experts = m.num_experts();
        c.top_k = m.top_k();
        c.shards = std::min<int>(c.shards, static_cast<int>(c.experts));
    } else {
        c.intermediate = m.intermediate_size;
        std::vector<std::string> moe_ops{"router_softmax", "router_sigmoid", "moe"};
        for (const std::string& op : c.ops)
            KVASIR_CHECK(std::find(moe_ops.begin(), moe_ops.end(), op) == moe_ops.end(), ErrorCode::bad_input,
                         "op '{}' needs a MoE layer, but layer {} of {} is dense (layers: {})", op, layer, model->path(),
                         m.layer_kinds());
    }
    return c;
}

void OpsConfig::validate() const {
    const auto positive = [](const char* name, std::int64_t v, std::int64_t max) {
        KVASIR_CHECK(v >= 1 && v <= max, ErrorCode::bad_input, "--{} must be in 1..{}, got {}", name, max, v);
    };
    positive("tokens", tokens, 1 << 16);
    positive("hidden", hidden, 1 << 16);
    positive("intermediate", intermediate, 1 << 17);
    positive("experts", experts, 1 << 12);
    positive("top-k", top_k, experts);
    positive("vocab", vocab, 1 << 20);
    positive("heads", heads, 1 << 10);
    positive("head-dim", head_dim, 1 << 12);
    positive("shards", shards, experts);
    KVASIR_CHECK(head_dim % 2 == 0, ErrorCode::bad_input, "--head-dim must be even, got {}", head_dim);
    KVASIR_CHECK(position_offset >= 0 && position_offset <= (std::int64_t{1} << 30), ErrorCode::bad_input,
                 "--position-offset must be in 0..2^30, got {}", position_offset);
    KVASIR_CHECK(std::isfinite(rope_theta) && rope_theta > 1.0, ErrorCode::bad_input, "--rope-theta must be > 1, got {}",
                 rope_theta);
    KVASIR_CHECK(std::isfinite(rms_eps) && rms_eps > 0, ErrorCode::bad_input, "--rms-eps must be > 0, got {}", rms_eps);
    for (const std::string& op : ops)
        KVASIR_CHECK(std::find(all_op_names().begin(), all_op_names().end(), op) != all_op_names().end(),
                     ErrorCode::bad_input, "unknown op '{}' (known: {})", op, fmt::join(all_op_names(), ", "));
    // The moe op's seeded experts are 3 f32 matrices each: refuse what would not fit comfortably. A model's
    // experts are views of its file (the op touches only the pages of the experts its tokens are routed to).
    if (model != nullptr) return;
    const double moe_bytes = 3.0 * 4.0 * static_cast<double>(experts) * static_cast<double>(hidden) *
                             static_cast<double>(intermediate);
    KVASIR_CHECK(moe_bytes <= 8e9, ErrorCode::bad_input, "--experts × --hidden × --intermediate needs {:.1f} GB of weights (limit 8 GB)",
                 moe_bytes / 1e9);
}

namespace {

// Seeded inputs of one op; tensor names are "ops/<op>/<tensor>" so any node,
// on any machine, regenerates them from the seed alone.
Tensor input(const OpsConfig& c, const std::string& op, const std::string& name, Shape shape, double mean, double sd) {
    return seeded_normal(c.seed, "ops/" + op + "/" + name, std::move(shape), mean, sd);
}

struct NodeOutput {
    Tensor value;  // the numeric output compared across nodes
    Tensor ids;    // router ops: chosen ids
};

struct MoeInputs;

// One op of step 1, planned once and run on every node: what its inputs are
// (one line for the report), how a node runs it, and what its a-priori bound
// needs of the exact inputs (matmul, softmax, rmsnorm, causal_conv1d, …: in
// f64, kept on the reference's outputs under ops.<op>.<name>, e.g.
// ops.matmul.abs_dot; audit/step_ops.cpp). The closures hold the inputs.
struct OpPlan {
    std::string inputs;
    std::function<NodeOutput(Backend&)> run;
    std::function<std::map<std::string, Tensor>()> bound_data;
    std::shared_ptr<const MoeInputs> moe;  // the moe op's inputs, for the shard check
};

// The bound scales of y = x·wᵀ under their capture names (metrics/error_bound.hpp).
std::map<std::string, Tensor> bound_scales(const TensorView& x, const TensorView& w) {
    AbsProducts a = abs_products(x, w);
    return {{"abs_dot", std::move(a.dot)}, {"abs_x", std::move(a.x)}, {"abs_w", std::move(a.w)}};
}

// Softmax's bound (metrics/error_bound.hpp softmax_row_bounds): each row's
// maximum and log Σ exp(x − max), in f64.
std::map<std::string, Tensor> softmax_bound_data(const TensorView& x) {
    const std::int64_t cols = x.dim(-1), rows = x.numel() / cols;
    Tensor mx(DType::f64, {rows}), ls(DType::f64, {rows});
    for (std::int64_t r = 0; r < rows; ++r) {
        double m = -INFINITY, z = 0;
        for (std::int64_t c = 0; c < cols; ++c) m = std::max(m, x.at(r * cols + c));
        for (std::int64_t c = 0; c < cols; ++c) z += std::exp(x.at(r * cols + c) - m);
        mx.as<double>()[r] = m;
        ls.as<double>()[r] = std::log(z);
    }
    return {{"row_max", std::move(mx)}, {"log_sum", std::move(ls)}};
}

// RMSNorm's bound (metrics/error_bound.hpp rmsnorm_relative_bound): each
// row's Σx²/K + eps, each column's |w| / |1 + w| where the scale is formed
// as 1 + w (0 otherwise) and the scale's magnitude, in f64.
std::map<std::string, Tensor> rmsnorm_bound_data(const TensorView& x, const TensorView& w, double eps, bool offset) {
    const std::int64_t cols = x.dim(-1), rows = x.numel() / cols;
    Tensor ms(DType::f64, {rows}), cond(DType::f64, {cols}), scale(DType::f64, {cols});
    for (std::int64_t r = 0; r < rows; ++r) {
        double s = 0;
        for (std::int64_t c = 0; c < cols; ++c) s += x.at(r * cols + c) * x.at(r * cols + c);
        ms.as<double>()[r] = s / static_cast<double>(cols) + eps;
    }
    for (std::int64_t c = 0; c < cols; ++c) {
        cond.as<double>()[c] = offset ? std::fabs(w.at(c)) / std::fabs(1.0 + w.at(c)) : 0.0;
        scale.as<double>()[c] = std::fabs(offset ? 1.0 + w.at(c) : w.at(c));
    }
    return {{"mean_square", std::move(ms)}, {"scale_cond", std::move(cond)}, {"abs_scale", std::move(scale)}};
}

// The causal conv's bound (audit/step_ops.cpp conv_bounds): per output
// (t, c), over its K taps of the padded input (history rows, then x), in
// f64: the exact pre-activation Σ w·x ("pre"), Σ|w·x| ("abs_dot"), Σ(|w| +
// |x|) ("abs_in": what a subnormal rounding of an input adds) and K.
std::map<std::string, Tensor> conv_bound_data(const TensorView& x, const TensorView& w, const TensorView& history) {
    const std::int64_t T = x.shape[0], C = x.shape[1], K = w.shape.back(), pad = K - 1;
    Tensor pre(DType::f64, {T, C}), dot(DType::f64, {T, C}), ain(DType::f64, {T, C}), kernel(DType::f64, {1});
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t ch = 0; ch < C; ++ch) {
            double z = 0, a = 0, b = 0;
            for (std::int64_t j = 0; j < K; ++j) {
                const std::int64_t tp = t + j - pad;
                const double xv = tp >= 0 ? x.at(tp * C + ch) : history.at((pad + tp) * C + ch), wv = w.at(ch * K + j);
                z += wv * xv;
                a += std::fabs(wv * xv);
                b += std::fabs(wv) + std::fabs(xv);
            }
            pre.as<double>()[t * C + ch] = z;
            dot.as<double>()[t * C + ch] = a;
            ain.as<double>()[t * C + ch] = b;
        }
    kernel.as<double>()[0] = static_cast<double>(K);
    return {{"pre", std::move(pre)}, {"abs_dot", std::move(dot)}, {"abs_in", std::move(ain)}, {"kernel", std::move(kernel)}};
}

// Attention's bound (audit/step_ops.cpp attention_bounds), in f64 from the
// exact q [T, nh, D], caches k, v (one [S, D] per kv head), the scale, the
// window and the sinks, per row (t, h) over the S keys and one more column
// for the sink (masked keys and an absent sink: 0):
//   probs [T, nh, S+1]     the exact softmax of the scaled scores (sink included)
//   abs_dot [T, nh, S+1]   scale·Σ_d |q_d·k_jd|
//   row_max, log_sum [T, nh]  max of the row's logits and log Σ exp(x − max)
//   abs_in [T, nh]         scale·max_j(Σ|q| + Σ|k_j|) (what subnormal roundings add)
//   abs_v [nkv, S, D]      |v|
//   dims [3]               D, S, scale
// Row t sits at cache position S − T + t and sees keys up to it, the last
// `window` of them where a window is set (arch::windowed_attention's rule).
std::map<std::string, Tensor> attention_bound_data(const TensorView& q, std::span<const Tensor> k, std::span<const Tensor> v, double scale,
                                                   std::int64_t window, const TensorView* sinks) {
    const std::int64_t T = q.dim(0), nh = q.dim(1), D = q.dim(2), nkv = static_cast<std::int64_t>(k.size()), S = k[0].dim(0);
    const std::int64_t rep = nh / nkv, first = S - T, C = S + 1;
    Tensor probs(DType::f64, {T, nh, C}), dot(DType::f64, {T, nh, C}), mx(DType::f64, {T, nh}), ls(DType::f64, {T, nh}),
        ain(DType::f64, {T, nh}), av(DType::f64, {nkv, S, D}), dims(DType::f64, {3});
    std::fill(probs.as<double>(), probs.as<double>() + T * nh * C, 0.0);
    std::fill(dot.as<double>(), dot.as<double>() + T * nh * C, 0.0);
    for (std::int64_t g = 0; g < nkv; ++g)
        for (std::int64_t i = 0; i < S * D; ++i) av.as<double>()[g * S * D + i] = std::fabs(v[static_cast<std::size_t>(g)].view().at(i));
    std::vector<double> logit(static_cast<std::size_t>(C));
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t h = 0; h < nh; ++h) {
            const TensorView kg = k[static_cast<std::size_t>(h / rep)].view();
            const std::int64_t row = t * nh + h, p = first + t;
            const std::int64_t lo = window > 0 && S > window ? std::max<std::int64_t>(0, p - window + 1) : 0;
            double qabs = 0, m = -INFINITY, inmax = 0;
            for (std::int64_t d = 0; d < D; ++d) qabs += std::fabs(q.at(row * D + d));
            for (std::int64_t j = lo; j <= p; ++j) {
                double s = 0, a = 0, kabs = 0;
                for (std::int64_t d = 0; d < D; ++d) {
                    const double qd = q.at(row * D + d), kd = kg.at(j * D + d);
                    s += qd * kd;
                    a += std::fabs(qd * kd);
                    kabs += std::fabs(kd);
                }
                logit[static_cast<std::size_t>(j)] = s * scale;
                dot.as<double>()[row * C + j] = a * scale;
                inmax = std::max(inmax, (qabs + kabs) * scale);
                m = std::max(m, s * scale);
            }
            const bool sink = sinks != nullptr;
            if (sink) m = std::max(m, logit[static_cast<std::size_t>(S)] = sinks->at(h));
            double z = 0;
            for (std::int64_t j = lo; j <= p; ++j) z += std::exp(logit[static_cast<std::size_t>(j)] - m);
            if (sink) z += std::exp(logit[static_cast<std::size_t>(S)] - m);
            for (std::int64_t j = lo; j <= p; ++j) probs.as<double>()[row * C + j] = std::exp(logit[static_cast<std::size_t>(j)] - m) / z;
            if (sink) probs.as<double>()[row * C + S] = std::exp(logit[static_cast<std::size_t>(S)] - m) / z;
            mx.as<double>()[row] = m;
            ls.as<double>()[row] = std::log(z);
            ain.as<double>()[row] = inmax;
        }
    dims.as<double>()[0] = static_cast<double>(D);
    dims.as<double>()[1] = static_cast<double>(S);
    dims.as<double>()[2] = scale;
    return {{"probs", std::move(probs)}, {"abs_dot", std::move(dot)}, {"row_max", std::move(mx)}, {"log_sum", std::move(ls)},
            {"abs_in", std::move(ain)},  {"abs_v", std::move(av)},    {"dims", std::move(dims)}};
}

// The gated delta rule's bound (audit/step_ops.cpp gated_delta_bounds), from
// the f64 oracle's own run with its trace (backend/linear_attention.hpp):
//   cols [T, nv, dv, 6]   per state column: ‖S‖ before the decay, Σ|S·k|
//                         after it, v, m, ‖S‖ after the update, Σ|S·q|
//   heads [T, nv, 4]      Σq², Σk² of the raw q and k, a, b
//   params [nv, 2]        A_log, dt_bias
//   dims [1]              dk
std::map<std::string, Tensor> gated_delta_bound_data(const GatedDeltaInputs& in) {
    GatedDeltaTrace tr;
    (void)gated_delta_rule_ref<double>(in, false, &tr);
    const std::int64_t T = in.q.dim(0), dk = in.q.dim(2), nv = in.v.dim(1), dv = in.v.dim(2);
    Tensor cols(DType::f64, {T, nv, dv, 6}), heads(DType::f64, {T, nv, 4}), params(DType::f64, {nv, 2}), dims(DType::f64, {1});
    std::copy(tr.cols.begin(), tr.cols.end(), cols.as<double>());
    for (std::int64_t i = 0; i < T * nv; ++i) {
        double* hd = heads.as<double>() + i * 4;
        hd[0] = tr.heads[static_cast<std::size_t>(i * 2)];
        hd[1] = tr.heads[static_cast<std::size_t>(i * 2 + 1)];
        hd[2] = in.a.at(i);
        hd[3] = in.b.at(i);
    }
    for (std::int64_t h = 0; h < nv; ++h) {
        params.as<double>()[h * 2] = in.a_log.at(h);
        params.as<double>()[h * 2 + 1] = in.dt_bias.at(h);
    }
    dims.as<double>()[0] = static_cast<double>(dk);
    return {{"cols", std::move(cols)}, {"heads", std::move(heads)}, {"params", std::move(params)}, {"dims", std::move(dims)}};
}

struct MoeInputs {
    Tensor x;
    std::vector<Tensor> storage;  // owns the expert matrices
    std::vector<ExpertWeights> experts;
    TensorView bias;
    RoutingPlan plan;
};

// The MoE block's bound (audit/step_ops.cpp moe_bounds: the derivation),
// in f64 from the exact inputs, experts, routing and combine weights. Per
// token t and routed slot j (expert e_j, combine weight c_j), with
// g = G·x, u = U·x, Sg = Σ_k |G_ik·x_k|, Su likewise, s = silu(g),
// h = s·u, d = D·h: a node's error of h is a sum of six element-wise terms
// that do not depend on its formats, each times a coefficient that does,
//   V0 = 1.1·Sg·|u| + |s|·Su, V1 = 1.1·|g|·|u| + |s|·|u|, V2 = |h|,
//   V3 = Sg·Su, V4 = Sg + Su, V5 = 1,
// so every node's bound follows from them carried through the down
// projection's magnitudes and the combine:
//   abs_terms [6, T, H]   Σ_j |c_j|·(|D_j|·V_b)
//   abs_sums [T, 6]       Σ_j |c_j|·Σ_i V_b,i
//   abs_combine [T, H]    Σ_j |c_j|·|d_j|
//   abs_weights [T]       Σ_j |c_j|
//   dims [4]              H, I, k, and the largest Σ_k|x_k| + Σ_k|G_ik| (or
//                         U's): what a subnormal rounding of an input adds;
// and for the probabilistic bound (the sums of squares of the coefficients
// with which each accumulation rounding reaches y):
//   sq_terms [2, T, H]    Σ_j c_j²·Σ_i D_mi²·((1.1·|u_i|·Sg_i)² + (s_i·Su_i)²),
//                         Σ_j c_j²·(Σ_i |D_mi·h_i|)²
// Experts with biases or gpt-oss's clamped activation have no such bound
// here, nor a combine weight below 1e-30 (where casting it may underflow):
// nothing is returned, and the op is judged by its statistics alone.
namespace {

constexpr int kMoeTerms = 6;  // the six per-output bound terms of moe_bound_data

// The experts and combine weights the bound's terms model: SwiGLU experts of
// one width, without biases or the clamp, and combine weights that are finite
// and not denormal-small.
bool moe_bound_applies(const MoeInputs& in, std::int64_t width) {
    for (const ExpertWeights& e : in.experts)
        if (present(e.gate_bias) || present(e.up_bias) || present(e.down_bias) || e.activation.clamped || e.gate.dim(0) != width)
            return false;
    for (std::int64_t i = 0; i < in.plan.weights.numel(); ++i)
        if (const double c = std::fabs(in.plan.weights.at(i)); !std::isfinite(c) || (c > 0 && c < 1e-30)) return false;
    return true;
}

// One expert's weights in f64 (gate, up [I, H], down [H, I]) and the largest
// row sum of |gate| or |up|.
struct ExpertF64 {
    std::vector<double> G, U, D;
    double row_max = 0;
    ExpertF64(const ExpertWeights& ew, std::int64_t I, std::int64_t H)
        : G(static_cast<std::size_t>(I * H)), U(static_cast<std::size_t>(I * H)), D(static_cast<std::size_t>(H * I)) {
        std::vector<double> rowg(static_cast<std::size_t>(I), 0.0), rowu(static_cast<std::size_t>(I), 0.0);
        for (std::int64_t i = 0; i < I * H; ++i) {
            const auto at = static_cast<std::size_t>(i);
            G[at] = ew.gate.at(i);
            U[at] = ew.up.at(i);
            D[at] = ew.down.at(i);
            rowg[static_cast<std::size_t>(i / H)] += std::fabs(G[at]);
            rowu[static_cast<std::size_t>(i / H)] += std::fabs(U[at]);
        }
        row_max = std::max(*std::max_element(rowg.begin(), rowg.end()), *std::max_element(rowu.begin(), rowu.end()));
    }
};

// One routed row xt [H] through expert `e`: into out [(B + 2)·H] the six
// terms per output m (Σ_i |D_mi|·V_b,i), |d_m| and Σ_i D_mi²·W_i; into
// psum [B] the six Σ_i V_b,i.
void moe_row_terms(const ExpertF64& e, const double* xt, std::int64_t I, std::int64_t H, double* out, double* psum) {
    constexpr int B = kMoeTerms;
    const auto sz = [](std::int64_t n) { return static_cast<std::size_t>(n); };
    std::vector<double> V(sz(B * I)), hv(sz(I)), W(sz(I));
    for (std::int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0, sg = 0, su = 0;
        const double* gr = e.G.data() + i * H;
        const double* ur = e.U.data() + i * H;
        for (std::int64_t c = 0; c < H; ++c) {
            g += gr[c] * xt[c];
            u += ur[c] * xt[c];
            sg += std::fabs(gr[c] * xt[c]);
            su += std::fabs(ur[c] * xt[c]);
        }
        const double s = g / (1.0 + std::exp(-g)), h = s * u;
        hv[sz(i)] = h;
        W[sz(i)] = (1.1 * std::fabs(u) * sg) * (1.1 * std::fabs(u) * sg) + (s * su) * (s * su);
        V[sz(0 * I + i)] = 1.1 * sg * std::fabs(u) + std::fabs(s) * su;
        V[sz(1 * I + i)] = (1.1 * std::fabs(g) + std::fabs(s)) * std::fabs(u);
        V[sz(2 * I + i)] = std::fabs(h);
        V[sz(3 * I + i)] = sg * su;
        V[sz(4 * I + i)] = sg + su;
        V[sz(5 * I + i)] = 1.0;
    }
    for (std::int64_t m = 0; m < H; ++m) {
        const double* dr = e.D.data() + m * I;
        double acc[B] = {0, 0, 0, 0, 0, 0}, d = 0, q = 0;
        for (std::int64_t i = 0; i < I; ++i) {
            const double a = std::fabs(dr[i]);
            for (int b = 0; b < B; ++b) acc[b] += a * V[sz(b * I + i)];
            d += dr[i] * hv[sz(i)];
            q += a * a * W[sz(i)];
        }
        for (int b = 0; b < B; ++b) out[b * H + m] = acc[b];
        out[B * H + m] = std::fabs(d);
        out[(B + 1) * H + m] = q;
    }
    for (int b = 0; b < B; ++b) {
        double t = 0;
        for (std::int64_t i = 0; i < I; ++i) t += V[sz(b * I + i)];
        psum[b] = t;
    }
}

}  // namespace

std::map<std::string, Tensor> moe_bound_data(const MoeInputs& in) {
    const std::int64_t T = in.x.dim(0), H = in.x.dim(1), k = in.plan.ids.dim(1);
    if (in.experts.empty()) return {};
    const std::int64_t I = in.experts[0].gate.dim(0);
    if (!moe_bound_applies(in, I)) return {};
    constexpr int B = kMoeTerms;
    // Tensors start zero-filled.
    Tensor terms(DType::f64, {B, T, H}), sums(DType::f64, {T, B}), comb(DType::f64, {T, H}), wsum(DType::f64, {T}), dims(DType::f64, {4}),
        sq(DType::f64, {2, T, H});
    double* SQ = sq.as<double>();
    double* P = terms.as<double>();
    double* Q = sums.as<double>();
    double* C = comb.as<double>();
    std::vector<double> x(static_cast<std::size_t>(T * H)), xabs_sum(static_cast<std::size_t>(T), 0.0);
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t h = 0; h < H; ++h) {
            x[static_cast<std::size_t>(t * H + h)] = in.x.at(t * H + h);
            xabs_sum[static_cast<std::size_t>(t)] += std::fabs(x[static_cast<std::size_t>(t * H + h)]);
        }
    const std::int32_t* ids = in.plan.ids.as<std::int32_t>();
    double amax = 0;
    const auto sz = [](std::int64_t n) { return static_cast<std::size_t>(n); };
    for (std::size_t e = 0; e < in.experts.size(); ++e) {
        std::vector<std::pair<std::int64_t, double>> routed;  // (token, combine weight)
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t j = 0; j < k; ++j)
                if (ids[t * k + j] == static_cast<std::int32_t>(e)) routed.emplace_back(t, in.plan.weights.at(t * k + j));
        if (routed.empty()) continue;
        const ExpertF64 ew(in.experts[e], I, H);
        // Each routed row's contribution: B + 2 rows of H (the six terms, |d|, Σ D²·W) and B sums.
        const auto R = static_cast<std::int64_t>(routed.size());
        std::vector<double> part(sz(R * (B + 2) * H)), psum(sz(R * B));
#pragma omp parallel for schedule(dynamic, 1)
        for (std::int64_t r = 0; r < R; ++r)
            moe_row_terms(ew, x.data() + routed[sz(r)].first * H, I, H, part.data() + r * (B + 2) * H, psum.data() + r * B);
        for (std::int64_t r = 0; r < R; ++r) {
            const auto [t, cw] = routed[sz(r)];
            const double c = std::fabs(cw);
            const double* src = part.data() + r * (B + 2) * H;
            for (int b = 0; b < B; ++b)
                for (std::int64_t m = 0; m < H; ++m) P[(b * T + t) * H + m] += c * src[b * H + m];
            for (std::int64_t m = 0; m < H; ++m) {
                C[t * H + m] += c * src[B * H + m];
                SQ[t * H + m] += c * c * src[(B + 1) * H + m];
                SQ[(T + t) * H + m] += c * c * src[2 * H + m] * src[2 * H + m];  // (Σ_i |D_mi h_i|)², V2 = |h|
            }
            for (int b = 0; b < B; ++b) Q[t * B + b] += c * psum[sz(r * B + b)];
            wsum.as<double>()[t] += c;
            amax = std::max(amax, xabs_sum[sz(t)] + ew.row_max);
        }
    }
    double* dm = dims.as<double>();
    dm[0] = static_cast<double>(H);
    dm[1] = static_cast<double>(I);
    dm[2] = static_cast<double>(k);
    dm[3] = amax;
    return {{"abs_terms", std::move(terms)},
            {"abs_sums", std::move(sums)},
            {"abs_combine", std::move(comb)},
            {"abs_weights", std::move(wsum)},
            {"dims", std::move(dims)},
            {"sq_terms", std::move(sq)}};
}

RouterParams model_router_params(const ModelConfig& m, const TensorView* bias) {
    RouterParams rp;
    rp.top_k = static_cast<int>(m.top_k());
    rp.scoring = m.router.scoring;
    rp.renormalize = m.router.norm_topk_prob;
    rp.scaling = m.router.routed_scaling_factor;
    rp.n_group = static_cast<int>(m.router.n_group);
    rp.topk_group = static_cast<int>(m.router.topk_group);
    rp.bias = bias;
    return rp;
}

// The MoE input with real statistics: a seeded hidden state through the
// layer's own post-attention RMSNorm, on the reference, stored as f32 so
// every node reads identical values.
Tensor model_moe_input(const OpsConfig& c, const LayerWeights& lw, Backend& reference, const std::string& op) {
    const Tensor h = input(c, op, "hidden", {c.tokens, c.hidden}, 0.0, 1.0);
    const Tensor w = arch::norm_scale(reference, lw.post_attention_norm, c.model->config().norm_weight_offset);
    return Tensor::convert(reference.rmsnorm(h, w, c.rms_eps), DType::f32);
}

MoeInputs make_moe_inputs(const OpsConfig& c, Backend& reference) {
    MoeInputs m;
    if (c.model != nullptr) {
        const LayerWeights& lw = c.model->layer(c.layer);
        m.x = model_moe_input(c, lw, reference, "moe");
        m.experts = lw.experts;
        m.bias = lw.router_bias;
        const RouterParams rp = model_router_params(c.model->config(), present(m.bias) ? &m.bias : nullptr);
        const RouterOutput r = reference.route(reference.matmul(m.x, lw.router), rp);
        m.plan.ids = r.ids;
        m.plan.weights = r.weights;
        return m;
    }
    const double sh = 1.0 / std::sqrt(static_cast<double>(c.hidden));
    const double si = 1.0 / std::sqrt(static_cast<double>(c.intermediate));
    m.x = input(c, "moe", "x", {c.tokens, c.hidden}, 0.0, 1.0);
    const Tensor router_w = input(c, "moe", "router", {c.experts, c.hidden}, 0.0, sh);
    m.storage.reserve(static_cast<std::size_t>(3 * c.experts));
    for (std::int64_t e = 0; e < c.experts; ++e) {
        m.storage.push_back(input(c, "moe", fmt::format("expert{}.gate", e), {c.intermediate, c.hidden}, 0.0, sh));
        m.storage.push_back(input(c, "moe", fmt::format("expert{}.up", e), {c.intermediate, c.hidden}, 0.0, sh));
        m.storage.push_back(input(c, "moe", fmt::format("expert{}.down", e), {c.hidden, c.intermediate}, 0.0, si));
    }
    for (std::int64_t e = 0; e < c.experts; ++e) {
        const auto i = static_cast<std::size_t>(3 * e);
        m.experts.push_back({m.storage[i].view(), m.storage[i + 1].view(), m.storage[i + 2].view()});
    }
    // Router authority: the reference decides which experts run and with what weight.
    RouterParams rp;
    rp.top_k = static_cast<int>(c.top_k);
    const RouterOutput r = reference.route(reference.matmul(m.x, router_w), rp);
    m.plan.ids = r.ids;
    m.plan.weights = r.weights;
    return m;
}

// Plans the ops of step 1, one member per op (or per family of ops sharing
// their inputs' construction). Reads the resolved config, the model layer
// (null: seeded inputs only) and the reference node (a model layer's
// real-statistics inputs and the moe op's pinned routing come from it).
struct OpPlanner {
    const OpsConfig& c;
    const LayerWeights* lw;
    Backend& ref;
    std::string where;  // "<model> layer <l>", for the inputs' line
    std::int64_t T, H, I, E;
    double sh;  // 1/√H
    std::vector<std::int64_t> positions;

    OpPlan matmul(const std::string& op) const;
    OpPlan swiglu(const std::string& op) const;
    OpPlan softmax(const std::string& op) const;
    OpPlan rmsnorm(const std::string& op) const;
    OpPlan rope(const std::string& op) const;  // rope_neox, rope_normal
    OpPlan rope_yarn(const std::string& op) const;
    OpPlan router(const std::string& op) const;  // router_softmax, router_sigmoid
    OpPlan linear_attention(const std::string& op) const;  // causal_conv1d, gated_delta
    OpPlan attention(const std::string& op) const;  // attention, attention_sinks
    OpPlan clamped_swiglu(const std::string& op) const;
    OpPlan moe(const std::string& op) const;
};

OpPlan OpPlanner::matmul(const std::string& op) const {
    OpPlan plan;
    if (lw != nullptr) {
        const TensorView w = lw->moe ? lw->experts[0].gate : lw->mlp_gate;
        auto in = std::make_shared<std::pair<Tensor, Tensor>>(model_moe_input(c, *lw, ref, op), Tensor());
        plan.inputs = fmt::format("x[{},{}] real-statistics · {}ᵀ {} of {}", T, H, lw->moe ? "expert 0 gate" : "mlp gate",
                                  shape_str(w.shape), where);
        plan.run = [in, w](Backend& b) { return NodeOutput{b.matmul(in->first, w), {}}; };
        plan.bound_data = [in, w] { return bound_scales(in->first.view(), w); };
        return plan;
    }
    auto in = std::make_shared<std::pair<Tensor, Tensor>>(input(c, op, "x", {T, H}, 0, 1),
                                                          input(c, op, "w", {I, H}, 0, sh));
    plan.inputs = fmt::format("x[{},{}]~N(0,1) · w[{},{}]ᵀ~N(0,1/√{})", T, H, I, H, H);
    plan.run = [in](Backend& b) { return NodeOutput{b.matmul(in->first, in->second), {}}; };
    plan.bound_data = [in] { return bound_scales(in->first.view(), in->second.view()); };
    return plan;
}

OpPlan OpPlanner::swiglu(const std::string& op) const {
    OpPlan plan;
    auto in = std::make_shared<std::pair<Tensor, Tensor>>(input(c, op, "gate", {T, I}, 0, 2),
                                                          input(c, op, "up", {T, I}, 0, 1));
    plan.inputs = fmt::format("silu(gate[{},{}]~N(0,2)) · up~N(0,1)", T, I);
    plan.run = [in](Backend& b) { return NodeOutput{b.swiglu(in->first, in->second), {}}; };
    return plan;
}

OpPlan OpPlanner::softmax(const std::string& op) const {
    OpPlan plan;
    auto in = std::make_shared<Tensor>(input(c, op, "x", {T, c.vocab}, 0, 3));
    plan.inputs = fmt::format("x[{},{}]~N(0,3), row-wise", T, c.vocab);
    plan.run = [in](Backend& b) { return NodeOutput{b.softmax(*in), {}}; };
    plan.bound_data = [in] { return softmax_bound_data(in->view()); };
    return plan;
}

OpPlan OpPlanner::rmsnorm(const std::string& op) const {
    OpPlan plan;
    if (lw != nullptr) {
        auto in = std::make_shared<Tensor>(input(c, op, "x", {T, H}, 0, 1));
        const double eps = c.rms_eps;
        const TensorView w = lw->post_attention_norm;
        const bool offset = c.model->config().norm_weight_offset;
        plan.inputs = fmt::format("x[{},{}]~N(0,1), post-attention norm of {}{}, eps {}", T, H, where,
                                  offset ? " (scale 1 + w)" : "", eps);
        plan.run = [in, w, eps, offset](Backend& b) {
            return NodeOutput{b.rmsnorm(*in, arch::norm_scale(b, w, offset), eps), {}};
        };
        plan.bound_data = [in, w, eps, offset] { return rmsnorm_bound_data(in->view(), w, eps, offset); };
        return plan;
    }
    auto in = std::make_shared<std::pair<Tensor, Tensor>>(input(c, op, "x", {T, H}, 0, 1),
                                                          input(c, op, "weight", {H}, 1, 0.1));
    const double eps = c.rms_eps;
    plan.inputs = fmt::format("x[{},{}]~N(0,1), weight~N(1,0.1), eps {}", T, H, eps);
    plan.run = [in, eps](Backend& b) { return NodeOutput{b.rmsnorm(in->first, in->second, eps), {}}; };
    plan.bound_data = [in, eps] { return rmsnorm_bound_data(in->first.view(), in->second.view(), eps, false); };
    return plan;
}

OpPlan OpPlanner::rope(const std::string& op) const {
    OpPlan plan;
    auto in = std::make_shared<Tensor>(input(c, op, "x", {T, c.heads, c.head_dim}, 0, 1));
    RopeParams rp{c.rope_theta, op == "rope_neox" ? RopeLayout::neox : RopeLayout::normal, nullptr};
    plan.inputs = fmt::format("x[{},{},{}]~N(0,1), positions {}..{}, theta {}", T, c.heads, c.head_dim,
                              c.position_offset, c.position_offset + T - 1, c.rope_theta);
    plan.run = [in, rp, positions = positions](Backend& b) { return NodeOutput{b.rope(*in, positions, rp), {}}; };
    return plan;
}

OpPlan OpPlanner::rope_yarn(const std::string& op) const {
    OpPlan plan;
    // A frequency table computed once in f64 (model/rope_frequencies.hpp) that every node's rope
    // consumes in its own precision: the model's own yarn when it has one, else DeepSeek-V3's
    // (factor 40, original context 4096, beta 32/1, theta 1e4) on this head width.
    ModelConfig y;
    const bool own = c.model != nullptr && c.model->config().rope_type == "yarn";
    if (own) {
        y = c.model->config();
    } else {
        y.source = "rope_yarn";
        y.head_dim = c.head_dim;
        y.rope_theta = 10000.0;
        y.rope_type = "yarn";
        y.rope_scaling.factor = 40.0;
        y.rope_scaling.original_max_position_embeddings = 4096.0;
    }
    auto in = std::make_shared<Tensor>(input(c, op, "x", {T, c.heads, c.head_dim}, 0, 1));
    RopeParams rp{y.rope_theta, RopeLayout::neox,
                  std::make_shared<const std::vector<double>>(rope_inverse_frequencies(y))};
    plan.inputs = fmt::format("x[{},{},{}]~N(0,1), positions {}..{}, yarn {} (theta {:g}, factor {:g}, original "
                              "context {:g}, beta {:g}/{:g})",
                              T, c.heads, c.head_dim, c.position_offset, c.position_offset + T - 1,
                              own ? "of the model" : "of DeepSeek-V3", y.rope_theta, y.rope_scaling.factor,
                              y.rope_scaling.original_max_position_embeddings, y.rope_scaling.beta_fast,
                              y.rope_scaling.beta_slow);
    plan.run = [in, rp, positions = positions](Backend& b) { return NodeOutput{b.rope(*in, positions, rp), {}}; };
    return plan;
}

OpPlan OpPlanner::router(const std::string& op) const {
    OpPlan plan;
    if (lw != nullptr) {
        const Tensor x = model_moe_input(c, *lw, ref, op);
        auto in = std::make_shared<std::pair<Tensor, TensorView>>(
            Tensor::convert(ref.matmul(x, lw->router), DType::f32), lw->router_bias);
        const RouterParams base = model_router_params(c.model->config(), nullptr);
        plan.inputs = fmt::format("real router logits [{},{}] of {}, {} top-{}{}{}{}{}", T, E, where,
                                  op == "router_softmax" ? "softmax" : "sigmoid", c.top_k,
                                  present(lw->router_bias) ? " on score + e_score_correction_bias" : "",
                                  base.n_group > 1 ? fmt::format(" within the best {} of {} groups", base.topk_group,
                                                                 base.n_group)
                                                   : std::string(),
                                  base.renormalize ? ", renormalised" : "",
                                  base.scaling != 1.0 ? fmt::format(" × {:g}", base.scaling) : std::string());
        plan.run = [in, base](Backend& b) {
            RouterParams rp = base;
            if (present(in->second)) rp.bias = &in->second;
            RouterOutput r = b.route(in->first, rp);
            return NodeOutput{std::move(r.scores), std::move(r.ids)};
        };
        return plan;
    }
    if (op == "router_softmax") {
        auto in = std::make_shared<Tensor>(input(c, op, "logits", {T, E}, 0, 1));
        RouterParams rp;
        rp.top_k = static_cast<int>(c.top_k);
        plan.inputs = fmt::format("logits[{},{}]~N(0,1), softmax, top-{}, renormalised", T, E, c.top_k);
        plan.run = [in, rp](Backend& b) {
            RouterOutput r = b.route(*in, rp);
            return NodeOutput{std::move(r.scores), std::move(r.ids)};
        };
        return plan;
    }
    auto in = std::make_shared<std::pair<Tensor, Tensor>>(input(c, op, "logits", {T, E}, 0, 1),
                                                          input(c, op, "bias", {E}, 0, 0.1));
    RouterParams rp;
    rp.top_k = static_cast<int>(c.top_k);
    rp.scoring = RouterScoring::sigmoid;
    rp.scaling = 2.5;
    // Grouped selection as in DeepSeek-V3 where the shape allows it.
    if (E % 4 == 0 && E / 4 >= 2 && c.top_k <= 2 * (E / 4)) {
        rp.n_group = 4;
        rp.topk_group = 2;
    }
    plan.inputs = fmt::format("logits[{},{}]~N(0,1), sigmoid + bias~N(0,0.1), {} groups keep {}, top-{}, ×2.5",
                              T, E, rp.n_group, rp.topk_group, c.top_k);
    plan.run = [in, rp](Backend& b) mutable {
        const TensorView bias = in->second.view();
        rp.bias = &bias;
        RouterOutput r = b.route(in->first, rp);
        return NodeOutput{std::move(r.scores), std::move(r.ids)};
    };
    return plan;
}

OpPlan OpPlanner::linear_attention(const std::string& op) const {
    OpPlan plan;
    // Gated DeltaNet (qwen3_5_moe, qwen3_next; linear_attention.hpp).
    // Dimensions: the model's linear-attention heads when it has them,
    // else nk = max(1, heads/4) key heads and nv = 2·nk value heads of
    // head_dim; kernel 4. Inputs continue a decode: a seeded conv
    // history and a seeded recurrent state, so the carried state is
    // exercised too.
    const ModelConfig* mc = c.model != nullptr ? &c.model->config() : nullptr;
    const bool hybrid = mc != nullptr && !mc->linear_attention_layers.empty();
    const std::int64_t nk = hybrid ? mc->linear.key_heads : std::max<std::int64_t>(1, c.heads / 4);
    const std::int64_t nv = hybrid ? mc->linear.value_heads : 2 * nk;
    const std::int64_t dk = hybrid ? mc->linear.key_head_dim : c.head_dim;
    const std::int64_t dv = hybrid ? mc->linear.value_head_dim : c.head_dim;
    const std::int64_t K = hybrid ? mc->linear.conv_kernel : 4;
    if (op == "causal_conv1d") {
        const std::int64_t C = 2 * nk * dk + nv * dv;
        auto in = std::make_shared<std::vector<Tensor>>();
        in->push_back(input(c, op, "x", {T, C}, 0, 1));
        in->push_back(input(c, op, "weight", {C, K}, 0, 1.0 / std::sqrt(static_cast<double>(K))));
        in->push_back(input(c, op, "history", {K - 1, C}, 0, 1));
        plan.inputs = fmt::format("silu(causal depthwise conv) x[{},{}]~N(0,1), weight[{},{}]~N(0,1/√{}), history of "
                                  "{} inputs~N(0,1)",
                                  T, C, C, K, K, K - 1);
        plan.run = [in](Backend& b) {
            const TensorView h = (*in)[2];
            return NodeOutput{b.causal_conv1d_silu((*in)[0], (*in)[1], &h), {}};
        };
        plan.bound_data = [in] { return conv_bound_data((*in)[0].view(), (*in)[1].view(), (*in)[2].view()); };
    } else {
        auto in = std::make_shared<std::vector<Tensor>>();
        in->push_back(input(c, op, "q", {T, nk, dk}, 0, 1));
        in->push_back(input(c, op, "k", {T, nk, dk}, 0, 1));
        in->push_back(input(c, op, "v", {T, nv, dv}, 0, 1));
        in->push_back(input(c, op, "a", {T, nv}, 0, 1));
        in->push_back(input(c, op, "b", {T, nv}, 0, 1));
        in->push_back(input(c, op, "A_log", {nv}, 1, 0.5));
        in->push_back(input(c, op, "dt_bias", {nv}, 0, 1));
        in->push_back(input(c, op, "state", {nv, dk, dv}, 0, 0.1));
        plan.inputs = fmt::format("gated delta rule: q,k[{},{},{}] v[{},{},{}] a,b[{},{}]~N(0,1), A_log~N(1,0.5), "
                                  "dt_bias~N(0,1), state[{},{},{}]~N(0,0.1)",
                                  T, nk, dk, T, nv, dv, T, nv, nv, dk, dv);
        plan.run = [in](Backend& b) {
            const auto& v = *in;
            const TensorView st = v[7];
            GatedDeltaInputs g{v[0], v[1], v[2], v[3], v[4], v[5], v[6], &st};
            return NodeOutput{b.gated_delta_rule(g).out, {}};
        };
        plan.bound_data = [in] {
            const auto& v = *in;
            const TensorView st = v[7];
            return gated_delta_bound_data(GatedDeltaInputs{v[0], v[1], v[2], v[3], v[4], v[5], v[6], &st});
        };
    }
    return plan;
}

OpPlan OpPlanner::attention(const std::string& op) const {
    OpPlan plan;
    // Causal GQA attention over a cache: T queries at positions T..2T−1 of 2T cached keys, nkv =
    // heads/2 kv heads (heads when odd), scale 1/√head_dim, through each node's own attention op.
    // attention_sinks (gpt-oss): a sliding window of max(1, T/2) keys (each row its own call on its
    // window) and a sink logit per head (the layer's own when the model has them).
    const std::int64_t nh = c.heads, nkv = nh % 2 == 0 ? nh / 2 : nh, D = c.head_dim, S = 2 * T;
    struct AttnInputs {
        Tensor q, sinks;
        std::vector<Tensor> k, v;
    };
    auto in = std::make_shared<AttnInputs>();
    in->q = input(c, op, "q", {T, nh, D}, 0, 1);
    for (std::int64_t g = 0; g < nkv; ++g) {
        in->k.push_back(input(c, op, fmt::format("k{}", g), {S, D}, 0, 1));
        in->v.push_back(input(c, op, fmt::format("v{}", g), {S, D}, 0, 1));
    }
    const bool sinks = op == "attention_sinks";
    const bool model_sinks = sinks && lw != nullptr && present(lw->sinks) && lw->sinks.dim(0) == nh;
    if (sinks) in->sinks = model_sinks ? Tensor::convert(lw->sinks, DType::f32) : input(c, op, "sinks", {nh}, 0, 1);
    const std::int64_t window = sinks ? std::max<std::int64_t>(1, T / 2) : 0;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    plan.inputs = fmt::format("q[{},{},{}] over a cache of {} keys × {} kv heads~N(0,1), scale 1/√{}{}", T, nh, D, S,
                              nkv, D,
                              sinks ? fmt::format(", sliding window {}, sinks[{}] {}", window, nh,
                                                  model_sinks ? "of " + where : "~N(0,1)")
                                    : std::string(", causal"));
    plan.run = [in, scale, window, sinks](Backend& b) {
        const std::vector<TensorView> ks(in->k.begin(), in->k.end()), vs(in->v.begin(), in->v.end());
        const TensorView sv = in->sinks.view();
        return NodeOutput{arch::windowed_attention(b, in->q, ks, vs, scale, window, sinks ? &sv : nullptr), {}};
    };
    plan.bound_data = [in, scale, window, sinks] {
        const TensorView sv = in->sinks.view();
        return attention_bound_data(in->q.view(), in->k, in->v, scale, window, sinks ? &sv : nullptr);
    };
    return plan;
}

OpPlan OpPlanner::clamped_swiglu(const std::string& op) const {
    OpPlan plan;
    // gpt-oss's expert activation with its own alpha and limit (the model's when it has them); inputs
    // wide enough (sd 4) that the clamps fire on ~8 % of the elements.
    const bool oss = lw != nullptr && c.model->config().clamped_swiglu;
    const double alpha = oss ? c.model->config().swiglu_alpha : 1.702, limit = oss ? c.model->config().swiglu_limit : 7.0;
    auto in = std::make_shared<std::pair<Tensor, Tensor>>(input(c, op, "gate", {T, I}, 0, 4),
                                                          input(c, op, "up", {T, I}, 0, 4));
    plan.inputs = fmt::format("clamped SwiGLU gate, up[{},{}]~N(0,4), alpha {}, limit {}", T, I, alpha, limit);
    plan.run = [in, alpha, limit](Backend& b) {
        return NodeOutput{b.clamped_swiglu(in->first, in->second, alpha, limit), {}};
    };
    return plan;
}

OpPlan OpPlanner::moe(const std::string&) const {
    OpPlan plan;
    auto in = std::make_shared<MoeInputs>(make_moe_inputs(c, ref));
    plan.inputs = lw != nullptr
                      ? fmt::format("x[{},{}] real-statistics, {} real experts of {}×{} of {}, top-{} pinned by {}", T,
                                    H, E, I, H, where, c.top_k, ref.capabilities().node)
                      : fmt::format("x[{},{}]~N(0,1), {} experts of {}×{}, top-{} pinned by {}", T, H, E, I, H,
                                    c.top_k, ref.capabilities().node);
    plan.run = [in](Backend& b) { return NodeOutput{b.moe_block(in->x, in->experts, in->plan), {}}; };
    plan.bound_data = [in] { return moe_bound_data(*in); };
    plan.moe = in;

    return plan;
}

using PlanOp = OpPlan (OpPlanner::*)(const std::string&) const;

// Every op of step 1 in report order, with its planner: the one list of ops.
const std::vector<std::pair<std::string, PlanOp>>& op_table() {
    static const std::vector<std::pair<std::string, PlanOp>> table = {
        {"matmul", &OpPlanner::matmul},
        {"swiglu", &OpPlanner::swiglu},
        {"softmax", &OpPlanner::softmax},
        {"rmsnorm", &OpPlanner::rmsnorm},
        {"rope_neox", &OpPlanner::rope},
        {"rope_normal", &OpPlanner::rope},
        {"rope_yarn", &OpPlanner::rope_yarn},
        {"router_softmax", &OpPlanner::router},
        {"router_sigmoid", &OpPlanner::router},
        {"moe", &OpPlanner::moe},
        {"causal_conv1d", &OpPlanner::linear_attention},
        {"gated_delta", &OpPlanner::linear_attention},
        {"attention", &OpPlanner::attention},
        {"attention_sinks", &OpPlanner::attention},
        {"clamped_swiglu", &OpPlanner::clamped_swiglu},
    };
    return table;
}

// The moe op's shard check on one node: the same block split over `shards`
// expert-parallel nodes, each summing only its experts (expert e on shard
// e·shards/E), then the partials added in shard order; compared with the
// node's monolithic output. The node's failure is the check's error. With
// `keep`, the combined output is kept as ops.moe.shard_combined.
ShardCheck shard_check(Backend& node, const MoeInputs& in, int shards, const Tensor& whole, std::map<std::string, Tensor>* keep) {
    ShardCheck sc;
    const std::int64_t experts = static_cast<std::int64_t>(in.experts.size());
    const auto why = as_node_failure([&] {
        Tensor combined;
        for (int s = 0; s < shards; ++s) {
            std::vector<bool> mine(static_cast<std::size_t>(experts));
            for (std::int64_t e = 0; e < experts; ++e) mine[static_cast<std::size_t>(e)] = (e * shards / experts) == s;
            Tensor partial = node.moe_block(in.x, in.experts, in.plan, &mine);
            combined = s == 0 ? std::move(partial) : node.add(combined, partial);
        }
        sc.stats = compare(whole, combined);
        if (keep != nullptr) (*keep)["ops.moe.shard_combined"] = std::move(combined);
    });
    if (why) sc.error = *why;
    return sc;
}

}  // namespace

const std::vector<std::string>& all_op_names() {
    static const std::vector<std::string> names = [] {
        std::vector<std::string> out;
        for (const auto& [name, plan] : op_table()) out.push_back(name);
        return out;
    }();
    return names;
}

OpResult op_result_from_outputs(const std::string& op, const std::string& inputs,
                                const std::vector<std::optional<TensorView>>& values,
                                const std::vector<std::optional<TensorView>>& ids, std::vector<std::string> errors) {
    const std::size_t n = values.size();
    KVASIR_CHECK(ids.size() == n && errors.size() == n, ErrorCode::internal, "op_result_from_outputs: {} values, {} ids, {} errors",
                 n, ids.size(), errors.size());
    OpResult res;
    res.op = op;
    res.inputs = inputs;
    res.errors = std::move(errors);
    for (const auto& v : values)
        if (v && res.output_shape.empty()) res.output_shape = v->shape;
    res.matrix.assign(n, std::vector<std::optional<CompareStats>>(n));
    res.id_matrix.assign(n, std::vector<std::optional<IndexAgreement>>(n));
    for (std::size_t a = 0; a < n; ++a)
        for (std::size_t b = 0; b < n; ++b) {
            if (a == b || !values[a] || !values[b]) continue;
            try {
                res.matrix[a][b] = compare(*values[a], *values[b]);
                if (ids[a] && ids[b]) res.id_matrix[a][b] = compare_indices(*ids[a], *ids[b]);
            } catch (const Error& e) {
                if (res.errors[b].empty()) res.errors[b] = e.what();
            }
        }
    return res;
}

OpsReport run_op_delta(const OpsConfig& requested, std::vector<std::unique_ptr<Backend>>& nodes, std::size_t reference,
                       OpsOutputs* outputs, ReferenceRole role) {
    const OpsConfig c = requested.resolved();
    c.validate();
    KVASIR_CHECK(!nodes.empty() && reference < nodes.size(), ErrorCode::internal, "run_op_delta: bad reference index");
    OpsReport report;
    report.config = c;
    report.reference = reference;
    for (const auto& n : nodes) report.nodes.push_back(n->capabilities());

    std::vector<std::string> selected = c.ops.empty() ? all_op_names() : c.ops;
    const LayerWeights* lw = c.model != nullptr ? &c.model->layer(c.layer) : nullptr;
    if (lw != nullptr) {
        // Only the ops the layer has weights for; the router op of the model's own scoring.
        const bool sigmoid = c.model->config().router.scoring == RouterScoring::sigmoid;
        std::erase_if(selected, [&](const std::string& op) {
            if (!lw->moe) return op == "router_softmax" || op == "router_sigmoid" || op == "moe";
            return op == (sigmoid ? "router_softmax" : "router_sigmoid");
        });
    }
    OpPlanner planner{c, lw, *nodes[reference], lw != nullptr ? fmt::format("{} layer {}", c.model->path(), c.layer) : "",
                      c.tokens, c.hidden, c.intermediate, c.experts, 1.0 / std::sqrt(static_cast<double>(c.hidden)), {}};
    for (std::int64_t t = 0; t < c.tokens; ++t) planner.positions.push_back(c.position_offset + t);

    for (const auto& [op, plan_op] : op_table()) {
        if (std::find(selected.begin(), selected.end(), op) == selected.end()) continue;
        // Inputs are generated once per op and shared by every node.
        const OpPlan plan = (planner.*plan_op)(op);
        const std::size_t n = nodes.size();
        std::vector<std::string> errors(n);
        std::vector<std::optional<NodeOutput>> outs(n);
        const auto runs = [&](std::size_t i) { return i != reference || role == ReferenceRole::full; };
        for (std::size_t i = 0; i < n; ++i) {
            if (!runs(i)) continue;
            // The node's failure is this op's error; a bug of this tool propagates.
            if (auto why = as_node_failure([&] { outs[i] = plan.run(*nodes[i]); })) errors[i] = *why;
        }
        if (outputs != nullptr) {
            outputs->resize(n);
            for (std::size_t i = 0; i < n; ++i) {
                if (!outs[i]) continue;
                (*outputs)[i]["ops." + op + ".out"] = outs[i]->value;
                if (!outs[i]->ids.empty()) (*outputs)[i]["ops." + op + ".ids"] = outs[i]->ids;
            }
            if (role == ReferenceRole::full && plan.bound_data && outs[reference])
                for (auto& [name, t] : plan.bound_data()) (*outputs)[reference]["ops." + op + "." + name] = std::move(t);
        }
        std::vector<std::optional<TensorView>> values(n), ids(n);
        for (std::size_t i = 0; i < n; ++i) {
            if (!outs[i]) continue;
            values[i] = outs[i]->value.view();
            if (!outs[i]->ids.empty()) ids[i] = outs[i]->ids.view();
        }
        OpResult res = op_result_from_outputs(op, plan.inputs, values, ids, std::move(errors));
        // Shard check on every node that ran the moe op.
        if (plan.moe)
            for (std::size_t i = 0; i < n; ++i) {
                if (!runs(i)) continue;
                ShardCheck sc = outs[i] ? shard_check(*nodes[i], *plan.moe, c.shards, outs[i]->value,
                                                      outputs != nullptr ? &(*outputs)[i] : nullptr)
                                        : ShardCheck{};
                sc.node = report.nodes[i].node;
                sc.shards = c.shards;
                if (!outs[i]) sc.error = res.errors[i];
                report.shard_checks.push_back(std::move(sc));
            }
        report.ops.push_back(std::move(res));
    }
    return report;
}

nlohmann::ordered_json to_json(const OpsConfig& c) {
    nlohmann::ordered_json j;
    j["seed"] = c.seed;
    if (c.model != nullptr) {
        j["model"] = c.model->path();
        j["model_fingerprint"] = c.model->fingerprint();
        j["layer"] = c.layer;
    }
    j["tokens"] = c.tokens;
    j["hidden"] = c.hidden;
    j["intermediate"] = c.intermediate;
    j["experts"] = c.experts;
    j["top_k"] = c.top_k;
    j["vocab"] = c.vocab;
    j["heads"] = c.heads;
    j["head_dim"] = c.head_dim;
    j["position_offset"] = c.position_offset;
    j["rope_theta"] = c.rope_theta;
    j["rms_eps"] = c.rms_eps;
    j["shards"] = c.shards;
    return j;
}

nlohmann::ordered_json to_json(const OpsReport& r) {
    nlohmann::ordered_json j;
    j["schema"] = "kvasir-equiv/ops/1";
    j["tool"] = tool_json();
    j["config"] = to_json(r.config);
    j["reference"] = r.nodes[r.reference].node;
    j["nodes"] = nlohmann::ordered_json::array();
    for (const Capabilities& c : r.nodes) j["nodes"].push_back(to_json(c));
    j["ops"] = nlohmann::ordered_json::array();
    for (const OpResult& op : r.ops) {
        nlohmann::ordered_json o;
        o["op"] = op.op;
        o["inputs"] = op.inputs;
        o["output_shape"] = op.output_shape;
        nlohmann::ordered_json errors = nlohmann::ordered_json::object();
        for (std::size_t i = 0; i < op.errors.size(); ++i)
            if (!op.errors[i].empty()) errors[r.nodes[i].node] = op.errors[i];
        o["errors"] = errors;
        o["pairs"] = nlohmann::ordered_json::array();
        for (std::size_t a = 0; a < op.matrix.size(); ++a)
            for (std::size_t b = 0; b < op.matrix.size(); ++b) {
                if (!op.matrix[a][b]) continue;
                nlohmann::ordered_json p;
                p["reference"] = r.nodes[a].node;
                p["candidate"] = r.nodes[b].node;
                p["stats"] = to_json(*op.matrix[a][b]);
                if (op.id_matrix[a][b]) p["ids"] = to_json(*op.id_matrix[a][b]);
                o["pairs"].push_back(std::move(p));
            }
        j["ops"].push_back(std::move(o));
    }
    j["shard_checks"] = nlohmann::ordered_json::array();
    for (const ShardCheck& s : r.shard_checks) {
        nlohmann::ordered_json o;
        o["node"] = s.node;
        o["shards"] = s.shards;
        if (s.stats) o["stats"] = to_json(*s.stats);
        else o["error"] = s.error;
        j["shard_checks"].push_back(std::move(o));
    }
    return j;
}

}  // namespace kvasir
