#include "kvasir/steps/protocol_steps.hpp"

#include "kvasir/arch/architecture.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/core/sha256.hpp"
#include "kvasir/model/safetensors.hpp"
#include "kvasir/model/tokenizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <cstring>
#include <filesystem>
#include <limits>

namespace kvasir {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// Token ids
// ---------------------------------------------------------------------------

namespace {


// The offending text, printable and short, so the error stays one line.
std::string printable(std::string_view s) {
    std::string out;
    const std::size_t n = std::min<std::size_t>(s.size(), 24);
    for (std::size_t i = 0; i < n; ++i) {
        const auto b = static_cast<unsigned char>(s[i]);
        if (b >= 0x20 && b < 0x7f && b != '\'' && b != '\\')
            out += static_cast<char>(b);
        else
            out += fmt::format("\\x{:02x}", b);
    }
    if (s.size() > n) out += "...";
    return out;
}

}  // namespace

std::vector<std::int32_t> parse_token_ids(std::string_view text, const std::string& name, std::int64_t vocab) {
    std::vector<std::int32_t> ids;
    std::size_t i = 0, line = 1, line_start = 0;
    while (i < text.size()) {
        if (is_ascii_space(text[i])) {
            if (text[i] == '\n') {
                ++line;
                line_start = i + 1;
            }
            ++i;
            continue;
        }
        const std::size_t begin = i;
        while (i < text.size() && !is_ascii_space(text[i])) ++i;
        const std::string_view tok = text.substr(begin, i - begin);
        const std::size_t col = begin - line_start + 1;
        const std::size_t index = ids.size() + 1;
        const bool digits = std::all_of(tok.begin(), tok.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
        KVASIR_CHECK(digits, ErrorCode::bad_input, "{}:{}:{}: token {} '{}' is not a token id (non-negative decimal integer)",
                     name, line, col, index, printable(tok));
        // More than 10 digits cannot be an int32 id; checking the length first keeps the parse overflow-free.
        std::int64_t v = 0;
        const bool fits = tok.size() <= 10;
        if (fits)
            for (char ch : tok) v = v * 10 + (ch - '0');
        KVASIR_CHECK(fits && v < vocab, ErrorCode::bad_input, "{}:{}:{}: token {} id {} is outside the vocabulary [0, {})",
                     name, line, col, index, printable(tok), vocab);
        ids.push_back(static_cast<std::int32_t>(v));
    }
    KVASIR_CHECK(!ids.empty(), ErrorCode::bad_input, "{}: no token ids", name);
    return ids;
}

TokenSequence read_token_file(const std::string& path, std::int64_t vocab) {
    TokenSequence s;
    s.ids = parse_token_ids(read_text_file(path), path, vocab);
    s.source = fmt::format("file {}", path);
    return s;
}

TokenSequence seeded_tokens(std::uint64_t seed, std::int64_t n, std::int64_t vocab) {
    KVASIR_CHECK(n >= 1 && n <= (std::int64_t{1} << 20), ErrorCode::bad_input, "--tokens must be in 1..{}, got {}",
                 std::int64_t{1} << 20, n);
    KVASIR_CHECK(vocab >= 1, ErrorCode::bad_input, "seeded tokens: empty vocabulary");
    const Tensor u = seeded_uniform(seed, "steps/tokens", {n}, 0.0, 1.0, DType::f64, 1);
    TokenSequence s;
    s.ids.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
        const auto id = static_cast<std::int64_t>(std::floor(u.at(i) * static_cast<double>(vocab)));
        s.ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(std::clamp<std::int64_t>(id, 0, vocab - 1));
    }
    s.source = fmt::format("seeded: kvasir-rng/1 seed {}, stream 'steps/tokens', {} ids uniform in [0, {})", seed, n, vocab);
    return s;
}

std::string reference_data_path(const std::string& model_path) {
    std::error_code ec;
    const fs::path p(model_path);
    fs::path cand;
    if (fs::is_directory(p, ec))
        cand = p / "reference.safetensors";
    else if (p.extension() == ".safetensors")
        cand = p.parent_path() / "reference.safetensors";
    else if (p.extension() == ".gguf")
        cand = fs::path(p).replace_extension(".reference.safetensors");
    else
        return {};
    if (!fs::is_regular_file(cand, ec) || cand == p) return {};
    return cand.string();
}

TokenSequence resolve_tokens(const Model& model, const TokenOptions& o) {
    const std::int64_t vocab = model.config().vocab_size;
    if (!o.text_file.empty()) {
        KVASIR_CHECK(o.file.empty() && o.count == 0, ErrorCode::bad_input, "--text excludes --tokens and --tokens-file");
        const Tokenizer tok = load_tokenizer_for(model.path(), o.tokenizer);
        const std::string text = read_text_file(o.text_file);
        TokenSequence s;
        s.ids = tok.encode(text);
        KVASIR_CHECK(!s.ids.empty(), ErrorCode::bad_input, "{}: the text gives no tokens", o.text_file);
        s.source = fmt::format("text {} (sha256 {}, {} bytes, {} tokens by {})", o.text_file, sha256_hex(text), text.size(),
                               s.ids.size(), tok.source());
        return s;
    }
    if (!o.file.empty()) {
        KVASIR_CHECK(o.count == 0, ErrorCode::bad_input, "--tokens and --tokens-file exclude each other");
        return read_token_file(o.file, vocab);
    }
    if (o.count != 0) return seeded_tokens(o.seed, o.count, vocab);
    const std::string ref = reference_data_path(model.path());
    if (ref.empty()) return seeded_tokens(o.seed, o.default_count, vocab);
    const SafetensorsFile f = SafetensorsFile::open(ref);
    KVASIR_CHECK(f.contains("input_ids"), ErrorCode::bad_input, "{}: no tensor 'input_ids' (use --tokens or --tokens-file)", ref);
    const TensorView v = f.view("input_ids");
    KVASIR_CHECK(v.dtype == DType::i32 && v.rank() == 1 && v.numel() >= 1, ErrorCode::bad_input,
                 "{}: input_ids must be a non-empty I32 vector, got {} {}", ref, dtype_name(v.dtype), shape_str(v.shape));
    TokenSequence s;
    for (std::int64_t i = 0; i < v.numel(); ++i) {
        const double id = v.at(i);
        KVASIR_CHECK(id >= 0 && id < static_cast<double>(vocab), ErrorCode::bad_input,
                     "{}: input_ids[{}] = {} is outside the vocabulary [0, {})", ref, i, id, vocab);
        s.ids.push_back(static_cast<std::int32_t>(id));
    }
    s.source = fmt::format("reference data {} (input_ids, the prompt transformers ran)", ref);
    return s;
}

// ---------------------------------------------------------------------------
// Common configuration
// ---------------------------------------------------------------------------

void StepCommon::validate() const {
    KVASIR_CHECK(model != nullptr, ErrorCode::bad_input, "no model given");
    const ModelConfig& c = model->config();
    (void)arch::architecture_for(c);  // a model the forward pass does not implement is refused before any step
    KVASIR_CHECK(!tokens.ids.empty(), ErrorCode::bad_input, "no token ids ({})", tokens.source);
    for (std::size_t i = 0; i < tokens.ids.size(); ++i)
        KVASIR_CHECK(tokens.ids[i] >= 0 && tokens.ids[i] < c.vocab_size, ErrorCode::bad_input,
                     "token {} at position {} of {} is outside the vocabulary [0, {}) of {}", tokens.ids[i], i,
                     tokens.source, c.vocab_size, model->path());
}

std::uint64_t available_memory_bytes() {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    std::uint64_t kib = 0;
    while (in >> key >> kib >> unit)
        if (key == "MemAvailable:") return kib * 1024;
    return 0;
}

std::uint64_t step_memory_estimate(const ModelConfig& c, std::int64_t tokens, std::size_t nodes, std::int64_t window) {
    // In long double: a hostile token count must not overflow the estimate itself.
    const long double t = static_cast<long double>(std::max<std::int64_t>(tokens, 0));
    const long double w = window > 0 ? std::min(t, static_cast<long double>(window)) : t;
    const long double v = static_cast<long double>(c.vocab_size), h = static_cast<long double>(c.hidden_size);
    const long double layers = static_cast<long double>(c.num_layers);
    const long double kv = static_cast<long double>(c.num_kv_heads) * static_cast<long double>(c.attention_width());
    const long double width = std::max({h, static_cast<long double>(c.q_dim()), static_cast<long double>(c.intermediate_size),
                                        static_cast<long double>(c.moe_intermediate_size) * std::max<std::int64_t>(c.router.top_k, 1)});
    const long double per_node = 8.0L * (t * 2.0L * v + w * (layers * h + layers * 2.0L * kv + 8.0L * width));
    const long double all = per_node * static_cast<long double>(std::max<std::size_t>(nodes, 1));
    return all >= 1.8e19L ? std::numeric_limits<std::uint64_t>::max() : static_cast<std::uint64_t>(all);
}

void check_step_memory(const StepCommon& c, std::size_t nodes, const std::string& what, std::int64_t window) {
    KVASIR_CHECK(c.model != nullptr, ErrorCode::bad_input, "no model given");
    const std::uint64_t avail = available_memory_bytes();
    if (avail == 0) return;
    const auto tokens = static_cast<std::int64_t>(c.tokens.ids.size());
    const std::uint64_t need = step_memory_estimate(c.model->config(), tokens, nodes, window);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    KVASIR_CHECK(need <= avail, ErrorCode::bad_input,
                 "{}: {} tokens ({} node runs held at once) need at least {:.3g} GiB (logits, residuals and KV cache of {}, in f64), but {:.3g} "
                 "GiB is available: use fewer tokens or nodes",
                 what, tokens, nodes, static_cast<double>(need) / gib, c.model->path(), static_cast<double>(avail) / gib);
}

nlohmann::ordered_json common_json(const StepCommon& c) {
    nlohmann::ordered_json j;
    j["model"] = c.model->path();
    j["model_fingerprint"] = c.model->fingerprint();
    j["architecture"] = architecture_name(c.model->config().architecture);
    j["layers"] = c.model->config().num_layers;
    j["tokens_source"] = c.tokens.source;
    j["token_count"] = c.tokens.ids.size();
    j["seed"] = c.seed;
    j["repeat"] = c.repeat;
    return j;
}

// ---------------------------------------------------------------------------
// Self non-determinism
// ---------------------------------------------------------------------------

namespace {
// NaN-sticky maximum: once a NaN is seen nothing can look better.
double worse(double a, double b) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
    return a > b ? a : b;
}
}  // namespace

SelfCheck self_check_of(const std::string& node, const RunToRunDelta& d) {
    SelfCheck s;
    s.node = node;
    s.bit_identical = d.bit_identical;
    s.max_abs = worse(worse(d.logits_max_abs, d.final_max_abs), worse(d.hidden_max_abs, d.router_logits_max_abs));
    s.routing_rows_differing = d.routing_rows_differing;
    s.compared = "forward pass: hidden states, router logits, routing, final hidden, logits";
    return s;
}

SelfCheck self_check_error(const std::string& node, const std::string& error) {
    SelfCheck s;
    s.node = node;
    s.error = error;
    return s;
}

nlohmann::ordered_json to_json(const SelfCheck& s) {
    nlohmann::ordered_json j;
    j["node"] = s.node;
    if (!s.error.empty()) {
        j["error"] = s.error;
        return j;
    }
    j["bit_identical"] = s.bit_identical;
    j["max_abs"] = json_double(s.max_abs);
    j["routing_rows_differing"] = s.routing_rows_differing;
    j["tokens_differing"] = s.tokens_differing;
    j["compared"] = s.compared;
    return j;
}

double max_abs_difference(const TensorView& a, const TensorView& b) {
    KVASIR_CHECK(a.numel() == b.numel(), ErrorCode::bad_input, "max|Δ|: {} and {} have different sizes", shape_str(a.shape),
                 shape_str(b.shape));
    double m = 0;
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
        m = std::max(m, std::fabs(x - y));
    }
    return m;
}

bool same_bits(const TensorView& a, const TensorView& b) {
    if (a.dtype != b.dtype || a.shape != b.shape) return false;
    const std::size_t n = static_cast<std::size_t>(a.numel()) * dtype_size(a.dtype);
    return n == 0 || std::memcmp(a.data, b.data, n) == 0;
}

// ---------------------------------------------------------------------------
// Pure statistics
// ---------------------------------------------------------------------------

namespace {

void check_logits_2d(const char* what, const TensorView& v) {
    KVASIR_CHECK(v.rank() == 2 && v.shape[0] >= 1 && v.shape[1] >= 1, ErrorCode::bad_input,
                 "{}: logits must be [T, V] with T, V ≥ 1, got {}", what, shape_str(v.shape));
}

void check_pair(const char* what, const TensorView& a, const TensorView& b) {
    check_logits_2d(what, a);
    KVASIR_CHECK(a.shape == b.shape, ErrorCode::bad_input, "{}: reference {} and candidate {} differ in shape", what,
                 shape_str(a.shape), shape_str(b.shape));
}

std::vector<double> row_of(const TensorView& v, std::int64_t r) {
    const std::int64_t n = v.shape.back();
    std::vector<double> out(static_cast<std::size_t>(n));
    for (std::int64_t j = 0; j < n; ++j) out[static_cast<std::size_t>(j)] = v.at(r * n + j);
    return out;
}

std::int32_t argmax_of(std::span<const double> row) {
    std::int64_t best = -1;
    for (std::size_t j = 0; j < row.size(); ++j) {
        if (std::isnan(row[j])) continue;
        if (best < 0 || row[j] > row[static_cast<std::size_t>(best)]) best = static_cast<std::int64_t>(j);
    }
    return static_cast<std::int32_t>(best);
}

}  // namespace

std::vector<std::int32_t> argmax_rows(const TensorView& logits) {
    check_logits_2d("argmax", logits);
    std::vector<std::int32_t> out;
    for (std::int64_t r = 0; r < logits.shape[0]; ++r) out.push_back(argmax_of(row_of(logits, r)));
    return out;
}

std::vector<double> top_margins(const TensorView& logits) {
    check_logits_2d("margins", logits);
    std::vector<double> out;
    for (std::int64_t r = 0; r < logits.shape[0]; ++r) {
        double t1 = -std::numeric_limits<double>::infinity(), t2 = t1;
        int seen = 0;
        for (double x : row_of(logits, r)) {
            if (std::isnan(x)) continue;
            ++seen;
            if (x > t1) {
                t2 = t1;
                t1 = x;
            } else if (x > t2) {
                t2 = x;
            }
        }
        out.push_back(seen >= 2 ? t1 - t2 : std::numeric_limits<double>::quiet_NaN());
    }
    return out;
}

Fraction top1_agreement(const TensorView& ref_logits, const TensorView& cand_logits) {
    check_pair("top-1 agreement", ref_logits, cand_logits);
    const auto a = argmax_rows(ref_logits), b = argmax_rows(cand_logits);
    std::int64_t same = 0;
    for (std::size_t i = 0; i < a.size(); ++i) same += (a[i] >= 0 && a[i] == b[i]) ? 1 : 0;
    return binomial(same, static_cast<std::int64_t>(a.size()));
}

std::int64_t first_divergence(std::span<const std::int32_t> ref, std::span<const std::int32_t> cand) {
    const std::size_t n = std::min(ref.size(), cand.size());
    for (std::size_t i = 0; i < n; ++i)
        if (ref[i] != cand[i]) return static_cast<std::int64_t>(i);
    return ref.size() == cand.size() ? -1 : static_cast<std::int64_t>(n);
}

PositionDivergence logit_divergence(const TensorView& ref_logits, const TensorView& cand_logits) {
    check_pair("logit divergence", ref_logits, cand_logits);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    PositionDivergence d;
    for (std::int64_t t = 0; t < ref_logits.shape[0]; ++t) {
        const std::vector<double> r = row_of(ref_logits, t), c = row_of(cand_logits, t);
        double linf = 0;
        NeumaierSum sq;
        bool poisoned = false;
        for (std::size_t j = 0; j < r.size(); ++j) {
            const bool fr = std::isfinite(r[j]), fc = std::isfinite(c[j]);
            if (fr && fc) {
                const double x = c[j] - r[j];
                linf = std::max(linf, std::fabs(x));
                sq.add(x * x);
            } else if (!(std::isnan(r[j]) && std::isnan(c[j])) && !(std::isinf(r[j]) && r[j] == c[j])) {
                poisoned = true;  // a non-finite mismatch: no distance can describe it
            }
        }
        d.linf.push_back(poisoned ? nan : linf);
        d.l2.push_back(poisoned ? nan : std::sqrt(sq.value()));
        d.kl.push_back(kl_divergence_from_logits(r, c));
        const std::int32_t a = argmax_of(r);
        if (a < 0) {
            d.dp_top.push_back(nan);
        } else {
            const std::vector<double> lr = log_softmax(r), lc = log_softmax(c);
            d.dp_top.push_back(std::exp(lc[static_cast<std::size_t>(a)]) - std::exp(lr[static_cast<std::size_t>(a)]));
        }
    }
    return d;
}

double rms(std::span<const double> xs) {
    if (xs.empty()) return std::numeric_limits<double>::quiet_NaN();
    NeumaierSum s;
    for (double x : xs) s.add(x * x);
    return std::sqrt(s.value() / static_cast<double>(xs.size()));
}

double relative_l2(const TensorView& ref, const TensorView& cand) {
    KVASIR_CHECK(ref.numel() == cand.numel() && ref.numel() >= 1, ErrorCode::bad_input,
                 "relative delta: {} and {} differ in size", shape_str(ref.shape), shape_str(cand.shape));
    // compare() already gives Σ Δ² / Σ ref² (nmse) with compensated, rescaled
    // sums and NaN on a non-finite mismatch; the relative L2 is its root.
    const CompareStats s = compare(ref, cand);
    if (s.nonfinite_mismatch > 0) return std::numeric_limits<double>::quiet_NaN();
    return std::sqrt(s.nmse);
}

namespace {

// The k-th minus the (k+1)-th of `v` (+inf when it has no (k+1)-th).
double kth_gap(std::vector<double> v, std::int64_t k) {
    if (static_cast<std::int64_t>(v.size()) <= k) return std::numeric_limits<double>::infinity();
    std::sort(v.begin(), v.end(), std::greater<>());
    return v[static_cast<std::size_t>(k - 1)] - v[static_cast<std::size_t>(k)];
}

// How far one token's selection scores are from another choice. Grouped top-k (DeepseekV3TopkRouter): a
// group is scored by the sum of its two best scores and the topk_group best groups are kept — a decision
// that flips when the topk_group-th and the next group swap — then the top-k among the kept groups'
// experts; the gap is the smaller of the two margins.
double selection_gap(const std::vector<double>& score, const RouterConfig& router) {
    const std::int64_t e = static_cast<std::int64_t>(score.size()), k = router.top_k, ng = router.n_group;
    if (ng <= 1) return kth_gap(score, k);
    const std::int64_t per = e / ng;
    std::vector<double> group(static_cast<std::size_t>(ng));
    for (std::int64_t g = 0; g < ng; ++g) {
        std::vector<double> in(score.begin() + g * per, score.begin() + (g + 1) * per);
        std::partial_sort(in.begin(), in.begin() + 2, in.end(), std::greater<>());
        group[static_cast<std::size_t>(g)] = in[0] + in[1];
    }
    std::vector<std::int64_t> order(static_cast<std::size_t>(ng));
    for (std::int64_t g = 0; g < ng; ++g) order[static_cast<std::size_t>(g)] = g;
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
        return group[static_cast<std::size_t>(a)] > group[static_cast<std::size_t>(b)];
    });
    std::vector<double> kept;
    for (std::int64_t i = 0; i < router.topk_group; ++i) {
        const std::int64_t g = order[static_cast<std::size_t>(i)];
        kept.insert(kept.end(), score.begin() + g * per, score.begin() + (g + 1) * per);
    }
    return std::min(kth_gap(group, router.topk_group), kth_gap(kept, k));
}

}  // namespace

std::vector<double> router_gaps(const TensorView& router_logits, const RouterConfig& router, const TensorView* bias) {
    KVASIR_CHECK(router_logits.rank() == 2, ErrorCode::bad_input, "router gaps: logits must be [T, E], got {}",
                 shape_str(router_logits.shape));
    const std::int64_t e = router_logits.shape[1];
    const std::int64_t k = router.top_k;
    KVASIR_CHECK(k >= 1 && k <= e, ErrorCode::bad_input, "router gaps: top-k {} of {} experts", k, e);
    if (bias != nullptr)
        KVASIR_CHECK(bias->numel() == e, ErrorCode::bad_input, "router gaps: bias of {} for {} experts", bias->numel(), e);
    std::vector<double> gaps;
    for (std::int64_t t = 0; t < router_logits.shape[0]; ++t) {
        std::vector<double> row = row_of(router_logits, t), score(row.size());
        const bool any_nan = std::any_of(row.begin(), row.end(), [](double x) { return std::isnan(x); });
        if (any_nan) {
            gaps.push_back(std::numeric_limits<double>::quiet_NaN());
            continue;
        }
        if (router.scoring == RouterScoring::softmax) {
            const std::vector<double> ls = log_softmax(row);
            for (std::size_t j = 0; j < row.size(); ++j) score[j] = std::exp(ls[j]);
        } else {
            for (std::size_t j = 0; j < row.size(); ++j)
                score[j] = 1.0 / (1.0 + std::exp(-row[j])) + (bias != nullptr ? bias->at(static_cast<std::int64_t>(j)) : 0.0);
        }
        gaps.push_back(selection_gap(score, router));
    }
    return gaps;
}

std::vector<double> token_nll(const TensorView& logits, std::span<const std::int32_t> targets) {
    check_logits_2d("nll", logits);
    const std::int64_t v = logits.shape[1];
    KVASIR_CHECK(static_cast<std::int64_t>(targets.size()) <= logits.shape[0], ErrorCode::bad_input,
                 "nll: {} targets for {} rows", targets.size(), logits.shape[0]);
    std::vector<double> out;
    for (std::size_t t = 0; t < targets.size(); ++t) {
        KVASIR_CHECK(targets[t] >= 0 && targets[t] < v, ErrorCode::bad_input, "nll: target {} at {} outside [0, {})",
                     targets[t], t, v);
        const std::vector<double> ls = log_softmax(row_of(logits, static_cast<std::int64_t>(t)));
        out.push_back(-ls[static_cast<std::size_t>(targets[t])]);
    }
    return out;
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace kvasir
