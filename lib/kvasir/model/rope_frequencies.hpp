// The inverse frequencies of a frequency-scaled rope, from the model's config:
// model constants, computed once in f64 (the oracle's values; an f32 node
// rounds them, see RopeParams::inv_freq).
#pragma once

#include "kvasir/model/config.hpp"

#include <vector>

namespace kvasir {

// The head_dim·partial_rotary_factor / 2 inverse frequencies the config's rope
// uses, or an empty vector for rope_type "default" (theta^(−2i/d): every node
// computes those itself). rope_type "llama3" (transformers 5.24
// _compute_llama3_parameters, evaluated in f64):
//   inv_i   = 1 / theta^(2i/d),  wavelen_i = 2π / inv_i
//   wavelen_i < original_max_position_embeddings / high_freq_factor  → inv_i
//   wavelen_i > original_max_position_embeddings / low_freq_factor   → inv_i / factor
//   otherwise, s = (original_max_position_embeddings / wavelen_i − low_freq_factor)
//                  / (high_freq_factor − low_freq_factor)            → (1 − s)·inv_i / factor + s·inv_i
// Error(unsupported) for any other rope_type.
std::vector<double> rope_inverse_frequencies(const ModelConfig& config);

}  // namespace kvasir
