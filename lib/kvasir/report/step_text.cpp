#include "kvasir/report/step_text.hpp"

#include "kvasir/audit/step_decide.hpp"
#include "kvasir/audit/step_determinism.hpp"
#include "kvasir/audit/step_drift.hpp"
#include "kvasir/audit/step_generate.hpp"
#include "kvasir/audit/step_logits.hpp"
#include "kvasir/audit/step_perplexity.hpp"
#include "kvasir/audit/step_task.hpp"
#include "kvasir/core/error.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <map>
#include <optional>

namespace kvasir {

namespace {

// A figure: "3.5e-10", "nan"; "—" when not measured.
std::string sci(const std::optional<double>& v) { return v ? fmt_sci(*v) : "—"; }
std::string layer_text(std::int64_t l) { return l < 0 ? "none" : fmt::format("layer {}", l); }

std::string section_title(const std::string& name, const std::string& reference, const std::string& compared, const Style& st) {
    std::string out = "\n" + st.bold(name) + fmt::format("  reference {}\n", reference);
    if (!compared.empty()) out += st.dim(compared) + "\n";
    return out;
}

// A candidate's entry that failed: one red line.
bool failed_entry(const NodeEntry& e, std::string& out, const Style& st) {
    if (!e.error) return false;
    out += "  " + st.red(fmt::format("{}: error: {}", e.node, *e.error)) + "\n";
    return true;
}

// A node's entry that holds an error instead of figures: one row of the
// table, the message in its second column. False for an entry with figures.
bool error_row(TextTable& t, const NodeEntry& e, std::size_t columns, const Style& st) {
    if (!e.error) return false;
    std::vector<std::string> row{e.node, st.red("error: " + *e.error)};
    row.resize(columns);
    t.add_row(row);
    return true;
}

// The step's typed result; Error(internal) when the report holds another type under its name.
template <class R>
const R& result_as(const StepResult& r, const char* step) {
    const R* typed = dynamic_cast<const R*>(&r);
    KVASIR_CHECK(typed != nullptr, ErrorCode::internal, "step {}'s result is not of its type", step);
    return *typed;
}

std::string drift_text(const StepResult& result, const Style& st) {
    const DriftResult& s = result_as<DriftResult>(result, "drift");
    std::string out = section_title("Step 2 — layer-boundary drift", s.reference, s.compared, st);
    out += st.dim(fmt::format("free = own residual stream (accumulated error); local = each layer fed the reference's "
                              "input; threshold {}",
                              fmt_sci(s.threshold))) +
           "\n";
    for (const DriftResult::Entry& e : s.results) {
        out += "\n";
        if (failed_entry(e, out, st)) continue;
        out += st.bold(e.node) + fmt::format("  embedding ‖Δ‖/‖ref‖ {}\n", fmt_sci(e.embedding_rel));
        TextTable t({"layer", "free ‖Δ‖/‖ref‖", "free max|Δ|", "free cosine", "local ‖Δ‖/‖ref‖", "local max|Δ|",
                     "attention block", "MLP block"});
        for (const DriftResult::Layer& l : e.layers)
            t.add_row({std::to_string(l.layer), fmt_sci(l.free_rel), fmt_sci(l.free_max_abs), fmt_cosine(l.free_cosine), sci(l.anchored_rel),
                       sci(l.anchored_max_abs), sci(l.attention_block_rel), sci(l.mlp_block_rel)});
        out += t.render("  ");
        out += fmt::format("  first over the threshold: {} free, {} local; α {} (fit {}, R² {}, {} points)\n", layer_text(e.first_over),
                           layer_text(e.first_over_local), fmt_sci(e.alpha), fmt_sci(e.fit.alpha), fmt_sci(e.fit.r2), e.fit.points_used);
        if (const auto& w = e.localisation)
            out += "  " + st.yellow(fmt::format("where it starts: layer {}, {}: {} > {} ({})", w->layer, w->block, fmt_sci(w->delta),
                                                fmt_sci(w->yardstick), w->rule)) +
                   "\n";
    }
    return out;
}

std::string logits_text(const StepResult& result, const Style& st) {
    const LogitsResult& s = result_as<LogitsResult>(result, "logits");
    std::string out = section_title("Step 3 — logit divergence", s.reference, s.compared, st);
    out += st.dim(fmt::format("{} positions; KL(P_ref ‖ P) in nats", s.positions)) + "\n";
    TextTable t({"node", "KL mean", "KL p99", "KL max", "L∞ mean", "L∞ max", "L2 max", "RMS Δp(top)"});
    const auto of = [](const std::optional<Summary>& x, double Summary::*field) { return x ? fmt_sci((*x).*field) : "—"; };
    for (const LogitsResult::Entry& e : s.results) {
        if (error_row(t, e, 8, st)) continue;
        t.add_row({e.node, of(e.kl, &Summary::mean), of(e.kl, &Summary::p99), of(e.kl, &Summary::max), of(e.linf, &Summary::mean),
                   of(e.linf, &Summary::max), of(e.l2, &Summary::max), e.kl ? fmt_sci(e.top_dp_rms) : "—"});
    }
    return out + t.render("  ");
}

// A rate with its counts: "98.5% (63/64)".
std::string fraction_text(const std::optional<Fraction>& f) {
    if (!f) return "—";
    return fmt::format("{} ({}/{})", std::isfinite(f->rate) ? fmt_rate(f->rate) : "nan", f->successes, f->n);
}

std::string decide_text(const StepResult& result, const Style& st) {
    const DecisionResult& s = result_as<DecisionResult>(result, "decide");
    std::string out = section_title("Step 4 — decision agreement", s.reference, s.compared, st);
    const bool moe = s.moe_layers > 0;
    if (!moe) {
        out += st.dim("no MoE layers: routing agreement and border tokens do not apply (top-1 agreement only)") + "\n";
    } else {
        std::vector<std::string> border;
        if (s.border_tokens)
            for (const auto& [layer, tokens] : *s.border_tokens)
                for (const DecisionResult::BorderToken& t : tokens) border.push_back(fmt::format("L{}/t{} ({})", layer, t.token, fmt_sci(t.gap)));
        out += st.dim(fmt::format("border {}: the reference's border tokens (router gap below it): {}", fmt_sci(s.border),
                                  border.empty() ? std::string("none") : fmt::format("{}", fmt::join(border, ", ")))) +
               "\n";
    }
    std::vector<std::string> header{"node", "top-1 (authority)", "top-1 (own router)"};
    if (moe) header.insert(header.end(), {"routing exact (own router)", "border flipped", "other flips"});
    TextTable t(header);
    std::string layers;
    for (const DecisionResult::Entry& e : s.results) {
        if (error_row(t, e, header.size(), st)) continue;
        std::vector<std::string> row{e.node, fraction_text(e.top1_pinned), fraction_text(e.top1_free)};
        if (moe) {
            row.push_back(e.routing_free ? fmt::format("{} ({}/{})", fmt_sci(e.routing_free->exact_match_rate), e.routing_free->exact_matches,
                                                       e.routing_free->rows)
                                         : e.routing_free_note.value_or("—"));
            row.push_back(e.border ? fmt::format("{}/{}", e.border->border_flipped, e.border->border_tokens) : "—");
            row.push_back(e.border ? std::to_string(e.border->other_flipped) : "—");
        }
        t.add_row(row);
        if (!e.routing_free) continue;
        TextTable per({"layer", "exact (own router)", "set overlap", "border flipped", "other flips", "flipped tokens"});
        for (const DecisionResult::LayerRouting& l : e.routing_free->per_moe_layer) {
            const DecisionResult::Flips f = l.flips.value_or(DecisionResult::Flips{});
            per.add_row({std::to_string(l.layer), fmt_sci(l.agreement.exact_match_rate), fmt_sci(l.agreement.set_overlap_rate),
                         fmt::format("{}/{}", f.border_flipped, f.border_tokens), std::to_string(f.other_flipped),
                         l.flipped_tokens.empty() ? std::string("—") : fmt::format("{}", fmt::join(l.flipped_tokens, " "))});
        }
        layers += "\n" + st.bold(e.node) + st.dim("  per MoE layer, its own router against the reference's") + "\n" + per.render("  ");
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

std::string generate_text(const StepResult& result, const Style& st) {
    const GenerationResult& s = result_as<GenerationResult>(result, "generate");
    std::string out = section_title("Step 5 — generation stability", s.reference, "", st);
    out += st.dim(fmt::format("{} tokens decoded greedily; free = each node's own router and tokens, teacher-forced = fed "
                              "the reference's tokens with its routing",
                              s.new_tokens)) +
           "\n";
    out += fmt::format("reference tokens: {}\n", fmt::join(s.reference_tokens, " "));
    if (s.reference_text) out += "reference text: " + one_line_text(*s.reference_text) + "\n";
    TextTable t({"node", "first divergence", "ref margin there", "own margin there", "teacher-forced divergences", "at steps"});
    std::string texts;
    for (const GenerationResult::Entry& e : s.results) {
        if (error_row(t, e, 6, st)) continue;
        const auto& forced = e.teacher_forced_divergence_steps;
        const std::string div = forced ? fmt::format("{}/{}", forced->size(), s.new_tokens) : "—";
        const std::string steps = forced && !forced->empty() ? fmt::format("{}", fmt::join(*forced, " ")) : "—";
        t.add_row({e.node, e.first_divergence < 0 ? std::string("none") : st.yellow(std::to_string(e.first_divergence)),
                   sci(e.ref_margin_at_divergence), sci(e.cand_margin_at_divergence), div, steps});
        if (e.text) texts += fmt::format("  {}: {}\n", e.node, one_line_text(*e.text));
    }
    out += t.render("  ");
    if (!texts.empty()) out += st.dim("continuations (free run)") + "\n" + texts;
    return out;
}

std::string perplexity_text(const StepResult& result, const Style& st) {
    const PerplexityResult& s = result_as<PerplexityResult>(result, "perplexity");
    std::string out = section_title("Step 6 — perplexity", s.reference, "", st);
    out += st.dim(fmt::format("{} predictions scored ({}), windows of {} tokens; routing {}", s.predictions, s.scored, s.context, s.routing)) +
           "\n";
    const bool kld = s.kl_divergence_base_rounding.has_value();
    std::vector<std::string> header{"node", "mean NLL", "perplexity", "Δ", "ratio", "max|ΔNLL|"};
    if (kld) header.insert(header.end(), {"Mean KLD", "same top"});
    TextTable t(header);
    std::vector<std::string> ref{s.reference + " (ref)", fmt_sci(s.reference_mean_nll), fmt_sci(s.reference_perplexity), "·", "·", "·"};
    ref.resize(header.size(), "·");
    t.add_row(ref);
    for (const PerplexityResult::Entry& e : s.results) {
        if (error_row(t, e, header.size(), st)) continue;
        std::vector<std::string> row{e.node, fmt_sci(e.mean_nll), fmt_sci(e.perplexity), fmt_sci(e.delta), fmt_fixed(e.ratio, 9),
                                     fmt_sci(e.nll_max_abs_delta)};
        if (kld) {
            const auto& k = e.llamacpp_kl_divergence;
            row.push_back(k ? fmt_sci(k->kld.value) : "—");
            row.push_back(k ? fmt_sci(k->same_top.value) : "—");
        }
        t.add_row(row);
    }
    return out + t.render("  ");
}

std::string task_text(const StepResult& result, const Style& st) {
    const TaskResult& s = result_as<TaskResult>(result, "task");
    std::string out = section_title("Step 6 — task score", s.reference, "", st);
    out += st.dim(fmt::format("{} multiple-choice items by log-likelihood (lm-eval acc, acc_norm); routing {}", s.items, s.routing)) + "\n";
    const auto pm = [](double value, double stderr_) { return fmt::format("{} ± {}", fmt_fixed(value, 4), fmt_fixed(stderr_, 4)); };
    TextTable t({"node", "acc ± stderr", "acc_norm ± stderr", "acc ratio", "acc_norm ratio", "same answer", "max|Δ ll|"});
    t.add_row({s.reference + " (ref)", pm(s.reference_acc, s.reference_acc_stderr), pm(s.reference_acc_norm, s.reference_acc_norm_stderr),
               "·", "·", "·", "·"});
    for (const TaskResult::Entry& e : s.results) {
        if (error_row(t, e, 7, st)) continue;
        t.add_row({e.node, pm(e.acc, e.acc_stderr), pm(e.acc_norm, e.acc_norm_stderr), fmt_fixed(e.vs.acc_ratio, 6),
                   fmt_fixed(e.vs.acc_norm_ratio, 6), fmt_fixed(e.agreement(), 4), fmt_sci(e.vs.ll_max_abs_delta)});
    }
    return out + t.render("  ");
}

// The determinism step: each node run twice (a view's --repeat).
std::string self_determinism_table(const DeterminismResult& s, const Style& st) {
    std::string out = "\n" + st.bold("Self non-determinism") + st.dim(fmt::format("  each node run {} times on the same tokens", s.repeats)) + "\n";
    TextTable t({"node", "bit-identical", "run-to-run max rel", "routing rows ≠"});
    for (const DeterminismResult::Entry& e : s.nodes) {
        if (error_row(t, e, 4, st)) continue;
        t.add_row({e.node, e.bit_identical() ? st.green("yes") : st.red("no"), sci(e.run_to_run_max_rel),
                   sci(e.routing_rows_differing)});
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
    const auto render = renderers().find(step);
    if (render == renderers().end()) return "";
    std::string out;
    if (const auto result = r.results.find(step); result != r.results.end() && result->second != nullptr) {
        out = render->second(*result->second, st);
    } else if (const auto failed = r.steps.find(step); failed != r.steps.end() && failed->contains("error")) {
        // The reference failed the step: nothing was compared (the verdicts say so too).
        out = "\n" + st.bold(step) + "  " + st.red("not compared: the reference failed: " + failed->value("error", std::string())) + "\n";
    } else {
        return "";
    }
    if (const DeterminismResult* d = r.result<DeterminismResult>("determinism")) out += self_determinism_table(*d, st);
    return out;
}

}  // namespace kvasir
