#include "commands.hpp"
#include "nodes.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/report/audit_html.hpp"
#include "kvasir/report/audit_text.hpp"
#include "kvasir/report/markdown.hpp"
#include "kvasir/report/ops_text.hpp"
#include "kvasir/audit/audit.hpp"
#include "kvasir/steps/node_clock.hpp"
#include "kvasir/steps/op_delta.hpp"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>

namespace kvasir::app {

namespace {

struct MatrixOptions {
    std::string model = default_model_path();
    std::optional<std::int64_t> layer;  // default: the first MoE layer
    OpsConfig config;
    NodeOptions nodes;
    OutputOptions output;
    std::string markdown_file;
    std::string html_file;
    bool timings = false;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run_matrix(MatrixOptions& opt) {
    const auto t_open = std::chrono::steady_clock::now();
    const Model model = Model::open(opt.model);
    const double open_s = seconds_since(t_open);
    if (!opt.layer) {
        for (std::int64_t l = 0; l < model.config().num_layers && !opt.layer; ++l)
            if (model.config().is_moe(l)) opt.layer = l;
        KVASIR_CHECK(opt.layer.has_value(), ErrorCode::bad_input, "{}: the model has no MoE layer", opt.model);
    }
    const std::int64_t layer = *opt.layer;
    OpsConfig c = opt.config;
    c.model = &model;
    c.layer = layer;
    c.ops = {"moe"};
    c.validate();
    (void)c.resolved();  // a bad --layer is refused here, in the step's own words
    std::vector<std::pair<std::string, std::string>> outputs;
    if (!opt.output.output_file.empty()) outputs.emplace_back("--output", opt.output.output_file);
    if (!opt.markdown_file.empty()) outputs.emplace_back("--markdown", opt.markdown_file);
    if (!opt.html_file.empty()) outputs.emplace_back("--html", opt.html_file);
    check_output_paths(outputs);
    Nodes nodes = create_nodes(opt.nodes, &model);

    // Load: the layer's weights read once, before any node computes, so the
    // nodes' seconds below are computing only.
    RunTimings timings;
    const std::int64_t layers[] = {layer};
    load_phase(model, layers, false, timings);
    for (const auto& n : nodes.nodes) timings.nodes.push_back(n->capabilities().node);

    const auto progress = progress_printer();
    const int node_count = static_cast<int>(nodes.nodes.size());
    NodeClock clock(nodes.nodes, [&](std::size_t i) {
        if (progress) progress({"matrix", 1, 1, timings.nodes[i], static_cast<int>(i) + 1, node_count});
    });
    const auto t_run = std::chrono::steady_clock::now();
    const OpsReport report = run_op_delta(c, clock.timed(), nodes.reference);
    StepTiming step{"moe", seconds_since(t_run), {}};
    for (std::size_t i = 0; i < clock.size(); ++i) step.node_seconds.push_back(clock.seconds(i));
    timings.steps.push_back(std::move(step));
    if (progress) end_progress();
    record_node_counters(nodes.nodes, timings);
    if (opt.timings) std::fprintf(stderr, "model open %.2f s\n%s", open_s, render_timings(timings).c_str());
    const auto json = to_json(report);
    const std::string md = pair_table_markdown(report, "moe");
    std::string html;  // built before anything is written, like the audit's files
    if (!opt.html_file.empty()) {
        nlohmann::ordered_json m = audit_model_json(model);
        m["layer"] = layer;
        html = matrix_html(report, m, html_stamp());
    }
    if (!opt.output.output_file.empty()) write_file_atomic(opt.output.output_file, json.dump(2) + "\n");
    if (!opt.markdown_file.empty()) write_file_atomic(opt.markdown_file, md);
    if (!opt.html_file.empty()) write_file_atomic(opt.html_file, html);
    if (opt.output.json)
        std::cout << json.dump(2) << '\n';
    else
        std::cout << render_ops_text(report, style_for(stdout));
    std::cout.flush();
    judge_non_finite(json, "matrix", &model);
}

}  // namespace

void set_matrix_command(CLI::App& app) {
    auto opt = std::make_shared<MatrixOptions>();
    CLI::App* cmd = app.add_subcommand(
        "matrix", "Backend-pair matrix (max|Δ|, cosine) of one real MoE layer's block output, routing pinned by the "
                  "reference");
    cmd->add_option("-m,--model", opt->model, "Model: HF folder, .safetensors or .gguf")->capture_default_str();
    cmd->add_option("-l,--layer", opt->layer, "Layer (default: the first MoE layer)");
    cmd->add_option("--tokens", opt->config.tokens, "Tokens")->capture_default_str();
    cmd->add_option("--seed", opt->config.seed, "Seed of the activations")->capture_default_str();
    cmd->add_option("--shards", opt->config.shards, "Simulated expert-parallel nodes in the shard check")
        ->capture_default_str();
    add_node_options(*cmd, opt->nodes);
    add_output_options(*cmd, opt->output);
    cmd->add_option("--markdown", opt->markdown_file, "Also write the pair table as Markdown to FILE");
    cmd->add_option("--html", opt->html_file,
                    "Also write a self-contained HTML page (the nodes, max|Δ| and 1 − cosine heatmaps, the pair table; no network) to FILE");
    add_timings_flag(*cmd, opt->timings, "loading the layer, computing per backend, comparing");
    cmd->callback([opt] { run_matrix(*opt); });
}

}  // namespace kvasir::app
