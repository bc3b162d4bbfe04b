// One function per subcommand: each binds its options to a CLI11 subcommand
// and sets a callback that calls into the library. The library never sees
// CLI11; errors propagate as kvasir::Error to main(), which maps them to exit
// codes in one place.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace kvasir {
class Model;          // kvasir/model/model.hpp
struct AuditProgress;  // kvasir/audit/audit.hpp
struct HtmlStamp;      // kvasir/report/writers.hpp
struct Protocol;       // kvasir/audit/protocol.hpp
struct PerplexityOverrides;
}

namespace kvasir::app {

// Where a command's report goes: a table on stdout, JSON on stdout (--json),
// and/or JSON written atomically to a file (-o).
struct OutputOptions {
    bool json = false;
    std::string output_file;
};
void add_output_options(CLI::App& cmd, OutputOptions& out);

// Node selection shared by the measuring commands.
struct NodeOptions {
    std::vector<std::string> backends;  // empty: registry defaults
    std::string reference = "cpu-ref";
};
void add_node_options(CLI::App& cmd, NodeOptions& nodes);

// llama-perplexity's options, as its users know them: --score all|second-half
// and --kl-divergence[=exact|llamacpp-u16] (exact when no value is given).
// On perplexity they set the run; on audit, capture and compare they
// override the protocol's steps.perplexity (with_perplexity_overrides).
struct PerplexityFlags {
    std::string score;          // "" not given
    std::string kl_divergence;  // "" not given
};
void add_perplexity_flags(CLI::App& cmd, PerplexityFlags& f, const std::string& applies_to);
PerplexityOverrides perplexity_overrides(const PerplexityFlags& f);
// The protocol a run uses: `path` (default_protocol_path when empty) with the flags applied.
Protocol load_run_protocol(const std::string& path, bool model_given, const PerplexityFlags& f);

// --timings, the same flag on every command that measures.
void add_timings_flag(CLI::App& cmd, bool& timings, const std::string& what);

// Numbers on the command line are parsed strictly, never coerced: every
// option of `app` and its subcommands whose type is an integer or a floating
// point number gets a check that runs before CLI11's conversion — decimal
// digits only (a '-' only on a signed integer; no spaces, '+', hex or
// fraction), within the 64-bit range (never saturated), and a floating-point
// value finite and representable (1e999 is an error, not inf). A
// multi-value option (--backends, --steps, --only-steps, ...) takes one
// argument per occurrence (commas separate values), so it never swallows the
// positional arguments after it. A text option (a path, a node, a name) is
// never empty: `-o ""` is an error, not "no output". Applied once in main(), so an option added
// later is covered too.
void strict_options(CLI::App& app);

// After a step command (ops, matrix, drift, logits, ...) built its report:
// the same rules as audit for values that are NaN/Inf. A candidate whose
// figures are non-finite is named on stderr ("NODE: non-finite results in
// STEP, first at /json/path"), as is a candidate whose step failed ("NODE:
// error in STEP: why"), and the command exits 1; the reference's own
// non-finite values (a pair's nan_ref/inf_ref), or a model holding a
// non-finite weight, are exit 2 naming the node, or the layer and tensor.
void judge_non_finite(const nlohmann::ordered_json& report, const std::string& step, const Model* model);

// Exit code a command sets for main() to return (0 unless it decided otherwise).
int& command_exit_code();

// A progress line on stderr, rewritten in place — "[3/7  36%] logits — cpu
// (2/4)  1 min 05 s elapsed, ~1 min 52 s left": step, the node computing
// now, the share of the run done, and the time left at the pace so far —
// when stderr is a terminal; an empty function (nothing printed) otherwise
// (a log, CI).
std::function<void(const AuditProgress&)> progress_printer();
// The line itself, after `elapsed_s` seconds of the run (pure, for tests).
std::string progress_line(const AuditProgress& p, double elapsed_s);
// Clears the progress line.
void end_progress();

// The embedded default model: the qwen3_moe fixture made by transformers.
std::string default_model_path();
// "a,,b" → a, "", b: the pieces of one option value between its commas.
std::vector<std::string> comma_pieces(const std::string& text);
// "a,b" "c" → a, b, c: a list option's values split at commas, empty pieces dropped.
std::vector<std::string> split_commas(const std::vector<std::string>& args);

// The protocol audit and capture use when --protocol is not given. The
// default audit (no --model either) is the trained fixture audited from text:
// protocols/trained.json on fixtures/models/qwen3_moe_trained (issue #19). A
// model named with --model gets protocols/default.json: its token-id streams
// need no tokenizer and its tolerances were calibrated on all the fixtures.
std::string default_protocol_path(bool model_given);
// compare without --protocol: the shipped protocol (protocols/*.json) whose
// content hash the captures carry; Error(bad_input) naming `described_as`
// when none has it.
// With flags, a shipped protocol matches when its hash with the flags applied does.
std::string shipped_protocol_with_hash(const std::string& hash, const std::string& described_as,
                                       const PerplexityFlags& flags = {});

// When and where an HTML report is written: the date (UTC, to the minute)
// from SOURCE_DATE_EPOCH when set — so two runs can give the same bytes —
// else from the clock; the machine as host name and uname.
HtmlStamp html_stamp();

void set_backends_command(CLI::App& app);
void set_tokenize_command(CLI::App& app);
void set_task_command(CLI::App& app);
void set_ops_command(CLI::App& app);
void set_inspect_command(CLI::App& app);
void set_matrix_command(CLI::App& app);
// Protocol steps 2–6 (app/cmd_steps.cpp).
void set_drift_command(CLI::App& app);
void set_logits_command(CLI::App& app);
void set_decide_command(CLI::App& app);
void set_generate_command(CLI::App& app);
void set_perplexity_command(CLI::App& app);
void set_audit_command(CLI::App& app);
// capture / compare (app/cmd_capture.cpp).
void set_capture_command(CLI::App& app);
void set_compare_command(CLI::App& app);


}  // namespace kvasir::app
