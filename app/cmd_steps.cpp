// Subcommands of protocol steps 2–6: drift, logits, decide, generate,
// perplexity, task — each a VIEW of the audit (audit/step_view.hpp). Each
// opens the model (the qwen3_moe fixture by default), chooses the token ids
// (resolve_tokens: --tokens-file, --text, --tokens N seeded, or the model's
// reference prompt; the task reads its --items instead), creates the nodes
// and runs the audit's step in this process on a protocol of that one step,
// judged by the base protocol's tolerances (-p, default
// protocols/default.json). It prints the audit report with the step's own
// section (report/step_text.hpp), or the report's JSON (--json, -o: one
// JSON form of a step's result wherever it appears); --gate (default none)
// sets the exit status as audit's does, and a node that failed or went
// non-finite makes it 1 at least.
#include "commands.hpp"
#include "nodes.hpp"

#include "report_output.hpp"

#include "kvasir/audit/step_view.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/core/sha256.hpp"
#include "kvasir/report/audit_text.hpp"
#include "kvasir/report/step_text.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/model/tokenizer.hpp"
#include "kvasir/backend/router_perturbed.hpp"
#include "kvasir/steps/perplexity.hpp"  // kMinPerplexityContext

#include <iostream>
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>

namespace kvasir::app {

namespace {

// The options of a step command: the model, the nodes, the tokens, the
// base protocol and the audit's report options.
struct ViewOptions {
    std::string model = default_model_path();
    NodeOptions nodes;
    std::string tokens_file, text_file, tokenizer;
    std::int64_t tokens = 0;  // 0: not given (TokenOptions)
    std::uint64_t seed = 20261129;
    bool repeat = false;
    bool timings = false;
    std::string protocol;  // empty: protocols/default.json
    ReportOptions report;
};

// tokens_help null: a step that reads no token stream (task) — no token
// options and no --repeat.
void add_view_options(CLI::App& cmd, ViewOptions& o, const char* tokens_help) {
    cmd.add_option("-m,--model", o.model, "Model: HF folder, .safetensors or .gguf")->capture_default_str();
    add_node_options(cmd, o.nodes);
    cmd.add_option("--tokenizer", o.tokenizer,
                   "tokenizer.json for --text, generate's continuations and the task (default: the one beside the model)");
    if (tokens_help != nullptr) {
        // 0 stands for "not given" in TokenOptions, so an explicit 0 is refused here.
        cmd.add_option("--tokens", o.tokens, tokens_help)->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
        cmd.add_option("--tokens-file", o.tokens_file, "Token ids from FILE (whitespace-separated decimal ids)");
        cmd.add_option("--text", o.text_file,
                       "UTF-8 text FILE, tokenized by the model's tokenizer.json (BOS included where it adds one)");
        cmd.add_option("--seed", o.seed, "Seed of generated token ids (and of --perturb-router)")->capture_default_str();
        cmd.add_flag("--repeat", o.repeat, "Also the determinism step: every node run twice on the same tokens, bit-identical or not");
    }
    cmd.add_option("-p,--protocol", o.protocol,
                   tokens_help != nullptr
                       ? "Protocol whose tolerances and statistics judge the step (default: protocols/default.json); its "
                         "token streams are not read — the step runs on this command's tokens"
                       : "Protocol whose tolerances and statistics judge the step (default: protocols/trained.json, "
                         "which runs a task); its items are not read — the step scores --items");
    o.report.gate = "none";  // a measurement: exit 0 unless asked to gate (or a node failed / went non-finite)
    add_report_options(cmd, o.report);
    add_timings_flag(cmd, o.timings, "loading, the seconds inside each node and comparing (as audit --timings)");
}

// Runs `view` on the command's model, tokens and nodes in this process and
// writes the audit report of it: files, then the text (the verdicts and the
// step's own section) or the JSON; exit as --gate says, 1 at least when a
// node failed or computed non-finite figures. `wrap` (optional) decorates
// the nodes once created (decide's --perturb-router).
using WrapNodes = std::function<void(std::vector<std::unique_ptr<Backend>>& nodes, std::size_t reference)>;
void run_view_command(const ViewOptions& o, const Model& model, StepView view, const WrapNodes& wrap = {}) {
    const TokenSequence tokens = !view.reads_tokens ? TokenSequence{{}, fmt::format("none (the {}'s items)", view.step)}
                                                    : resolve_tokens(model, TokenOptions{o.tokens_file, o.text_file, o.tokenizer,
                                                                                         o.tokens, o.seed, 24});
    view.repeat = o.repeat;
    view.settings["seed"] = o.seed;
    const Protocol base = load_protocol(!o.protocol.empty() ? o.protocol : default_protocol_path(view.default_base));
    const Protocol protocol = view_protocol(base, view, tokens);
    check_report_outputs(o.report);
    Nodes nodes = create_nodes(o.nodes, &model);
    if (wrap) wrap(nodes.nodes, nodes.reference);
    AuditRun run = run_view(protocol, model, tokens, nodes.nodes, nodes.reference, parse_gate(o.report.gate), o.seed, o.tokenizer);
    if (o.timings) std::fputs(render_timings(run.timings).c_str(), stderr);
    emit_report(run, o.report);
    if (!o.report.output.json) std::cout << render_step_text(run.report, view.step, style_for(stdout));
    std::cout.flush();
    int code = command_exit_code();
    for (const NodeVerdict& v : run.report.nodes)
        for (const auto& [step, why] : v.errors) {  // a node (or the reference) failed the step
            std::fprintf(stderr, "kvasir-equiv: %s: error in %s: %s\n", v.node.c_str(), step.c_str(), why.c_str());
            code = std::max(code, 1);
        }
    judge_non_finite(run.report.steps.at(view.step), view.step, &model);
    command_exit_code() = std::max(code, command_exit_code());
}

constexpr const char* kPromptTokens = "Use N seeded token ids (default: the model's reference prompt, else 24 seeded ids)";

}  // namespace

void set_drift_command(CLI::App& app) {
    struct Opt {
        ViewOptions view;
        double threshold = 1e-3;
    };
    auto opt = std::make_shared<Opt>();
    CLI::App* cmd = app.add_subcommand(
        "drift", "Step 2 (the audit's drift step): per-layer residual drift against the reference (free-running and "
                 "re-anchored), growth exponent α, where the error starts");
    add_view_options(*cmd, opt->view, kPromptTokens);
    cmd->add_option("--threshold", opt->threshold, "Relative residual delta that marks where it went wrong")
        ->capture_default_str();
    cmd->callback([opt] {
        KVASIR_CHECK(std::isfinite(opt->threshold) && opt->threshold > 0, ErrorCode::bad_input,
                     "--threshold must be > 0, got {}", opt->threshold);
        const Model model = Model::open(opt->view.model);
        const double threshold = opt->threshold;
        run_view_command(opt->view, model,
                         StepView{"drift", false, {{"threshold", threshold}}, [threshold](Protocol& p) { p.drift.threshold = threshold; }});
    });
}

void set_logits_command(CLI::App& app) {
    struct Opt {
        ViewOptions view;
        bool no_authority = false;
    };
    auto opt = std::make_shared<Opt>();
    CLI::App* cmd = app.add_subcommand(
        "logits", "Step 3 (the audit's logits step): per-position L∞, L2 and KL(P_ref‖P) of the final logits against the reference");
    add_view_options(*cmd, opt->view, kPromptTokens);
    cmd->add_flag("--no-authority", opt->no_authority, "Let every node run its own router (default: reference routing imposed)");
    cmd->callback([opt] {
        const Model model = Model::open(opt->view.model);
        const bool authority = !opt->no_authority;
        run_view_command(opt->view, model,
                         StepView{"logits", false, {{"router_authority", authority}},
                                  [authority](Protocol& p) { p.logits.router_authority = authority; }});
    });
}

void set_decide_command(CLI::App& app) {
    struct Opt {
        ViewOptions view;
        double border = 1e-3;
        double perturb = 0;
    };
    auto opt = std::make_shared<Opt>();
    CLI::App* cmd = app.add_subcommand(
        "decide", "Step 4 (the audit's decide step): top-1 agreement with router authority, routing agreement with "
                  "each node's own router, border tokens and their flips");
    add_view_options(*cmd, opt->view, kPromptTokens);
    cmd->add_option("--border", opt->border, "Router gap below which a token is a border token: the k-th − (k+1)-th selection score (softmax probability, or sigmoid + correction bias), for grouped top-k the smaller of that and the margin between the last kept and the first dropped group")
        ->capture_default_str();
    cmd->add_option("--perturb-router", opt->perturb,
                    "Add seeded noise uniform in ±EPS to the candidates' router logits before their own top-k (0: off)")
        ->capture_default_str();
    cmd->callback([opt] {
        KVASIR_CHECK(std::isfinite(opt->border) && opt->border > 0, ErrorCode::bad_input, "--border must be > 0, got {}",
                     opt->border);
        KVASIR_CHECK(std::isfinite(opt->perturb) && opt->perturb >= 0, ErrorCode::bad_input,
                     "--perturb-router must be ≥ 0, got {}", opt->perturb);
        const Model model = Model::open(opt->view.model);
        const double border = opt->border, eps = opt->perturb;
        const std::uint64_t seed = opt->view.seed;
        std::int64_t moe_layers = 0;
        for (std::int64_t l = 0; l < model.config().num_layers; ++l) moe_layers += model.config().is_moe(l) ? 1 : 0;
        KVASIR_CHECK(eps == 0 || moe_layers > 0, ErrorCode::bad_input, "--perturb-router: {} has no MoE layer (no router to perturb)",
                     model.path());
        const WrapNodes perturb = [&](std::vector<std::unique_ptr<Backend>>& nodes, std::size_t reference) {
            if (eps == 0) return;
            for (std::size_t i = 0; i < nodes.size(); ++i)
                if (i != reference) nodes[i] = std::make_unique<RouterPerturbedBackend>(std::move(nodes[i]), eps, seed, moe_layers);
        };
        run_view_command(opt->view, model,
                         StepView{"decide", false, {{"border", border}, {"perturb_router", eps}},
                                  [border](Protocol& p) { p.decide.border = border; }},
                         perturb);
    });
}

void set_generate_command(CLI::App& app) {
    struct Opt {
        ViewOptions view;
        int new_tokens = 16;
    };
    auto opt = std::make_shared<Opt>();
    CLI::App* cmd = app.add_subcommand(
        "generate", "Step 5 (the audit's generate step): greedy decoding per node, first divergence and its margins; "
                    "teacher-forced divergences");
    add_view_options(*cmd, opt->view, "Use a prompt of N seeded token ids (default: the model's reference prompt)");
    cmd->add_option("-n,--new-tokens", opt->new_tokens, "Tokens to generate (1..4096)")->capture_default_str();
    cmd->callback([opt] {
        KVASIR_CHECK(opt->new_tokens >= 1 && opt->new_tokens <= 4096, ErrorCode::bad_input,
                     "--new-tokens must be in 1..4096, got {}", opt->new_tokens);
        const Model model = Model::open(opt->view.model);
        const int n = opt->new_tokens;
        run_view_command(opt->view, model,
                         StepView{"generate", false, {{"new_tokens", n}}, [n](Protocol& p) { p.generate.n = n; }});
    });
}

void set_perplexity_command(CLI::App& app) {
    struct Opt {
        ViewOptions view;
        std::string stream;
        std::int64_t context = 64;
        bool no_authority = false;
        PerplexityFlags llamacpp;
    };
    auto opt = std::make_shared<Opt>();
    CLI::App* cmd = app.add_subcommand(
        "perplexity", "Step 6 (the audit's perplexity step): perplexity per node on a token stream, delta and ratio to the reference");
    add_view_options(*cmd, opt->view, "Use N seeded token ids as the stream instead of --stream");
    cmd->add_option("--stream", opt->stream,
                    "Token stream FILE (whitespace-separated ids; default fixtures/tokens/default.txt); same as --tokens-file");
    cmd->add_option("--context", opt->context, "Window length: the stream is cut into windows of this many tokens")
        ->capture_default_str();
    cmd->add_flag("--no-authority", opt->no_authority, "Let every node run its own router (default: reference routing imposed)");
    add_perplexity_flags(*cmd, opt->llamacpp, "");
    cmd->callback([opt] {
        KVASIR_CHECK(opt->context >= kMinPerplexityContext && opt->context <= kMaxPerplexityContext, ErrorCode::bad_input,
                     "--context must be in {}..{}, got {}", kMinPerplexityContext, kMaxPerplexityContext, opt->context);
        ViewOptions s = opt->view;
        KVASIR_CHECK(opt->stream.empty() || s.tokens_file.empty(), ErrorCode::bad_input,
                     "--stream and --tokens-file name the same thing; give one");
        if (!opt->stream.empty()) s.tokens_file = opt->stream;
        // The default stream ships with the fixtures; --tokens N asks for a seeded one instead.
        if (s.tokens_file.empty() && s.text_file.empty() && s.tokens == 0)
            s.tokens_file = std::string(KVASIR_SOURCE_DIR) + "/fixtures/tokens/default.txt";
        const Model model = Model::open(s.model);
        const std::int64_t context = opt->context;
        const bool authority = !opt->no_authority;
        const PerplexityOverrides flags = perplexity_overrides(opt->llamacpp);
        nlohmann::json settings{{"context", context}, {"router_authority", authority}};
        if (flags.second_half) settings["score"] = *flags.second_half ? "second_half" : "all";
        if (flags.kl_divergence) settings["kl_divergence"] = *flags.kl_divergence;
        run_view_command(s, model, StepView{"perplexity", false, settings, [context, authority, flags](Protocol& p) {
                                                p.perplexity.context = context;
                                                p.perplexity.router_authority = authority;
                                                p.perplexity.second_half = flags.second_half.value_or(false);
                                                p.perplexity.kl_divergence = flags.kl_divergence.has_value();
                                                if (flags.kl_divergence) p.perplexity.base_rounding = *flags.kl_divergence;
                                            }});
    });
}

void set_task_command(CLI::App& app) {
    struct Opt {
        ViewOptions view;
        std::string items;
        bool no_authority = false;
    };
    auto opt = std::make_shared<Opt>();
    CLI::App* cmd = app.add_subcommand(
        "task", "Step 6 (the audit's task step): multiple-choice task score per node (lm-eval acc / acc_norm), ratio and "
                "answer agreement with the reference");
    add_view_options(*cmd, opt->view, nullptr);
    cmd->add_option("--items", opt->items, "Task items, JSONL: {\"context\", \"choices\": [...], \"gold\"} per line")->required();
    cmd->add_flag("--no-authority", opt->no_authority, "Let every node run its own router (default: reference routing imposed)");
    cmd->callback([opt] {
        const Model model = Model::open(opt->view.model);
        // The items are pinned by their sha256 in the view's protocol, as a protocol file pins them.
        const std::string sha = sha256_hex(read_text_file(opt->items));
        const std::string items = opt->items;
        const bool authority = !opt->no_authority;
        // A task reads its items, not a token stream; its tolerances live in
        // the protocol that runs a task (trained.json).
        run_view_command(opt->view, model,
                         StepView{"task", false, {{"items", items}, {"sha256", sha}, {"router_authority", authority}},
                                  [items, sha, authority](Protocol& p) {
                                      p.task.path = p.task.resolved_path = items;
                                      p.task.sha256 = sha;
                                      p.task.router_authority = authority;
                                  },
                                  /*reads_tokens=*/false, /*default_base=*/false});
    });
}

}  // namespace kvasir::app
