// f64 statistics for protocol steps 2–6 (drift fit, logit divergence,
// decision agreement, perplexity).
//
// Conventions shared by every function here:
//   * all arithmetic is double; sums are Neumaier-compensated (NeumaierSum);
//   * NaN in an input propagates to the result as NaN, never dropped, so a
//     check on the result with within()/at_least() (metrics.hpp) fails;
//   * structurally impossible requests (mismatched lengths, nothing to average
//     where the caller must have had data) throw Error(bad_input).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string_view>
#include <span>
#include <vector>

namespace kvasir {

// Neumaier's improved Kahan summation: the running compensation catches the
// low-order bits lost in each addition, whichever of sum and term is larger.
// Error is O(ε)·Σ|x_i| independent of the count — what keeps a million-term
// NMSE or mean honest. Once the running sum is non-finite the compensation is
// meaningless (inf − inf) and value() returns the plain sum (inf or NaN).
class NeumaierSum {
public:
    void add(double x) noexcept;
    double value() const noexcept;

private:
    double sum_ = 0;
    double comp_ = 0;
};
double compensated_sum(std::span<const double> xs) noexcept;

// Quantile q ∈ [0,1] of an ASCENDING-sorted, NaN-free, non-empty sample by
// linear interpolation between closest ranks — Hyndman & Fan type 7, numpy's
// default method='linear' — evaluated with numpy's exact floating-point steps
// so results equal numpy.quantile(x, q) bit for bit:
//   h = (n − 1)·q                    (one rounding, as numpy computes it)
//   h >= n−1 → x[n−1];  else i = floor(h), g = h − i and
//   g <  0.5 → x[i] + (x[i+1] − x[i])·g
//   g >= 0.5 → x[i+1] − (x[i+1] − x[i])·(1 − g)
// (np.percentile(x, 99.9) first divides by 100 and may differ in the last bit
// from quantile(x, 0.999), which is what this implements.) Throws bad_input
// for an empty sample or q outside [0,1] (q NaN included).
double quantile_sorted(std::span<const double> sorted, double q);

struct Summary {
    std::int64_t count = 0;  // number of input values (NaN ones included)
    double mean = 0;         // compensated sum / count
    double median = 0;       // quantile 0.5 (for even count: lerp at g = 0.5)
    double p90 = 0;          // quantile 0.9
    double p99 = 0;          // quantile 0.99
    double p999 = 0;         // quantile 0.999
    double min = 0;
    double max = 0;
};
// Any NaN in the input → every statistic NaN (count still the input size):
// a NaN KL at one position must not disappear from the max. An EMPTY input
// gives count 0 and every statistic NaN (e.g. "KL over border tokens" when
// there are none) — NaN, so a gate on it fails rather than passing vacuously.
// ±inf are ordinary ordered values (max = inf, mean possibly inf or NaN).
Summary summarize(std::span<const double> xs);

// logsumexp(x) = m + log1p(Σ_{i≠j} exp(x_i − m)), m = x_j = max x (log1p of
// the others is more accurate than log of a sum that includes the 1 from the
// max). NaN anywhere → NaN; any +inf → +inf; all −inf → −inf. Empty →
// bad_input.
double logsumexp(std::span<const double> logits);

// log_softmax(x)_i = x_i − logsumexp(x). −inf logits (masked tokens) give
// −inf (probability 0). A NaN or +inf logit, or all logits −inf (no
// distribution), gives an all-NaN result. Empty → bad_input. The span form
// writes into `out`, which must have the same length (bad_input otherwise).
std::vector<double> log_softmax(std::span<const double> logits);
void log_softmax(std::span<const double> logits, std::span<double> out);

// KL(P_ref ‖ P_cand) in nats, P = softmax(logits), both computed here with the
// stable log_softmax above. Evaluated term by term as
//   KL = Σ_i p_i · (d_i + expm1(−d_i)),   d_i = log p_i − log q_i,
// which equals Σ p_i d_i because Σ p_i·expm1(−d_i) = Σ q_i − Σ p_i = 0. Why
// this form: every term is ≥ 0 (d + e^−d − 1 ≥ 0), so there is no
// cancellation between positive and negative terms of size |d|, the result is
// ≥ 0 without a fudge, and identical logits give d_i = 0 → exactly 0. (For
// d_i < −1 the term is evaluated as p_i·d_i + (q_i − p_i), the same value,
// because expm1(−d_i) can overflow where p_i underflows.) The
// final max(0, ·) clamp is kept only as a guard and never hides NaN.
// p_i = 0 (−inf logit): 0·log 0 = 0, and the term is its limit q_i (the
// q − p part of the identity); q_i = 0 < p_i gives +inf.
// Any NaN / +inf logit → NaN. Lengths must be equal and non-zero (bad_input).
double kl_divergence_from_logits(std::span<const double> ref_logits, std::span<const double> cand_logits);

struct Fraction {
    std::int64_t successes = 0;
    std::int64_t n = 0;
    double rate = 0;   // successes / n
    double sigma = 0;  // binomial standard error sqrt(rate·(1−rate)/n); 0 at rate 0 or 1
};
// n <= 0, successes < 0 or successes > n → Error(bad_input): a rate over no
// trials is not 100% agreement.
Fraction binomial(std::int64_t successes, std::int64_t n);

// One-sided confidence bounds of a binomial proportion from `successes` of `n` trials, at `confidence`
// in (0.5, 1) (0.95: the true rate is ≥ the lower bound with 95 % confidence):
//   wilson           the Wilson score bound with z = Φ⁻¹(confidence):
//                    (p̂ + z²/2n ∓ z·sqrt(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n)
//   clopper_pearson  the exact bound from the beta distribution: lower = B⁻¹(1 − c; k, n − k + 1)
//                    (0 at k = 0), upper = B⁻¹(c; k + 1, n − k) (1 at k = n)
// — each equals the bound of the two-sided interval at level 2c − 1 (statsmodels' proportion_confint with
// alpha = 2(1 − c), method "wilson" / "beta"; tests/metrics/test_stats.cpp checks them against its values).
// The arguments of binomial(); a confidence outside (0.5, 1) → Error(bad_input).
enum class BinomialBound { wilson, clopper_pearson };
double binomial_lower_bound(std::int64_t successes, std::int64_t n, double confidence, BinomialBound method);
double binomial_upper_bound(std::int64_t successes, std::int64_t n, double confidence, BinomialBound method);
// The fewest trials, all successes, whose lower bound reaches `rate` in (0, 1) at `confidence`: how many
// tokens a criterion "agreement ≥ rate" needs before a perfect node can pass it (e.g. Wilson, 95 %:
// 0.99 needs 268). Error(bad_input) for a rate outside (0, 1); at most 2^40.
std::int64_t binomial_trials_to_show(double rate, double confidence, BinomialBound method);
// The fewest trials N at which a node that keeps agreeing at rate `observed` (in [0, 1]) is DECIDED
// against `threshold` (in (0, 1)) at `confidence`: observed > threshold → the lower bound of
// ⌊observed·N⌋ of N reaches threshold (shown to meet it); observed < threshold → the upper bound of
// ⌈observed·N⌉ of N falls below threshold (shown to miss it). nullopt when it never is: observed ==
// threshold, or more than 2^40 trials. Found by doubling then bisection; ⌊·⌋/⌈·⌉ make the bound a
// little non-monotone in N, so the figure is exact to within a few trials (a sizing figure, not a
// verdict). binomial_trials_to_show(rate) == *binomial_trials_to_decide(1, rate).
std::optional<std::int64_t> binomial_trials_to_decide(double observed, double threshold, double confidence,
                                                      BinomialBound method);
// "wilson", "clopper-pearson"; parse: Error(bad_input) naming the accepted names.
const char* to_string(BinomialBound b) noexcept;
BinomialBound parse_binomial_bound(std::string_view text);

// Φ⁻¹(p), the standard normal quantile, p in (0, 1), to ~1e-15 relative (a rational first guess refined by
// Newton steps on erfc); Error(bad_input) outside (0, 1).
double normal_quantile(double p);
// I_x(a, b), the regularised incomplete beta function (a, b > 0, x in [0, 1]), by its continued fraction.
double regularized_incomplete_beta(double x, double a, double b);

struct PowerFit {
    double alpha = 0;             // exponent α of y ≈ c·x^α
    double c = 0;                 // prefactor
    double r2 = 0;                // coefficient of determination of the log-log fit
    std::int64_t points_used = 0;
    std::int64_t points_excluded = 0;  // points with y <= 0 (no logarithm)
};
// Ordinary least squares of ln y on ln x (centred sums, compensated):
//   α = Σ(u−ū)(v−v̄) / Σ(u−ū)²,  ln c = v̄ − α·ū,  R² = 1 − SS_res/SS_tot,
// u = ln x, v = ln y. Points with y <= 0 are excluded and counted (a layer
// whose delta is exactly 0, e.g. bit-identical backends, has no logarithm).
// Fewer than 2 used points, or all used x equal, → α, c and R² NaN (no slope).
// SS_tot = 0 (all used y equal) → R² = 1 if the fit is exact, else 0.
// x must be finite and > 0 (depths are 1-based; x = 0 is a caller bug) and
// the lengths equal, else Error(bad_input). A NaN or ±inf y → α, c, R² NaN:
// a backend that blew up at some layer must not get a plausible exponent.
PowerFit fit_power_law(std::span<const double> x, std::span<const double> y);
// The growth exponent a drift series is judged and reported by: the fitted α
// of `fit` (fit_power_law of `y`); 0 when fewer than two points are > 0 (a
// bit-identical node, or one whose error sits in a single layer, has no
// growth); NaN when a y is not finite (a blown-up layer has no exponent).
double growth_alpha(const PowerFit& fit, std::span<const double> y) noexcept;

// exp(mean NLL) over per-token negative log-likelihoods (nats); values used as
// given (NaN → NaN). Empty → Error(bad_input).
double perplexity_from_nll(std::span<const double> nll);
// The mean of the per-token NLLs (compensated sum), its log-perplexity.
double mean_nll(std::span<const double> nll);
// ppl(candidate) / ppl(reference) − 1 = expm1(mean_nll(c) − mean_nll(r)):
// finite where the perplexities themselves overflow (a mean NLL above ~709
// nats), and exact to rounding for ratios near 1, where ppl_c/ppl_r − 1
// would cancel.
double perplexity_ratio_minus_one(std::span<const double> candidate, std::span<const double> reference);

// A double as JSON: finite values as numbers (shortest round-trip form),
// NaN / +inf / -inf as the strings "nan" / "inf" / "-inf" (JSON has no
// non-finite numbers, and silently writing null would hide a failure).
nlohmann::ordered_json json_double(double x);
// A JSON array of doubles, each as json_double writes it.
nlohmann::ordered_json json_doubles(const std::vector<double>& xs);

// The larger of a and b, NaN-sticky: once a NaN is seen nothing can look
// better (a running "worst" over measurements that may be non-finite).
double nan_max(double a, double b) noexcept;

// JSON views (doubles via json_double: non-finite as "nan"/"inf"/"-inf").
// Keys in declaration order.
nlohmann::ordered_json to_json(const Summary& s);
nlohmann::ordered_json to_json(const Fraction& f);
nlohmann::ordered_json to_json(const PowerFit& p);

}  // namespace kvasir
