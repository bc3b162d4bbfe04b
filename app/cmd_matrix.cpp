#include "commands.hpp"
#include "nodes.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/report/markdown.hpp"
#include "kvasir/report/ops_text.hpp"
#include "kvasir/steps/op_delta.hpp"

#include <iostream>
#include <memory>

namespace kvasir::app {

namespace {

struct MatrixOptions {
    std::string model = default_model_path();
    std::int64_t layer = -1;  // -1: the first MoE layer
    OpsConfig config;
    NodeOptions nodes;
    OutputOptions output;
    std::string markdown_file;
};

void run_matrix(MatrixOptions& opt) {
    const Model model = Model::open(opt.model);
    if (opt.layer < 0) {
        for (std::int64_t l = 0; l < model.config().num_layers && opt.layer < 0; ++l)
            if (model.config().is_moe(l)) opt.layer = l;
        KVASIR_CHECK(opt.layer >= 0, ErrorCode::bad_input, "{}: the model has no MoE layer", opt.model);
    }
    OpsConfig c = opt.config;
    c.model = &model;
    c.layer = opt.layer;
    c.ops = {"moe"};
    Nodes nodes = create_nodes(opt.nodes);
    const OpsReport report = run_op_delta(c, nodes.nodes, nodes.reference);
    const auto json = to_json(report);
    const std::string md = pair_table_markdown(report, "moe");
    if (!opt.output.output_file.empty()) write_file_atomic(opt.output.output_file, json.dump(2) + "\n");
    if (!opt.markdown_file.empty()) write_file_atomic(opt.markdown_file, md);
    if (opt.output.json)
        std::cout << json.dump(2) << '\n';
    else
        std::cout << render_ops_text(report, style_for(stdout));
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
    cmd->callback([opt] { run_matrix(*opt); });
}

}  // namespace kvasir::app
