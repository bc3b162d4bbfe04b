#include "kvasir/report/steps_text.hpp"

#include <fmt/format.h>

#include <cmath>

namespace kvasir {

namespace {

std::string header(const std::string& title, const StepCommon& c, const Capabilities& ref, const Style& st) {
    return st.bold(title) + fmt::format("  model {}  reference {}\n", c.model->path(), ref.node) +
           st.dim(fmt::format("tokens: {} ids, {}", c.tokens.ids.size(), c.tokens.source)) + "\n";
}

std::string error_line(const std::string& node, const std::string& error, const Style& st) {
    return "  " + st.red(fmt::format("{}: error: {}", node, error)) + "\n";
}

// How routing was run, or that a dense model has none.
std::string routing_text(const StepCommon& c, const std::string& with_moe) {
    return c.model->config().has_moe() ? with_moe : "no MoE layers (nothing to route)";
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

std::string fmt_layer(std::int64_t l) { return l < 0 ? "none" : fmt::format("layer {}", l); }

std::string fmt_fixed(double v, int digits) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    return fmt::format("{:.{}f}", v, digits);
}

std::string fmt_fraction(const Fraction& f) {
    return fmt::format("{} ± {} ({}/{})", fmt_rate(f.rate), fmt_rate(f.sigma), f.successes, f.n);
}

}  // namespace

std::string render_self_checks_text(const std::vector<SelfCheck>& checks, const Style& st) {
    if (checks.empty()) return "";
    std::string out = "\n" + st.bold("Self non-determinism") + st.dim("  each node run twice on the same inputs") + "\n";
    TextTable t({"node", "bit-identical", "run-to-run max|Δ|", "routing rows ≠", "tokens ≠", "compared"});
    for (const SelfCheck& s : checks) {
        if (!s.error.empty()) {
            t.add_row({s.node, st.red("error: " + s.error), "", "", "", ""});
            continue;
        }
        t.add_row({s.node, s.bit_identical ? st.green("yes") : st.red("no"), fmt_sci(s.max_abs),
                   std::to_string(s.routing_rows_differing), std::to_string(s.tokens_differing), s.compared});
    }
    return out + t.render("  ");
}

std::string render_drift_text(const DriftReport& r, const Style& st) {
    std::string out = header("Step 2 — layer-boundary drift", r.config, r.nodes[r.reference], st);
    out += st.dim(fmt::format("{}; free = own residual stream (accumulated "
                              "error), local = each layer fed the reference's input; threshold {}",
                              routing_text(r.config, "routing pinned by the reference in both runs"),
                              fmt_sci(r.config.threshold))) +
           "\n";
    for (const NodeDrift& nd : r.results) {
        out += "\n";
        if (!nd.error.empty()) {
            out += error_line(nd.node, nd.error, st);
            continue;
        }
        out += st.bold(nd.node) +
               fmt::format("  α {} (R² {}, {} layers)  first over threshold: {} (local: {})  logits rel {}\n",
                           fmt_fixed(nd.alpha, 2), fmt_fixed(nd.fit.r2, 3), nd.fit.points_used,
                           nd.first_over < 0 ? fmt_layer(-1) : st.yellow(fmt_layer(nd.first_over)),
                           nd.first_over_local < 0 ? fmt_layer(-1) : st.yellow(fmt_layer(nd.first_over_local)),
                           fmt_sci(nd.logits_rel));
        TextTable t({"layer", "kind", "free rel", "free max|Δ|", "cosine", "local rel", "local max|Δ|"});
        for (const LayerDrift& ld : nd.layers)
            t.add_row({std::to_string(ld.layer), ld.moe ? "moe" : "dense", fmt_sci(ld.free_rel), fmt_sci(ld.free_max_abs),
                       fmt_cosine(ld.free_cosine), fmt_sci(ld.anchored_rel), fmt_sci(ld.anchored_max_abs)});
        out += t.render("  ");
    }
    return out + render_self_checks_text(r.repeat, st);
}

std::string render_logits_text(const LogitsReport& r, const Style& st) {
    std::string out = header("Step 3 — end-to-end logit divergence", r.config, r.nodes[r.reference], st);
    out += st.dim(routing_text(r.config, r.config.router_authority ? "routing pinned by the reference (router authority)"
                                                                   : "each node runs its own router (no authority)")) +
           "\n\n";
    TextTable t({"node", "per position", "mean", "median", "p90", "p99", "p99.9", "max"});
    TextTable w({"node", "RMS Δp(top)", "max|Δ| logits", "cosine"});
    for (const NodeLogits& nl : r.results) {
        if (!nl.error.empty()) {
            out += error_line(nl.node, nl.error, st);
            continue;
        }
        const auto row = [&](const std::string& node, const char* what, const Summary& s) {
            t.add_row({node, what, fmt_sci(s.mean), fmt_sci(s.median), fmt_sci(s.p90), fmt_sci(s.p99), fmt_sci(s.p999),
                       fmt_sci(s.max)});
        };
        row(nl.node, "KL(P_ref‖P)", nl.kl);
        row("", "L∞ Δlogit", nl.linf);
        row("", "L2 Δlogit", nl.l2);
        w.add_row({nl.node, fmt_sci(nl.top_dp_rms), fmt_sci(nl.stats.max_abs), fmt_cosine(nl.stats.cosine)});
    }
    out += t.render("  ") + w.render("  ");
    return out + render_self_checks_text(r.repeat, st);
}

std::string render_decide_text(const DecideReport& r, const Style& st) {
    std::string out = header("Step 4 — decision agreement", r.config, r.nodes[r.reference], st);
    if (!r.config.model->config().has_moe()) {  // a dense model: top-1 only, no router to compare
        out += st.dim("no MoE layers: routing agreement and border tokens do not apply; top-1 agreement only") + "\n\n";
        TextTable s({"node", "top-1 no authority", "top-1 authority"});
        for (const NodeDecide& nd : r.results) {
            if (!nd.error.empty()) {
                out += error_line(nd.node, nd.error, st);
                continue;
            }
            s.add_row({nd.node, fmt_fraction(nd.top1_free), fmt_fraction(nd.top1_pinned)});
        }
        return out + s.render("  ") + render_self_checks_text(r.repeat, st);
    }
    out += st.dim(fmt::format("border token: reference router gap (k-th − (k+1)-th selection score; grouped top-k: or the group margin) < {}{}", fmt_sci(r.config.border),
                              r.config.perturb_router > 0
                                  ? fmt::format("; candidates' router logits perturbed by seeded noise ±{}",
                                                fmt_sci(r.config.perturb_router))
                                  : std::string())) +
           "\n";
    std::string borders;
    for (const RouterGapsLayer& g : r.reference_gaps)
        for (std::int64_t t : g.border_tokens)
            borders += fmt::format("{}L{}/t{} ({})", borders.empty() ? "" : ", ", g.layer, t,
                                   fmt_sci(g.gaps[static_cast<std::size_t>(t)]));
    out += fmt::format("reference border tokens: {}\n\n", borders.empty() ? "none" : borders);

    TextTable s({"node", "top-1 no authority", "top-1 authority", "routing exact no auth", "overlap",
                 "border flipped", "other flips", "routing exact authority"});
    for (const NodeDecide& nd : r.results) {
        if (!nd.error.empty()) {
            out += error_line(nd.node, nd.error, st);
            continue;
        }
        const std::string flipped = fmt::format("{}/{}", nd.border_flipped, nd.border_tokens);
        s.add_row({nd.node, fmt_fraction(nd.top1_free), fmt_fraction(nd.top1_pinned), fmt_rate(nd.routing_free.exact_match_rate),
                   fmt_rate(nd.routing_free.set_overlap_rate), nd.border_flipped > 0 ? st.yellow(flipped) : flipped,
                   std::to_string(nd.other_flipped), fmt_rate(nd.routing_pinned.exact_match_rate)});
    }
    out += s.render("  ");
    for (const NodeDecide& nd : r.results) {
        if (!nd.error.empty()) continue;
        out += "\n" + st.bold(nd.node) + st.dim("  per MoE layer") + "\n";
        TextTable t({"layer", "exact no auth", "overlap", "border", "border flipped", "other flips", "flipped tokens",
                     "exact authority"});
        for (const LayerAgreement& la : nd.layers) {
            std::string toks;
            for (std::int64_t x : la.flipped_tokens) toks += fmt::format("{}{}", toks.empty() ? "" : " ", x);
            t.add_row({std::to_string(la.layer), fmt_rate(la.free.exact_match_rate), fmt_rate(la.free.set_overlap_rate),
                       std::to_string(la.border_tokens), std::to_string(la.border_flipped), std::to_string(la.other_flipped),
                       toks.empty() ? "—" : toks, fmt_rate(la.pinned.exact_match_rate)});
        }
        out += t.render("  ");
    }
    return out + render_self_checks_text(r.repeat, st);
}

std::string render_generate_text(const GenerateReport& r, const Style& st) {
    std::string out = header("Step 5 — generation stability", r.config, r.nodes[r.reference], st);
    out += st.dim(fmt::format("greedy, {} new tokens; free = own router and own argmax; pinned = reference tokens fed "
                              "(teacher forcing) and reference routing imposed",
                              r.config.new_tokens)) +
           "\n";
    out += fmt::format("reference tokens: {}\n", fmt::join(r.reference_tokens, " "));
    if (r.reference_text) out += fmt::format("reference text:   {}\n", one_line_text(*r.reference_text));
    out += "\n";
    TextTable t({"node", "first divergence", "ref margin there", "own margin there", "teacher-forced divergences",
                 "pinned max|Δ| logits", "pinned sequence identical"});
    for (const NodeGenerate& ng : r.results) {
        if (!ng.error.empty()) {
            out += error_line(ng.node, ng.error, st);
            continue;
        }
        const std::string first = ng.first_divergence < 0 ? "none" : st.yellow(fmt::format("step {}", ng.first_divergence));
        const std::string div = fmt::format("{}/{}", ng.divergences, r.config.new_tokens);
        t.add_row({ng.node, first, ng.first_divergence < 0 ? "—" : fmt_sci(ng.ref_margin_at_divergence),
                   ng.first_divergence < 0 ? "—" : fmt_sci(ng.cand_margin_at_divergence),
                   ng.divergences > 0 ? st.yellow(div) : div, fmt_sci(ng.max_abs), ng.sequence_identical ? "yes" : st.red("no")});
    }
    out += t.render("  ");
    for (const NodeGenerate& ng : r.results) {
        if (!ng.error.empty() || ng.first_divergence < 0) continue;
        out += st.dim(fmt::format("  {} free tokens: {}", ng.node, fmt::join(ng.tokens, " "))) + "\n";
    }
    for (const NodeGenerate& ng : r.results)
        if (ng.error.empty() && ng.text) out += fmt::format("  {} text: {}\n", ng.node, one_line_text(*ng.text));
    return out + render_self_checks_text(r.repeat, st);
}

std::string render_perplexity_text(const PerplexityReport& r, const Style& st) {
    std::string out = header("Step 6 — perplexity", r.config, r.nodes[r.reference], st);
    out += st.dim(fmt::format("{} windows of ≤ {} tokens, {} predictions{}; {}", r.windows, r.config.context, r.predictions,
                              r.config.second_half ? " scored (second half of each window, llama-perplexity)" : "",
                              routing_text(r.config, r.config.router_authority
                                                         ? "routing pinned by the reference (router authority)"
                                                         : "each node runs its own router"))) +
           "\n\n";
    TextTable t({"node", "perplexity", "mean NLL", "Δ perplexity", "ratio", "max|ΔNLL|"});
    for (const NodePerplexity& np : r.results) {
        if (!np.error.empty()) {
            t.add_row({np.node, st.red("error: " + np.error), "", "", "", ""});
            continue;
        }
        t.add_row({np.reference ? np.node + " (ref)" : np.node, fmt_fixed(np.perplexity, 6), fmt_fixed(np.mean_nll, 9),
                   np.reference ? "·" : fmt_sci(np.delta), np.reference ? "·" : fmt_fixed(np.ratio, 9),
                   np.reference ? "·" : fmt_sci(np.nll_max_abs_delta)});
    }
    out += t.render("  ");
    if (!r.config.kl_divergence.empty()) {
        out += "\n" + st.dim(fmt::format("llama-perplexity --kl-divergence against {} (base rounding {})",
                                         r.nodes[r.reference].node, r.config.kl_divergence)) + "\n";
        TextTable k({"node", "Mean KLD", "99% KLD", "Maximum KLD", "RMS Δp", "Same top p"});
        for (const NodePerplexity& np : r.results)
            if (np.kl_divergence)
                k.add_row({np.node, fmt_sci(np.kl_divergence->kld.value), fmt_sci(np.kl_divergence->kld_spread.p99),
                           fmt_sci(np.kl_divergence->kld_spread.max), fmt_sci(np.kl_divergence->dp_rms.value),
                           fmt_fixed(np.kl_divergence->same_top.value, 6)});
        out += k.render("  ");
    }
    return out + render_self_checks_text(r.repeat, st);
}

std::string render_task_text(const TaskReport& r, const Style& st) {
    std::string out = header("Step 6 — task score", r.config, r.nodes[r.reference], st);
    const std::size_t n = r.config.items.size();
    out += st.dim(fmt::format("task {}: multiple choice by log-likelihood (lm-eval acc, acc_norm); {}", r.config.source,
                              routing_text(r.config, r.config.router_authority
                                                         ? "routing pinned by the reference (router authority)"
                                                         : "each node runs its own router"))) +
           "\n\n";
    TextTable t({"node", "acc ± stderr", "acc_norm ± stderr", "acc ratio", "acc_norm ratio", "same answer", "max|Δ ll|"});
    for (const NodeTask& nt : r.results) {
        if (!nt.error.empty()) {
            t.add_row({nt.node, st.red("error: " + nt.error), "", "", "", "", ""});
            continue;
        }
        const TaskComparison& v = nt.vs_reference;
        const auto pm = [](double v, double e) { return fmt::format("{:.4f} ± {:.4f}", v, e); };
        t.add_row({nt.reference ? nt.node + " (ref)" : nt.node, pm(nt.scores.acc, nt.scores.acc_stderr),
                   pm(nt.scores.acc_norm, nt.scores.acc_norm_stderr), nt.reference ? "·" : fmt_fixed(v.acc_ratio, 6),
                   nt.reference ? "·" : fmt_fixed(v.acc_norm_ratio, 6),
                   nt.reference ? "·" : fmt::format("{}/{} · {}/{}", v.agree, n, v.agree_norm, n),
                   nt.reference ? "·" : fmt_sci(v.ll_max_abs_delta)});
    }
    return out + t.render("  ");
}

}  // namespace kvasir
