// audit — the main job: run the protocol's six steps on every node, judge
// each node against the protocol's two tiers, write the reports, and exit
// 0 (every node meets the gate), 1 (some node does not), 2 (bad usage or
// input), 3 (internal error).
#include "commands.hpp"
#include "nodes.hpp"
#include "report_output.hpp"

#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/report/audit_json.hpp"
#include "kvasir/report/audit_text.hpp"
#include "kvasir/report/protocol.hpp"
#include "kvasir/report/writers.hpp"
#include "kvasir/steps/audit.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

namespace kvasir::app {

namespace {

struct AuditOptions {
    std::string protocol = std::string(KVASIR_SOURCE_DIR) + "/protocols/default.json";
    std::string model;  // empty: the protocol's model, else the embedded fixture
    NodeOptions nodes;
    bool reference_given = false;
    std::optional<std::uint64_t> seed;
    bool timings = false;
    ReportOptions report;
};

// Like create_nodes(), but a node whose backend exists and fails to start
// (Error(backend_failure): a device that does not initialise) becomes an
// error node of the audit instead of stopping it. Bad specs and absent
// backends named explicitly stay exit 2.
Nodes create_audit_nodes(const NodeOptions& options, std::vector<NodeInput>& failed) {
    NodeOptions ok = options;
    ok.backends.clear();
    const std::vector<std::string> specs = options.backends.empty() ? default_nodes() : split_node_list(options.backends);
    for (const std::string& s : specs) {
        try {
            (void)create_backend(s);
            ok.backends.push_back(s);
        } catch (const Error& e) {
            if (e.code() != ErrorCode::backend_failure) throw;
            NodeInput n;
            n.node = s;
            n.capabilities["node"] = s;
            n.errors["create"] = e.what();
            failed.push_back(std::move(n));
        }
    }
    // A list that became empty must not fall back to the defaults.
    if (ok.backends.empty()) ok.backends.push_back(options.reference);
    return create_nodes(ok);
}

void run_audit_command(const AuditOptions& opt) {
    const Protocol protocol = load_protocol(opt.protocol);
    const Gate gate = parse_gate(opt.report.gate);
    std::string model_path = opt.model;
    if (model_path.empty()) model_path = protocol.model.empty() ? default_model_path() : protocol.model_resolved;
    const auto t_open = std::chrono::steady_clock::now();
    const Model model = Model::open(model_path);
    const double open_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_open).count();

    NodeOptions node_opts = opt.nodes;
    if (!opt.reference_given) node_opts.reference = protocol.reference;
    AuditConfig cfg;
    cfg.protocol = &protocol;
    cfg.model = &model;
    cfg.gate = gate;
    cfg.seed = opt.seed;
    Nodes nodes = create_audit_nodes(node_opts, cfg.failed_nodes);
    cfg.progress = progress_printer();

    const AuditRun run = run_audit(cfg, nodes.nodes, nodes.reference);
    if (cfg.progress) end_progress();
    if (opt.timings) {
        // "open" is the header/config parse; the load phase reads the weights.
        std::fprintf(stderr, "model open %.2f s\n%s", open_s, render_timings(run.timings).c_str());
    }
    emit_report(run, opt.report);
}

}  // namespace

void add_report_options(CLI::App& cmd, ReportOptions& o) {
    cmd.add_option("--gate", o.gate,
                   "Which tier a node must meet for exit 0: sensitive (fit), tolerant (fit or unfit-sensitive), none")
        ->capture_default_str()
        ->check(CLI::IsMember({"sensitive", "tolerant", "none"}));
    add_output_options(cmd, o.output);
    cmd.add_option("--junit", o.files.junit, "Write JUnit XML (a testcase per node per criterion)");
    cmd.add_option("--markdown", o.files.markdown, "Write a Markdown report");
    cmd.add_option("--csv", o.files.csv, "Write the MoE-block cosine pair matrix as CSV");
    cmd.add_option("--svg-heatmap", o.files.heatmap_svg, "Write an SVG heatmap of the MoE-block cosine pair matrix");
    cmd.add_option("--svg-drift", o.files.drift_svg, "Write an SVG plot of drift against depth (with √L and L guides)");
}

void emit_report(const AuditRun& run, const ReportOptions& o) {
    OutputPaths files = o.files;
    files.json = o.output.output_file;
    write_outputs(run.report, files);  // atomically, each file, after everything ran
    if (o.output.json)
        std::cout << audit_report_json(run.report).dump(2) << '\n';
    else
        std::cout << render_audit_text(run.report, style_for(stdout));
    command_exit_code() = exit_code(run.report.nodes, run.report.gate);
}

void set_audit_command(CLI::App& app) {
    auto opt = std::make_shared<AuditOptions>();
    CLI::App* cmd = app.add_subcommand(
        "audit",
        "The main job: run the protocol's six steps on every node, judge each node fit / unfit-sensitive / unfit / "
        "error, write the reports. Exit 0: every node meets the gate; 1: some node does not; 2: bad usage or input; "
        "3: internal error");
    cmd->add_option("-p,--protocol", opt->protocol, "Protocol file (steps, shapes, seed, tolerances)")
        ->capture_default_str();
    cmd->add_option("-m,--model", opt->model,
                    "Model: HF folder, .safetensors or .gguf (default: the protocol's model, the embedded fixture)");
    add_node_options(*cmd, opt->nodes);
    cmd->get_option("--reference")->description("Node every other node is compared with (default: the protocol's, cpu-ref)");
    cmd->get_option("--reference")->each([opt](const std::string&) { opt->reference_given = true; });
    cmd->add_option("--seed", opt->seed, "Override the protocol's seed (seeded op inputs); the report records it");
    cmd->add_flag("--timings", opt->timings, "Print where the time went on stderr: the load phase, then per step its wall seconds, the seconds inside each backend and the rest (comparing); not in the report, which stays reproducible");
    add_report_options(*cmd, opt->report);
    cmd->callback([opt] { run_audit_command(*opt); });
}

}  // namespace kvasir::app
