#include "commands.hpp"

#include <fmt/ranges.h>
#include "nodes.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/report/ops_text.hpp"
#include "kvasir/steps/op_delta.hpp"

#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <optional>

namespace kvasir::app {

namespace {

struct OpsOptions {
    std::string model;
    std::optional<std::int64_t> layer;  // default 0 with --model
    OpsConfig config;
    NodeOptions nodes;
    OutputOptions output;
    bool timings = false;
};

void run_ops(OpsOptions& opt) {
    std::optional<Model> model;
    OpsConfig config = opt.config;
    if (!opt.model.empty()) {
        model.emplace(Model::open(opt.model));
        config.model = &*model;
        config.layer = opt.layer.value_or(0);
    } else {
        KVASIR_CHECK(!opt.layer, ErrorCode::bad_input, "--layer needs --model");
    }
    config.resolved().validate();
    if (!opt.output.output_file.empty()) check_output_paths({{"--output", opt.output.output_file}});
    Nodes nodes = create_nodes(opt.nodes, model ? &*model : nullptr);
    const OpsReport report = run_timed("ops", nodes, opt.timings, [&](std::vector<std::unique_ptr<Backend>>& timed) {
        return run_op_delta(config, timed, nodes.reference);
    });
    const auto json = to_json(report);
    if (!opt.output.output_file.empty()) write_file_atomic(opt.output.output_file, json.dump(2) + "\n");
    if (opt.output.json)
        std::cout << json.dump(2) << '\n';
    else
        std::cout << render_ops_text(report, style_for(stdout));
    std::cout.flush();
    judge_non_finite(json, "ops", model ? &*model : nullptr);
}

}  // namespace

void set_ops_command(CLI::App& app) {
    auto opt = std::make_shared<OpsOptions>();
    CLI::App* cmd = app.add_subcommand(
        "ops", "Step 1: run each op on each node with seeded inputs and print backend-pair matrices (max|Δ|, cosine)");
    OpsConfig& c = opt->config;
    add_node_options(*cmd, opt->nodes);
    cmd->add_option("--ops", c.ops, "Ops to run, comma separated (default: all): " + fmt::format("{}", fmt::join(all_op_names(), ", ")))
        ->delimiter(',');
    cmd->add_option("-m,--model", opt->model, "Take shapes and weights from this model (HF folder, .safetensors, .gguf)");
    cmd->add_option("-l,--layer", opt->layer, "Layer of --model whose weights are used (default 0)");
    cmd->add_option("--seed", c.seed, "Seed of the counter-based input generator")->capture_default_str();
    cmd->add_option("--tokens", c.tokens, "Tokens (rows) per op")->capture_default_str();
    cmd->add_option("--hidden", c.hidden, "Model width")->capture_default_str();
    cmd->add_option("--intermediate", c.intermediate, "Expert FFN width")->capture_default_str();
    cmd->add_option("--experts", c.experts, "Experts in the moe op and the routers")->capture_default_str();
    cmd->add_option("--top-k", c.top_k, "Experts chosen per token")->capture_default_str();
    cmd->add_option("--vocab", c.vocab, "Softmax row width")->capture_default_str();
    cmd->add_option("--heads", c.heads, "Attention heads for rope")->capture_default_str();
    cmd->add_option("--head-dim", c.head_dim, "Head dimension for rope (even)")->capture_default_str();
    cmd->add_option("--position-offset", c.position_offset, "First rope position")->capture_default_str();
    cmd->add_option("--rope-theta", c.rope_theta, "Rope base frequency")->capture_default_str();
    cmd->add_option("--rms-eps", c.rms_eps, "RMSNorm epsilon")->capture_default_str();
    cmd->add_option("--shards", c.shards, "Simulated expert-parallel nodes in the shard check")->capture_default_str();
    add_output_options(*cmd, opt->output);
    add_timings_flag(*cmd, opt->timings, "the ops' wall seconds, the seconds inside each backend and the rest (comparing)");
    cmd->callback([opt] { run_ops(*opt); });
}

}  // namespace kvasir::app
