#include "kvasir/arch/architecture.hpp"

#include "kvasir/core/error.hpp"

namespace kvasir::arch {

// The families, each in its own file.
const DecoderArchitecture& qwen2_moe();
const DecoderArchitecture& qwen3_moe();
const DecoderArchitecture& mixtral();
const DecoderArchitecture& qwen3_5_moe();
const DecoderArchitecture& qwen3_next();
const DecoderArchitecture& llama();
const DecoderArchitecture& mistral();
const DecoderArchitecture& qwen2();
const DecoderArchitecture& qwen3();
const DecoderArchitecture& qwen3_5();
const DecoderArchitecture& olmoe();
const DecoderArchitecture& gpt_oss();
const DecoderArchitecture& deepseek_v3();
const DecoderArchitecture& glm4_moe();

const std::vector<const DecoderArchitecture*>& architectures() {
    static const std::vector<const DecoderArchitecture*> all{&qwen2_moe(), &qwen3_moe(), &mixtral(), &qwen3_5_moe(),
                                                             &qwen3_next(), &llama(), &mistral(), &qwen2(),
                                                             &qwen3(), &qwen3_5(), &olmoe(), &gpt_oss(),
                                                             &deepseek_v3(), &glm4_moe()};
    return all;
}

const DecoderArchitecture& architecture_for(const ModelConfig& c) {
    for (const DecoderArchitecture* a : architectures())
        if (a->id() == c.architecture) {
            a->check(c);
            return *a;
        }
    fail(ErrorCode::unsupported,
         "{}: the full forward pass of {} is not implemented (no decoder graph is registered for it); the layer-level "
         "steps (ops, matrix) run on it",
         c.source, architecture_name(c.architecture));
}

void check_standard_attention(const ModelConfig& c) {
    KVASIR_CHECK(c.rope_type == "default" || c.rope_type == "llama3" || c.rope_type == "yarn", ErrorCode::unsupported,
                 "{}: rope type '{}' is not implemented by the forward pass (only 'default', 'llama3' and 'yarn')",
                 c.source, c.rope_type);
    KVASIR_CHECK(c.rope_type == "default" || c.partial_rotary_factor == 1.0, ErrorCode::unsupported,
                 "{}: rope type '{}' with partial rotary is not implemented by the forward pass", c.source, c.rope_type);
}

void FamilyDecoder::check(const ModelConfig& c) const {
    check_standard_attention(c);
    KVASIR_CHECK(sliding_ == Sliding::checked || c.sliding_window == 0, ErrorCode::unsupported,
                 "{}: sliding-window attention ({}) of {} is not implemented by the forward pass (no fixture checks "
                 "which of its layers slide)",
                 c.source, c.sliding_window, architecture_name(c.architecture));
}

Tensor FamilyDecoder::layer(LayerGraph& g, std::int64_t l, const TensorView& h, LayerIO& io) const {
    // A streaming model (Model::streams_weights): the next layer's weights are read ahead while this one
    // computes (layer 0's before it), its experts once its routing has chosen them (LayerGraph::feed_forward).
    if (g.model.streams_weights()) {
        if (l == 0) g.model.will_read_layer(0);
        if (l + 1 < g.c.num_layers) g.model.will_read_layer(l + 1);
    }
    return (g.*layer_)(l, h, io);
}

}  // namespace kvasir::arch
