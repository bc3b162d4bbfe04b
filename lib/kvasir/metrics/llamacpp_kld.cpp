#include "kvasir/metrics/llamacpp_kld.hpp"
#include "kvasir/core/nonfinite.hpp"

#include "kvasir/core/dtype.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/metrics/stats.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace kvasir {

BaseRounding parse_base_rounding(std::string_view s) {
    if (s == "exact") return BaseRounding::exact;
    if (s == "llamacpp-u16") return BaseRounding::llamacpp_u16;
    fail(ErrorCode::bad_input, "base rounding '{}' (expected exact or llamacpp-u16)", s);
}

const char* to_string(BaseRounding r) noexcept { return r == BaseRounding::exact ? "exact" : "llamacpp-u16"; }

namespace {


// One row's log-probabilities as the base file of llama-perplexity holds
// them (u16, decoded), in f32 exactly as its log_softmax() writer computes.
std::vector<double> u16_log_probs(const std::vector<float>& z) {
    float max_logit = z[0], min_logit = z[0];
    for (float x : z) {
        max_logit = std::max(max_logit, x);
        min_logit = std::min(min_logit, x);
    }
    min_logit = std::max(min_logit, max_logit - 16);
    double sum_exp = 0.0;
    for (float x : z) sum_exp += std::exp(x - max_logit);  // expf, summed in double
    const float log_sum_exp = static_cast<float>(std::log(sum_exp));
    const float min_log_prob = min_logit - max_logit - log_sum_exp;
    const float scale = (max_logit - min_logit) / 65535.f;
    std::vector<double> out(z.size());
    const float inv_scale = scale != 0 ? 1 / scale : 0.f;
    for (std::size_t i = 0; i < z.size(); ++i) {
        const int q = scale != 0 && z[i] > min_logit ? ggml_nearest_int(inv_scale * (z[i] - min_logit)) : 0;
        out[i] = static_cast<double>(scale * static_cast<float>(static_cast<std::uint16_t>(q)) + min_log_prob);
    }
    return out;
}

std::vector<double> exact_log_probs(const std::vector<double>& z) {
    const double m = *std::max_element(z.begin(), z.end());
    NeumaierSum s;
    for (double x : z) s.add(std::exp(x - m));
    const double lse = m + std::log(s.value());
    std::vector<double> out(z.size());
    for (std::size_t i = 0; i < z.size(); ++i) out[i] = z[i] - lse;
    return out;
}

std::size_t first_max(const std::vector<double>& v) {
    std::size_t k = 0;
    for (std::size_t i = 1; i < v.size(); ++i)
        if (v[i] > v[k]) k = i;
    return k;
}

// llama.cpp's mean_and_uncertainty.
ValueUncertainty mean_unc(double sum, double sum2, std::int64_t n) {
    if (n < 1) return {};
    const double f = sum / static_cast<double>(n);
    double df = sum2 / static_cast<double>(n) - f * f;
    df = df > 0 && n > 10 ? std::sqrt(df / static_cast<double>(n - 1)) : 0.0;
    return {f, df};
}

double covariance(double a, double b, double ab, std::int64_t n) {
    if (n < 10) return 0.0;
    const double dn = static_cast<double>(n);
    return (ab / dn - (a / dn) * (b / dn)) / (dn - 1);
}

// llama.cpp's percentile() over ascending values.
double percentile(const std::vector<double>& v, double fraction) {
    if (fraction <= 0) return v.front();
    if (fraction >= 1) return v.back();
    double p = fraction * static_cast<double>(v.size() - 1);
    const auto ip = static_cast<std::size_t>(p);
    p -= static_cast<double>(ip);
    return (1 - p) * v[ip] + p * v[std::min(ip + 1, v.size() - 1)];
}

double median(const std::vector<double>& v) {
    const std::size_t n = v.size();
    return n % 2 == 0 ? 0.5 * (v[n / 2] + v[n / 2 - 1]) : v[n / 2];
}

Spread spread_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    Spread s;
    s.max = v.back();
    s.min = v.front();
    s.median = median(v);
    const std::pair<double*, double> at[] = {{&s.p999, 0.999}, {&s.p99, 0.99}, {&s.p95, 0.95}, {&s.p90, 0.90},
                                             {&s.p75, 0.75},   {&s.p25, 0.25}, {&s.p10, 0.10}, {&s.p5, 0.05},
                                             {&s.p1, 0.01},    {&s.p01, 0.001}};
    for (const auto& [field, fraction] : at) *field = percentile(v, fraction);
    return s;
}

std::vector<double> row(const TensorView& t, std::int64_t r) {
    const std::int64_t V = t.shape[1];
    std::vector<double> out(static_cast<std::size_t>(V));
    for (std::int64_t v = 0; v < V; ++v) out[static_cast<std::size_t>(v)] = t.at(r * V + v);
    return out;
}

nlohmann::ordered_json vu(const ValueUncertainty& x) {
    return {{"value", json_double(x.value)}, {"uncertainty", json_double(x.uncertainty)}};
}

}  // namespace

LlamaCppKld llamacpp_kl_divergence(const TensorView& base, const TensorView& cand, const std::vector<std::int32_t>& targets,
                                   BaseRounding rounding) {
    KVASIR_CHECK(base.shape.size() == 2 && base.shape == cand.shape, ErrorCode::bad_input,
                 "KL divergence: base logits {} and candidate logits {} must be the same [P, V]", shape_str(base.shape),
                 shape_str(cand.shape));
    const std::int64_t P = base.shape[0], V = base.shape[1];
    KVASIR_CHECK(P >= 2 && V >= 2 && static_cast<std::int64_t>(targets.size()) == P, ErrorCode::bad_input,
                 "KL divergence: {} predictions of {} logits with {} targets (need P >= 2 targets, one per row)", P, V,
                 targets.size());
    LlamaCppKld k;
    k.count = P;
    double s_nll = 0, s_nll2 = 0, s_b = 0, s_b2 = 0, s_nb = 0, s_kld = 0, s_kld2 = 0, s_dp = 0, s_dp2 = 0, s_dp4 = 0;
    std::int64_t same = 0;
    bool finite = true;
    std::vector<double> klds, dps;
    klds.reserve(static_cast<std::size_t>(P));
    dps.reserve(static_cast<std::size_t>(P));
    for (std::int64_t i = 0; i < P; ++i) {
        const std::int32_t t = targets[static_cast<std::size_t>(i)];
        KVASIR_CHECK(t >= 0 && t < V, ErrorCode::bad_input, "KL divergence: target {} of prediction {} outside [0, {})", t, i, V);
        const std::vector<double> zb = row(base, i), zq = row(cand, i);
        for (std::int64_t v = 0; v < V; ++v)
            finite = finite && std::isfinite(zb[static_cast<std::size_t>(v)]) && std::isfinite(zq[static_cast<std::size_t>(v)]);
        if (!finite) break;
        const auto ut = static_cast<std::size_t>(t);
        double nll = 0, nll_b = 0, kld = 0, dp = 0;
        if (rounding == BaseRounding::llamacpp_u16) {
            // llama-perplexity's own arithmetic (its log_softmax(), kl-divergence flavour): the base as its
            // file decodes it, the candidate's log-softmax and the per-token terms in f32, sums in f64.
            std::vector<float> zf(zb.size()), qf(zq.size());
            for (std::size_t v = 0; v < zb.size(); ++v) {
                zf[v] = static_cast<float>(zb[v]);
                qf[v] = static_cast<float>(zq[v]);
            }
            const std::vector<double> lb = u16_log_probs(zf);
            float max_logit = qf[0];
            std::size_t imax = 0;
            for (std::size_t v = 1; v < qf.size(); ++v)
                if (qf[v] > max_logit) {
                    max_logit = qf[v];
                    imax = v;
                }
            double sum_exp = 0.0;
            for (float x : qf) sum_exp += std::exp(x - max_logit);
            const float log_sum_exp = static_cast<float>(std::log(sum_exp));
            const float nll_f = max_logit + log_sum_exp - qf[ut];
            const float nll_base_f = -static_cast<float>(lb[ut]);
            max_logit += log_sum_exp;
            double sum = 0;
            for (std::size_t v = 0; v < qf.size(); ++v) {
                const auto p_log_base = static_cast<float>(lb[v]);
                if (p_log_base > -16.f) {
                    const float p_base = std::exp(p_log_base);
                    sum += p_base * (p_log_base - qf[v] + max_logit);
                }
            }
            nll = nll_f;
            nll_b = nll_base_f;
            kld = sum;
            same += imax == first_max(lb);
            dp = static_cast<double>(std::exp(-nll_f) - std::exp(-nll_base_f));
        } else {
            const std::vector<double> lb = exact_log_probs(zb), lq = exact_log_probs(zq);
            nll = -lq[ut];
            nll_b = -lb[ut];
            NeumaierSum kl;
            for (std::size_t v = 0; v < lb.size(); ++v)
                if (lb[v] > -16.0) kl.add(std::exp(lb[v]) * (lb[v] - lq[v]));
            kld = kl.value();
            same += first_max(lq) == first_max(lb);
            dp = std::exp(-nll) - std::exp(-nll_b);
        }
        s_nll += nll;
        s_nll2 += nll * nll;
        s_b += nll_b;
        s_b2 += nll_b * nll_b;
        s_nb += nll * nll_b;
        s_kld += kld;
        s_kld2 += kld * kld;
        klds.push_back(kld);
        s_dp += dp;
        s_dp2 += dp * dp;
        s_dp4 += dp * dp * dp * dp;
        dps.push_back(dp);
    }
    if (!finite) {
        LlamaCppKld nan;
        nan.count = P;
        for (ValueUncertainty* x : {&nan.ppl, &nan.ppl_base, &nan.ln_ppl_ratio, &nan.ppl_ratio, &nan.ppl_diff, &nan.kld,
                                    &nan.dp, &nan.dp_rms, &nan.same_top})
            *x = {kNaN, kNaN};
        for (Spread* sp : {&nan.kld_spread, &nan.dp_spread})
            for (double* x : {&sp->max, &sp->p999, &sp->p99, &sp->p95, &sp->p90, &sp->p75, &sp->median, &sp->p25, &sp->p10,
                              &sp->p5, &sp->p1, &sp->p01, &sp->min})
                *x = kNaN;
        nan.ln_ppl_correlation = kNaN;
        return nan;
    }
    const ValueUncertainty lq = mean_unc(s_nll, s_nll2, P), lb = mean_unc(s_b, s_b2, P);
    const double cov = covariance(s_nll, s_b, s_nb, P);
    k.ppl = {std::exp(lq.value), std::exp(lq.value) * lq.uncertainty};
    k.ppl_base = {std::exp(lb.value), std::exp(lb.value) * lb.uncertainty};
    k.ln_ppl_correlation = cov / (lq.uncertainty * lb.uncertainty);
    const double ln_ratio = lq.value - lb.value;
    const double ln_ratio_unc = std::sqrt(lq.uncertainty * lq.uncertainty + lb.uncertainty * lb.uncertainty - 2.0 * cov);
    k.ln_ppl_ratio = {ln_ratio, ln_ratio_unc};
    k.ppl_ratio = {std::exp(ln_ratio), std::exp(ln_ratio) * ln_ratio_unc};
    const double ppl_cov = k.ppl.value * k.ppl_base.value * cov;
    k.ppl_diff = {k.ppl.value - k.ppl_base.value,
                  std::sqrt(k.ppl.uncertainty * k.ppl.uncertainty + k.ppl_base.uncertainty * k.ppl_base.uncertainty - 2.0 * ppl_cov)};
    k.kld = mean_unc(s_kld, s_kld2, P);
    k.kld_spread = spread_of(std::move(klds));
    k.dp = mean_unc(s_dp, s_dp2, P);
    k.dp_spread = spread_of(std::move(dps));
    const ValueUncertainty mse = mean_unc(s_dp2, s_dp4, P);
    const double rms = std::sqrt(mse.value);
    k.dp_rms = {rms, rms > 0 ? 0.5 / rms * mse.uncertainty : 0.0};
    const double p = static_cast<double>(same) / static_cast<double>(P);
    k.same_top = {p, std::sqrt(p * (1.0 - p) / static_cast<double>(P - 1))};
    return k;
}

nlohmann::ordered_json to_json(const LlamaCppKld& k) {
    return {{"predictions", k.count},
            {"Mean PPL(Q)", vu(k.ppl)},
            {"Mean PPL(base)", vu(k.ppl_base)},
            {"Cor(ln(PPL(Q)), ln(PPL(base)))", json_double(k.ln_ppl_correlation)},
            {"Mean ln(PPL(Q)/PPL(base))", vu(k.ln_ppl_ratio)},
            {"Mean PPL(Q)/PPL(base)", vu(k.ppl_ratio)},
            {"Mean PPL(Q)-PPL(base)", vu(k.ppl_diff)},
            {"Mean KLD", vu(k.kld)},
            {"Maximum KLD", json_double(k.kld_spread.max)},
            {"99.9% KLD", json_double(k.kld_spread.p999)},
            {"99.0% KLD", json_double(k.kld_spread.p99)},
            {"95.0% KLD", json_double(k.kld_spread.p95)},
            {"90.0% KLD", json_double(k.kld_spread.p90)},
            {"Median KLD", json_double(k.kld_spread.median)},
            {"10.0% KLD", json_double(k.kld_spread.p10)},
            {"5.0% KLD", json_double(k.kld_spread.p5)},
            {"1.0% KLD", json_double(k.kld_spread.p1)},
            {"0.1% KLD", json_double(k.kld_spread.p01)},
            {"Minimum KLD", json_double(k.kld_spread.min)},
            {"Mean Δp", vu(k.dp)},
            {"Maximum Δp", json_double(k.dp_spread.max)},
            {"99.9% Δp", json_double(k.dp_spread.p999)},
            {"99.0% Δp", json_double(k.dp_spread.p99)},
            {"95.0% Δp", json_double(k.dp_spread.p95)},
            {"90.0% Δp", json_double(k.dp_spread.p90)},
            {"75.0% Δp", json_double(k.dp_spread.p75)},
            {"Median Δp", json_double(k.dp_spread.median)},
            {"25.0% Δp", json_double(k.dp_spread.p25)},
            {"10.0% Δp", json_double(k.dp_spread.p10)},
            {"5.0% Δp", json_double(k.dp_spread.p5)},
            {"1.0% Δp", json_double(k.dp_spread.p1)},
            {"0.1% Δp", json_double(k.dp_spread.p01)},
            {"Minimum Δp", json_double(k.dp_spread.min)},
            {"RMS Δp", vu(k.dp_rms)},
            {"Same top p", vu(k.same_top)}};
}

}  // namespace kvasir
