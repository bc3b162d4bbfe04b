// Whole-model prefill and decode throughput of one node, as llama-bench
// measures a model (pp = prompt processing, tg = text generation).
//
// A Decoder (lib/kvasir/steps/forward.hpp) on the node: the prompt of P
// tokens in ONE step (prefill, causal attention over the new rows), then G
// steps of one token each over the growing KV cache (decode). Token ids are
// fixed and spread over the vocabulary (no text, no sampling: what is fed
// does not change the work). Every layer is read once before the clock
// starts (Model::load_layer/load_globals), so the file's first read is not
// timed; weights stay in the file's mapping as any run of the tool keeps them.
//
// Decode GB/s: the weight bytes one decoded token must read — per layer the
// attention projections, norms and router plus top_k experts, then the
// lm_head (the embedding row is noise) — times tokens/s. The KV cache (S·2·nkv·D
// f32 per layer) is added too. That is the figure to hold against the
// machine's memory bandwidth.
//
//   bench_model MODEL [--node cpu:threads=2] [--prompt 512] [--gen 128] [--reps 1]
// MODEL: a GGUF or safetensors checkpoint whose tensors share one dtype (F32, BF16 or F16).
// Prints one line per repetition: node, pp tokens/s, tg tokens/s, tg GB/s.
#include "kvasir/backend/registry.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/steps/forward.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

using namespace kvasir;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Bytes one decode step reads from the weights, at the file's dtype (`w`
// bytes per weight: the caller checks the file holds one dtype).
double decode_weight_bytes(const Model& model, double w) {
    const ModelConfig& c = model.config();
    const double h = static_cast<double>(c.hidden_size);
    double per_layer = (static_cast<double>(c.q_dim()) * h * 2 + static_cast<double>(c.kv_dim()) * h * 2) * w  // q, o, k, v
                       + (2 * h + 2 * static_cast<double>(c.head_dim)) * w                                     // norms
                       + static_cast<double>(c.num_experts()) * h * w                                          // router
                       + static_cast<double>(c.router.top_k) * 3 * h * static_cast<double>(c.moe_intermediate_size) * w;
    return per_layer * static_cast<double>(c.num_layers) + (static_cast<double>(c.vocab_size) + 1) * h * w + h * w;
}

int usage() {
    std::fprintf(stderr, "usage: bench_model MODEL.gguf [--node SPEC] [--prompt P] [--gen G] [--reps R]\n");
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) return usage();
    std::string path = argv[1], node = "cpu:threads=2";
    int prompt = 512, gen = 128, reps = 1;
    for (int i = 2; i + 1 < argc; i += 2) {
        const std::string key = argv[i], value = argv[i + 1];
        if (key == "--node") node = value;
        else if (key == "--prompt") prompt = std::atoi(value.c_str());
        else if (key == "--gen") gen = std::atoi(value.c_str());
        else if (key == "--reps") reps = std::atoi(value.c_str());
        else return usage();
    }
    if (prompt < 1 || gen < 0 || reps < 1) return usage();
    try {
        const Model model = Model::open(path);
        // One weight dtype (F32, BF16 or F16) for the GB/s figure.
        const std::string dtype = model.tensor_table().empty() ? "F32" : model.tensor_table().front().dtype;
        for (const ModelTensorEntry& t : model.tensor_table())
            if (t.dtype != dtype || (dtype != "F32" && dtype != "BF16" && dtype != "F16")) {
                std::fprintf(stderr, "bench_model: %s is %s, %s is %s; the GB/s figure needs one dtype (F32, BF16 or F16)\n",
                             t.name.c_str(), t.dtype.c_str(), model.tensor_table().front().name.c_str(), dtype.c_str());
                return 2;
            }
        for (std::int64_t l = 0; l < model.config().num_layers; ++l) model.load_layer(l);
        model.load_globals();
        const std::unique_ptr<Backend> backend = create_backend(node);
        const ModelConfig& c = model.config();
        std::vector<std::int32_t> ids(static_cast<std::size_t>(prompt + gen));
        for (std::size_t i = 0; i < ids.size(); ++i)
            ids[i] = static_cast<std::int32_t>(3 + (i * 7919 + 17) % static_cast<std::size_t>(c.vocab_size - 3));
        const double weight_bytes = decode_weight_bytes(model, dtype == "F32" ? 4.0 : 2.0);
        std::printf("# %s: %lld layers, hidden %lld, %lld experts (top %lld), decode reads %.3f GB of weights/token\n",
                    path.c_str(), static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size),
                    static_cast<long long>(c.num_experts()), static_cast<long long>(c.router.top_k), weight_bytes / 1e9);
        std::printf("# node                      pp%d tok/s   tg%d tok/s   tg GB/s\n", prompt, gen);
        for (int r = 0; r < reps; ++r) {
            Decoder dec(*backend, model);
            auto t0 = Clock::now();
            (void)dec.step(std::span<const std::int32_t>(ids.data(), static_cast<std::size_t>(prompt)));
            const double pp_s = seconds_since(t0);
            t0 = Clock::now();
            double kv_bytes = 0;
            for (int g = 0; g < gen; ++g) {
                (void)dec.step(std::span<const std::int32_t>(ids.data() + prompt + g, 1));
                kv_bytes += static_cast<double>(dec.position()) * 2.0 * static_cast<double>(c.kv_dim()) * 4.0 *
                            static_cast<double>(c.num_layers);
            }
            const double tg_s = seconds_since(t0);
            std::printf("%-26s %12.2f %12.2f %9.2f\n", backend->capabilities().node.c_str(), prompt / pp_s,
                        gen > 0 ? gen / tg_s : 0.0, gen > 0 ? (weight_bytes * gen + kv_bytes) / tg_s / 1e9 : 0.0);
            std::fflush(stdout);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_model: %s\n", e.what());
        return 1;
    }
    return 0;
}
