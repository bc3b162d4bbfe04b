// Protocol step 5 — generation stability.
//
// Greedy decoding (argmax, ties to the lower id, KV cache, no sampling, no
// EOS stop) of `new_tokens` tokens after the prompt, on every node. Two runs
// per candidate:
//
//  * FREE: the candidate decodes entirely on its own — its own router, its
//    own argmax fed back. Once one token differs the two sequences fork and
//    every later position is a different computation, so only the FIRST
//    divergence index is meaningful: the step i where the candidate's token
//    differs from the reference's (−1: none in N), with the reference's
//    logit margin (top1 − top2) there — small margins are where a ~1e-3
//    logit error flips argmax — and the candidate's own margin there.
//
//  * PINNED: decoding pinned to the reference (the authority's tokens are
//    fed: greedy_generate's pinned_tokens) and its routing imposed step by
//    step (step_routing = the reference's generation routing: valid because
//    the candidate now sees exactly the reference's tokens). The fed
//    sequence is the reference's by construction (checked, reported as
//    `sequence_identical`). This is also TEACHER FORCING: after each step
//    the candidate is resynchronised to the reference prefix, so every step
//    where the candidate's own argmax ≠ the reference's token is an
//    independent divergence: `divergences` over N (a rate, unlike the free
//    run's single index). The per-step logit max|Δ| against the reference's
//    logits of the same step is the error a pinned deployment carries.
#pragma once

#include "kvasir/model/tokenizer.hpp"
#include "kvasir/steps/protocol_steps.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvasir {

struct GenerateConfig : StepCommon {
    int new_tokens = 16;     // N, 1 … 4096
    // When set, the report also gives every continuation as text (the
    // tokenizer's decode, special tokens kept).
    std::optional<Tokenizer> tokenizer;
    void validate() const;   // StepCommon::validate + the range of new_tokens
};

struct NodeGenerate {
    std::string node;
    std::string error;
    // Free run.
    std::vector<std::int32_t> tokens;         // the candidate's own greedy tokens
    std::optional<std::string> text;          // their decoded text (GenerateConfig::tokenizer)
    std::vector<double> margins;              // its margins (top1 − top2) per step
    std::int64_t first_divergence = -1;       // first step whose token differs from the reference's (−1: none)
    double ref_margin_at_divergence = 0;      // reference margin at that step (NaN when no divergence)
    double cand_margin_at_divergence = 0;     // candidate margin at that step (NaN when no divergence)
    // Pinned run (teacher forcing + routing authority).
    std::vector<std::int32_t> pinned_own;     // the candidate's own argmax at each pinned step
    std::int64_t divergences = 0;             // steps where pinned_own ≠ the reference's token
    std::vector<std::int64_t> divergence_steps;
    bool sequence_identical = false;          // the fed tokens equal the reference's (by construction)
    std::vector<double> step_max_abs;         // per step max|Δ logit| vs the reference
    std::vector<double> step_kl;              // per step KL(P_ref ‖ P_cand)
    double max_abs = 0;                       // max over steps of step_max_abs (NaN-sticky)
};

struct GenerateReport {
    GenerateConfig config;
    std::vector<Capabilities> nodes;
    std::size_t reference = 0;
    std::vector<std::int32_t> reference_tokens;  // the reference's greedy continuation
    std::optional<std::string> reference_text;   // decoded (GenerateConfig::tokenizer)
    std::vector<double> reference_margins;
    std::vector<NodeGenerate> results;           // one per candidate, in node order
    std::vector<SelfCheck> repeat;               // per node: the free run twice (tokens and logits)
};

GenerateReport run_generate(const GenerateConfig& config, std::vector<std::unique_ptr<Backend>>& nodes,
                            std::size_t reference);

// Schema "kvasir-equiv/generate/1": schema, tool, config {common…,
// new_tokens, free, pinned}, reference, nodes[], reference_tokens[],
// reference_margins[], results[{node, error | free{tokens[], margins[],
// first_divergence, ref_margin_at_divergence, cand_margin_at_divergence},
// pinned{own_tokens[], divergences, steps, divergence_steps[],
// sequence_identical, step_max_abs[], step_kl[], max_abs}}], repeat[].
nlohmann::ordered_json to_json(const GenerateReport& report);

}  // namespace kvasir
