#include "kvasir/report/audit_text.hpp"
#include "kvasir/audit/step_invariance.hpp"
#include "kvasir/audit/step_perplexity.hpp"
#include "kvasir/audit/step_task.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

namespace kvasir {

namespace {

std::string colour_verdict(Verdict v, const Style& st) {
    const std::string s = to_string(v);
    switch (v) {
        case Verdict::fit: return st.green(s);
        case Verdict::unfit_sensitive: return st.yellow(s);
        case Verdict::unfit:
        case Verdict::error: return st.red(s);
        case Verdict::reference: return st.dim(s);
    }
    return s;
}

std::string cell(const std::optional<double>& v, bool cosine) {
    if (!v) return "—";
    return cosine ? fmt_cosine(*v) : fmt_sci(*v);
}

std::string render_pair(const PairMatrix& m, const Style& st) {
    std::string out = st.bold(m.name) + "  " + st.dim(m.description) + "\n";
    for (const bool cosine : {false, true}) {
        std::vector<std::string> header{cosine ? "cosine" : "max|Δ|"};
        header.insert(header.end(), m.nodes.begin(), m.nodes.end());
        TextTable t(header);
        for (std::size_t a = 0; a < m.nodes.size(); ++a) {
            std::vector<std::string> row{m.nodes[a]};
            for (std::size_t b = 0; b < m.nodes.size(); ++b)
                row.push_back(a == b ? "·" : cell(cosine ? m.cosine[a][b] : m.max_abs[a][b], cosine));
            t.add_row(row);
        }
        out += t.render("  ");
    }
    return out;
}

// A self-comparison figure: "identical" (the same bits) or the guarded max_rel.
std::string self_cell(double v, const Style& st) {
    if (v == 0.0) return st.green("identical");
    if (std::isfinite(v)) return st.yellow(fmt_sci(v));
    return st.red(fmt_sci(v));
}

// The invariance step: each node against itself.
std::string render_invariance(const AuditReport& r, const Style& st) {
    const InvarianceResult* step = r.result<InvarianceResult>("invariance");
    if (step == nullptr) return "";
    std::vector<std::string> header{"invariance", "row alone vs batch"};
    for (const std::int64_t b : step->batch_sizes) header.push_back(fmt::format("B={}", b));
    header.emplace_back("prefill vs decode");
    header.push_back(fmt::format("unique outputs of {}", step->repeats));
    TextTable t(header);
    for (const InvarianceResult::Entry& n : step->nodes) {
        std::vector<std::string> row{n.node};
        if (n.error) {
            row.push_back(st.red("error: " + *n.error));
            while (row.size() < header.size()) row.emplace_back("");
            t.add_row(row);
            continue;
        }
        if (!n.ops) {
            row.push_back(st.dim("—"));  // not measurable on this node (an external runtime's whole graphs)
        } else {
            std::string ops_text;
            for (const auto& [op, v] : *n.ops)
                if (v != 0.0) ops_text += (ops_text.empty() ? "" : " ") + op;
            row.push_back(ops_text.empty() ? st.green("identical") : st.yellow("differs: " + ops_text));
        }
        for (const InvarianceResult::Batch& b : n.batch) row.push_back(self_cell(b.max_rel, st));
        row.push_back(self_cell(n.prefill_decode_max_rel, st));
        const double bits = n.unique_outputs, tokens = n.unique_token_sequences;
        const std::string cell = fmt::format("{:g} ({:g} as tokens)", bits, tokens);
        row.push_back(bits == 1.0 ? cell : st.yellow(cell));
        t.add_row(row);
    }
    return "\n" + st.bold("Invariance (each node against itself; guarded max_rel, identical = same bits)") + "\n" +
           t.render("  ");
}

// A figure to show: unset when not finite (the reports write "nan").
std::optional<double> finite(double v) { return std::isfinite(v) ? std::optional<double>(v) : std::nullopt; }

// A node's entry of a step's results; null when it has none.
template <class Entry>
const Entry* entry_of(const std::vector<Entry>& results, const std::string& node) {
    for (const Entry& e : results)
        if (e.node == node) return &e;
    return nullptr;
}

// Step 6 in one table: each node's perplexity (ratio to the reference's) and,
// where the protocol has a task, its accuracy and answer agreement.
std::string render_step6(const AuditReport& r, const Style& st) {
    const PerplexityResult* ppl = r.result<PerplexityResult>("perplexity");
    const TaskResult* task = r.result<TaskResult>("task");
    if (ppl == nullptr && task == nullptr) return "";
    std::vector<std::string> header{"step 6"};
    if (ppl) {
        header.push_back("perplexity");
        header.emplace_back("ratio");
    }
    if (task) {
        header.emplace_back("acc ± stderr");
        header.emplace_back("acc_norm ± stderr");
        header.emplace_back("acc ratio");
        header.emplace_back("same answer");
    }
    TextTable t(header);
    // A figure of a node's entry: unset for a node without one, an entry
    // holding an error, or a non-finite figure.
    const auto num = [](const auto* e, double value) { return e != nullptr && !e->error ? finite(value) : std::nullopt; };
    const auto acc_cell = [](std::optional<double> v, std::optional<double> se) {
        return v ? fmt::format("{:.4f} ± {:.4f}", *v, se.value_or(0.0)) : std::string("—");
    };
    for (const NodeVerdict& v : r.nodes) {
        std::vector<std::string> row{v.verdict == Verdict::reference ? v.node + " (ref)" : v.node};
        const bool ref = v.verdict == Verdict::reference;
        if (ppl) {
            const PerplexityResult::Entry* e = ref ? nullptr : entry_of(ppl->results, v.node);
            const std::optional<double> p = ref ? finite(ppl->reference_perplexity) : num(e, e ? e->perplexity : 0.0);
            row.push_back(p ? fmt::format("{:.6g}", *p) : "—");
            const std::optional<double> ratio = num(e, e ? e->ratio : 0.0);
            row.push_back(ref ? "·" : ratio ? fmt::format("{:.9f}", *ratio) : "—");
        }
        if (task) {
            if (ref) {
                row.push_back(acc_cell(finite(task->reference_acc), finite(task->reference_acc_stderr)));
                row.push_back(acc_cell(finite(task->reference_acc_norm), finite(task->reference_acc_norm_stderr)));
                row.emplace_back("·");
                row.emplace_back("·");
            } else {
                const TaskResult::Entry* e = entry_of(task->results, v.node);
                const bool has = e != nullptr && !e->error;  // figures to show
                row.push_back(acc_cell(num(e, has ? e->acc : 0.0), num(e, has ? e->acc_stderr : 0.0)));
                row.push_back(acc_cell(num(e, has ? e->acc_norm : 0.0), num(e, has ? e->acc_norm_stderr : 0.0)));
                const std::optional<double> ratio = num(e, has ? e->vs.acc_ratio : 0.0), agree = num(e, has ? e->agreement() : 0.0);
                row.push_back(ratio ? fmt::format("{:.6f}", *ratio) : "—");
                row.push_back(agree ? fmt::format("{:.4f}", *agree) : "—");
            }
        }
        t.add_row(row);
    }
    std::string title = "Step 6: ";
    if (ppl) title += fmt::format("perplexity over {} predictions", ppl->predictions);
    if (task) title += fmt::format("{}task score, {} multiple-choice items (lm-eval acc, acc_norm)", ppl ? "; " : "", task->items);
    return "\n" + st.bold(title) + "\n" + t.render("  ");
}

}  // namespace

namespace {

// The command, the protocol, the model, the reference and the gate; a step
// command's view line.
std::string header_lines(const AuditReport& r, const Style& st) {
    std::string out;
    const bool from_captures = r.model.value("source", std::string()) == "captures";
    out += st.bold(from_captures ? "kvasir-equiv compare" : "kvasir-equiv audit") +
           fmt::format("  protocol {} v{} ({}){}  seed {}\n", r.protocol.id, r.protocol.version,
                       r.protocol.content_hash.substr(0, 19),
                       r.protocol.steps_judged.empty() ? std::string()
                                                       : fmt::format("  steps {} only", fmt::join(r.protocol.steps_judged, ",")),
                       r.seed);
    std::string model = r.model.value("path", std::string());
    if (model.empty()) model = "fingerprint " + r.model.value("fingerprint", std::string("?"));
    if (r.model.contains("architecture")) model += " (" + r.model["architecture"].get<std::string>() + ")";
    out += fmt::format("model {}  reference {}  gate {}\n", model, r.reference, to_string(r.gate));
    // A step command's view: which protocol's tolerances judged it, and on which tokens.
    if (const auto& v = r.protocol.view; !v.is_null())
        out += st.dim(fmt::format("the audit's {} step on {} tokens ({}), judged by protocol {} v{}", v.value("view", std::string()),
                                  v["tokens"].value("count", 0), v["tokens"].value("source", std::string()),
                                  v["of"].value("id", std::string()), v["of"].value("version", 0))) +
               "\n";
    return out + "\n";
}

// One row per node (verdict, gate, the worst criterion), then where to look,
// what was not judged and why, and the errors; counts the verdicts.
std::string verdict_lines(const AuditReport& r, const Style& st, std::map<Verdict, int>& counts) {
    TextTable t({"node", "verdict", "gate", "why (worst criterion: value vs tolerance, margin)"});
    t.left_aligned(4);
    for (const NodeVerdict& v : r.nodes) {
        ++counts[v.verdict];
        std::string why;
        if (v.verdict == Verdict::reference)
            why = st.dim("the reference: every other node is compared with it");
        else if (v.verdict == Verdict::error && !v.errors.empty())
            why = st.red(v.errors.begin()->first + ": " + v.errors.begin()->second);
        else if (v.worst)
            why = describe(*v.worst);
        // A contrast node is shown, not gated: its verdict says what it is.
        const std::string gate = v.verdict == Verdict::reference ? ""
                                 : v.contrast                    ? st.dim(v.floor ? "floor" : "contrast")
                                 : meets_gate(v, r.gate)          ? st.green("pass")
                                                                  : st.red("FAIL");
        t.add_row({v.floor ? v.node + " (floor)" : v.node, colour_verdict(v.verdict, st), gate, why});
    }
    std::string out = t.render();
    for (const NodeVerdict& v : r.nodes)
        for (const auto& [step, where] : v.localisation) out += "where to look for " + v.node + ": " + where + "\n";
    for (const auto& [criterion, why] : not_applicable_criteria(r.nodes))
        out += st.dim(fmt::format("not judged: {} does not apply to this model ({})", criterion, why)) + "\n";
    for (const NodeVerdict& v : r.nodes)
        for (const auto& [why, criteria] : not_measurable_by_reason(v))
            out += st.dim(fmt::format("not judged for {}: {} ({})", v.node, fmt::join(criteria, ", "), why)) + "\n";
    bool any_error = false;
    for (const NodeVerdict& v : r.nodes)
        for (const auto& [step, msg] : v.errors) {
            if (!any_error) out += "\n" + st.bold("Errors") + "\n";
            any_error = true;
            out += "  " + st.red(fmt::format("{} [{}]: {}", v.node, step, msg)) + "\n";
        }
    return out;
}

// The headline matrices of step 1: the MoE block and the plain matmul.
std::string headline_pairs(const AuditReport& r, const Style& st) {
    std::string out;
    int shown = 0;
    for (const PairMatrix& m : r.pairs)
        if (m.name == "moe" || m.name == "matmul") {
            out += (shown++ == 0 ? "\n" + st.bold("Backend pairs (step 1, every node against every node)") + "\n" : "") +
                   render_pair(m, st);
        }
    if (shown > 0 && r.pairs.size() > static_cast<std::size_t>(shown))
        out += st.dim(fmt::format("  ({} more op matrices in --json / --markdown)", r.pairs.size() - shown)) + "\n";
    return out;
}

// Step 2's drift per node and layer, with its growth exponent.
std::string drift_table(const AuditReport& r, const Style& st) {
    if (r.drift.empty()) return {};
    std::size_t layers = 0;
    for (const DriftSeries& d : r.drift) layers = std::max(layers, d.rel.size());
    std::vector<std::string> header{"drift ‖Δ‖/‖ref‖"};
    for (std::size_t l = 0; l < layers; ++l) header.push_back(fmt::format("L{}", l + 1));
    header.emplace_back("α");
    TextTable d(header);
    for (const DriftSeries& s : r.drift) {
        std::vector<std::string> row{s.node};
        for (std::size_t l = 0; l < layers; ++l) row.push_back(l < s.rel.size() ? fmt_sci(s.rel[l]) : "");
        row.push_back(fmt::format("{:.2f}", s.alpha));
        d.add_row(row);
    }
    return "\n" + st.bold("Drift over depth (step 2, residual stream after each layer)") + "\n" + d.render("  ");
}

// The sample-size warnings, the verdict counts and the exit code, the contrast nodes.
std::string closing_lines(const AuditReport& r, const Style& st, std::map<Verdict, int>& counts) {
    std::string out;
    if (const std::vector<std::string> warnings = sample_size_warnings(r.nodes); !warnings.empty()) {
        out += "\n" + st.bold("Warnings (sample sizes)") + "\n";
        for (const std::string& w : warnings) out += "  " + st.yellow(w) + "\n";
    }
    const int code = exit_code(r.nodes, r.gate);
    std::vector<std::string> contrast;
    for (const NodeVerdict& v : r.nodes)
        if (v.contrast) contrast.push_back(v.node);
    out += "\n" + fmt::format("{} fit, {} unfit-sensitive, {} unfit, {} error → exit {} (gate {})",
                              counts[Verdict::fit], counts[Verdict::unfit_sensitive], counts[Verdict::unfit],
                              counts[Verdict::error], code, to_string(r.gate)) +
           "\n";
    if (!contrast.empty())
        out += st.dim(fmt::format("{} shown as a contrast, not gated (name it in --backends to gate it)",
                                  fmt::format("{}", fmt::join(contrast, ", ")))) +
               "\n";
    return out;
}

}  // namespace

std::string render_audit_text(const AuditReport& r, const Style& st) {
    std::map<Verdict, int> counts;
    std::string out = header_lines(r, st) + verdict_lines(r, st, counts);
    // Nothing compared: say so, and print no table without a pair in it.
    const bool any_candidate = std::any_of(r.nodes.begin(), r.nodes.end(),
                                           [](const NodeVerdict& v) { return v.verdict != Verdict::reference; });
    if (!any_candidate) {
        out += "\n" + st.red("No node was compared with the reference: nothing compared is never a pass.") + "\n";
        out += "\n" + fmt::format("0 nodes judged → exit {} (gate {})", exit_code(r.nodes, r.gate), to_string(r.gate)) + "\n";
        return out;
    }
    out += headline_pairs(r, st) + drift_table(r, st) + render_invariance(r, st) + render_step6(r, st);
    return out + closing_lines(r, st, counts);
}

std::string render_timings(const RunTimings& t) {
    std::string out = "timings (wall seconds; not part of the report)\n";
    if (t.loaded) {
        const double gb = static_cast<double>(t.load_bytes) * 1e-9;
        out += fmt::format("  load   {:.3f} GB of weights in {:.2f} s ({:.2f} GB/s)\n", gb, t.load_seconds,
                           t.load_seconds > 0 ? gb / t.load_seconds : 0.0);
    } else {
        out += fmt::format("  load   {}\n", t.load_note.empty() ? "none" : t.load_note);
    }
    std::vector<std::string> header{"step", "wall"};
    for (const std::string& n : t.nodes) header.push_back(n);
    header.push_back("other");
    TextTable table(header);
    StepTiming total{"total", 0, std::vector<double>(t.nodes.size(), 0.0)};
    auto row = [&](const StepTiming& s) {
        std::vector<std::string> cells{s.step, fmt::format("{:.2f}", s.wall)};
        double inside = 0;
        for (double v : s.node_seconds) {
            cells.push_back(fmt::format("{:.2f}", v));
            inside += v;
        }
        cells.push_back(fmt::format("{:.2f}", std::max(0.0, s.wall - inside)));
        table.add_row(std::move(cells));
    };
    for (const StepTiming& s : t.steps) {
        row(s);
        total.wall += s.wall;
        for (std::size_t i = 0; i < s.node_seconds.size() && i < total.node_seconds.size(); ++i)
            total.node_seconds[i] += s.node_seconds[i];
    }
    if (t.steps.size() > 1) row(total);
    out += table.render("  ");
    if (t.nodes_at_once > 1)
        out += fmt::format("  nodes  {} at once (each node's seconds include the contention); the "
                           "audit took {:.2f} s\n",
                           t.nodes_at_once, t.elapsed);
    else if (t.elapsed > 0)
        out += fmt::format("  nodes  one at a time; the audit took {:.2f} s\n", t.elapsed);
    if (!t.peak_memory.empty()) {
        // Its own memory is what stays bounded on a model larger than RAM;
        // resident adds the mapped weights the kernel happened to keep cached.
        std::string line = "  memory peak per node process, own / resident with mapped weights:";
        const auto gib = [](std::uint64_t b) { return static_cast<double>(b) / (1u << 30); };
        for (const auto& m : t.peak_memory) line += fmt::format(" {} {:.2f} / {:.2f} GiB,", m.node, gib(m.own), gib(m.resident));
        line.back() = '\n';
        out += line;
    }
    for (const auto& [node, c] : t.weight_caches) {
        if (c.budget_bytes == 0) {
            out += fmt::format("  weight cache {}: off; {} weights uploaded per call, {:.3f} GB\n", node, c.uncacheable,
                               static_cast<double>(c.bytes_uploaded) * 1e-9);
            continue;
        }
        out += fmt::format("  weight cache {}: {} hits, {} misses, {} evictions, {} declined, {} uncacheable, {} oversized; "
                           "{:.3f} GB uploaded; {} resident, {:.3f} of {:.3f} GB\n",
                           node, c.hits, c.misses, c.evictions, c.declined, c.uncacheable, c.oversized,
                           static_cast<double>(c.bytes_uploaded) * 1e-9, c.resident_entries,
                           static_cast<double>(c.resident_bytes) * 1e-9, static_cast<double>(c.budget_bytes) * 1e-9);
    }
    if (!t.transfers.empty()) {
        // The device nodes' traffic: what a device-resident design drives to O(1) per forward step.
        TextTable tt({"transfers", "step", "uploads", "MB up", "downloads", "MB down", "syncs", "launches", "allocations"});
        const auto add = [&](const std::string& node, const std::string& step, const TransferStats& x) {
            tt.add_row({node, step, std::to_string(x.uploads), fmt::format("{:.3f}", static_cast<double>(x.upload_bytes) * 1e-6),
                        std::to_string(x.downloads), fmt::format("{:.3f}", static_cast<double>(x.download_bytes) * 1e-6),
                        std::to_string(x.syncs), std::to_string(x.launches), std::to_string(x.allocations)});
        };
        for (const NodeTransfers& n : t.transfers) {
            for (const auto& [step, x] : n.steps) add(n.node, step, x);
            add(n.node, "total", n.total);
        }
        out += tt.render("  ");
    }
    return out;
}

}  // namespace kvasir
