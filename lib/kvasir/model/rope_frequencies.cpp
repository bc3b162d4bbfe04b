#include "kvasir/model/rope_frequencies.hpp"

#include "kvasir/core/error.hpp"

#include <cmath>
#include <numbers>

namespace kvasir {

std::vector<double> rope_inverse_frequencies(const ModelConfig& c) {
    if (c.rope_type == "default") return {};
    KVASIR_CHECK(c.rope_type == "llama3", ErrorCode::unsupported, "{}: rope type '{}' is not implemented", c.source,
                 c.rope_type);
    const auto d = static_cast<std::int64_t>(static_cast<double>(c.head_dim) * c.partial_rotary_factor);
    const auto& r = c.rope_scaling;
    const double low_wavelen = r.original_max_position_embeddings / r.low_freq_factor;
    const double high_wavelen = r.original_max_position_embeddings / r.high_freq_factor;
    std::vector<double> out(static_cast<std::size_t>(d / 2));
    for (std::int64_t i = 0; i < d / 2; ++i) {
        const double inv = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(d));
        const double wavelen = 2.0 * std::numbers::pi / inv;
        double f = inv;
        if (wavelen > low_wavelen) {
            f = inv / r.factor;
        } else if (!(wavelen < high_wavelen)) {
            const double s = (r.original_max_position_embeddings / wavelen - r.low_freq_factor) /
                             (r.high_freq_factor - r.low_freq_factor);
            f = (1.0 - s) * inv / r.factor + s * inv;
        }
        out[static_cast<std::size_t>(i)] = f;
    }
    return out;
}

}  // namespace kvasir
