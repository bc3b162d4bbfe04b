#include "kvasir/backend/linear_attention.hpp"

#include "kernels/cpu/f16_round.hpp"

#include "kvasir/core/error.hpp"

#include <cmath>
#include <type_traits>
#include <vector>

namespace kvasir {

namespace {

template <class R>
R silu(R x) {
    return x / (R(1) + std::exp(-x));
}

template <class R>
R softplus(R x) {
    return x > R(20) ? x : std::log1p(std::exp(x));  // torch.nn.functional.softplus, beta 1, threshold 20
}

// One step of a running dot product, s + a·b: in R, or (f16) the exact
// product added in double and the sum rounded to half after every add.
template <class R>
struct DotStep {
    bool f16 = false;
    R operator()(R s, R a, R b) const {
        if constexpr (std::is_same_v<R, float>)
            if (f16)
                return static_cast<R>(
                    kernels::round_f16_fast(static_cast<double>(s) + static_cast<double>(a) * static_cast<double>(b)));
        return s + a * b;
    }
};

template <class R>
DotStep<R> dot_step(bool f16_acc, const char* op) {
    constexpr bool is_f32 = std::is_same_v<R, float>;
    KVASIR_CHECK(!f16_acc || is_f32, ErrorCode::internal, "{}: f16 accumulation is an f32 node's variant",
                 op);
    return DotStep<R>{f16_acc};
}

// x · rsqrt(Σ x² + eps) over `n` values in place.
template <class R>
void l2norm(R* x, std::int64_t n, DotStep<R> step) {
    R ss = 0;
    for (std::int64_t i = 0; i < n; ++i) ss = step(ss, x[i], x[i]);
    const R inv = R(1) / std::sqrt(ss + R(1e-6));
    for (std::int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

void check_conv1d_args(const TensorView& x, const TensorView& w, const TensorView* history) {
    KVASIR_CHECK(x.rank() == 2, ErrorCode::bad_input, "causal_conv1d: x {} must be [T, C]", shape_str(x.shape));
    const std::int64_t c = x.shape[1];
    const bool ok = (w.rank() == 2 && w.shape[0] == c) || (w.rank() == 3 && w.shape[0] == c && w.shape[1] == 1);
    KVASIR_CHECK(ok && w.shape.back() >= 1, ErrorCode::bad_input, "causal_conv1d: weight {} does not fit {} channels",
                 shape_str(w.shape), c);
    if (history != nullptr)
        KVASIR_CHECK(history->rank() == 2 && history->shape[0] == w.shape.back() - 1 && history->shape[1] == c,
                     ErrorCode::bad_input, "causal_conv1d: history {} must be [{}, {}]", shape_str(history->shape),
                     w.shape.back() - 1, c);
}

void check_gated_delta_args(const GatedDeltaInputs& in) {
    const auto& q = in.q;
    KVASIR_CHECK(q.rank() == 3 && in.k.shape == q.shape, ErrorCode::bad_input, "gated_delta_rule: q {} / k {} must be [T, nk, dk]",
                 shape_str(q.shape), shape_str(in.k.shape));
    const std::int64_t t = q.shape[0], nk = q.shape[1], dk = q.shape[2];
    KVASIR_CHECK(in.v.rank() == 3 && in.v.shape[0] == t && in.v.shape[1] % nk == 0, ErrorCode::bad_input,
                 "gated_delta_rule: v {} must be [{}, nv, dv] with nv a multiple of {}", shape_str(in.v.shape), t, nk);
    const std::int64_t nv = in.v.shape[1], dv = in.v.shape[2];
    for (const auto& [view, what] : {std::pair{&in.a, "a"}, std::pair{&in.b, "b"}})
        KVASIR_CHECK(view->shape == Shape({t, nv}), ErrorCode::bad_input, "gated_delta_rule: {} {} must be [{}, {}]", what,
                     shape_str(view->shape), t, nv);
    for (const auto& [view, what] : {std::pair{&in.a_log, "A_log"}, std::pair{&in.dt_bias, "dt_bias"}})
        KVASIR_CHECK(view->numel() == nv, ErrorCode::bad_input, "gated_delta_rule: {} {} must have {} values", what,
                     shape_str(view->shape), nv);
    if (in.state != nullptr)
        KVASIR_CHECK(in.state->shape == Shape({nv, dk, dv}), ErrorCode::bad_input,
                     "gated_delta_rule: state {} must be [{}, {}, {}]", shape_str(in.state->shape), nv, dk, dv);
}

template <class R>
Tensor causal_conv1d_silu_ref(const TensorView& x, const TensorView& w, const TensorView* history, bool f16_acc) {
    check_conv1d_args(x, w, history);
    const DotStep<R> step = dot_step<R>(f16_acc, "causal_conv1d");
    const std::int64_t t_count = x.shape[0], c_count = x.shape[1], k_count = w.shape.back(), pad = k_count - 1;
    Tensor y(dtype_of<R>(), {t_count, c_count});
    R* yp = y.as<R>();
    // The input row t' (t' < 0: history or zeros).
    const auto at = [&](std::int64_t tp, std::int64_t c) -> R {
        if (tp >= 0) return static_cast<R>(x.at(tp * c_count + c));
        if (history == nullptr) return R(0);
        return static_cast<R>(history->at((pad + tp) * c_count + c));
    };
    for (std::int64_t t = 0; t < t_count; ++t)
        for (std::int64_t c = 0; c < c_count; ++c) {
            R s = 0;
            for (std::int64_t j = 0; j < k_count; ++j) s = step(s, static_cast<R>(w.at(c * k_count + j)), at(t + j - pad, c));
            yp[t * c_count + c] = silu(s);
        }
    return y;
}

template <class R>
GatedDeltaResult gated_delta_rule_ref(const GatedDeltaInputs& in, bool f16_acc, GatedDeltaTrace* trace) {
    check_gated_delta_args(in);
    KVASIR_CHECK(trace == nullptr || (std::is_same_v<R, double>), ErrorCode::internal, "gated_delta_rule: a trace is the f64 oracle's");
    const DotStep<R> step = dot_step<R>(f16_acc, "gated_delta_rule");
    const std::int64_t t_count = in.q.shape[0], nk = in.q.shape[1], dk = in.q.shape[2];
    const std::int64_t nv = in.v.shape[1], dv = in.v.shape[2], rep = nv / nk;
    GatedDeltaResult res{Tensor(dtype_of<R>(), {t_count, nv, dv}), Tensor(dtype_of<R>(), {nv, dk, dv})};
    R* out = res.out.as<R>();
    R* state = res.state.as<R>();
    if (in.state != nullptr)
        for (std::int64_t i = 0; i < res.state.numel(); ++i) state[i] = static_cast<R>(in.state->at(i));
    const R q_scale = R(1) / std::sqrt(static_cast<R>(dk));
    std::vector<R> q(static_cast<std::size_t>(dk)), k(static_cast<std::size_t>(dk)), mem(static_cast<std::size_t>(dv));
    if (trace != nullptr) {
        trace->cols.assign(static_cast<std::size_t>(t_count * nv * dv * 6), 0.0);
        trace->heads.assign(static_cast<std::size_t>(t_count * nv * 2), 0.0);
    }
    // The trace's column norms and |S|·|x| sums of head h's state s.
    const auto col_norm = [&](const R* s, std::int64_t j) {
        double n = 0;
        for (std::int64_t i = 0; i < dk; ++i) n += static_cast<double>(s[i * dv + j]) * static_cast<double>(s[i * dv + j]);
        return std::sqrt(n);
    };
    const auto col_abs_dot = [&](const R* s, std::int64_t j, const std::vector<R>& x) {
        double n = 0;
        for (std::int64_t i = 0; i < dk; ++i) n += std::fabs(static_cast<double>(s[i * dv + j]) * static_cast<double>(x[static_cast<std::size_t>(i)]));
        return n;
    };
    for (std::int64_t t = 0; t < t_count; ++t) {
        for (std::int64_t h = 0; h < nv; ++h) {
            const std::int64_t kh = h / rep;
            for (std::int64_t i = 0; i < dk; ++i) {
                q[static_cast<std::size_t>(i)] = static_cast<R>(in.q.at((t * nk + kh) * dk + i));
                k[static_cast<std::size_t>(i)] = static_cast<R>(in.k.at((t * nk + kh) * dk + i));
            }
            double* tc = trace != nullptr ? trace->cols.data() + (t * nv + h) * dv * 6 : nullptr;
            if (trace != nullptr) {
                double nq = 0, nkk = 0;
                for (std::int64_t i = 0; i < dk; ++i) {
                    nq += static_cast<double>(q[static_cast<std::size_t>(i)]) * static_cast<double>(q[static_cast<std::size_t>(i)]);
                    nkk += static_cast<double>(k[static_cast<std::size_t>(i)]) * static_cast<double>(k[static_cast<std::size_t>(i)]);
                }
                trace->heads[static_cast<std::size_t>((t * nv + h) * 2)] = nq;
                trace->heads[static_cast<std::size_t>((t * nv + h) * 2 + 1)] = nkk;
            }
            l2norm(q.data(), dk, step);
            l2norm(k.data(), dk, step);
            for (R& x : q) x *= q_scale;
            const R a = static_cast<R>(in.a.at(t * nv + h)) + static_cast<R>(in.dt_bias.at(h));
            const R g = -std::exp(static_cast<R>(in.a_log.at(h))) * softplus(a);
            const R decay = std::exp(g);
            const R beta = R(1) / (R(1) + std::exp(-static_cast<R>(in.b.at(t * nv + h))));
            R* s = state + h * dk * dv;
            if (tc != nullptr)
                for (std::int64_t j = 0; j < dv; ++j) tc[j * 6] = col_norm(s, j);
            for (std::int64_t i = 0; i < dk * dv; ++i) s[i] *= decay;
            for (std::int64_t j = 0; j < dv; ++j) {
                R m = 0;
                for (std::int64_t i = 0; i < dk; ++i) m = step(m, s[i * dv + j], k[static_cast<std::size_t>(i)]);
                const R vj = static_cast<R>(in.v.at((t * nv + h) * dv + j));
                mem[static_cast<std::size_t>(j)] = (vj - m) * beta;
                if (tc != nullptr) {
                    tc[j * 6 + 1] = col_abs_dot(s, j, k);
                    tc[j * 6 + 2] = static_cast<double>(vj);
                    tc[j * 6 + 3] = static_cast<double>(m);
                }
            }
            for (std::int64_t i = 0; i < dk; ++i)
                for (std::int64_t j = 0; j < dv; ++j) s[i * dv + j] += k[static_cast<std::size_t>(i)] * mem[static_cast<std::size_t>(j)];
            for (std::int64_t j = 0; j < dv; ++j) {
                R o = 0;
                for (std::int64_t i = 0; i < dk; ++i) o = step(o, s[i * dv + j], q[static_cast<std::size_t>(i)]);
                out[(t * nv + h) * dv + j] = o;
                if (tc != nullptr) {
                    tc[j * 6 + 4] = col_norm(s, j);
                    tc[j * 6 + 5] = col_abs_dot(s, j, q);
                }
            }
        }
    }
    return res;
}

template Tensor causal_conv1d_silu_ref<double>(const TensorView&, const TensorView&, const TensorView*, bool);
template Tensor causal_conv1d_silu_ref<float>(const TensorView&, const TensorView&, const TensorView*, bool);
template GatedDeltaResult gated_delta_rule_ref<double>(const GatedDeltaInputs&, bool, GatedDeltaTrace*);
template GatedDeltaResult gated_delta_rule_ref<float>(const GatedDeltaInputs&, bool, GatedDeltaTrace*);

}  // namespace kvasir
