// Subcommands of protocol steps 2–6: drift, logits, decide, generate,
// perplexity. Each opens the model (the qwen3_moe fixture by default),
// chooses the token ids (resolve_tokens: --tokens-file, --tokens N seeded, or
// the model's reference prompt), creates the nodes, runs the library step and
// prints a table, JSON (--json) and/or writes JSON atomically (-o).
#include "commands.hpp"
#include "nodes.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/model/tokenizer.hpp"
#include "kvasir/report/steps_text.hpp"
#include "kvasir/steps/decide.hpp"
#include "kvasir/steps/drift.hpp"
#include "kvasir/steps/generate.hpp"
#include "kvasir/steps/logits.hpp"
#include "kvasir/steps/perplexity.hpp"
#include "kvasir/steps/task.hpp"

#include <iostream>
#include <algorithm>
#include <memory>
#include <type_traits>

namespace kvasir::app {

namespace {

// Options every step shares.
struct StepOptions {
    std::string model = default_model_path();
    std::string tokens_file;
    std::string text_file;
    std::string tokenizer;
    std::int64_t tokens = 0;
    std::uint64_t seed = 20261129;
    bool repeat = false;
    bool timings = false;
    NodeOptions nodes;
    OutputOptions output;
};

void add_step_options(CLI::App& cmd, StepOptions& o, const char* tokens_help) {
    cmd.add_option("-m,--model", o.model, "Model: HF folder, .safetensors or .gguf")->capture_default_str();
    add_node_options(cmd, o.nodes);
    // 0 stands for "not given" in TokenOptions, so an explicit 0 is refused here.
    cmd.add_option("--tokens", o.tokens, tokens_help)->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
    cmd.add_option("--tokens-file", o.tokens_file, "Token ids from FILE (whitespace-separated decimal ids)");
    cmd.add_option("--text", o.text_file, "UTF-8 text FILE, tokenized by the model's tokenizer.json (BOS included where it adds one)");
    cmd.add_option("--tokenizer", o.tokenizer, "tokenizer.json for --text (default: the one beside the model)");
    cmd.add_option("--seed", o.seed, "Seed of generated token ids (and of --perturb-router)")->capture_default_str();
    cmd.add_flag("--repeat", o.repeat, "Run every node twice: bit-identical or not, and the run-to-run max|Δ|");
    add_output_options(cmd, o.output);
    add_timings_flag(cmd, o.timings, "the step's wall seconds, the seconds inside each backend and the rest (comparing)");
}

// Fills the common part of a step config; `model` must outlive the run.
void fill_common(StepCommon& c, const Model& model, const StepOptions& o) {
    c.model = &model;
    c.seed = o.seed;
    c.repeat = o.repeat;
    c.tokens = resolve_tokens(model, TokenOptions{o.tokens_file, o.text_file, o.tokenizer, o.tokens, o.seed, 24});
}

template <typename Report>
void emit(const char* step, const Model* model, const Report& report, const OutputOptions& out,
          std::string (*render)(const Report&, const Style&)) {
    const auto json = to_json(report);
    if (!out.output_file.empty()) write_file_atomic(out.output_file, json.dump(2) + "\n");
    if (out.json)
        std::cout << json.dump(2) << '\n';
    else
        std::cout << render(report, style_for(stdout));
    std::cout.flush();
    judge_non_finite(json, step, model);
}

// Validates the config before any node is created, so a bad option costs no
// backend start-up (an OpenCL context) and is reported first.
template <typename Config, typename Run, typename Report>
void run_step(const char* step, const StepOptions& o, Config& config, Run run,
              std::string (*render)(const Report&, const Style&)) {
    config.validate();
    if (!o.output.output_file.empty()) check_output_paths({{"--output", o.output.output_file}});
    Nodes nodes = create_nodes(o.nodes);
    // The reference and one candidate at a time, plus --repeat's second run.
    const std::size_t held = std::min<std::size_t>(nodes.nodes.size(), 2) + (o.repeat ? 1 : 0);
    if constexpr (std::is_same_v<Config, PerplexityConfig>)
        check_step_memory(config, held, step, config.context);
    else
        check_step_memory(config, held, step);
    const Report report = run_timed(step, nodes, o.timings, [&](std::vector<std::unique_ptr<Backend>>& timed) {
        return run(config, timed, nodes.reference);
    });
    emit(step, config.model, report, o.output, render);
}

constexpr const char* kPromptTokens = "Use N seeded token ids (default: the model's reference prompt, else 24 seeded ids)";

}  // namespace

void set_drift_command(CLI::App& app) {
    struct Opt {
        StepOptions step;
        double threshold = 1e-3;
    };
    auto opt = std::make_shared<Opt>();
    CLI::App* cmd = app.add_subcommand(
        "drift", "Step 2: per-layer residual drift against the reference (free-running and re-anchored), growth exponent α");
    add_step_options(*cmd, opt->step, kPromptTokens);
    cmd->add_option("--threshold", opt->threshold, "Relative residual delta that marks where it went wrong")
        ->capture_default_str();
    cmd->callback([opt] {
        const Model model = Model::open(opt->step.model);
        DriftConfig c;
        fill_common(c, model, opt->step);
        c.threshold = opt->threshold;
        run_step("drift", opt->step, c, run_drift, render_drift_text);
    });
}

void set_logits_command(CLI::App& app) {
    struct Opt {
        StepOptions step;
        bool no_authority = false;
    };
    auto opt = std::make_shared<Opt>();
    CLI::App* cmd = app.add_subcommand(
        "logits", "Step 3: per-position L∞, L2 and KL(P_ref‖P) of the final logits against the reference");
    add_step_options(*cmd, opt->step, kPromptTokens);
    cmd->add_flag("--no-authority", opt->no_authority, "Let every node run its own router (default: reference routing imposed)");
    cmd->callback([opt] {
        const Model model = Model::open(opt->step.model);
        LogitsConfig c;
        fill_common(c, model, opt->step);
        c.router_authority = !opt->no_authority;
        run_step("logits", opt->step, c, run_logits, render_logits_text);
    });
}

void set_decide_command(CLI::App& app) {
    struct Opt {
        StepOptions step;
        double border = 1e-3;
        double perturb = 0;
    };
    auto opt = std::make_shared<Opt>();
    CLI::App* cmd = app.add_subcommand(
        "decide", "Step 4: top-1 agreement and top-k routing agreement with and without router authority, border tokens");
    add_step_options(*cmd, opt->step, kPromptTokens);
    cmd->add_option("--border", opt->border, "Router gap below which a token is a border token: the k-th − (k+1)-th selection score (softmax probability, or sigmoid + correction bias), for grouped top-k the smaller of that and the margin between the last kept and the first dropped group")
        ->capture_default_str();
    cmd->add_option("--perturb-router", opt->perturb,
                    "Add seeded noise uniform in ±EPS to the candidates' router logits before their own top-k (0: off)")
        ->capture_default_str();
    cmd->callback([opt] {
        const Model model = Model::open(opt->step.model);
        DecideConfig c;
        fill_common(c, model, opt->step);
        c.border = opt->border;
        c.perturb_router = opt->perturb;
        run_step("decide", opt->step, c, run_decide, render_decide_text);
    });
}

void set_generate_command(CLI::App& app) {
    struct Opt {
        StepOptions step;
        int new_tokens = 16;
    };
    auto opt = std::make_shared<Opt>();
    CLI::App* cmd = app.add_subcommand(
        "generate", "Step 5: greedy decoding per node: first divergence and its margin; teacher-forced and pinned decoding");
    add_step_options(*cmd, opt->step, "Use a prompt of N seeded token ids (default: the model's reference prompt)");
    cmd->add_option("-n,--new-tokens", opt->new_tokens, "Tokens to generate")->capture_default_str();
    cmd->callback([opt] {
        const Model model = Model::open(opt->step.model);
        GenerateConfig c;
        fill_common(c, model, opt->step);
        c.new_tokens = opt->new_tokens;
        // The continuations as text where the model has a tokenizer (or --tokenizer names one).
        if (!opt->step.tokenizer.empty() || !tokenizer_path_for(model.path()).empty())
            c.tokenizer = load_tokenizer_for(model.path(), opt->step.tokenizer);
        run_step("generate", opt->step, c, run_generate, render_generate_text);
    });
}

void set_perplexity_command(CLI::App& app) {
    struct Opt {
        StepOptions step;
        std::string stream;
        std::int64_t context = 64;
        bool no_authority = false;
        PerplexityFlags llamacpp;
    };
    auto opt = std::make_shared<Opt>();
    CLI::App* cmd = app.add_subcommand("perplexity", "Step 6: perplexity per node on a token stream, delta and ratio to the reference");
    add_step_options(*cmd, opt->step, "Use N seeded token ids as the stream instead of --stream");
    cmd->add_option("--stream", opt->stream,
                    "Token stream FILE (whitespace-separated ids; default fixtures/tokens/default.txt); same as --tokens-file");
    cmd->add_option("--context", opt->context, "Window length: the stream is cut into windows of this many tokens")
        ->capture_default_str();
    cmd->add_flag("--no-authority", opt->no_authority, "Let every node run its own router (default: reference routing imposed)");
    add_perplexity_flags(*cmd, opt->llamacpp, "");
    cmd->callback([opt] {
        const Model model = Model::open(opt->step.model);
        StepOptions s = opt->step;
        KVASIR_CHECK(opt->stream.empty() || s.tokens_file.empty(), ErrorCode::bad_input,
                     "--stream and --tokens-file name the same thing; give one");
        if (!opt->stream.empty()) s.tokens_file = opt->stream;
        // The default stream ships with the fixtures; --tokens N asks for a seeded one instead.
        if (s.tokens_file.empty() && s.text_file.empty() && s.tokens == 0) s.tokens_file = std::string(KVASIR_SOURCE_DIR) + "/fixtures/tokens/default.txt";
        PerplexityConfig c;
        fill_common(c, model, s);
        c.context = opt->context;
        c.router_authority = !opt->no_authority;
        c.second_half = opt->llamacpp.score == "second-half";
        c.kl_divergence = opt->llamacpp.kl_divergence;
        run_step("perplexity", s, c, run_perplexity, render_perplexity_text);
    });
}

void set_task_command(CLI::App& app) {
    struct Opt {
        StepOptions step;
        std::string items;
        bool no_authority = false;
    };
    auto opt = std::make_shared<Opt>();
    CLI::App* cmd = app.add_subcommand(
        "task", "Step 6: multiple-choice task score per node (lm-eval acc / acc_norm), ratio and answer agreement with the reference");
    cmd->add_option("-m,--model", opt->step.model, "Model: HF folder, .safetensors or .gguf")->capture_default_str();
    add_node_options(*cmd, opt->step.nodes);
    cmd->add_option("--items", opt->items, "Task items, JSONL: {\"context\", \"choices\": [...], \"gold\"} per line")->required();
    cmd->add_option("--tokenizer", opt->step.tokenizer, "tokenizer.json (default: the one beside the model)");
    cmd->add_flag("--no-authority", opt->no_authority, "Let every node run its own router (default: reference routing imposed)");
    add_output_options(*cmd, opt->step.output);
    add_timings_flag(*cmd, opt->step.timings, "the step's wall seconds, the seconds inside each backend and the rest (comparing)");
    cmd->callback([opt] {
        const Model model = Model::open(opt->step.model);
        TaskConfig c = make_task_config(model, opt->items, load_tokenizer_for(model.path(), opt->step.tokenizer));
        c.seed = opt->step.seed;
        c.router_authority = !opt->no_authority;
        run_step("task", opt->step, c, run_task, render_task_text);
    });
}

}  // namespace kvasir::app
