// What the audit's forward steps (drift, logits, decide, generate,
// perplexity, task: audit/step_*.cpp) share below the audit: where their
// token ids come from (resolve_tokens, the step commands' --tokens /
// --tokens-file / --text), the common part of their configuration
// (StepCommon), the memory a run of them needs, and the router gaps the
// decide step reads.
//
// All statistics are f64 (inputs are widened exactly through TensorView::at)
// and NaN never disappears: a NaN logit makes the KL, the L∞, the agreement
// test at that position fail, never pass (see metrics.hpp, stats.hpp).
#pragma once

#include "kvasir/backend/backend.hpp"
#include "kvasir/metrics/logits.hpp"
#include "kvasir/metrics/stats.hpp"
#include "kvasir/model/config.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/steps/forward.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

// ---------------------------------------------------------------------------
// Token ids
// ---------------------------------------------------------------------------

// A token sequence and one line saying where it came from (reported in every
// step's JSON so a reader can regenerate the run).
struct TokenSequence {
    std::vector<std::int32_t> ids;
    std::string source;
};

// Whitespace-separated decimal ids (spaces, tabs, newlines, CR). `name`
// stands for the file in messages. Every id must be in [0, vocab). Bad
// content throws Error(bad_input) with ONE line naming the file and the
// position, e.g.
//   "ids.txt:3:7: token 12 'x9' is not a token id (non-negative decimal integer)"
//   "ids.txt:1:1: token 1 id 999 is outside the vocabulary [0, 384)"
//   "ids.txt: no token ids"
// (line and column 1-based, in bytes; the offending text is truncated to 24
// bytes and non-printable bytes are shown as \xNN, so the message stays one
// printable line whatever the file holds).
std::vector<std::int32_t> parse_token_ids(std::string_view text, const std::string& name, std::int64_t vocab);

// read_text_file(path) + parse_token_ids. Error(bad_input) naming the path
// when it cannot be read.
TokenSequence read_token_file(const std::string& path, std::int64_t vocab);

// n ids from kvasir's counter-based RNG: id_i = floor(u_i · vocab) with u_i
// = seeded_uniform(seed, "steps/tokens", [n], 0, 1) in f64 (clamped to
// vocab − 1 against rounding), so any node, on any machine, regenerates the
// same prompt from the seed alone.
TokenSequence seeded_tokens(std::uint64_t seed, std::int64_t n, std::int64_t vocab);

// The reference data that ships next to a model (made by transformers, see
// fixtures/models/README.md), when there is one:
//   folder F                → F/reference.safetensors
//   F/x.safetensors         → F/reference.safetensors
//   P.gguf                  → P.reference.safetensors
// Empty when that file does not exist. No content check here.
std::string reference_data_path(const std::string& model_path);

// How a step's token ids are chosen (the CLI options --tokens-file, --tokens,
// --seed): a file wins; else `count` > 0 gives `count` seeded ids; else the
// model's reference data `input_ids` when it exists (the prompt transformers
// ran: the fixtures' 24 tokens), else `default_count` seeded ids. A reference
// file that exists but cannot be read or has no usable input_ids is an error
// (bad_input naming it): silently falling back would change the prompt
// without anyone noticing.
// --text FILE: the ids the model's tokenizer (--tokenizer FILE, else
// tokenizer.json beside the model) gives the UTF-8 text, BOS included where
// its post-processor adds one; exclusive with the other sources.
struct TokenOptions {
    std::string file;
    std::string text_file;
    std::string tokenizer;
    std::int64_t count = 0;
    std::uint64_t seed = 20261129;
    std::int64_t default_count = 24;
};
TokenSequence resolve_tokens(const Model& model, const TokenOptions& options);

// ---------------------------------------------------------------------------
// Configuration shared by every step
// ---------------------------------------------------------------------------

struct StepCommon {
    const Model* model = nullptr;  // required; must outlive the run
    TokenSequence tokens;          // the prompt (perplexity: the stream)
    std::uint64_t seed = 20261129; // seeded token ids and perturbations

    // Throws Error(bad_input): no model, a model whose full forward pass is
    // not implemented (deepseek_v3: Error(unsupported)), no tokens, an id
    // outside the vocabulary (naming the source and the position).
    void validate() const;
};

// Bytes of memory the kernel could hand out now (MemAvailable of
// /proc/meminfo); 0 when unknown.
std::uint64_t available_memory_bytes();

// What a forward-pass step over `tokens` positions holds at once on `nodes`
// node runs held together (a lower bound, every term f64, the widest a node
// keeps): per run the final logits and their probabilities (2·T·V) over all
// T tokens, and over one forward pass of W = min(window, T) tokens (window 0:
// all T; perplexity: its context) the per-layer residual stream the drift
// step keeps (L·W·H), the KV cache (L·W·2·kv_dim) and a layer's working
// activations (≈ 8·W·max(H, q_dim, FFN width)).
std::uint64_t step_memory_estimate(const ModelConfig& c, std::int64_t tokens, std::size_t nodes, std::int64_t window = 0);

// Refuses, before anything is allocated, a token count the run cannot hold:
// Error(bad_input) "WHAT: N tokens need at least X GiB (...), Y GiB is
// available". `nodes_held`: the node runs whose outputs one process keeps
// at once (audit/audit_plan.hpp: a node process 2, an in-process audit every
// node). Nothing is refused when the available memory is unknown.
void check_step_memory(const StepCommon& c, std::size_t nodes_held, const std::string& what, std::int64_t window = 0);

// Router "gap" of each token: the k-th minus the (k+1)-th largest SELECTION
// score, from router logits [T, E] in f64, where the score is what the
// router ranks: softmax probability over all E experts (softmax routers —
// the fixtures' layer.{l}.router_gap), or sigmoid(logit) + bias (sigmoid
// routers; `bias` may be null). Grouped top-k (n_group > 1): the smaller of
// the group margin (the topk_group-th minus the next group score, a group
// scored by the sum of its two best selection scores) and the k-th minus
// (k+1)-th score among the kept groups' experts. A token whose gap is
// below the observed error (the CLI's --border) is a BORDER token: a
// backend's error can swap its k-th and (k+1)-th expert. E == k (nothing to
// swap) → +inf. A NaN logit in a row → NaN gap.
std::vector<double> router_gaps(const TensorView& router_logits, const RouterConfig& router, const TensorView* bias);

// ' ', \t, \n, \r, \v, \f: the C locale's whitespace, whatever the locale.
bool is_ascii_space(char c);

}  // namespace kvasir
