// capture — run the protocol on ONE backend and write what it computed to a
// safetensors capture (protocols/CAPTURE.md); compare — judge any number of
// captures, from any machines and runtimes, exactly as audit judges live
// nodes: same verdicts, matrices, report files and exit codes.
#include "commands.hpp"
#include "report_output.hpp"

#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/metrics/compact.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/steps/substitution.hpp"
#include "kvasir/audit/protocol.hpp"
#include "kvasir/audit/capture.hpp"
#include "kvasir/report/audit_text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

namespace kvasir::app {

namespace {

struct CaptureOptions {
    std::string backend;
    std::string authority = "cpu-ref";
    std::string protocol;  // empty: default_protocol_path(--model given), as audit
    std::string model;
    std::vector<std::string> steps;
    std::optional<std::uint64_t> seed;
    std::string name;
    std::string output;
    PerplexityFlags perplexity;
    bool timings = false;
    std::string decisions_out, decisions_in;
    bool compact = false;
    int top_k = kCompactDefaultTopK;
};

void run_capture(const CaptureOptions& o) {
    KVASIR_CHECK(!o.output.empty(), ErrorCode::bad_input, "capture needs -o FILE");
    check_output_paths({{"--output", o.output}});
    const Protocol protocol = load_run_protocol(o.protocol, !o.model.empty(), o.perplexity);
    const std::string model_path =
        !o.model.empty() ? o.model : (protocol.model.empty() ? default_model_path() : protocol.model_resolved);
    const Model model = Model::open(model_path);
    auto node = create_node(o.backend, &model);
    // Discrete decisions are pinned to the authority: the f64 oracle, which
    // runs anywhere, unless the audit that spawned this capture has another
    // reference.
    std::unique_ptr<Backend> authority;
    Backend* auth = node.get();
    if (node->capabilities().node != create_node(o.authority, &model)->capabilities().node) {
        authority = create_node(o.authority, &model);
        auth = authority.get();
    }
    AuditConfig cfg;
    cfg.protocol = &protocol;
    cfg.model = &model;
    cfg.seed = o.seed;
    KVASIR_CHECK(o.top_k >= 1 && o.top_k <= 64, ErrorCode::bad_input, "--top-k {}: must be in [1, 64]", o.top_k);
    cfg.compact_top_k = o.compact ? o.top_k : 0;
    SharedDecisions shared;
    KVASIR_CHECK(o.decisions_out.empty() || o.decisions_in.empty(), ErrorCode::bad_input,
                 "--decisions-out and --decisions-in: a capture either decides or reads decisions");
    if (!o.decisions_out.empty()) {
        std::filesystem::create_directories(o.decisions_out);
        shared = {SharedDecisions::Mode::write, o.decisions_out};
    } else if (!o.decisions_in.empty()) {
        KVASIR_CHECK(std::filesystem::is_directory(o.decisions_in), ErrorCode::bad_input, "--decisions-in {}: not a folder",
                     o.decisions_in);
        shared = {SharedDecisions::Mode::read, o.decisions_in};
    }
    CaptureData data = capture_node(cfg, *node, *auth, split_commas(o.steps), shared);
    if (!o.name.empty()) data.metadata["node"] = o.name;
    write_capture(o.output, data);
    if (o.timings)  // from the metadata written, not the file: -o /dev/null discards it
        std::fputs(render_timings(timings_of_metadata({{data.metadata.at("node"), &data.metadata}}, {})).c_str(), stderr);
    const auto errors = nlohmann::json::parse(data.metadata.at("errors"));
    std::cout << fmt::format("{}: node {}, protocol {} v{}, steps {}, {} tensors{}\n", o.output, data.metadata.at("node"),
                             protocol.id, protocol.version, data.metadata.at("steps"), data.tensors.size(),
                             errors.empty() ? "" : ", errors in " + errors.dump());
}

struct CompareOptions {
    std::vector<std::string> captures;
    std::string protocol;  // empty: the shipped protocol the captures were made with
    std::string reference;
    std::vector<std::string> only_steps;
    PerplexityFlags perplexity;
    ReportOptions report;
    bool timings = false;
    std::vector<std::string> contrast;
};

void run_compare(const CompareOptions& o) {
    check_report_outputs(o.report);
    std::vector<Capture> caps;
    caps.reserve(o.captures.size());
    for (const std::string& path : o.captures) caps.push_back(Capture::open(path));
    // Every capture's hash is checked against the protocol by compare_captures.
    const Protocol protocol = load_run_protocol(
        o.protocol.empty() ? shipped_protocol_with_hash(caps.front().protocol_hash(), caps.front().path(), o.perplexity)
                           : o.protocol,
        false, o.perplexity);
    std::vector<const Capture*> ptrs;
    for (const Capture& c : caps) ptrs.push_back(&c);
    // The reference: named, else the f64 oracle, else the first capture.
    std::size_t ref = 0;
    const std::string want = o.reference.empty() ? "cpu-ref" : o.reference;
    const auto it = std::find_if(caps.begin(), caps.end(), [&](const Capture& c) { return c.node() == want; });
    if (it != caps.end())
        ref = static_cast<std::size_t>(it - caps.begin());
    else
        KVASIR_CHECK(o.reference.empty(), ErrorCode::bad_input, "--reference {}: no capture of that node (captured: {})",
                     o.reference, fmt::join(o.captures, ", "));
    CompareConfig cc;
    cc.protocol = &protocol;
    cc.gate = parse_gate(o.report.gate);
    cc.only_steps = split_commas(o.only_steps);
    cc.contrast_nodes = o.contrast;
    emit_report(compare_captures(cc, ptrs, ref), o.report);
    if (o.timings) std::fputs(render_timings(timings_of_captures(ptrs, {})).c_str(), stderr);
}

}  // namespace

void set_capture_command(CLI::App& app) {
    auto opt = std::make_shared<CaptureOptions>();
    CLI::App* cmd = app.add_subcommand(
        "capture", "Run the protocol on ONE backend and write its outputs to a capture file for `compare` on another machine");
    cmd->add_option("-b,--backend", opt->backend, "The node: NAME[:DEVICE][:key=value,...], e.g. opencl:0")->required();
    cmd->add_option("-p,--protocol", opt->protocol,
                    "Protocol file (default: as audit — protocols/trained.json, with --model protocols/default.json)");
    cmd->add_option("--authority", opt->authority,
                    "The node whose discrete decisions (routing, tokens, anchors) pin this one; it runs beside it. "
                    "Must be the reference of the later compare")
        ->capture_default_str();
    cmd->add_option("-m,--model", opt->model, "Model (default: the protocol's, the embedded fixture)");
    cmd->add_option("--steps", opt->steps, "Only these steps, comma separated (default: every step of the protocol)");
    cmd->add_option("--seed", opt->seed, "Override the protocol's seed (every capture compared must use the same)");
    cmd->add_option("--name", opt->name,
                    "Node name in the capture (default: the backend spec); e.g. cuda:0@host17 when many machines "
                    "capture the same backend");
    cmd->add_option("-o,--output", opt->output, "Capture file to write (safetensors, atomically)")->required();
    add_perplexity_flags(*cmd, opt->perplexity, "; overrides the protocol's steps.perplexity (compare needs the same)");
    add_timings_flag(*cmd, opt->timings,
                     "per step the node's wall seconds (the authority's share included), as recorded in the capture");
    cmd->add_option("--decisions-out", opt->decisions_out,
                    "Folder to write the authority's decisions into, step by step, for other captures of the same "
                    "protocol, seed and model to read");
    cmd->add_option("--decisions-in", opt->decisions_in,
                    "Folder to read the authority's decisions from (written by --decisions-out, waited for step by "
                    "step) instead of running the authority's passes here; what the isolated audit's node processes do");
    cmd->add_flag("--compact", opt->compact,
                  "Keep, per position of the logits step, the top-K log-probabilities with their ids and the "
                  "log-sum-exp instead of the whole row (1 KiB per 32 positions at K = 3, whatever the vocabulary; "
                  "compare then judges the logits step on what remains: |delta log p| at shared top tokens and the "
                  "hidden-state fingerprint, and names KL and L-infinity as not measured)");
    cmd->add_option("--top-k", opt->top_k, "K of --compact (default 3)");
    cmd->callback([opt] { run_capture(*opt); });
}

void set_compare_command(CLI::App& app) {
    auto opt = std::make_shared<CompareOptions>();
    CLI::App* cmd = app.add_subcommand(
        "compare", "Judge captures from any machines or runtimes as `audit` judges live nodes (same verdicts, reports, exit codes)");
    cmd->add_option("captures", opt->captures, "Capture files (kvasir-equiv capture, scripts/numpy_node.py, ...)")
        ->required();  // each is checked when opened: a FIFO, device or directory is refused by name
    cmd->add_option("-p,--protocol", opt->protocol,
                    "Protocol file the captures were made with, its hash must match (default: the shipped "
                    "protocols/*.json whose hash the captures carry)");
    cmd->add_option("-r,--reference", opt->reference, "Node every other node is compared with (default: cpu-ref if captured, else the first)");
    cmd->add_option("--only-steps", opt->only_steps, "Judge only these steps, comma separated (e.g. ops for numpy/torch nodes)");
    cmd->add_option("--contrast", opt->contrast,
                    "A node shown with its verdict but not gated (the exit status ignores it), as audit shows the "
                    "default list's cpu:acc=f16; repeatable");
    add_perplexity_flags(*cmd, opt->perplexity, "; as given to the capture commands");
    add_report_options(*cmd, opt->report);
    add_timings_flag(*cmd, opt->timings,
                     "the seconds per step each capture recorded when it was made (nothing is computed here)");
    cmd->callback([opt] { run_compare(*opt); });
}

}  // namespace kvasir::app
