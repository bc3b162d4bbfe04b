#include "kvasir/report/step_text.hpp"

#include "kvasir/core/error.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>

namespace kvasir {

namespace {

using StepJson = nlohmann::ordered_json;

// A figure of a step's JSON: a number, or the string a non-finite one is
// written as ("nan", "inf"); "—" when absent.
std::string sci_of(const StepJson& parent, const char* key) {
    if (!parent.contains(key)) return "—";
    const StepJson& v = parent[key];
    if (v.is_number()) return fmt_sci(v.get<double>());
    return v.is_string() ? v.get<std::string>() : "—";
}

// A figure with `digits` decimals (rates, ratios, accuracies).
std::string fixed_of(const StepJson& parent, const char* key, int digits) {
    if (!parent.contains(key)) return "—";
    const StepJson& v = parent[key];
    if (v.is_number()) return fmt::format("{:.{}f}", v.get<double>(), digits);
    return v.is_string() ? v.get<std::string>() : "—";
}

std::string cosine_of(const StepJson& parent, const char* key) {
    if (!parent.contains(key)) return "—";
    const StepJson& v = parent[key];
    return v.is_number() ? fmt_cosine(v.get<double>()) : v.is_string() ? v.get<std::string>() : "—";
}

std::string layer_text(const StepJson& v) {
    const std::int64_t l = v.is_number_integer() ? v.get<std::int64_t>() : -1;
    return l < 0 ? "none" : fmt::format("layer {}", l);
}

std::string section_title(const std::string& name, const StepJson& section, const Style& st) {
    std::string out = "\n" + st.bold(name) + fmt::format("  reference {}\n", section.value("reference", std::string("?")));
    if (section.contains("compared")) out += st.dim(section["compared"].get<std::string>()) + "\n";
    return out;
}

// A candidate's entry that failed: one red line.
bool failed_entry(const StepJson& e, std::string& out, const Style& st) {
    if (!e.contains("error")) return false;
    out += "  " + st.red(fmt::format("{}: error: {}", e.value("node", std::string("?")), e["error"].get<std::string>())) + "\n";
    return true;
}

// A node's entry that holds an error instead of figures: one row of the
// table, the message in its second column. False for an entry with figures.
bool error_row(TextTable& t, const StepJson& e, std::size_t columns, const Style& st) {
    if (!e.contains("error")) return false;
    std::vector<std::string> row{e.value("node", std::string("?")), st.red("error: " + e["error"].get<std::string>())};
    row.resize(columns);
    t.add_row(row);
    return true;
}

std::string drift_text(const StepJson& s, const Style& st) {
    std::string out = section_title("Step 2 — layer-boundary drift", s, st);
    out += st.dim(fmt::format("free = own residual stream (accumulated error); local = each layer fed the reference's "
                              "input; threshold {}",
                              sci_of(s, "threshold"))) +
           "\n";
    for (const StepJson& e : s.value("results", StepJson::array())) {
        out += "\n";
        if (failed_entry(e, out, st)) continue;
        out += st.bold(e.value("node", std::string("?"))) + fmt::format("  embedding ‖Δ‖/‖ref‖ {}\n", sci_of(e, "embedding_rel"));
        TextTable t({"layer", "free ‖Δ‖/‖ref‖", "free max|Δ|", "free cosine", "local ‖Δ‖/‖ref‖", "local max|Δ|",
                     "attention block", "MLP block"});
        for (const StepJson& l : e.value("layers", StepJson::array()))
            t.add_row({std::to_string(l.value("layer", 0)), sci_of(l, "free_rel"), sci_of(l, "free_max_abs"), cosine_of(l, "free_cosine"),
                       sci_of(l, "anchored_rel"), sci_of(l, "anchored_max_abs"), sci_of(l, "attention_block_rel"), sci_of(l, "mlp_block_rel")});
        out += t.render("  ");
        const StepJson fit = e.value("fit", StepJson::object());
        out += fmt::format("  first over the threshold: {} free, {} local; α {} (fit {}, R² {}, {} points)\n",
                           layer_text(e.value("first_over", StepJson(-1))), layer_text(e.value("first_over_local", StepJson(-1))),
                           sci_of(e, "alpha"), sci_of(fit, "alpha"), sci_of(fit, "r2"), fit.value("points_used", 0));
        if (e.contains("localisation") && e["localisation"].is_object()) {
            const StepJson& w = e["localisation"];
            out += "  " + st.yellow(fmt::format("where it starts: layer {}, {}: {} > {} ({})", w.value("layer", 0),
                                                w.value("block", std::string()), sci_of(w, "delta"), sci_of(w, "yardstick"),
                                                w.value("rule", std::string()))) +
                   "\n";
        }
    }
    return out;
}

std::string logits_text(const StepJson& s, const Style& st) {
    std::string out = section_title("Step 3 — logit divergence", s, st);
    out += st.dim(fmt::format("{} positions; KL(P_ref ‖ P) in nats", s.value("positions", 0))) + "\n";
    TextTable t({"node", "KL mean", "KL p99", "KL max", "L∞ mean", "L∞ max", "L2 max", "RMS Δp(top)"});
    for (const StepJson& e : s.value("results", StepJson::array())) {
        if (error_row(t, e, 8, st)) continue;
        const std::string node = e.value("node", std::string("?"));
        const StepJson kl = e.value("kl", StepJson::object()), linf = e.value("linf", StepJson::object()), l2 = e.value("l2", StepJson::object());
        t.add_row({node, sci_of(kl, "mean"), sci_of(kl, "p99"), sci_of(kl, "max"), sci_of(linf, "mean"), sci_of(linf, "max"), sci_of(l2, "max"),
                   sci_of(e, "top_dp_rms")});
    }
    return out + t.render("  ");
}

// A Fraction of the step's JSON: "98.5% (63/64)".
std::string fraction_of(const StepJson& parent, const char* key) {
    if (!parent.contains(key) || !parent[key].is_object()) return "—";
    const StepJson& f = parent[key];
    const StepJson& rate = f.value("rate", StepJson());
    return fmt::format("{} ({}/{})", rate.is_number() ? fmt_rate(rate.get<double>()) : "nan", f.value("successes", 0),
                       f.value("n", 0));
}

std::string decide_text(const StepJson& s, const Style& st) {
    std::string out = section_title("Step 4 — decision agreement", s, st);
    const bool moe = s.value("moe_layers", 0) > 0;
    if (!moe) {
        out += st.dim("no MoE layers: routing agreement and border tokens do not apply (top-1 agreement only)") + "\n";
    } else {
        std::vector<std::string> border;
        for (const StepJson& l : s.value("border_tokens", StepJson::array()))
            for (const StepJson& t : l.value("tokens", StepJson::array()))
                border.push_back(fmt::format("L{}/t{} ({})", l.value("layer", 0), t.value("token", 0), sci_of(t, "gap")));
        out += st.dim(fmt::format("border {}: the reference's border tokens (router gap below it): {}", sci_of(s, "border"),
                                  border.empty() ? std::string("none") : fmt::format("{}", fmt::join(border, ", ")))) +
               "\n";
    }
    std::vector<std::string> header{"node", "top-1 (authority)", "top-1 (own router)"};
    if (moe) header.insert(header.end(), {"routing exact (own router)", "border flipped", "other flips"});
    TextTable t(header);
    std::string layers;
    for (const StepJson& e : s.value("results", StepJson::array())) {
        if (error_row(t, e, header.size(), st)) continue;
        const std::string node = e.value("node", std::string("?"));
        std::vector<std::string> row{node, fraction_of(e, "top1_pinned"), fraction_of(e, "top1_free")};
        const StepJson routing = e.value("routing_free", StepJson());
        const StepJson b = e.value("border", StepJson::object());
        if (moe) {
            row.push_back(routing.is_object() ? fmt::format("{} ({}/{})", sci_of(routing, "exact_match_rate"),
                                                            routing.value("exact_matches", 0), routing.value("rows", 0))
                          : routing.is_string() ? routing.get<std::string>()
                                                : "—");
            row.push_back(b.contains("border_flipped") ? fmt::format("{}/{}", b.value("border_flipped", 0), b.value("border_tokens", 0))
                                                       : "—");
            row.push_back(b.contains("other_flipped") ? std::to_string(b.value("other_flipped", 0)) : "—");
        }
        t.add_row(row);
        if (!routing.is_object()) continue;
        TextTable per({"layer", "exact (own router)", "set overlap", "border flipped", "other flips", "flipped tokens"});
        for (const StepJson& l : routing.value("per_moe_layer", StepJson::array())) {
            std::vector<std::string> tokens;
            for (const StepJson& tok : l.value("flipped_tokens", StepJson::array())) tokens.push_back(std::to_string(tok.get<std::int64_t>()));
            per.add_row({std::to_string(l.value("layer", 0)), sci_of(l, "exact_match_rate"), sci_of(l, "set_overlap_rate"),
                         fmt::format("{}/{}", l.value("border_flipped", 0), l.value("border_tokens", 0)),
                         std::to_string(l.value("other_flipped", 0)),
                         tokens.empty() ? std::string("—") : fmt::format("{}", fmt::join(tokens, " "))});
        }
        layers += "\n" + st.bold(node) + st.dim("  per MoE layer, its own router against the reference's") + "\n" + per.render("  ");
    }
    return out + t.render("  ") + layers;
}

// A decoded text on one line, in quotes: newlines, tabs and other control
// characters as escapes, so a continuation cannot break the table around it.
std::string one_line_text(const std::string& t) {
    std::string out = "\"";
    for (const char c : t) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c == '\r') out += "\\r";
        else if (c == '"' || c == '\\') (out += '\\') += c;
        else if (u < 0x20 || u == 0x7F) out += fmt::format("\\x{:02x}", u);
        else out += c;
    }
    return out + "\"";
}

std::string ids_text(const StepJson& ids) {
    std::vector<std::string> out;
    for (const StepJson& t : ids) out.push_back(std::to_string(t.get<std::int64_t>()));
    return fmt::format("{}", fmt::join(out, " "));
}

std::string generate_text(const StepJson& s, const Style& st) {
    std::string out = section_title("Step 5 — generation stability", s, st);
    out += st.dim(fmt::format("{} tokens decoded greedily; free = each node's own router and tokens, teacher-forced = fed "
                              "the reference's tokens with its routing",
                              s.value("new_tokens", 0))) +
           "\n";
    out += fmt::format("reference tokens: {}\n", ids_text(s.value("reference_tokens", StepJson::array())));
    if (s.contains("reference_text")) out += "reference text: " + one_line_text(s["reference_text"].get<std::string>()) + "\n";
    TextTable t({"node", "first divergence", "ref margin there", "own margin there", "teacher-forced divergences", "at steps"});
    std::string texts;
    for (const StepJson& e : s.value("results", StepJson::array())) {
        if (error_row(t, e, 6, st)) continue;
        const std::string node = e.value("node", std::string("?"));
        const std::int64_t first = e.value("first_divergence", std::int64_t{-1});
        const std::string div = e.contains("teacher_forced_divergences")
                                    ? fmt::format("{}/{}", e["teacher_forced_divergences"].get<std::int64_t>(), s.value("new_tokens", 0))
                                    : "—";
        const std::string steps = e.contains("teacher_forced_divergence_steps") && !e["teacher_forced_divergence_steps"].empty()
                                      ? ids_text(e["teacher_forced_divergence_steps"])
                                      : "—";
        t.add_row({node, first < 0 ? std::string("none") : st.yellow(std::to_string(first)), sci_of(e, "ref_margin_at_divergence"),
                   sci_of(e, "cand_margin_at_divergence"), div, steps});
        if (e.contains("text")) texts += fmt::format("  {}: {}\n", node, one_line_text(e["text"].get<std::string>()));
    }
    out += t.render("  ");
    if (!texts.empty()) out += st.dim("continuations (free run)") + "\n" + texts;
    return out;
}

std::string perplexity_text(const StepJson& s, const Style& st) {
    std::string out = section_title("Step 6 — perplexity", s, st);
    out += st.dim(fmt::format("{} predictions scored ({}), windows of {} tokens; routing {}", s.value("predictions", 0),
                              s.value("scored", std::string()), s.value("context", 0), s.value("routing", std::string()))) +
           "\n";
    const bool kld = s.contains("kl_divergence_base_rounding");
    std::vector<std::string> header{"node", "mean NLL", "perplexity", "Δ", "ratio", "max|ΔNLL|"};
    if (kld) header.insert(header.end(), {"Mean KLD", "same top"});
    TextTable t(header);
    std::vector<std::string> ref{s.value("reference", std::string("?")) + " (ref)", sci_of(s, "reference_mean_nll"),
                                 sci_of(s, "reference_perplexity"), "·", "·", "·"};
    ref.resize(header.size(), "·");
    t.add_row(ref);
    for (const StepJson& e : s.value("results", StepJson::array())) {
        if (error_row(t, e, header.size(), st)) continue;
        const std::string node = e.value("node", std::string("?"));
        std::vector<std::string> row{node, sci_of(e, "mean_nll"), sci_of(e, "perplexity"), sci_of(e, "delta"),
                                     fixed_of(e, "ratio", 9),
                                     sci_of(e, "nll_max_abs_delta")};
        if (kld) {
            const StepJson k = e.value("llamacpp_kl_divergence", StepJson::object());
            row.push_back(sci_of(k.value("Mean KLD", StepJson::object()), "value"));
            row.push_back(sci_of(k.value("Same top p", StepJson::object()), "value"));
        }
        t.add_row(row);
    }
    return out + t.render("  ");
}

std::string task_text(const StepJson& s, const Style& st) {
    std::string out = section_title("Step 6 — task score", s, st);
    out += st.dim(fmt::format("{} multiple-choice items by log-likelihood (lm-eval acc, acc_norm); routing {}", s.value("items", 0),
                              s.value("routing", std::string()))) +
           "\n";
    const auto pm = [](const StepJson& e, const char* value, const char* stderr_key) {
        return fmt::format("{} ± {}", fixed_of(e, value, 4), fixed_of(e, stderr_key, 4));
    };
    TextTable t({"node", "acc ± stderr", "acc_norm ± stderr", "acc ratio", "acc_norm ratio", "same answer", "max|Δ ll|"});
    t.add_row({s.value("reference", std::string("?")) + " (ref)", pm(s, "reference_acc", "reference_acc_stderr"),
               pm(s, "reference_acc_norm", "reference_acc_norm_stderr"), "·", "·", "·", "·"});
    for (const StepJson& e : s.value("results", StepJson::array())) {
        if (error_row(t, e, 7, st)) continue;
        const std::string node = e.value("node", std::string("?"));
        t.add_row({node, pm(e, "acc", "acc_stderr"), pm(e, "acc_norm", "acc_norm_stderr"), fixed_of(e, "acc_ratio", 6),
                   fixed_of(e, "acc_norm_ratio", 6), fixed_of(e, "agreement", 4), sci_of(e, "ll_max_abs_delta")});
    }
    return out + t.render("  ");
}

// The determinism step: each node run twice (a view's --repeat).
std::string self_determinism_table(const StepJson& s, const Style& st) {
    std::string out = "\n" + st.bold("Self non-determinism") +
                      st.dim(fmt::format("  each node run {} times on the same tokens", s.value("repeats", 2))) + "\n";
    TextTable t({"node", "bit-identical", "run-to-run max rel", "routing rows ≠"});
    for (const StepJson& e : s.value("nodes", StepJson::array())) {
        if (error_row(t, e, 4, st)) continue;
        const std::string node = e.value("node", std::string("?"));
        const bool same = e.value("bit_identical", false);
        t.add_row({node, same ? st.green("yes") : st.red("no"), sci_of(e, "run_to_run_max_rel"), sci_of(e, "routing_rows_differing")});
    }
    return out + t.render("  ");
}

}  // namespace

namespace {
std::map<std::string, StepTextRenderer>& renderers() {
    static std::map<std::string, StepTextRenderer> r = {{"drift", drift_text},           {"logits", logits_text},
                                                        {"decide", decide_text},         {"generate", generate_text},
                                                        {"perplexity", perplexity_text}, {"task", task_text}};
    return r;
}
}  // namespace

void register_step_text(const std::string& step, StepTextRenderer render) {
    KVASIR_CHECK(renderers().emplace(step, render).second, ErrorCode::internal, "step '{}' has a text section already", step);
}

std::string render_step_text(const AuditReport& r, const std::string& step, const Style& st) {
    const auto section = r.steps.find(step);
    const auto render = renderers().find(step);
    if (section == r.steps.end() || render == renderers().end()) return "";
    std::string out = render->second(*section, st);
    if (const auto d = r.steps.find("determinism"); d != r.steps.end()) out += self_determinism_table(*d, st);
    return out;
}

}  // namespace kvasir
