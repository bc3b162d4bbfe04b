#include "kvasir/audit/protocol.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/model/tokenizer.hpp"
#include "kvasir/steps/perplexity.hpp"  // kMinPerplexityContext, kMaxPerplexityContext

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <regex>
#include <set>

namespace kvasir {

// ============================================================================
// Criteria
// ============================================================================

const char* to_string(Direction d) noexcept { return d == Direction::max ? "max" : "min"; }

const char* margin_unit(MarginScale s) noexcept { return s == MarginScale::linear ? "units" : "decades"; }

const char* to_string(Tier t) noexcept { return t == Tier::sensitive ? "sensitive" : "tolerant"; }

namespace {
// The built-in catalogue, then what registered steps declare (register_protocol_step).
std::vector<CriterionInfo>& catalog_storage() {
    using D = Direction;
    using S = MarginScale;
    static std::vector<CriterionInfo> catalog = {
        {"ops.max_rel", "ops", D::max, S::log, false, true,
         "step 1: guarded per-element max relative delta of each op's output vs the reference (worst op unless a per-op tolerance names it)"},
        {"ops.cosine_min", "ops", D::min, S::complement_log, false, true,
         "step 1: cosine of each op's output with the reference's (worst op unless a per-op tolerance names it)"},
        {"shard.max_rel", "ops", D::max, S::log, false, true,
         "step 1: MoE block split across simulated nodes and recombined vs monolithic, same node (accumulation order only)"},
        {"router.flips_max", "ops", D::max, S::linear, true, false,
         "step 1: rows of the router ops (router_softmax, router_sigmoid) whose top-k expert SET differs from the reference's: a router authority must pick the oracle's experts"},
        {"bound.violations_max", "ops", D::max, S::linear, true, false,
         "step 1: matmul, softmax, rmsnorm and causal_conv1d outputs outside their rigorous a-priori error bounds (Higham 3.1: storage rounding + gamma_K of the accumulator + element-wise roundings + output rounding, from the oracle's exact inputs), summed over the ops: one is proof of a wrong result"},
        {"bound.probable_violations_max", "ops", D::max, S::linear, true, false,
         "step 1: matmul, softmax, rmsnorm and causal_conv1d outputs outside the same bounds with the probabilistic gamma of their sums (Higham & Mary 2019, lambda 8: an honest element lands outside with probability < 2.6e-14) in place of gamma_K: ~sqrt(K) tighter"},
        {"drift.final_rel", "drift", D::max, S::log, false, true,
         "step 2: normwise relative delta ||h_cand - h_ref|| / ||h_ref|| of the residual stream after the last layer"},
        {"drift.alpha_max", "drift", D::max, S::linear, false, true,
         "step 2: fitted growth exponent alpha of drift(L) ~ L^alpha over depth (0.5 incoherent, 1 coherent); 0 when drift is identically zero"},
        {"logits.kl_p99", "logits", D::max, S::log, false, true,
         "step 3: 99th percentile over positions of KL(P_ref || P_cand) of the next-token distributions, in nats"},
        {"logits.kl_lower_p99", "logits", D::max, S::log, false, false,
         "step 3: 99th percentile over positions of a rigorous lower bound of KL(P_ref || P_cand) from the tokens "
         "both nodes hold (a compact capture's top-K; KL itself when both rows are full), in nats: above KL's "
         "tolerance is a certain failure"},
        {"logits.linf_max", "logits", D::max, S::log, false, true,
         "step 3: max over positions of the L-infinity norm of the logit delta"},
        {"logits.top_logprob_delta_max", "logits", D::max, S::log, false, false,
         "step 3: max over positions of |delta log-probability| at the tokens in both nodes' top-K (what a compact "
         "capture keeps; <= 2 x the L-infinity of the logit delta)"},
        {"logits.fingerprint_max_rel", "logits", D::max, S::log, false, false,
         "step 3: max relative delta of the final hidden states' fingerprint (the 16 largest-magnitude entries per 32 "
         "positions, TOPLOC-style; an entry missing from the candidate's counts by a rigorous lower bound)"},
        {"decide.top1_agreement_min", "decide", D::min, S::complement_log, false, true,
         "step 4: fraction of positions whose argmax token equals the reference's (judged on its lower confidence bound)", true},
        {"decide.routing_agreement_min", "decide", D::min, S::complement_log, false, false,
         "step 4: fraction of (token, layer) rows whose top-k expert SET equals the reference's, each node running its own router (no authority; judged on its lower confidence bound)", true},
        {"decide.routing_clear_flips_max", "decide", D::max, S::linear, true, false,
         "step 4: (token, MoE layer) rows whose expert SET differs from the reference's, each node running its own router, among rows whose authority router gap is at least the border (1e-3): a flip there is no near-tie but a wrong router"},
        {"generate.first_divergence_min", "generate", D::min, S::linear, true, true,
         "step 5: index of the first generated token that differs from the reference's under independent greedy decoding; n when none differs"},
        {"generate.divergences_max", "generate", D::max, S::linear, true, false,
         "step 5: positions whose argmax differs from the reference's when both are fed the reference's tokens (teacher forcing)"},
        {"perplexity.ratio_max", "perplexity", D::max, S::log, false, true,
         "step 6: |ppl_cand / ppl_ref - 1| on the perplexity stream"},
        {"task.acc_ratio_min", "task", D::min, S::linear, false, true,
         "step 6: the node's task accuracy (lm-eval acc) divided by the reference's (MLPerf's '>= 99 % of the reference accuracy')"},
        {"task.agreement_min", "task", D::min, S::complement_log, false, true,
         "step 6: fraction of task items whose chosen answer (acc) is the reference's (judged on its lower confidence bound)", true},
        {"task.ll_max_abs_delta_max", "task", D::max, S::log, false, false,
         "step 6: max over every task choice of |log-likelihood - the reference's| (nats)"},
        {"determinism", "determinism", D::max, S::log, false, true,
         "every step run twice on the same node: max over outputs of the run-to-run guarded max_rel; 0 = bit-identical"},
        {"invariance.ops_max_rel", "invariance", D::max, S::log, false, true,
         "matmul, softmax and rmsnorm: a row computed alone vs the same row inside op_rows rows, same node: guarded max_rel; 0 = bit-identical"},
        {"invariance.batch_max_rel", "invariance", D::max, S::log, false, true,
         "the sequence's logits alone vs inside a batch of B sequences with other batchmates (each B of the protocol), same node: guarded max_rel; 0 = bit-identical"},
        {"invariance.prefill_decode_max_rel", "invariance", D::max, S::log, false, true,
         "logits of one prefill vs the same positions decoded one token at a time from the KV cache, same node: guarded max_rel; 0 = bit-identical"},
        {"invariance.repeat_unique_max", "invariance", D::max, S::linear, true, true,
         "distinct outputs, bit for bit (greedy tokens with their logits), over `repeats` identical requests, same node; 1 = every request the same"},
    };
    return catalog;
}

std::vector<std::string>& step_name_storage() {
    static std::vector<std::string> names = {"ops",      "drift",      "logits",     "decide",
                                             "generate", "perplexity", "determinism", "invariance", "task"};
    return names;
}
constexpr std::size_t kBuiltInSteps = 9;

bool built_in_step(std::string_view step) {
    const auto& names = step_name_storage();
    return std::find(names.begin(), names.begin() + kBuiltInSteps, step) != names.begin() + kBuiltInSteps;
}
}  // namespace

const std::vector<CriterionInfo>& criterion_catalog() { return catalog_storage(); }

void register_protocol_step(const std::string& step, const std::vector<CriterionInfo>& criteria) {
    auto& names = step_name_storage();
    KVASIR_CHECK(std::find(names.begin(), names.end(), step) == names.end(), ErrorCode::internal,
                 "protocol step '{}' registered twice", step);
    for (const CriterionInfo& c : criteria) {
        KVASIR_CHECK(c.step == step && !find_criterion(c.name) && criterion_family(c.name) == c.name, ErrorCode::internal,
                     "step '{}' registers criterion '{}': not its own, or already known", step, c.name);
    }
    names.push_back(step);
    auto& catalog = catalog_storage();
    catalog.insert(catalog.end(), criteria.begin(), criteria.end());
}

std::string criterion_op(std::string_view name) {
    // ops.<op>.<metric> with exactly two dots.
    if (name.rfind("ops.", 0) != 0) return "";
    const std::string_view rest = name.substr(4);
    const std::size_t dot = rest.find('.');
    if (dot == std::string_view::npos || rest.find('.', dot + 1) != std::string_view::npos) return "";
    return std::string(rest.substr(0, dot));
}

std::string criterion_family(std::string_view name) {
    const std::string op = criterion_op(name);
    if (op.empty()) return std::string(name);
    return "ops." + std::string(name.substr(4 + op.size() + 1));
}

std::optional<CriterionInfo> find_criterion(std::string_view name) {
    const std::string op = criterion_op(name);
    if (!op.empty()) {
        const auto& ops = all_op_names();
        if (std::find(ops.begin(), ops.end(), op) == ops.end()) return std::nullopt;
    }
    const std::string family = criterion_family(name);
    for (const CriterionInfo& c : criterion_catalog())
        if (c.name == family) {
            CriterionInfo out = c;
            if (!op.empty()) {
                out.name = std::string(name);
                out.required = false;
                out.meaning = fmt::format("step 1: {} of op '{}' only (overrides {})", family.substr(4), op, family);
            }
            return out;
        }
    return std::nullopt;
}

// ============================================================================
// Protocol
// ============================================================================

const std::vector<std::string>& protocol_step_names() { return step_name_storage(); }

namespace {
// The enabled flag of a step, for a const and a mutable protocol alike.
template <class P>
auto& step_flag(P& p, std::string_view step) {
    if (step == "ops") return p.ops.enabled;
    if (step == "drift") return p.drift.enabled;
    if (step == "logits") return p.logits.enabled;
    if (step == "decide") return p.decide.enabled;
    if (step == "generate") return p.generate.enabled;
    if (step == "perplexity") return p.perplexity.enabled;
    if (step == "determinism") return p.determinism.enabled;
    if (step == "invariance") return p.invariance.enabled;
    if (step == "task") return p.task.enabled;
    fail(ErrorCode::internal, "unknown protocol step '{}'", step);
}
}  // namespace

bool Protocol::runs(std::string_view step) const {
    if (built_in_step(step)) return step_flag(*this, step);
    const auto it = registered.find(std::string(step));
    if (it != registered.end()) return it->second.enabled;
    const auto& names = protocol_step_names();
    KVASIR_CHECK(std::find(names.begin(), names.end(), step) != names.end(), ErrorCode::internal, "unknown protocol step '{}'", step);
    return false;
}

bool& Protocol::enabled(std::string_view step) {
    if (built_in_step(step)) return step_flag(*this, step);
    const auto& names = protocol_step_names();
    KVASIR_CHECK(std::find(names.begin(), names.end(), step) != names.end(), ErrorCode::internal, "unknown protocol step '{}'", step);
    return registered[std::string(step)].enabled;
}

const nlohmann::json& Protocol::section(std::string_view step) const {
    const auto it = registered.find(std::string(step));
    KVASIR_CHECK(it != registered.end(), ErrorCode::internal, "protocol step '{}' has no registered section", step);
    return it->second.section;
}

OpsConfig Protocol::ops_config() const {
    OpsConfig c;
    c.seed = seed;
    c.tokens = ops.tokens;
    c.hidden = ops.hidden;
    c.intermediate = ops.intermediate;
    c.experts = ops.experts;
    c.top_k = ops.top_k;
    c.vocab = ops.vocab;
    c.heads = ops.heads;
    c.head_dim = ops.head_dim;
    c.rope_theta = ops.rope_theta;
    c.rms_eps = ops.rms_eps;
    c.shards = ops.shards;
    c.ops = ops.ops;
    return c;
}

namespace {

// Walks a protocol document, refusing with "<source>: <pointer>: <problem>".
class Reader {
public:
    explicit Reader(std::string source) : source_(std::move(source)) {}

    [[noreturn]] void bad(const std::string& path, const std::string& problem) const {
        fail(ErrorCode::bad_input, "{}: {}: {}", source_, path.empty() ? "/" : path, problem);
    }

    // An object whose keys are exactly `required` plus any of `optional`.
    const nlohmann::json& object(const nlohmann::json& j, const std::string& path, std::vector<std::string> required,
                                 std::vector<std::string> optional = {}) const {
        if (!j.is_object()) bad(path, fmt::format("expected an object, got {}", describe_json_value(j)));
        std::vector<std::string> known = required;
        known.insert(known.end(), optional.begin(), optional.end());
        for (const auto& [key, value] : j.items())
            if (std::find(known.begin(), known.end(), key) == known.end()) {
                std::sort(known.begin(), known.end());
                std::string list;
                for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
                bad(json_pointer_child(path, key), fmt::format("unknown key (allowed here: {})", list));
            }
        for (const auto& key : required)
            if (!j.contains(key)) bad(path, fmt::format("missing key '{}'", key));
        return j;
    }

    std::string string(const nlohmann::json& parent, const std::string& key, const std::string& path, bool allow_empty = false) const {
        const auto& j = parent.at(key);
        const std::string p = json_pointer_child(path, key);
        if (!j.is_string()) bad(p, fmt::format("expected a string, got {}", describe_json_value(j)));
        const std::string s = j.get<std::string>();
        if (!allow_empty && s.empty()) bad(p, "must not be empty");
        return s;
    }

    double number(const nlohmann::json& j, const std::string& p) const {
        if (!j.is_number()) bad(p, fmt::format("expected a number, got {}", describe_json_value(j)));
        const double v = j.get<double>();
        if (!std::isfinite(v)) bad(p, "must be finite");
        return v;
    }
    double number(const nlohmann::json& parent, const std::string& key, const std::string& path) const {
        return number(parent.at(key), json_pointer_child(path, key));
    }

    std::int64_t integer(const nlohmann::json& j, const std::string& p, std::int64_t lo, std::int64_t hi) const {
        if (!json_is_integer(j)) bad(p, fmt::format("expected an integer, got {}", describe_json_value(j)));
        const double d = j.get<double>();
        if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
            bad(p, fmt::format("{} is out of range [{}, {}]", j.dump(), lo, hi));
        return j.is_number_float() ? static_cast<std::int64_t>(d) : j.get<std::int64_t>();
    }
    std::int64_t integer(const nlohmann::json& parent, const std::string& key, const std::string& path, std::int64_t lo,
                         std::int64_t hi) const {
        return integer(parent.at(key), json_pointer_child(path, key), lo, hi);
    }

    bool boolean(const nlohmann::json& parent, const std::string& key, const std::string& path) const {
        const auto& j = parent.at(key);
        if (!j.is_boolean()) bad(json_pointer_child(path, key), fmt::format("expected a boolean, got {}", describe_json_value(j)));
        return j.get<bool>();
    }

    const std::string& source() const { return source_; }

private:
    std::string source_;
};

std::string resolve_path(const std::string& base_dir, const std::string& p) {
    namespace fs = std::filesystem;
    const fs::path path(p);
    if (path.is_absolute() || base_dir.empty()) return path.lexically_normal().string();
    return (fs::path(base_dir) / path).lexically_normal().string();
}

bool is_lower_hex(const std::string& s, std::size_t n) {
    return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

constexpr std::int64_t kMaxTokens = std::int64_t{1} << 24;  // 16 M tokens: far beyond any audit, catches typos

TokenStream read_stream(const Reader& r, const nlohmann::json& parent, const std::string& key, const std::string& path,
                        const std::string& base_dir) {
    const std::string p = json_pointer_child(path, key);
    const auto& j = r.object(parent.at(key), p, {"path", "sha256", "offset", "count"}, {"format"});
    TokenStream s;
    s.path = r.string(j, "path", p);
    s.resolved_path = resolve_path(base_dir, s.path);
    s.sha256 = r.string(j, "sha256", p);
    if (!is_lower_hex(s.sha256, 64)) r.bad(json_pointer_child(p, "sha256"), "expected 64 lowercase hex digits (sha256 of the file)");
    s.offset = r.integer(j, "offset", p, 0, kMaxTokens);
    s.count = r.integer(j, "count", p, 1, kMaxTokens);
    if (j.contains("format")) {
        const std::string f = r.string(j, "format", p);
        if (f != "ids" && f != "text") r.bad(json_pointer_child(p, "format"), "expected \"ids\" or \"text\"");
        s.text = f == "text";
    }
    return s;
}

void read_ops(const Reader& r, const nlohmann::json& j, const std::string& p, OpsStep& ops) {
    r.object(j, p, {"tokens", "shapes", "rope_theta", "rms_eps", "shards", "ops", "weights"}, {"layer"});
    ops.enabled = true;
    ops.tokens = r.integer(j, "tokens", p, 1, 1 << 20);
    const std::string sp = json_pointer_child(p, "shapes");
    const auto& s = r.object(j.at("shapes"), sp, {"hidden", "intermediate", "experts", "top_k", "vocab", "heads", "head_dim"});
    ops.hidden = r.integer(s, "hidden", sp, 1, 1 << 20);
    ops.intermediate = r.integer(s, "intermediate", sp, 1, 1 << 20);
    ops.experts = r.integer(s, "experts", sp, 1, 1 << 12);
    ops.top_k = r.integer(s, "top_k", sp, 1, 1 << 12);
    ops.vocab = r.integer(s, "vocab", sp, 1, 1 << 22);
    ops.heads = r.integer(s, "heads", sp, 1, 1 << 12);
    ops.head_dim = r.integer(s, "head_dim", sp, 2, 1 << 12);
    if (ops.top_k > ops.experts)
        r.bad(json_pointer_child(sp, "top_k"), fmt::format("{} exceeds experts = {}", ops.top_k, ops.experts));
    if (ops.head_dim % 2 != 0) r.bad(json_pointer_child(sp, "head_dim"), fmt::format("{} must be even (rope pairs)", ops.head_dim));
    ops.rope_theta = r.number(j, "rope_theta", p);
    if (!(ops.rope_theta > 0)) r.bad(json_pointer_child(p, "rope_theta"), "must be > 0");
    ops.rms_eps = r.number(j, "rms_eps", p);
    if (!(ops.rms_eps > 0)) r.bad(json_pointer_child(p, "rms_eps"), "must be > 0");
    ops.shards = static_cast<int>(r.integer(j, "shards", p, 1, 1024));
    const std::string op_p = json_pointer_child(p, "ops");
    const auto& list = j.at("ops");
    if (!list.is_array()) r.bad(op_p, fmt::format("expected an array, got {}", describe_json_value(list)));
    if (list.empty()) r.bad(op_p, "must name at least one op");
    for (std::size_t i = 0; i < list.size(); ++i) {
        const std::string ip = json_pointer_child(op_p, i);
        if (!list[i].is_string()) r.bad(ip, fmt::format("expected a string, got {}", describe_json_value(list[i])));
        const std::string name = list[i].get<std::string>();
        const auto& known = all_op_names();
        if (std::find(known.begin(), known.end(), name) == known.end())
            r.bad(ip, fmt::format("unknown op '{}' (known: {})", name, fmt::join(known, ", ")));
        if (std::find(ops.ops.begin(), ops.ops.end(), name) != ops.ops.end()) r.bad(ip, fmt::format("op '{}' listed twice", name));
        ops.ops.push_back(name);
    }
    ops.weights = r.string(j, "weights", p);
    if (ops.weights != "seeded" && ops.weights != "model")
        r.bad(json_pointer_child(p, "weights"), fmt::format("\"{}\" is not one of [\"seeded\",\"model\"]", ops.weights));
    if (j.contains("layer")) ops.layer = r.integer(j, "layer", p, 0, 1 << 16);
}

Tolerances read_tier(const Reader& r, const nlohmann::json& j, const std::string& p) {
    if (!j.is_object()) r.bad(p, fmt::format("expected an object, got {}", describe_json_value(j)));
    Tolerances out;
    for (const auto& [name, t] : j.items()) {
        const std::string cp = json_pointer_child(p, name);
        const auto info = find_criterion(name);
        if (!info) {
            std::string known;
            for (const auto& c : criterion_catalog()) known += (known.empty() ? "" : ", ") + c.name;
            r.bad(cp, fmt::format("unknown criterion (known: {}, and ops.<op>.max_rel / ops.<op>.cosine_min)", known));
        }
        r.object(t, cp, {"value", "why"}, {"x_floor"});
        Tolerance tol;
        if (t.contains("x_floor")) {
            const std::string xp = json_pointer_child(cp, "x_floor");
            if (info->rate || info->integer || info->scale == MarginScale::linear)
                r.bad(xp, "a floor multiple applies to error magnitudes and cosines only (not to rates, counts or alpha)");
            const double m = r.number(t.at("x_floor"), xp);
            if (!(m >= 1.0 && m <= 1e12)) r.bad(xp, fmt::format("{} must be in [1, 1e12] (a multiple of the floor)", t.at("x_floor").dump()));
            tol.x_floor = m;
        }
        const std::string vp = json_pointer_child(cp, "value");
        if (info->integer)
            tol.value = static_cast<double>(r.integer(t.at("value"), vp, 0, kMaxTokens));
        else
            tol.value = r.number(t.at("value"), vp);
        if (info->scale == MarginScale::log && tol.value < 0) r.bad(vp, fmt::format("{} must be >= 0", t.at("value").dump()));
        if (info->scale == MarginScale::complement_log && !(tol.value >= 0 && tol.value <= 1))
            r.bad(vp, fmt::format("{} must be in [0, 1]", t.at("value").dump()));
        tol.why = r.string(t, "why", cp);
        if (tol.why.find('\n') != std::string::npos || tol.why.find('\r') != std::string::npos)
            r.bad(json_pointer_child(cp, "why"), "must be one line");
        out.emplace(name, std::move(tol));
    }
    return out;
}

// Tier checks that need the steps: see the list at the top of protocol.hpp.
void check_tiers(const Reader& r, const Protocol& pr) {
    for (const Tier tier : {Tier::sensitive, Tier::tolerant}) {
        const std::string tp = json_pointer_child("/tiers", to_string(tier));
        const Tolerances& tols = pr.tier(tier);
        for (const auto& [name, tol] : tols) {
            const std::string cp = json_pointer_child(tp, name);
            const auto info = find_criterion(name);
            if (!pr.runs(info->step))
                r.bad(cp, fmt::format("step '{}' is not run by this protocol (no /steps/{})", info->step, info->step));
            const std::string op = criterion_op(name);
            if (!op.empty() && std::find(pr.ops.ops.begin(), pr.ops.ops.end(), op) == pr.ops.ops.end())
                r.bad(cp, fmt::format("op '{}' is not among /steps/ops/ops", op));
            if (name == "generate.first_divergence_min" && tol.value > static_cast<double>(pr.generate.n))
                r.bad(json_pointer_child(cp, "value"),
                      fmt::format("{} exceeds /steps/generate/n = {} (could never pass)", tol.value, pr.generate.n));
            if (name == "generate.divergences_max" && !pr.generate.teacher_forcing)
                r.bad(cp, "needs /steps/generate/teacher_forcing = true");
        }
        for (const CriterionInfo& c : criterion_catalog())
            if (c.required && pr.runs(c.step) && tols.count(c.name) == 0)
                r.bad(tp, fmt::format("missing tolerance '{}' (required while step '{}' runs)", c.name, c.step));
    }
    // The sensitive tier is the stricter one: a node that is fit must also
    // meet the tolerant tier, or "unfit-sensitive" would not sit between fit
    // and unfit. A relative tolerance is compared with a relative one only
    // (its multiple and its fallback each at least as strict).
    for (const auto& [name, s] : pr.sensitive) {
        const auto t = pr.tolerant.find(name);
        if (t == pr.tolerant.end()) continue;
        const auto info = find_criterion(name);
        // A relative tolerance and an absolute one cannot be ordered before
        // the run: the verdict still checks the tolerant tier first.
        if (s.x_floor.has_value() != t->second.x_floor.has_value()) continue;
        if (s.x_floor && *s.x_floor > *t->second.x_floor)
            r.bad(json_pointer_child(json_pointer_child("/tiers/sensitive", name), "x_floor"),
                  fmt::format("{} is looser than the tolerant tier's {} (the sensitive tier must be at least as strict)",
                              *s.x_floor, *t->second.x_floor));
        const bool looser = info->direction == Direction::max ? s.value > t->second.value : s.value < t->second.value;
        if (looser)
            r.bad(json_pointer_child(json_pointer_child("/tiers/sensitive", name), "value"),
                  fmt::format("{} is looser than the tolerant tier's {} (the sensitive tier must be at least as strict)",
                              s.value, t->second.value));
    }
}

}  // namespace

bool Protocol::uses_floor() const {
    for (const Tolerances* t : {&sensitive, &tolerant})
        for (const auto& [name, tol] : *t)
            if (tol.x_floor) return true;
    return false;
}

namespace {

// The protocol's header: format, id, version, description, model, reference, seed.
void read_header(const Reader& r, const nlohmann::json& doc, const std::string& base_dir, Protocol& pr) {
    const std::string format = r.string(doc, "format", "");
    if (format != "kvasir-equiv/protocol/1")
        r.bad("/format", fmt::format("\"{}\" is not a supported format (this build reads \"kvasir-equiv/protocol/1\")", format));
    if (doc.contains("$schema")) r.string(doc, "$schema", "");
    pr.id = r.string(doc, "id", "");
    if (!std::regex_match(pr.id, std::regex("[a-z0-9][a-z0-9_.-]*")))
        r.bad("/id", fmt::format("\"{}\" must be lowercase letters, digits, '_', '.', '-'", pr.id));
    pr.version = r.integer(doc, "version", "", 1, std::numeric_limits<std::int32_t>::max());
    pr.description = r.string(doc, "description", "");
    if (doc.contains("model")) {
        pr.model = r.string(doc, "model", "");
        pr.model_resolved = resolve_path(base_dir, pr.model);
    }
    pr.reference = r.string(doc, "reference", "");
    try {
        BackendSpec::parse(pr.reference);
    } catch (const Error& e) {
        r.bad("/reference", e.what());
    }
    {
        const auto& s = doc.at("seed");
        if (!json_is_integer(s) || s.get<double>() < 0 || s.get<double>() >= 18446744073709551616.0)
            r.bad("/seed", fmt::format("expected a non-negative integer, got {}", describe_json_value(s)));
        pr.seed = s.is_number_unsigned() ? s.get<std::uint64_t>() : static_cast<std::uint64_t>(s.get<double>());
    }
}

// Resource limits of each node's process.
void read_limits(const Reader& r, const nlohmann::json& doc, Protocol& pr) {
    if (doc.contains("limits")) {
        const auto& l = r.object(doc.at("limits"), "/limits", {}, {"node_timeout_s", "node_memory_gib"});
        for (const auto& [key, field] : {std::pair{"node_timeout_s", &pr.limits.node_timeout_s},
                                         std::pair{"node_memory_gib", &pr.limits.node_memory_gib}}) {
            if (!l.contains(key)) continue;
            const std::string path = std::string("/limits/") + key;
            const double v = r.number(l.at(key), path);
            if (!(v > 0) || !std::isfinite(v)) r.bad(path, fmt::format("must be a positive number, got {}", v));
            *field = v;
        }
    }
}

// The floor node (x_floor tolerances) and the confidence bounds of rates.
void read_floor_and_statistics(const Reader& r, const nlohmann::json& doc, Protocol& pr) {
    if (doc.contains("floor")) {
        pr.floor = r.string(doc, "floor", "");
        try {
            pr.floor = BackendSpec::parse(pr.floor).canonical();
        } catch (const Error& e) {
            r.bad("/floor", e.what());
        }
    }
    if (doc.contains("statistics")) {
        const auto& st = r.object(doc.at("statistics"), "/statistics", {"confidence", "interval"});
        const double c = r.number(st, "confidence", "/statistics");
        // 0.5 is no confidence at all; beyond 1 − 1e-6 the bounds need more
        // tokens than any protocol holds.
        if (!(c > 0.5 && c <= 0.999999))
            r.bad("/statistics/confidence", fmt::format("{} must be in (0.5, 0.999999]", st.at("confidence").dump()));
        pr.statistics.confidence = c;
        const std::string interval = r.string(st, "interval", "/statistics");
        try {
            pr.statistics.interval = parse_binomial_bound(interval);
        } catch (const Error& e) {
            r.bad("/statistics/interval", e.what());
        }
    }
}

void read_generate(const Reader& r, const nlohmann::json& steps, const std::string& base_dir, Protocol& pr) {
    const std::string p = "/steps/generate";
    const auto& g = r.object(steps["generate"], p, {"prompt", "n", "teacher_forcing"});
    pr.generate.enabled = true;
    pr.generate.prompt = read_stream(r, g, "prompt", p, base_dir);
    pr.generate.n = r.integer(g, "n", p, 1, 1 << 16);
    pr.generate.teacher_forcing = r.boolean(g, "teacher_forcing", p);
}

void read_perplexity(const Reader& r, const nlohmann::json& steps, const std::string& base_dir, Protocol& pr) {
    const std::string p = "/steps/perplexity";
    const auto& g = r.object(steps["perplexity"], p, {"tokens", "context"}, {"score", "kl_divergence", "router_authority"});
    if (g.contains("router_authority")) pr.perplexity.router_authority = r.boolean(g, "router_authority", p);
    pr.perplexity.enabled = true;
    pr.perplexity.tokens = read_stream(r, g, "tokens", p, base_dir);
    if (pr.perplexity.tokens.count < 2)
        r.bad("/steps/perplexity/tokens/count", "needs at least 2 tokens (one predicted from another)");
    pr.perplexity.context = r.integer(g, "context", p, kMinPerplexityContext, kMaxPerplexityContext);
    if (g.contains("score")) {
        const std::string score = r.string(g, "score", p);
        if (score != "all" && score != "second_half") r.bad(p + "/score", "must be \"all\" or \"second_half\"");
        pr.perplexity.second_half = score == "second_half";
        if (pr.perplexity.second_half && pr.perplexity.context < 4)
            r.bad(p + "/context", "second_half scoring needs windows of at least 4 tokens");
    }
    if (g.contains("kl_divergence")) {
        const auto& k = r.object(g.at("kl_divergence"), p + "/kl_divergence", {"base_rounding"});
        pr.perplexity.kl_divergence = true;
        pr.perplexity.base_rounding = r.string(k, "base_rounding", p + "/kl_divergence");
        if (pr.perplexity.base_rounding != "exact" && pr.perplexity.base_rounding != "llamacpp-u16")
            r.bad(p + "/kl_divergence/base_rounding", "must be \"exact\" or \"llamacpp-u16\"");
    }
}

void read_invariance(const Reader& r, const nlohmann::json& steps, const std::string& base_dir, Protocol& pr) {
    const std::string p = "/steps/invariance";
    const auto& g = r.object(steps["invariance"], p, {"tokens", "batch_sizes", "op_rows", "repeats", "decode"});
    auto& inv = pr.invariance;
    inv.enabled = true;
    inv.tokens = read_stream(r, g, "tokens", p, base_dir);
    if (inv.tokens.count > 4096) r.bad("/steps/invariance/tokens/count", "at most 4096 tokens (decoded one by one)");
    const std::string bp = json_pointer_child(p, "batch_sizes");
    const auto& list = g.at("batch_sizes");
    if (!list.is_array()) r.bad(bp, fmt::format("expected an array, got {}", describe_json_value(list)));
    if (list.empty() || list.size() > 8) r.bad(bp, "must name 1 to 8 batch sizes");
    for (std::size_t i = 0; i < list.size(); ++i) {
        const std::int64_t b = r.integer(list[i], json_pointer_child(bp, std::to_string(i)), 2, 64);
        if (std::find(inv.batch_sizes.begin(), inv.batch_sizes.end(), b) != inv.batch_sizes.end())
            r.bad(json_pointer_child(bp, std::to_string(i)), fmt::format("batch size {} listed twice", b));
        inv.batch_sizes.push_back(b);
    }
    inv.op_rows = r.integer(g, "op_rows", p, 2, 4096);
    inv.repeats = static_cast<int>(r.integer(g, "repeats", p, 2, 64));
    inv.decode = r.integer(g, "decode", p, 1, 1024);
}

void read_task(const Reader& r, const nlohmann::json& steps, const std::string& base_dir, Protocol& pr) {
    const std::string p = "/steps/task";
    const auto& g = r.object(steps["task"], p, {"items"}, {"router_authority"});
    if (g.contains("router_authority")) pr.task.router_authority = r.boolean(g, "router_authority", p);
    const auto& it = r.object(g.at("items"), p + "/items", {"path", "sha256"});
    pr.task.enabled = true;
    pr.task.path = r.string(it, "path", p + "/items");
    pr.task.resolved_path = resolve_path(base_dir, pr.task.path);
    pr.task.sha256 = r.string(it, "sha256", p + "/items");
    if (!is_lower_hex(pr.task.sha256, 64))
        r.bad(p + "/items/sha256", "expected 64 lowercase hex digits (sha256 of the file)");
}

// Every step's section: the built-in ones read here, a registered step's kept for its own plan().
void read_steps(const Reader& r, const nlohmann::json& doc, const std::string& base_dir, Protocol& pr) {
    const auto& steps = r.object(doc.at("steps"), "/steps", {}, protocol_step_names());
    if (steps.empty()) r.bad("/steps", "names no step (nothing compared is never a pass)");
    if (steps.contains("ops")) read_ops(r, steps["ops"], "/steps/ops", pr.ops);
    // drift, logits, decide: a token stream and each its optional setting —
    // drift's threshold (where an error starts), decide's border (of a router
    // gap), logits' router authority (false: each node runs its own router).
    const auto token_step = [&](const char* name, TokenStep& step, const char* setting) -> const nlohmann::json* {
        if (!steps.contains(name)) return nullptr;
        const std::string p = json_pointer_child("/steps", name);
        r.object(steps[name], p, {"tokens"}, {setting});
        step.enabled = true;
        step.tokens = read_stream(r, steps[name], "tokens", p, base_dir);
        return steps[name].contains(setting) ? &steps[name] : nullptr;
    };
    const auto positive = [&](const nlohmann::json& j, const char* step, const char* key) {
        const std::string p = json_pointer_child("/steps", step);
        const double v = r.number(j, key, p);
        if (!(v > 0) || !std::isfinite(v)) r.bad(json_pointer_child(p, key), "must be a finite number > 0");
        return v;
    };
    if (const auto* j = token_step("drift", pr.drift, "threshold")) pr.drift.threshold = positive(*j, "drift", "threshold");
    if (const auto* j = token_step("decide", pr.decide, "border")) pr.decide.border = positive(*j, "decide", "border");
    if (const auto* j = token_step("logits", pr.logits, "router_authority"))
        pr.logits.router_authority = r.boolean(*j, "router_authority", "/steps/logits");
    if (steps.contains("generate")) read_generate(r, steps, base_dir, pr);
    if (steps.contains("perplexity")) read_perplexity(r, steps, base_dir, pr);
    if (steps.contains("determinism")) {
        const auto& d = r.object(steps["determinism"], "/steps/determinism", {"repeats"});
        pr.determinism.enabled = true;
        pr.determinism.repeats = static_cast<int>(r.integer(d, "repeats", "/steps/determinism", 2, 16));
    }
    if (steps.contains("invariance")) read_invariance(r, steps, base_dir, pr);
    if (steps.contains("task")) read_task(r, steps, base_dir, pr);
    // A registered step's section is its own to read (Step::plan validates it); here it must be an object.
    for (const std::string& name : protocol_step_names()) {
        if (built_in_step(name) || !steps.contains(name)) continue;
        const std::string p = json_pointer_child("/steps", name);
        if (!steps[name].is_object()) r.bad(p, fmt::format("expected an object, got {}", describe_json_value(steps[name])));
        pr.registered[name] = Protocol::RegisteredStep{true, steps[name]};
    }
    if (pr.ops.enabled) {
        try {
            pr.ops_config().validate();
        } catch (const Error& e) {
            r.bad("/steps/ops", e.what());
        }
    }
}

}  // namespace

Protocol parse_protocol(const nlohmann::json& doc, const std::string& source, const std::string& base_dir) {
    const Reader r(source);
    r.object(doc, "", {"format", "id", "version", "description", "reference", "seed", "steps", "tiers"},
             {"$schema", "model", "limits", "statistics", "floor"});
    Protocol pr;
    pr.source = source;
    pr.base_dir = base_dir;
    read_header(r, doc, base_dir, pr);
    read_limits(r, doc, pr);
    read_floor_and_statistics(r, doc, pr);
    read_steps(r, doc, base_dir, pr);
    const auto& tiers = r.object(doc.at("tiers"), "/tiers", {"sensitive", "tolerant"});
    pr.sensitive = read_tier(r, tiers.at("sensitive"), "/tiers/sensitive");
    pr.tolerant = read_tier(r, tiers.at("tolerant"), "/tiers/tolerant");
    check_tiers(r, pr);
    if (pr.uses_floor() && pr.floor == BackendSpec::parse(pr.reference).canonical())
        r.bad(doc.contains("floor") ? "/floor" : "/reference",
              fmt::format("the floor node '{}' is the reference: x_floor tolerances need a floor measured against it", pr.floor));

    pr.document = doc;
    pr.content_hash = content_hash(doc);
    return pr;
}


Protocol load_protocol(const std::string& path) {
    const std::string text = read_text_file(path, 4u << 20);
    const nlohmann::json doc = parse_json_strict(text, path);
    const std::filesystem::path p(path);
    return parse_protocol(doc, path, p.has_parent_path() ? p.parent_path().string() : std::string("."));
}

std::vector<std::string> PerplexityOverrides::arguments() const {
    std::vector<std::string> a;
    if (second_half) a.push_back(*second_half ? "--score=second-half" : "--score=all");
    if (kl_divergence) a.push_back("--kl-divergence=" + *kl_divergence);
    return a;
}

Protocol with_perplexity_overrides(const Protocol& p, const PerplexityOverrides& o) {
    if (!o.any()) return p;
    const char* option = o.kl_divergence ? "--kl-divergence" : "--score";
    KVASIR_CHECK(p.perplexity.enabled, ErrorCode::bad_input, "{}: protocol '{}' ({}) has no perplexity step to apply it to",
                 option, p.id, p.source);
    // A flag that says what the protocol already says changes nothing, not even the hash.
    const bool score = o.second_half && *o.second_half != p.perplexity.second_half;
    const bool kld = o.kl_divergence && !(p.perplexity.kl_divergence && p.perplexity.base_rounding == *o.kl_divergence);
    if (!score && !kld) return p;
    nlohmann::json doc = p.document;
    nlohmann::json& step = doc["steps"]["perplexity"];
    if (score) step["score"] = *o.second_half ? "second_half" : "all";
    if (kld) step["kl_divergence"] = {{"base_rounding", *o.kl_divergence}};
    return parse_protocol(doc, p.source, p.base_dir);
}

std::vector<std::int32_t> read_token_stream(const TokenStream& s, const std::string& model_path) {
    const std::string& file = s.resolved_path.empty() ? s.path : s.resolved_path;
    const std::string text = read_text_file(file, 64u << 20);
    const std::string actual = sha256_hex(text);
    KVASIR_CHECK(actual == s.sha256, ErrorCode::bad_input,
                 "{}: sha256 is {}, the protocol pins {} (the token stream changed: update the protocol)", file, actual,
                 s.sha256);
    std::vector<std::int32_t> ids;
    if (s.text) {
        KVASIR_CHECK(!model_path.empty(), ErrorCode::internal, "a text token stream read without its model");
        ids = load_tokenizer_for(model_path).encode(text);
    }
    std::size_t i = s.text ? text.size() : 0;
    while (i < text.size()) {
        if (std::isspace(static_cast<unsigned char>(text[i])) != 0) {
            ++i;
            continue;
        }
        std::size_t j = i;
        std::int64_t v = 0;
        while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j])) != 0 && v <= std::numeric_limits<std::int32_t>::max()) {
            v = v * 10 + (text[j] - '0');
            ++j;
        }
        const bool ended = j == text.size() || std::isspace(static_cast<unsigned char>(text[j])) != 0;
        KVASIR_CHECK(j > i && ended && v <= std::numeric_limits<std::int32_t>::max(), ErrorCode::bad_input,
                     "{}: token {} is not a non-negative integer below 2^31 (near \"{}\")", file, ids.size(),
                     text.substr(i, std::min<std::size_t>(12, text.size() - i)));
        ids.push_back(static_cast<std::int32_t>(v));
        i = j;
    }
    KVASIR_CHECK(s.offset + s.count <= static_cast<std::int64_t>(ids.size()), ErrorCode::bad_input,
                 "{}: holds {} tokens, the protocol reads {} from offset {}", file, ids.size(), s.count, s.offset);
    return std::vector<std::int32_t>(ids.begin() + s.offset, ids.begin() + s.offset + s.count);
}

}  // namespace kvasir
