#include "kvasir/model/rope_frequencies.hpp"

#include "kvasir/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kvasir {

namespace {

// theta^(2i/d): the unscaled rope's wavelength factor of pair i (its inverse frequency's reciprocal).
double pos_freq(const ModelConfig& c, std::int64_t i, std::int64_t d) {
    return std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(d));
}

std::vector<double> llama3_inverse_frequencies(const ModelConfig& c) {
    const std::int64_t d = c.rotary_dims();
    const auto& r = c.rope_scaling;
    const double low_wavelen = r.original_max_position_embeddings / r.low_freq_factor;
    const double high_wavelen = r.original_max_position_embeddings / r.high_freq_factor;
    std::vector<double> out(static_cast<std::size_t>(d / 2));
    for (std::int64_t i = 0; i < d / 2; ++i) {
        const double inv = 1.0 / pos_freq(c, i, d);
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

// _compute_yarn_parameters' correction dimension.
double yarn_correction_dim(double rotations, std::int64_t d, double base, double original) {
    return (static_cast<double>(d) * std::log(original / (rotations * 2.0 * std::numbers::pi))) / (2.0 * std::log(base));
}

std::vector<double> yarn_inverse_frequencies(const ModelConfig& c) {
    const std::int64_t d = c.rotary_dims();
    const auto& r = c.rope_scaling;
    double low = yarn_correction_dim(r.beta_fast, d, c.rope_theta, r.original_max_position_embeddings);
    double high = yarn_correction_dim(r.beta_slow, d, c.rope_theta, r.original_max_position_embeddings);
    if (r.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(d - 1));
    if (low == high) high += 0.001;  // transformers: "Prevent singularity"
    std::vector<double> out(static_cast<std::size_t>(d / 2));
    for (std::int64_t i = 0; i < d / 2; ++i) {
        const double pf = pos_freq(c, i, d);
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1.0 - ramp;  // inv_freq_extrapolation_factor
        out[static_cast<std::size_t>(i)] =
            (1.0 / (r.factor * pf)) * (1.0 - extrapolation) + (1.0 / pf) * extrapolation;
    }
    return out;
}

double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

}  // namespace

std::vector<double> rope_inverse_frequencies(const ModelConfig& c) {
    if (!c.rope_freq_factors.empty()) {  // GGUF rope_freqs: theta^(−2i/d) / factor_i (llama.cpp's ggml_rope_ext)
        const std::int64_t d = c.rotary_dims();
        KVASIR_CHECK(c.rope_type == "default" && static_cast<std::int64_t>(c.rope_freq_factors.size()) == d / 2,
                     ErrorCode::bad_input, "{}: {} rope frequency factors for {} rotary dimensions (rope type {})", c.source,
                     c.rope_freq_factors.size(), d, c.rope_type);
        std::vector<double> out(static_cast<std::size_t>(d / 2));
        for (std::int64_t i = 0; i < d / 2; ++i)
            out[static_cast<std::size_t>(i)] = 1.0 / pos_freq(c, i, d) / c.rope_freq_factors[static_cast<std::size_t>(i)];
        return out;
    }
    if (c.rope_type == "default") return {};
    if (c.rope_type == "llama3") return llama3_inverse_frequencies(c);
    if (c.rope_type == "yarn") return yarn_inverse_frequencies(c);
    fail(ErrorCode::unsupported, "{}: rope type '{}' is not implemented", c.source, c.rope_type);
}

double rope_attention_factor(const ModelConfig& c) {
    if (c.rope_type != "yarn") return 1.0;
    const auto& r = c.rope_scaling;
    if (!std::isnan(r.attention_factor)) return r.attention_factor;
    if (r.mscale != 0.0 && r.mscale_all_dim != 0.0)
        return yarn_mscale(r.factor, r.mscale) / yarn_mscale(r.factor, r.mscale_all_dim);
    return yarn_mscale(r.factor, 1.0);
}

double attention_scale(const ModelConfig& c) {
    double s = std::pow(static_cast<double>(c.head_dim), -0.5);
    if (!c.has_mla()) {
        const double af = rope_attention_factor(c);  // a full-rotary head: q and k both carry it
        return s * af * af;
    }
    // DeepseekV3Attention.scaling = yarn_apply_mscale(rope_parameters, qk_head_dim^−½): for a scaled rope with
    // mscale_all_dim set, × mscale(factor, mscale_all_dim)² (transformers computes it in Python floats).
    if (c.rope_type != "default" && c.rope_scaling.mscale_all_dim != 0.0) {
        const double m = yarn_mscale(c.rope_scaling.factor, c.rope_scaling.mscale_all_dim);
        s = s * m * m;
    }
    return s;
}

}  // namespace kvasir
