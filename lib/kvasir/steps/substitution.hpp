// Substitution variants: a node that runs something other than the model it
// was given — the cheap worker a swarm operator wants to catch. Declared
// contrasts (like cpu:acc=f16), written as options of any node's spec and
// named in its node name, so an audit reports them as what they are:
//
//   requant=q8_0|q4_k|mxfp4|q5_0  every matrix the forward pass multiplies by —
//                  attention and MLP/expert projections, the shared expert and its
//                  gate, Gated DeltaNet projections, the LM head when it is not the
//                  embedding — quantised row by row as llama-quantize --pure would
//                  store it (model/requant.hpp: same blocks, byte for byte; rows a
//                  format cannot hold fall back as llama.cpp falls back) and used
//                  dequantised. Kept as they are, as llama-quantize keeps them: the
//                  router (ffn_gate_inp), norms, biases, the conv1d, the token
//                  embedding (llama-quantize --token-embedding-type f32 gives the
//                  same model: tests/cli/test_substitution.sh).
//   kv=f16|fp8     every K and V row the attention reads rounded to f16, or to
//                  FP8 E4M3 (core/dtype.hpp round_to_fp8_e4m3: scale 1, saturating
//                  at ±448) — a KV cache stored in that format. Rounding is
//                  idempotent, so rounding the whole cache at each read equals
//                  rounding each row when it is stored. The node keeps its cache on
//                  the host.
//   topk=K         every MoE block sums only the K first experts of its routing
//                  (the authority's or its own: ids are in descending score), their
//                  weights rescaled to the sum of all the routing's weights — a
//                  worker that computes fewer experts than it was told to.
//   skip_layer=L   decoder layer L's residual contributions are zero (its output
//                  projection and every down projection of its MLP / experts /
//                  shared expert are zero matrices), so the layer's output equals
//                  its input exactly: the numbers of a worker that skips the layer.
//                  Refused for a layer with an output bias (it would survive).
//   perturb=REL    a "slightly different checkpoint": each weight above (and the
//                  router) plus seeded Gaussian noise of standard deviation
//                  REL·rms(W), the seed perturb_seed=N (default 0), the stream named
//                  by the layer, the weight and the expert — the same noise in
//                  every process. With requant, the perturbed weight is quantised.
//
// The substituted weights are copies made once per weight, on first use,
// registered as immutable memory (a device node may keep them resident).
#pragma once

#include "kvasir/backend/backend.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/model/quant.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

struct Substitution {
    std::optional<GgmlType> requant;
    enum class Kv { none, f16, fp8_e4m3 } kv = Kv::none;
    std::int64_t top_k = 0;        // 0: the routing's own
    std::int64_t skip_layer = -1;  // −1: none
    double perturb = 0;            // 0: none
    std::uint64_t perturb_seed = 0;
    bool empty() const;
    // The options as spec keys (requant=q4_k, ...), for the node's name.
    std::vector<std::pair<std::string, std::string>> options() const;
};

// The option keys above (requant, kv, topk, skip_layer, perturb, perturb_seed).
bool is_substitution_key(std::string_view key) noexcept;

// Moves the substitution keys out of `spec` (the rest is the backend's own
// spec). Error(bad_input) naming the spec for a bad value.
Substitution take_substitution(BackendSpec& spec);

// The node `spec` names, started: create_backend() of its backend part,
// wrapped in the substitution its options declare. `model` is the model the
// node will run — required when the spec declares a substitution
// (Error(bad_input) otherwise, as for a top-k not below the model's, a layer
// outside it, or topk on a model without MoE layers).
std::unique_ptr<Backend> create_node(std::string_view spec, const Model* model);

}  // namespace kvasir
