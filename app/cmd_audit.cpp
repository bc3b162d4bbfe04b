// audit — the main job: run the protocol's six steps on every node, judge
// each node against the protocol's two tiers, write the reports, and exit
// 0 (every node meets the gate), 1 (some node does not), 2 (bad usage or
// input), 3 (internal error). Each node runs in its own child process
// (audit/isolation.hpp) unless --in-process.
#include "commands.hpp"
#include "nodes.hpp"
#include "report_output.hpp"

#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/slurm.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/report/audit_json.hpp"
#include "kvasir/report/audit_text.hpp"
#include "kvasir/audit/protocol.hpp"
#include "kvasir/report/writers.hpp"
#include "kvasir/audit/audit.hpp"
#include "kvasir/audit/isolation.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <cstdio>
#include <iostream>
#include <memory>

namespace kvasir::app {

namespace {

struct AuditOptions {
    std::string protocol;  // empty: default_protocol_path(--model given)
    std::string model;  // empty: the protocol's model, else the embedded fixture
    NodeOptions nodes;
    bool reference_given = false;
    std::optional<std::uint64_t> seed;
    std::vector<std::string> steps;  // --steps: a subset of the protocol's
    bool timings = false;
    bool in_process = false;
    std::optional<double> node_timeout_s, node_memory_gib;
    std::optional<int> jobs;
    std::string resume;  // --resume DIR
    std::string slurm;   // --slurm DIR: write the Slurm jobs instead of running
    bool slurm_submit = false;
    SlurmOptions slurm_options;
    PerplexityFlags perplexity;
    ReportOptions report;
};

// The default memory limit of a node's process: 90 % of the machine's memory.
double default_node_memory_gib() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return 64.0;
    return 0.9 * static_cast<double>(pages) * static_cast<double>(page) / (1024.0 * 1024.0 * 1024.0);
}

// The weights a child process maps (every tensor's bytes in the file).
std::uint64_t model_weight_bytes(const Model& model) {
    std::uint64_t bytes = 0;
    for (const ModelTensorEntry& e : model.tensor_table()) bytes += e.bytes;
    return bytes;
}

// A limit must be a positive, finite number: one line naming the option.
CLI::Validator positive(const std::string& option, const std::string& unit) {
    return CLI::Validator(
        [option, unit](std::string& text) -> std::string {
            char* end = nullptr;
            const double v = std::strtod(text.c_str(), &end);
            if (end == text.c_str() || *end != '\0' || !(v > 0) || !std::isfinite(v))
                return fmt::format("must be a positive number of {}, not '{}'", unit, text);
            return {};
        },
        "POSITIVE", option);
}

// This executable, for the child processes.
std::string self_executable() {
    std::error_code ec;
    const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
    KVASIR_CHECK(!ec, ErrorCode::internal, "cannot find this executable (/proc/self/exe): {}", ec.message());
    return p.string();
}

IsolationOptions isolation_options(const AuditOptions& opt, const Protocol& protocol, const Model& model) {
    IsolationOptions iso;
    iso.executable = self_executable();
    iso.protocol_path = protocol.source;
    iso.protocol_arguments = perplexity_overrides(opt.perplexity).arguments();  // the children apply them too
    iso.model_path = model.path();
    iso.node_timeout_s = opt.node_timeout_s.value_or(protocol.limits.node_timeout_s > 0 ? protocol.limits.node_timeout_s : 1800.0);
    iso.node_memory_gib =
        opt.node_memory_gib.value_or(protocol.limits.node_memory_gib > 0 ? protocol.limits.node_memory_gib : default_node_memory_gib());
    iso.resume_dir = opt.resume;
    return iso;
}

// audit --slurm: the nodes as Slurm jobs (audit/slurm.hpp). Nothing runs and
// no node is started here — the machine that writes the jobs need not have
// the devices; the plan is made (tokens read, steps checked) so that a bad
// protocol fails now, not in the queue.
void write_slurm_audit(const AuditOptions& opt, const Protocol& protocol, const Model& model, const AuditConfig& cfg,
                       const std::vector<std::string>& given, const std::string& reference) {
    (void)detail::make_audit_plan(cfg);
    std::vector<std::string> specs{BackendSpec::parse(reference).canonical()};
    for (const std::string& s : given) {
        const std::string c = BackendSpec::parse(s).canonical();
        KVASIR_CHECK(c == specs[0] || std::find(specs.begin() + 1, specs.end(), c) == specs.end(), ErrorCode::bad_input,
                     "node '{}' given twice", c);
        if (c != specs[0]) specs.push_back(c);
    }
    IsolationOptions iso = isolation_options(opt, protocol, model);
    // Paths every machine of the cluster resolves alike (an empty protocol path is the embedded default).
    if (!iso.protocol_path.empty()) iso.protocol_path = std::filesystem::absolute(iso.protocol_path).string();
    if (!iso.model_path.empty()) iso.model_path = std::filesystem::absolute(iso.model_path).string();
    const std::string dir = std::filesystem::absolute(opt.slurm).lexically_normal().string();
    std::vector<std::string> compare{"--protocol", iso.protocol_path, "--reference", specs[0], "--gate", opt.report.gate};
    if (!cfg.only_steps.empty()) compare.insert(compare.end(), {"--only-steps", fmt::format("{}", fmt::join(cfg.only_steps, ","))});
    std::vector<std::string> contrast = cfg.contrast_nodes;
    // The default list's precision-mismatch contrast, as the local audit shows it.
    if (opt.nodes.backends.empty() && std::find(specs.begin(), specs.end(), "cpu:acc=f16") != specs.end())
        contrast.push_back("cpu:acc=f16");
    for (const std::string& c : contrast) compare.insert(compare.end(), {"--contrast", c});
    compare.insert(compare.end(), iso.protocol_arguments.begin(), iso.protocol_arguments.end());
    const auto out = [&](const char* option, const std::string& path, const char* fallback) {
        const std::string p = path.empty() ? (fallback ? (std::filesystem::path(dir) / fallback).string() : "")
                                           : std::filesystem::absolute(path).string();
        if (!p.empty()) compare.insert(compare.end(), {option, p});
    };
    out("--output", opt.report.output.output_file, "report.json");
    out("--markdown", opt.report.files.markdown, nullptr);
    out("--html", opt.report.files.html, nullptr);
    out("--junit", opt.report.files.junit, nullptr);
    const std::uint64_t seed = cfg.seed.value_or(protocol.seed);
    SlurmOptions so = opt.slurm_options;
    so.dir = dir;
    const SlurmJobs jobs = write_slurm_jobs(iso, specs, 0, seed, cfg.only_steps, compare, so);
    std::printf("%zu nodes as Slurm jobs in %s:\n", specs.size(), jobs.dir.c_str());
    for (const std::string& f : jobs.files) std::printf("  %s\n", f.c_str());
    if (!opt.slurm_submit) {
        std::printf("submit with: %s\n", jobs.submit.c_str());
        return;
    }
    std::fflush(stdout);
    const int rc = std::system(shell_quote(jobs.submit).c_str());
    KVASIR_CHECK(rc == 0, ErrorCode::backend_failure, "--slurm-submit: {} failed (status {})", jobs.submit, rc);
}

void run_audit_command(const AuditOptions& opt) {
    check_report_outputs(opt.report);  // before anything runs: a misused output costs no audit
    const Protocol protocol = load_run_protocol(opt.protocol, !opt.model.empty(), opt.perplexity);
    const Gate gate = parse_gate(opt.report.gate);
    // Before the model is opened and any node created: a misspelt step costs nothing.
    const std::vector<std::string> steps = select_steps(protocol, split_commas(opt.steps), "--steps");
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
    cfg.only_steps = steps;
    // x_floor tolerances need their floor node measured in this run: added
    // when not listed, and then shown but not gated.
    std::vector<std::string> specs = node_specs(node_opts);  // --backends split once, here
    bool floor_added = false;
    if (protocol.uses_floor() && std::none_of(specs.begin(), specs.end(), [&](const std::string& spec) {
            return BackendSpec::parse(spec).canonical() == protocol.floor;
        })) {
        specs.push_back(protocol.floor);
        floor_added = true;
    }
    if (floor_added) cfg.contrast_nodes.push_back(protocol.floor);
    if (!opt.slurm.empty()) {
        write_slurm_audit(opt, protocol, model, cfg, specs, node_opts.reference);
        return;
    }
    Nodes nodes = create_nodes(specs, node_opts.reference, &model, &cfg.failed_nodes);
    cfg.progress = progress_printer();
    // The default list's precision-mismatch contrast is shown, not gated,
    // unless the user asked for it by name.
    if (opt.nodes.backends.empty())
        for (const auto& n : nodes.nodes)
            if (n->capabilities().node == "cpu:acc=f16") cfg.contrast_nodes.push_back("cpu:acc=f16");

    AuditRun run;
    if (opt.in_process) {
        run = run_audit(cfg, nodes.nodes, nodes.reference);
    } else {
        IsolationOptions iso = isolation_options(opt, protocol, model);
        std::vector<std::string> started;  // the nodes as they named themselves
        for (const auto& n : nodes.nodes) started.push_back(n->capabilities().node);
        iso.jobs = opt.jobs.value_or(default_isolation_jobs(started.size(), model_weight_bytes(model)));
        const std::size_t reference = nodes.reference;
        nodes.nodes.clear();  // the children create their own; no device is held here meanwhile
        run = run_audit_isolated(cfg, started, reference, iso);
    }
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
    cmd.add_option("--html", o.files.html,
                   "Write one self-contained HTML report (verdicts, heatmaps, plots, every criterion; no network); its header "
                   "records the date (SOURCE_DATE_EPOCH when set) and machine");
}

void check_report_outputs(const ReportOptions& o, std::vector<std::pair<std::string, std::string>> more) {
    const std::pair<const char*, const std::string*> files[] = {
        {"--output", &o.output.output_file}, {"--junit", &o.files.junit},         {"--markdown", &o.files.markdown},
        {"--csv", &o.files.csv},             {"--svg-heatmap", &o.files.heatmap_svg}, {"--svg-drift", &o.files.drift_svg},
        {"--html", &o.files.html}};
    for (const auto& [option, path] : files)
        if (!path->empty()) more.emplace_back(option, *path);
    check_output_paths(more);
}

void emit_report(const AuditRun& run, const ReportOptions& o) {
    OutputPaths files = o.files;
    files.json = o.output.output_file;
    write_outputs(run.report, files, files.html.empty() ? HtmlStamp{} : html_stamp());  // atomically, each file, after everything ran
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
    cmd->add_option("-p,--protocol", opt->protocol,
                    "Protocol file (steps, shapes, seed, tolerances). Default: protocols/trained.json, the trained "
                    "fixture audited from text with its task score; with --model: protocols/default.json (token-id "
                    "streams, no tokenizer needed)");
    cmd->add_option("-m,--model", opt->model,
                    "Model: HF folder, .safetensors or .gguf (default: the protocol's model; the default protocol's is "
                    "the trained fixture fixtures/models/qwen3_moe_trained)");
    add_node_options(*cmd, opt->nodes);
    cmd->get_option("--reference")->description("Node every other node is compared with (default: the protocol's, cpu-ref)");
    cmd->get_option("--reference")->each([opt](const std::string&) { opt->reference_given = true; });
    cmd->add_option("--seed", opt->seed, "Override the protocol's seed (seeded op inputs); the report records it");
    cmd->add_option("--steps", opt->steps,
                    "Run and judge only these steps of the protocol, comma separated (e.g. invariance, or ops,drift); "
                    "the verdicts then rest on their criteria alone and every report names the subset. Default: every "
                    "step of the protocol");
    cmd->add_flag("--in-process", opt->in_process,
                  "Compute every node in this process (for debugging: a node that crashes then takes the audit down). "
                  "Default: each node in its own child process, so a crash, hang or runaway allocation is that node's "
                  "error");
    cmd->add_option("--node-timeout", opt->node_timeout_s,
                    "Wall-clock limit of each node's process, seconds (default: the protocol's limits.node_timeout_s, "
                    "else 1800)")
        ->check(positive("--node-timeout", "seconds"));
    cmd->add_option("--jobs,-j", opt->jobs,
                    "Nodes computed at once, each in its own process, after the reference (alone, first). Default: "
                    "this machine's cores, at most the nodes, as many as fit in half of the available memory. 1: "
                    "each node has the machine to itself, so --timings shows its own seconds. The figures never "
                    "depend on it")
        ->check(CLI::Range(1, 1024));
    cmd->add_option("--resume", opt->resume,
                    "Keep every node's capture (and the reference's decisions) in DIR; run again with the same DIR "
                    "after a kill or a crash, and every complete capture of the same protocol, seed, model, node and "
                    "steps is reused (verified by its content hash) — only the other nodes run. Also: capture the "
                    "reference once and audit more nodes against it later. Not with --in-process")
        ->excludes(cmd->get_option("--in-process"));
    cmd->add_option("--node-memory", opt->node_memory_gib,
                    "Host-memory limit of each node's process on the memory it owns (anonymous + shared; the "
                    "pages of mapped weights are the kernel's to reclaim and do not count), GiB (default: the "
                    "protocol's limits.node_memory_gib, else 90% of this machine's memory)")
        ->check(positive("--node-memory", "GiB"));
    cmd->add_option("--slurm", opt->slurm,
                    "Run nothing here: write the audit as Slurm jobs into DIR, a folder every machine of the cluster "
                    "sees — a job array of the nodes' captures (device nodes, cuda and hip, in their own array with "
                    "--slurm-device-sbatch) and a compare job after them that writes DIR/report.json (and the "
                    "--markdown/--html/--junit files) and ends with the audit's exit status; then DIR/submit.sh "
                    "submits them")
        ->excludes(cmd->get_option("--in-process"))
        ->excludes(cmd->get_option("--resume"));
    cmd->add_flag("--slurm-submit", opt->slurm_submit, "With --slurm: run DIR/submit.sh (sbatch on PATH)");
    cmd->add_option("--slurm-sbatch", opt->slurm_options.sbatch,
                    "With --slurm: sbatch options for every job, e.g. \"--partition=cpu --time=4:00:00\"");
    cmd->add_option("--slurm-device-sbatch", opt->slurm_options.device_sbatch,
                    "With --slurm: sbatch options added for the device nodes' array")
        ->capture_default_str();
    add_perplexity_flags(*cmd, opt->perplexity, "; overrides the protocol's steps.perplexity");
    add_timings_flag(*cmd, opt->timings,
                     "the load phase, then per step its wall seconds, the seconds inside each backend and the rest "
                     "(comparing)");
    add_report_options(*cmd, opt->report);
    cmd->callback([opt] { run_audit_command(*opt); });
}

}  // namespace kvasir::app
