#include "kvasir/metrics/stats.hpp"
#include "kvasir/core/nonfinite.hpp"

#include "kvasir/core/error.hpp"

#include <numbers>
#include <algorithm>
#include <cmath>
#include <limits>

namespace kvasir {
namespace {

bool any_nan(std::span<const double> xs) noexcept {
    return std::any_of(xs.begin(), xs.end(), [](double x) { return std::isnan(x); });
}

}  // namespace

void NeumaierSum::add(double x) noexcept {
    const double t = sum_ + x;
    if (std::fabs(sum_) >= std::fabs(x))
        comp_ += (sum_ - t) + x;  // low bits of x lost in t
    else
        comp_ += (x - t) + sum_;  // low bits of sum_ lost in t
    sum_ = t;
}

double NeumaierSum::value() const noexcept { return std::isfinite(sum_) ? sum_ + comp_ : sum_; }

double compensated_sum(std::span<const double> xs) noexcept {
    NeumaierSum s;
    for (double x : xs) s.add(x);
    return s.value();
}

double quantile_sorted(std::span<const double> sorted, double q) {
    KVASIR_CHECK(!sorted.empty(), ErrorCode::bad_input, "quantile of an empty sample");
    KVASIR_CHECK(q >= 0.0 && q <= 1.0, ErrorCode::bad_input, "quantile {} is outside [0, 1]", q);
    const auto n = static_cast<double>(sorted.size());
    const double h = (n - 1.0) * q;  // numpy's 'linear' virtual index, same single rounding
    if (h >= n - 1.0) return sorted.back();
    const double lo = std::floor(h);
    const double g = h - lo;
    const auto i = static_cast<std::size_t>(lo);
    const double a = sorted[i], b = sorted[i + 1];
    // Exact hits and equal neighbours return the value itself, so infinities
    // do not turn into inf·0 or inf − inf (NaN) as they would in the formula.
    if (g == 0.0 || a == b) return a;
    const double diff = b - a;
    return g < 0.5 ? a + diff * g : b - diff * (1.0 - g);
}

Summary summarize(std::span<const double> xs) {
    Summary s;
    s.count = static_cast<std::int64_t>(xs.size());
    if (xs.empty() || any_nan(xs)) {
        s.mean = s.median = s.p90 = s.p99 = s.p999 = s.min = s.max = kNaN;
        return s;
    }
    std::vector<double> sorted(xs.begin(), xs.end());
    std::sort(sorted.begin(), sorted.end());  // NaN-free here, so a strict weak order
    s.mean = compensated_sum(xs) / static_cast<double>(xs.size());
    s.median = quantile_sorted(sorted, 0.5);
    s.p90 = quantile_sorted(sorted, 0.9);
    s.p99 = quantile_sorted(sorted, 0.99);
    s.p999 = quantile_sorted(sorted, 0.999);
    s.min = sorted.front();
    s.max = sorted.back();
    return s;
}

double logsumexp(std::span<const double> logits) {
    KVASIR_CHECK(!logits.empty(), ErrorCode::bad_input, "logsumexp of an empty vector");
    std::size_t j = 0;
    for (std::size_t i = 0; i < logits.size(); ++i) {
        if (std::isnan(logits[i])) return kNaN;
        if (logits[i] > logits[j]) j = i;
    }
    const double m = logits[j];
    if (std::isinf(m)) return m;  // +inf dominates; all −inf → −inf
    NeumaierSum others;
    for (std::size_t i = 0; i < logits.size(); ++i)
        if (i != j) others.add(std::exp(logits[i] - m));
    return m + std::log1p(others.value());
}

void log_softmax(std::span<const double> logits, std::span<double> out) {
    KVASIR_CHECK(out.size() == logits.size(), ErrorCode::bad_input,
                 "log_softmax: output has {} elements for {} logits", out.size(), logits.size());
    const double lse = logsumexp(logits);
    if (!std::isfinite(lse)) {  // NaN, +inf or all −inf: no distribution
        std::fill(out.begin(), out.end(), kNaN);
        return;
    }
    for (std::size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - lse;
}

std::vector<double> log_softmax(std::span<const double> logits) {
    std::vector<double> out(logits.size());
    log_softmax(logits, out);
    return out;
}

double kl_divergence_from_logits(std::span<const double> ref_logits, std::span<const double> cand_logits) {
    KVASIR_CHECK(ref_logits.size() == cand_logits.size(), ErrorCode::bad_input,
                 "KL divergence: reference has {} logits but candidate has {}", ref_logits.size(),
                 cand_logits.size());
    KVASIR_CHECK(!ref_logits.empty(), ErrorCode::bad_input, "KL divergence of empty logit vectors");
    const std::vector<double> lp = log_softmax(ref_logits);
    const std::vector<double> lq = log_softmax(cand_logits);
    NeumaierSum kl;
    for (std::size_t i = 0; i < lp.size(); ++i) {
        if (std::isnan(lp[i]) || std::isnan(lq[i])) return kNaN;
        // p_i = 0: 0·log 0 = 0 in Σ p·d, but the q_i − p_i part of the term
        // (its limit) must stay, or Σ (q − p) = 0 no longer holds.
        if (lp[i] == -kInf) {
            kl.add(std::exp(lq[i]));
            continue;
        }
        if (lq[i] == -kInf) return kInf;  // q_i = 0 < p_i
        const double d = lp[i] - lq[i];
        const double p = std::exp(lp[i]);
        // For d < −1 (q > e·p) expm1(−d) may overflow while p underflows
        // (0·inf); there p·expm1(−d) = q − p has no cancellation to avoid.
        kl.add(d < -1.0 ? p * d + (std::exp(lq[i]) - p) : p * (d + std::expm1(-d)));
    }
    const double v = kl.value();
    return v < 0.0 ? 0.0 : v;  // guard only (terms are >= 0); NaN compares false and survives
}

namespace {

void check_trials(std::int64_t successes, std::int64_t n, double confidence) {
    (void)binomial(successes, n);
    KVASIR_CHECK(std::isfinite(confidence) && confidence > 0.5 && confidence < 1.0, ErrorCode::bad_input,
                 "confidence level {} is outside (0.5, 1)", confidence);
}

// log B(a, b) through lgamma (a, b > 0).
double log_beta(double a, double b) { return std::lgamma(a) + std::lgamma(b) - std::lgamma(a + b); }

// The continued fraction of I_x(a, b) (modified Lentz), valid for x < (a + 1)/(a + b + 2).
double beta_fraction(double x, double a, double b) {
    constexpr double tiny = 1e-300;
    const double qab = a + b, qap = a + 1.0, qam = a - 1.0;
    double c = 1.0, d = 1.0 - qab * x / qap;
    if (std::fabs(d) < tiny) d = tiny;
    d = 1.0 / d;
    double h = d;
    for (int m = 1; m <= 10000; ++m) {
        const double m2 = 2.0 * m;
        double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 + aa * d;
        if (std::fabs(d) < tiny) d = tiny;
        c = 1.0 + aa / c;
        if (std::fabs(c) < tiny) c = tiny;
        d = 1.0 / d;
        h *= d * c;
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 + aa * d;
        if (std::fabs(d) < tiny) d = tiny;
        c = 1.0 + aa / c;
        if (std::fabs(c) < tiny) c = tiny;
        d = 1.0 / d;
        const double del = d * c;
        h *= del;
        if (std::fabs(del - 1.0) < 1e-16) break;
    }
    return h;
}

// x with I_x(a, b) = p, by bisection on [0, 1] to the last bit (I is increasing in x).
double beta_quantile(double p, double a, double b) {
    double lo = 0.0, hi = 1.0;
    for (int i = 0; i < 200 && hi - lo > 0.0; ++i) {
        const double mid = 0.5 * (lo + hi);
        if (mid == lo || mid == hi) break;
        (regularized_incomplete_beta(mid, a, b) < p ? lo : hi) = mid;
    }
    return 0.5 * (lo + hi);
}

double wilson_bound(std::int64_t k, std::int64_t n, double confidence, double sign) {
    if (k == n && sign > 0) return 1.0;  // exactly, not 1 − an ulp
    if (k == 0 && sign < 0) return 0.0;
    const double z = normal_quantile(confidence), nd = static_cast<double>(n), p = static_cast<double>(k) / nd;
    const double z2 = z * z;
    const double centre = p + z2 / (2.0 * nd);
    const double spread = z * std::sqrt(p * (1.0 - p) / nd + z2 / (4.0 * nd * nd));
    return std::clamp((centre + sign * spread) / (1.0 + z2 / nd), 0.0, 1.0);
}

}  // namespace

double normal_quantile(double p) {
    KVASIR_CHECK(std::isfinite(p) && p > 0.0 && p < 1.0, ErrorCode::bad_input, "normal quantile of {}", p);
    // First guess: the Abramowitz & Stegun 26.2.23 rational approximation (|error| < 4.5e-4) on the
    // smaller tail, then Newton steps on Φ(x) − p with Φ(x) = erfc(−x/√2)/2, which converge quadratically.
    // Solved in the smaller tail q (x ≤ 0, Φ(x) = erfc(−x/√2)/2 free of cancellation), then mirrored.
    const double q = std::min(p, 1.0 - p);
    const double t = std::sqrt(-2.0 * std::log(q));
    double x = -(t - (2.515517 + 0.802853 * t + 0.010328 * t * t) /
                         (1.0 + 1.432788 * t + 0.189269 * t * t + 0.001308 * t * t * t));
    for (int i = 0; i < 8; ++i) {
        const double cdf = 0.5 * std::erfc(-x / std::numbers::sqrt2);
        const double pdf = std::exp(-0.5 * x * x) / std::sqrt(2.0 * std::numbers::pi);
        const double step = (cdf - q) / pdf;
        x -= step;
        if (std::fabs(step) <= 1e-16 * std::max(1.0, std::fabs(x))) break;
    }
    if (p > 0.5) x = -x;
    return x;
}

double regularized_incomplete_beta(double x, double a, double b) {
    KVASIR_CHECK(a > 0.0 && b > 0.0 && x >= 0.0 && x <= 1.0, ErrorCode::bad_input, "I_{}({}, {}) is undefined", x, a, b);
    if (x == 0.0 || x == 1.0) return x;
    const double front = std::exp(a * std::log(x) + b * std::log1p(-x) - log_beta(a, b));
    if (x < (a + 1.0) / (a + b + 2.0)) return front * beta_fraction(x, a, b) / a;
    return 1.0 - front * beta_fraction(1.0 - x, b, a) / b;  // the symmetry I_x(a, b) = 1 − I_{1−x}(b, a)
}

double binomial_lower_bound(std::int64_t k, std::int64_t n, double confidence, BinomialBound method) {
    check_trials(k, n, confidence);
    if (method == BinomialBound::wilson) return wilson_bound(k, n, confidence, -1.0);
    if (k == 0) return 0.0;
    return beta_quantile(1.0 - confidence, static_cast<double>(k), static_cast<double>(n - k + 1));
}

double binomial_upper_bound(std::int64_t k, std::int64_t n, double confidence, BinomialBound method) {
    check_trials(k, n, confidence);
    if (method == BinomialBound::wilson) return wilson_bound(k, n, confidence, +1.0);
    if (k == n) return 1.0;
    return beta_quantile(confidence, static_cast<double>(k + 1), static_cast<double>(n - k));
}

std::optional<std::int64_t> binomial_trials_to_decide(double observed, double threshold, double confidence,
                                                      BinomialBound method) {
    KVASIR_CHECK(std::isfinite(observed) && observed >= 0.0 && observed <= 1.0, ErrorCode::bad_input,
                 "an observed rate must be in [0, 1], got {}", observed);
    KVASIR_CHECK(std::isfinite(threshold) && threshold > 0.0 && threshold < 1.0, ErrorCode::bad_input,
                 "a rate threshold must be in (0, 1), got {}", threshold);
    if (observed == threshold) return std::nullopt;
    const bool above = observed > threshold;
    const auto decided = [&](std::int64_t n) {
        const double expected = observed * static_cast<double>(n);
        if (above) {
            const auto k = std::min(n, static_cast<std::int64_t>(std::floor(expected)));
            return binomial_lower_bound(k, n, confidence, method) >= threshold;
        }
        const auto k = std::min(n, static_cast<std::int64_t>(std::ceil(expected)));
        return binomial_upper_bound(k, n, confidence, method) < threshold;
    };
    constexpr std::int64_t kMax = std::int64_t{1} << 40;
    std::int64_t hi = 1;
    while (!decided(hi)) {
        if (hi >= kMax) return std::nullopt;
        hi *= 2;
    }
    std::int64_t lo = hi / 2;  // !decided(lo) or lo == 0
    while (hi - lo > 1) {
        const std::int64_t mid = lo + (hi - lo) / 2;
        (decided(mid) ? hi : lo) = mid;
    }
    return hi;
}

std::int64_t binomial_trials_to_show(double rate, double confidence, BinomialBound method) {
    KVASIR_CHECK(std::isfinite(rate) && rate > 0.0 && rate < 1.0, ErrorCode::bad_input,
                 "a rate to show must be in (0, 1), got {}", rate);
    const auto n = binomial_trials_to_decide(1.0, rate, confidence, method);
    KVASIR_CHECK(n.has_value(), ErrorCode::bad_input, "rate {} cannot be shown at confidence {}", rate, confidence);
    return *n;
}

const char* to_string(BinomialBound b) noexcept { return b == BinomialBound::wilson ? "wilson" : "clopper-pearson"; }

BinomialBound parse_binomial_bound(std::string_view text) {
    if (text == "wilson") return BinomialBound::wilson;
    if (text == "clopper-pearson") return BinomialBound::clopper_pearson;
    fail(ErrorCode::bad_input, "interval '{}': expected \"wilson\" or \"clopper-pearson\"", text);
}

Fraction binomial(std::int64_t successes, std::int64_t n) {
    KVASIR_CHECK(n > 0, ErrorCode::bad_input, "binomial rate over {} trials", n);
    KVASIR_CHECK(successes >= 0 && successes <= n, ErrorCode::bad_input, "binomial: {} successes out of {} trials",
                 successes, n);
    Fraction f;
    f.successes = successes;
    f.n = n;
    const double nd = static_cast<double>(n);
    f.rate = static_cast<double>(successes) / nd;
    // p(1−p) from the integers, s·(n−s)/n², avoids forming 1 − p in floating point.
    const double fail = static_cast<double>(n - successes);
    f.sigma = std::sqrt(static_cast<double>(successes) * fail / (nd * nd * nd));
    return f;
}

PowerFit fit_power_law(std::span<const double> x, std::span<const double> y) {
    KVASIR_CHECK(x.size() == y.size(), ErrorCode::bad_input, "power-law fit: {} x values but {} y values", x.size(),
                 y.size());
    for (std::size_t i = 0; i < x.size(); ++i)
        KVASIR_CHECK(std::isfinite(x[i]) && x[i] > 0, ErrorCode::bad_input,
                     "power-law fit: x[{}] = {} (x must be finite and > 0; depths are 1-based)", i, x[i]);
    PowerFit fit;
    bool poisoned = false;
    std::vector<double> u, v;
    for (std::size_t i = 0; i < x.size(); ++i) {
        if (!std::isfinite(y[i])) {
            poisoned = true;
        } else if (y[i] <= 0) {
            ++fit.points_excluded;
        } else {
            u.push_back(std::log(x[i]));
            v.push_back(std::log(y[i]));
        }
    }
    fit.points_used = static_cast<std::int64_t>(u.size());
    fit.alpha = fit.c = fit.r2 = kNaN;
    if (poisoned || u.size() < 2) return fit;

    const double m = static_cast<double>(u.size());
    const double ub = compensated_sum(u) / m, vb = compensated_sum(v) / m;
    NeumaierSum suu, suv, svv;
    for (std::size_t i = 0; i < u.size(); ++i) {
        const double du = u[i] - ub, dv = v[i] - vb;
        suu.add(du * du);
        suv.add(du * dv);
        svv.add(dv * dv);
    }
    if (!(suu.value() > 0)) return fit;  // all x equal: no slope
    fit.alpha = suv.value() / suu.value();
    const double lnc = vb - fit.alpha * ub;
    fit.c = std::exp(lnc);
    NeumaierSum ss_res;
    for (std::size_t i = 0; i < u.size(); ++i) {
        const double r = v[i] - (lnc + fit.alpha * u[i]);
        ss_res.add(r * r);
    }
    const double ss_tot = svv.value();
    if (ss_tot > 0)
        fit.r2 = 1.0 - ss_res.value() / ss_tot;
    else
        fit.r2 = ss_res.value() == 0 ? 1.0 : 0.0;
    return fit;
}

double growth_alpha(const PowerFit& fit, std::span<const double> y) noexcept {
    if (fit.points_used >= 2) return fit.alpha;  // NaN only if the fit itself failed
    for (double v : y)
        if (!std::isfinite(v)) return std::numeric_limits<double>::quiet_NaN();
    return 0.0;
}

double mean_nll(std::span<const double> nll) {
    KVASIR_CHECK(!nll.empty(), ErrorCode::bad_input, "perplexity over zero tokens");
    return compensated_sum(nll) / static_cast<double>(nll.size());
}

double perplexity_from_nll(std::span<const double> nll) { return std::exp(mean_nll(nll)); }

double perplexity_ratio_minus_one(std::span<const double> candidate, std::span<const double> reference) {
    return std::expm1(mean_nll(candidate) - mean_nll(reference));
}

double nan_max(double a, double b) noexcept {
    return (std::isnan(a) || std::isnan(b)) ? std::numeric_limits<double>::quiet_NaN() : (a > b ? a : b);
}

nlohmann::ordered_json json_double(double x) {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    return x;
}

nlohmann::ordered_json json_doubles(const std::vector<double>& xs) {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (double x : xs) a.push_back(json_double(x));
    return a;
}

nlohmann::ordered_json to_json(const Summary& s) {
    nlohmann::ordered_json j;
    j["count"] = s.count;
    j["mean"] = json_double(s.mean);
    j["median"] = json_double(s.median);
    j["p90"] = json_double(s.p90);
    j["p99"] = json_double(s.p99);
    j["p999"] = json_double(s.p999);
    j["min"] = json_double(s.min);
    j["max"] = json_double(s.max);
    return j;
}

nlohmann::ordered_json to_json(const Fraction& f) {
    nlohmann::ordered_json j;
    j["successes"] = f.successes;
    j["n"] = f.n;
    j["rate"] = json_double(f.rate);
    j["sigma"] = json_double(f.sigma);
    return j;
}

nlohmann::ordered_json to_json(const PowerFit& p) {
    nlohmann::ordered_json j;
    j["alpha"] = json_double(p.alpha);
    j["c"] = json_double(p.c);
    j["r2"] = json_double(p.r2);
    j["points_used"] = p.points_used;
    j["points_excluded"] = p.points_excluded;
    return j;
}

}  // namespace kvasir
