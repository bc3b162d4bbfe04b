// audit — the main job. Today it runs what exists: step 1 (per-op delta) on
// the model's first MoE layer with its real weights, and a full forward pass
// of the model on every node with routing pinned by the reference (logit
// divergence and top-1 agreement). Verdicts, protocol files and CI gating
// arrive with the audit issue; until then the exit code says whether the
// audit ran (0) — not whether the nodes are fit.
#include "commands.hpp"
#include "nodes.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/metrics/stats.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/model/safetensors.hpp"
#include "kvasir/report/json_common.hpp"
#include "kvasir/report/ops_text.hpp"
#include "kvasir/report/text.hpp"
#include "kvasir/steps/forward.hpp"
#include "kvasir/steps/op_delta.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>

namespace kvasir::app {

namespace {

struct AuditOptions {
    std::string model = default_model_path();
    NodeOptions nodes;
    OutputOptions output;
};

// The fixture's own prompt when it ships reference data, else 24 ids.
std::vector<std::int32_t> audit_tokens(const Model& model) {
    const std::filesystem::path ref = std::filesystem::path(model.path()) / "reference.safetensors";
    if (std::filesystem::is_regular_file(ref)) {
        const SafetensorsFile f = SafetensorsFile::open(ref.string());
        if (f.contains("input_ids")) {
            const TensorView v = f.view("input_ids");
            std::vector<std::int32_t> ids(static_cast<std::size_t>(v.numel()));
            for (std::int64_t i = 0; i < v.numel(); ++i) ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(v.at(i));
            return ids;
        }
    }
    std::vector<std::int32_t> ids(24);
    for (std::size_t i = 0; i < ids.size(); ++i)
        ids[i] = static_cast<std::int32_t>((i * 7919 + 13) % static_cast<std::size_t>(model.config().vocab_size));
    return ids;
}

void run_audit(const AuditOptions& opt) {
    const Model model = Model::open(opt.model);
    Nodes nodes = create_nodes(opt.nodes);
    const std::size_t ref = nodes.reference;
    const Style st = style_for(stdout);

    // Step 1 on the first MoE layer's real weights.
    OpsConfig oc;
    oc.model = &model;
    for (std::int64_t l = 0; l < model.config().num_layers; ++l)
        if (model.config().is_moe(l)) {
            oc.layer = l;
            break;
        }
    KVASIR_CHECK(oc.layer >= 0, ErrorCode::bad_input, "{}: the model has no MoE layer", opt.model);
    const OpsReport ops = run_op_delta(oc, nodes.nodes, ref);

    // Full forward, routing pinned by the reference.
    const std::vector<std::int32_t> tokens = audit_tokens(model);
    const ForwardResult ref_run = forward(*nodes.nodes[ref], model, tokens);
    ForwardOptions pinned;
    pinned.routing = &ref_run.routing;
    nlohmann::ordered_json nodes_json = nlohmann::ordered_json::array();
    TextTable summary({"node", "logits max|Δ|", "cosine", "KL p99", "top-1 agree", "worst op (max rel)", "status"});
    const std::int64_t vocab = model.config().vocab_size;
    for (std::size_t i = 0; i < nodes.nodes.size(); ++i) {
        const Capabilities& caps = nodes.nodes[i]->capabilities();
        nlohmann::ordered_json nj;
        nj["capabilities"] = to_json(caps);
        if (i == ref) {
            summary.add_row({caps.node, "", "", "", "", "", st.dim("reference")});
            nj["role"] = "reference";
            nodes_json.push_back(std::move(nj));
            continue;
        }
        std::string worst_op = "—";
        double worst = -1;
        for (const OpResult& op : ops.ops)
            if (op.matrix[ref][i] && !(op.matrix[ref][i]->max_rel <= worst)) {
                worst = op.matrix[ref][i]->max_rel;
                worst_op = fmt::format("{} ({})", op.op, fmt_sci(worst));
            }
        try {
            const ForwardResult run = forward(*nodes.nodes[i], model, tokens, pinned);
            const CompareStats s = compare(ref_run.logits, run.logits);
            std::vector<double> kl;
            std::int64_t agree = 0;
            const std::int64_t T = static_cast<std::int64_t>(tokens.size());
            const std::vector<double> rl = ref_run.logits.to_f64(), cl = run.logits.to_f64();
            for (std::int64_t t = 0; t < T; ++t) {
                const std::span<const double> a(rl.data() + t * vocab, static_cast<std::size_t>(vocab));
                const std::span<const double> b(cl.data() + t * vocab, static_cast<std::size_t>(vocab));
                kl.push_back(kl_divergence_from_logits(a, b));
                agree += std::max_element(a.begin(), a.end()) - a.begin() == std::max_element(b.begin(), b.end()) - b.begin();
            }
            const Summary ks = summarize(kl);
            summary.add_row({caps.node, fmt_sci(s.max_abs), fmt_cosine(s.cosine), fmt_sci(ks.p99),
                             fmt::format("{}/{}", agree, T), worst_op, finite_parity(s) ? "measured" : st.red("NaN/Inf")});
            nj["logits"] = to_json(s);
            nj["kl"] = to_json(ks);
            nj["top1_agreement"] = to_json(binomial(agree, T));
        } catch (const std::exception& e) {
            summary.add_row({caps.node, "", "", "", "", worst_op, st.red(std::string("error: ") + e.what())});
            nj["error"] = e.what();
        }
        nodes_json.push_back(std::move(nj));
    }

    nlohmann::ordered_json j;
    j["schema"] = "kvasir-equiv/audit-preview/1";
    j["tool"] = tool_json();
    j["model"] = model.path();
    j["model_fingerprint"] = model.fingerprint();
    j["reference"] = nodes.nodes[ref]->capabilities().node;
    j["verdicts"] = "not implemented yet: protocol files, tolerances and verdicts arrive with the audit issue";
    j["nodes"] = nodes_json;
    j["ops"] = to_json(ops);
    if (!opt.output.output_file.empty()) write_file_atomic(opt.output.output_file, j.dump(2) + "\n");
    if (opt.output.json) {
        std::cout << j.dump(2) << '\n';
        return;
    }
    std::cout << st.bold("kvasir-equiv audit (preview)") << "  model " << model.path() << " ("
              << architecture_name(model.config().architecture) << "), " << tokens.size() << " tokens, reference "
              << nodes.nodes[ref]->capabilities().node << "\n"
              << st.dim("Full forward on every node with routing pinned by the reference; step 1 on layer " +
                        std::to_string(oc.layer) + "'s real weights.") << "\n\n"
              << summary.render() << "\n"
              << render_ops_text(ops, st) << "\n"
              << st.yellow("Verdicts (fit / unfit-sensitive / unfit) and CI gating are not implemented yet: exit code 0 "
                           "means the audit ran, not that the nodes passed.")
              << "\n";
}

}  // namespace

void set_audit_command(CLI::App& app) {
    auto opt = std::make_shared<AuditOptions>();
    CLI::App* cmd = app.add_subcommand("audit", "The main job: measure every node against the reference on a real model "
                                                "(default: the embedded fixture)");
    cmd->add_option("-m,--model", opt->model, "Model: HF folder, .safetensors or .gguf")->capture_default_str();
    add_node_options(*cmd, opt->nodes);
    add_output_options(*cmd, opt->output);
    cmd->callback([opt] { run_audit(*opt); });
}

}  // namespace kvasir::app
