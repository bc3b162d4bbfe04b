#include "kvasir/arch/architecture.hpp"

#include "kvasir/core/error.hpp"

#include <map>
#include <memory>
#include <mutex>

namespace kvasir::arch {

namespace {

// One decoder per family, made on first use (a registered family included) and kept.
const DecoderArchitecture& decoder_of(const Family& family) {
    static std::mutex mutex;
    static std::map<const Family*, std::unique_ptr<FamilyDecoder>> decoders;
    const std::lock_guard lock(mutex);
    auto& d = decoders[&family];
    if (!d) d = std::make_unique<FamilyDecoder>(family);
    return *d;
}

}  // namespace

std::vector<const DecoderArchitecture*> architectures() {
    std::vector<const DecoderArchitecture*> all;
    for (const Family* f : all_families()) all.push_back(&decoder_of(*f));
    return all;
}

const DecoderArchitecture& architecture_for(const ModelConfig& c) {
    for (const Family* f : all_families())
        if (f->id == c.architecture) {
            const DecoderArchitecture& a = decoder_of(*f);
            a.check(c);
            return a;
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

FamilyDecoder::FamilyDecoder(const Family& family) : family_(family) {
    switch (family.layer) {
        case LayerKind::standard: layer_ = &LayerGraph::standard_layer; return;
        case LayerKind::mla: layer_ = &LayerGraph::mla_layer; return;
        case LayerKind::hybrid: layer_ = &LayerGraph::hybrid_layer; return;
    }
    fail(ErrorCode::internal, "model family {}: no decoder layer of kind {}", family.model_type,
         static_cast<int>(family.layer));
}

void FamilyDecoder::check(const ModelConfig& c) const {
    check_standard_attention(c);
    KVASIR_CHECK(family_.sliding_checked || c.sliding_window == 0, ErrorCode::unsupported,
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
