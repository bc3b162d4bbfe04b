// Audit protocols: versioned JSON files (protocols/*.json) that say WHAT an
// audit runs (steps, shapes, seed, token streams, default model and
// reference) and WHAT counts as passing (the tolerances of two tiers). The
// tolerances live here and nowhere in code (SPEC §3).
//
// The machinery the protocol files and the reports share lives in core and
// is included here, so callers of this header see it: SHA-256
// (core/sha256.hpp, libcrypto), canonical JSON and the content hash over it
// (core/canonical_json.hpp), and the JSON Schema subset validator
// (core/json_schema.hpp).
//
// ---------------------------------------------------------------------------
// Protocol file format "kvasir-equiv/protocol/1" (protocols/README.md has a
// commented example; protocols/protocol.schema.json is the machine form):
//
//   {
//     "format": "kvasir-equiv/protocol/1",
//     "id": "default", "version": 1, "description": "...",
//     "model": "../fixtures/models/qwen3_moe_tiny",   default --model
//     "reference": "cpu-ref",                         default --reference
//     "seed": 20261129,                               seeded inputs (counter RNG)
//     "limits": {"node_timeout_s", "node_memory_gib"}, optional: each node's
//                                                     process limits (audit)
//     "statistics": {"confidence": 0.95,              optional: how rate criteria
//                    "interval": "wilson"},           are judged (default as shown;
//                                                     or "clopper-pearson")
//     "floor": "cpu",                                 optional: the floor node of
//                                                     x_floor tolerances
//     "steps": {                                      a step runs iff it is present
//       "ops":        {"tokens", "shapes": {hidden, intermediate, experts, top_k,
//                      vocab, heads, head_dim}, "rope_theta", "rms_eps", "shards",
//                      "ops": [names], "weights": "seeded"|"model", "layer"},
//       "drift":      {"tokens": STREAM, "threshold"?},
//       "logits":     {"tokens": STREAM, "router_authority"?},
//       "decide":     {"tokens": STREAM, "border"?},
//       "generate":   {"prompt": STREAM, "n", "teacher_forcing"},
//       "perplexity": {"tokens": STREAM, "context", "score"?, "kl_divergence"?, "router_authority"?},
//       "determinism": {"repeats"},
//       "invariance": {"tokens": STREAM, "batch_sizes": [B...], "op_rows", "repeats", "decode"},
//       "task": {"items": {"path", "sha256"}, "router_authority"?}
//     },
//     "tiers": {
//       "sensitive": {CRITERION: {"value": number, "why": "one line"[, "x_floor": M]}, ...},
//       "tolerant":  {CRITERION: {"value": number, "why": "one line"}, ...}
//     }
//   }
//   STREAM = {"path": "../fixtures/tokens/default.txt", "sha256": "<64 hex>",
//             "offset": 0, "count": 64}
//
// Relative paths (model, token streams) are relative to the folder of the
// protocol file, so a protocol and its inputs travel together. A token
// stream's sha256 (of the file's bytes) is part of the protocol document, so
// the content hash pins the tokens too; read_token_stream() verifies it.
//
// Refusals. Every problem is Error(bad_input) with one line
//   "<file>: <JSON pointer>: <problem>"
// e.g. "protocols/x.json: /tiers/sensitive/logits.kl_p99/value: expected a
// number, got string". Refused: malformed JSON, unknown keys at any level,
// missing keys, wrong types, non-integers where integers are required,
// out-of-range values, a criterion name that is not in the catalogue, a
// required criterion missing from a tier for a step the protocol runs, a
// tolerance for a step the protocol does not run, a sensitive tolerance
// LOOSER than the tolerant one (the sensitive tier must be at least as
// strict), a first-divergence tolerance above generate.n, divergences_max
// without teacher forcing.
// ---------------------------------------------------------------------------
#pragma once

#include "kvasir/core/canonical_json.hpp"
#include "kvasir/core/json_schema.hpp"
#include "kvasir/core/sha256.hpp"
#include "kvasir/metrics/stats.hpp"  // BinomialBound
#include "kvasir/steps/op_delta.hpp"  // OpsConfig, all_op_names()

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

// --- criteria ---------------------------------------------------------------------

// How a criterion passes: max → value <= tolerance (within()), min → value >=
// tolerance (at_least()). NaN never passes either way.
enum class Direction { max, min };
const char* to_string(Direction d) noexcept;  // "max", "min"

// How a margin is measured (CriterionResult::margin), so that margins of
// quantities spanning many decades are comparable:
//   log            decades: log10(tolerance / value) — error magnitudes
//                  (max_rel, KL, |ratio−1|, ...); value <= 0 → +inf,
//                  tolerance 0 with value > 0 → −inf;
//   complement_log decades on 1−x: log10((1−tolerance)/(1−value)) — cosines and
//                  agreement rates, whose interesting part is the distance to 1;
//                  value >= 1 → +inf, tolerance 1 with value < 1 → −inf;
//   linear         plain difference in the criterion's unit, sign so that
//                  positive is inside: tolerance − value (max), value −
//                  tolerance (min) — token counts and the growth exponent α.
enum class MarginScale { log, complement_log, linear };
const char* margin_unit(MarginScale s) noexcept;  // "decades", "decades", "units"

struct CriterionInfo {
    std::string name;     // "logits.kl_p99"
    std::string step;     // the protocol step that measures it: "logits"
    Direction direction = Direction::max;
    MarginScale scale = MarginScale::log;
    bool integer = false;  // counts: tolerance must be an integer
    bool required = true;  // a tier must have it whenever its step runs
    std::string meaning;   // one line: what is measured, and how
    // A rate of successes over trials (agreement): judged on a one-sided
    // confidence bound of the rate, not on the point value (verdict.hpp;
    // Protocol::statistics says at which confidence, by which interval).
    bool rate = false;
};

// The fixed catalogue — these names are the contract between the protocol
// files, the steps that produce measurements, and the verdicts:
//   ops.max_rel ops.cosine_min router.flips_max shard.max_rel
//   drift.final_rel drift.alpha_max logits.kl_p99 logits.linf_max
//   decide.top1_agreement_min decide.routing_agreement_min
//   decide.routing_clear_flips_max generate.first_divergence_min
//   generate.divergences_max perplexity.ratio_max determinism
//   invariance.ops_max_rel invariance.batch_max_rel
//   invariance.prefill_decode_max_rel invariance.repeat_unique_max
//   task.acc_ratio_min task.agreement_min task.ll_max_abs_delta_max
// plus per-op overrides "ops.<op>.max_rel" / "ops.<op>.cosine_min" for every
// <op> of all_op_names(). Optional (required == false): the per-op overrides,
// decide.routing_agreement_min (measured WITHOUT router authority: it shows
// why authority is needed, see SPEC §1), the router flip counts
// router.flips_max and decide.routing_clear_flips_max (they gate router
// authorities: the shipped protocols give them in the sensitive tier only)
// and generate.divergences_max (needs teacher forcing). Every other criterion is required in both tiers whenever
// its step runs.
const std::vector<CriterionInfo>& criterion_catalog();
// The catalogue entry of `name`, per-op names included (they inherit their
// family's direction/scale/step); nullopt for an unknown name.
std::optional<CriterionInfo> find_criterion(std::string_view name);
// "ops.matmul.max_rel" → "ops.max_rel"; any other name → itself.
std::string criterion_family(std::string_view name);
// "ops.matmul.max_rel" → "matmul"; "" for a name that is not per-op.
std::string criterion_op(std::string_view name);

// --- protocol -------------------------------------------------------------------

struct Tolerance {
    double value = 0;
    std::string why;  // one-line justification, shown in reports
    // Relative to the floor node (Protocol::floor) measured in the same run:
    // the candidate may be at most x_floor × the floor's value of the same
    // criterion (cosines: on 1 − x). `value` is then the absolute fallback,
    // used when the floor's value is 0 (bit-identical to the reference),
    // non-finite or not measured, or the run has no floor node; the floor
    // node itself is not judged by it (verdict.hpp).
    std::optional<double> x_floor;
};
// Criterion name → tolerance. std::map: reports list criteria in name order.
using Tolerances = std::map<std::string, Tolerance>;

enum class Tier { sensitive, tolerant };
const char* to_string(Tier t) noexcept;  // "sensitive", "tolerant"

// A token stream: `count` ids starting at `offset` of a whitespace-separated
// file of non-negative integers — or, with "format": "text", of the ids the
// model's own tokenizer (tokenizer.json beside it: model/tokenizer.hpp) gives
// a UTF-8 text file, its special tokens (BOS) included. The sha256 pins the
// file's bytes either way.
struct TokenStream {
    std::string path;           // as written in the protocol
    std::string resolved_path;  // relative to the protocol's folder
    std::string sha256;         // 64 hex digits of the file's bytes
    std::int64_t offset = 0;
    std::int64_t count = 0;
    bool text = false;          // "format": "text" (default "ids")
};

// Step 1 (per-op delta). Field meanings as OpsConfig's.
struct OpsStep {
    bool enabled = false;
    std::int64_t tokens = 16;
    std::int64_t hidden = 2048, intermediate = 768, experts = 16, top_k = 8, vocab = 4096, heads = 8, head_dim = 128;
    double rope_theta = 1e6;
    double rms_eps = 1e-6;
    int shards = 4;
    std::vector<std::string> ops;  // never empty: protocols name the ops they gate
    std::string weights = "seeded";  // "seeded" | "model" (real weights of `layer`)
    std::int64_t layer = 0;
};
struct TokenStep {  // drift, logits, decide: a forward over `tokens`
    bool enabled = false;
    TokenStream tokens;
};
struct DriftStep : TokenStep {
    // "threshold": the relative residual delta that marks where an error
    // starts (first_over, and the localisation's yardstick without a floor).
    double threshold = 1e-3;
};
struct LogitsStep : TokenStep {
    // "router_authority": false — every node runs its own router (its
    // logits then hold its routing flips too); default: the reference's
    // routing imposed, so the logits differ by arithmetic alone.
    bool router_authority = true;
};
struct DecideStep : TokenStep {
    // "border": the router gap below which a token is a border token.
    double border = 1e-3;
};
struct GenerateStep {
    bool enabled = false;
    TokenStream prompt;
    std::int64_t n = 32;           // tokens decoded greedily
    bool teacher_forcing = false;  // also decode fed with the reference's tokens
};
struct PerplexityStep {
    bool enabled = false;
    TokenStream tokens;
    std::int64_t context = 64;  // window: each position is predicted from at most this many before it
    // "score": "second_half" — only the predictions from position ⌊C/2⌋ of
    // each window of C tokens on count (llama-perplexity's rule).
    bool second_half = false;
    // "kl_divergence": llama-perplexity's statistics against the reference
    // (metrics/llamacpp_kld.hpp), the base rounded as its base file rounds it or not.
    bool kl_divergence = false;
    std::string base_rounding = "exact";
    // "router_authority": false — every node routes each window itself.
    bool router_authority = true;
};
struct DeterminismStep {
    bool enabled = false;
    int repeats = 2;  // runs of the same node compared with each other (>= 2)
};

// The task score (steps/task.hpp): a JSONL item file, sha256-pinned, scored
// with the model's own tokenizer.json (beside the model).
struct TaskStep {
    bool enabled = false;
    std::string path, resolved_path, sha256;
    // "router_authority": false — every node routes each request itself.
    bool router_authority = true;
};

// The invariance step: the same node, the same request, different company.
struct InvarianceStep {
    bool enabled = false;
    TokenStream tokens;                     // the sequence under test (prefill vs decode on all of it)
    std::vector<std::int64_t> batch_sizes;  // B in 2..64: the sequence among B−1 seeded batchmates
    std::int64_t op_rows = 512;             // op level: a row alone vs among op_rows rows
    int repeats = 4;                        // identical greedy requests
    std::int64_t decode = 8;                // tokens each of them decodes
};

struct Protocol {
    std::string source;    // the file it came from (for messages)
    std::string base_dir;  // folder relative paths are resolved against
    std::string id;
    std::int64_t version = 0;
    std::string description;
    std::string model;           // as written; "" = none named
    std::string model_resolved;  // relative to base_dir
    std::string reference;       // node spec of the default reference
    std::uint64_t seed = 0;
    // Limits of each node's child process in `audit` (isolation.hpp); 0 =
    // not given (the tool's defaults apply: 1800 s; 90 % of the machine's
    // memory). --node-timeout / --node-memory override them.
    struct Limits {
        double node_timeout_s = 0;
        double node_memory_gib = 0;
    } limits;
    // Rate criteria (CriterionInfo::rate) are judged on a one-sided bound of
    // the rate at this confidence (verdict.hpp). "statistics" in the file;
    // absent: 0.95, Wilson.
    struct Statistics {
        double confidence = 0.95;  // in (0.5, 0.999999]
        BinomialBound interval = BinomialBound::wilson;
    } statistics;
    // The floor node: correct f32 arithmetic on this model and these inputs,
    // the yardstick of x_floor tolerances. "floor" in the file; default
    // "cpu". An audit whose protocol has any x_floor tolerance runs it even
    // when it is not listed (shown, not gated).
    std::string floor = "cpu";
    bool uses_floor() const;

    OpsStep ops;
    DriftStep drift;
    LogitsStep logits;
    DecideStep decide;
    GenerateStep generate;
    PerplexityStep perplexity;
    DeterminismStep determinism;
    InvarianceStep invariance;
    TaskStep task;

    // Steps registered beyond the built-in ones (step.hpp register_step):
    // whether the protocol runs each, and its section as written (the step's
    // plan() reads and validates it).
    struct RegisteredStep {
        bool enabled = false;
        nlohmann::json section;
    };
    std::map<std::string, RegisteredStep> registered;
    // A registered step's section; Error(internal) for another name.
    const nlohmann::json& section(std::string_view step) const;

    Tolerances sensitive, tolerant;
    const Tolerances& tier(Tier t) const { return t == Tier::sensitive ? sensitive : tolerant; }

    nlohmann::json document;   // as parsed
    std::string content_hash;  // content_hash(document)

    // "ops", "drift", "logits", "decide", "generate", "perplexity",
    // "determinism", "invariance"; Error(internal) for another name.
    bool runs(std::string_view step) const;
    // The flag runs() reads (a view protocol switches steps: step_view.hpp).
    bool& enabled(std::string_view step);
    // Step 1's configuration (seed from the protocol; model/layer left for the
    // caller to set when weights == "model").
    OpsConfig ops_config() const;
};

// Names of the steps, in protocol order: the built-in ones, then the
// registered ones in the order they registered.
const std::vector<std::string>& protocol_step_names();

// A step beyond the built-in ones (step.hpp register_step, which calls this):
// its name becomes a protocol section, its criteria join the catalogue.
// Error(internal) for a name already known or a criterion that is not the
// step's own or already in the catalogue. Call before any protocol is parsed
// (a step file's static registration, or a test's set-up).
void register_protocol_step(const std::string& step, const std::vector<CriterionInfo>& criteria);

// Parse and check a protocol document (see the top of this file). `source`
// prefixes every message; `base_dir` resolves relative paths (no file is
// opened here: token streams are read by read_token_stream()).
Protocol parse_protocol(const nlohmann::json& doc, const std::string& source, const std::string& base_dir);
// Read (64 MiB bound), parse JSON ("<path>: invalid JSON: ..." on a syntax
// error) and parse_protocol with base_dir = the file's folder.
Protocol load_protocol(const std::string& path);

// llama-perplexity's options given on a command line (--score second-half,
// --kl-divergence[=ROUNDING]) over a protocol's steps.perplexity: the
// document is edited ("score", "kl_divergence": {"base_rounding"}) and parsed
// again, so the protocol's content hash, which every capture carries, names
// the scoring the run really used — audit's child processes, capture and
// compare given the same options agree on it; a flag that says what the
// protocol already says changes nothing, its hash included. Error(bad_input)
// naming the option when the protocol has no perplexity step.
struct PerplexityOverrides {
    std::optional<bool> second_half;           // --score second-half (true) / all (false)
    std::optional<std::string> kl_divergence;  // --kl-divergence: "exact" | "llamacpp-u16"
    bool any() const { return second_half.has_value() || kl_divergence.has_value(); }
    // The options as a command line gives them (for audit's child processes).
    std::vector<std::string> arguments() const;
};
Protocol with_perplexity_overrides(const Protocol& p, const PerplexityOverrides& o);

// The stream's ids. Error(bad_input) naming the file when it cannot be read,
// its sha256 differs from the protocol's (the message gives the actual hash),
// a field is not a non-negative integer below 2^31, or offset + count runs
// past the end. A text stream needs `model_path` (whose tokenizer.json
// tokenizes it): Error(bad_input) when it has none or the text is not UTF-8.
std::vector<std::int32_t> read_token_stream(const TokenStream& stream, const std::string& model_path = {});

}  // namespace kvasir
