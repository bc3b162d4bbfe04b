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


// ---------------------------------------------------------------------------
// Self non-determinism
// ---------------------------------------------------------------------------




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
        std::vector<double> row = logits_row(router_logits, t), score(row.size());
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

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace kvasir
