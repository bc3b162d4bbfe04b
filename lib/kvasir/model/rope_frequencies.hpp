// The inverse frequencies of a frequency-scaled rope, from the model's config:
// model constants, computed once in f64 (the oracle's values; an f32 node
// rounds them, see RopeParams::inv_freq).
#pragma once

#include "kvasir/model/config.hpp"

#include <vector>

namespace kvasir {

// The rotary_dims() / 2 (head_dim·partial_rotary_factor, or MLA's qk_rope_head_dim) inverse frequencies the config's rope
// uses, or an empty vector for rope_type "default" (theta^(−2i/d): every node
// computes those itself). rope_type "llama3" (transformers 5.24
// _compute_llama3_parameters, evaluated in f64):
//   inv_i   = 1 / theta^(2i/d),  wavelen_i = 2π / inv_i
//   wavelen_i < original_max_position_embeddings / high_freq_factor  → inv_i
//   wavelen_i > original_max_position_embeddings / low_freq_factor   → inv_i / factor
//   otherwise, s = (original_max_position_embeddings / wavelen_i − low_freq_factor)
//                  / (high_freq_factor − low_freq_factor)            → (1 − s)·inv_i / factor + s·inv_i
// rope_type "yarn" (_compute_yarn_parameters, in f64): with the correction
// range low = max(cd(beta_fast), 0), high = min(cd(beta_slow), d − 1),
// cd(r) = d·ln(original / (2πr)) / (2 ln theta) (floored / ceiled when
// truncate), ramp_i = clamp((i − low) / (high − low), 0, 1):
//   inv_i = theta^(−2i/d) · (ramp_i / factor + (1 − ramp_i)).
// A GGUF's rope_freqs factors (ModelConfig::rope_freq_factors, rope type
// default): inv_i = theta^(−2i/d) / factor_i, as llama.cpp applies them.
// Error(unsupported) for any other rope_type.
std::vector<double> rope_inverse_frequencies(const ModelConfig& config);

// The factor transformers multiplies cos and sin by (attention_scaling):
// 1 but for yarn — attention_factor when given, else
// m(factor, mscale) / m(factor, mscale_all_dim) when both are set, else
// m(factor, 1); m(s, k) = 1 for s ≤ 1, else 0.1·k·ln s + 1. Both q and k
// carry it, so the attention scores carry its square: the forward pass
// multiplies the softmax scale by attention_factor² (LayerGraph).
double rope_attention_factor(const ModelConfig& config);

// The softmax scale of attention, in f64: head_dim^−½, times rope_attention_factor² where rope turns the
// whole head (q and k both carry yarn's cos/sin scale) — under MLA the cos/sin scale touches only the rope
// part, so the graph applies it there (LayerGraph::mla_attention), and the scale is × mscale(factor,
// mscale_all_dim)² for a scaled rope with mscale_all_dim ≠ 0: DeepSeek's correction (transformers'
// yarn_apply_mscale; DeepSeek-V3's own config has mscale = mscale_all_dim = 1: its cos/sin scale is 1 and
// this factor is the whole of yarn's effect on the scores).
double attention_scale(const ModelConfig& config);

}  // namespace kvasir
