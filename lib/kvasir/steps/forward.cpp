#include "kvasir/steps/forward.hpp"

#include "kvasir/arch/architecture.hpp"
#include "kvasir/arch/graph.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/metrics/logits.hpp"
#include "kvasir/metrics/metrics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

namespace kvasir {

namespace {

using arch::KvLayer;

// The runner: an architecture (arch/architecture.hpp) and the blocks it is
// made of (arch/graph.hpp) for one backend and model.
struct Runner {
    arch::LayerGraph graph;
    const arch::DecoderArchitecture& architecture;
    Runner(Backend& b, const Model& m) : graph(b, m), architecture(arch::architecture_for(m.config())) {}
    // The input of layer 0: the embedding rows, widened exactly to the backend's output dtype.
    Tensor embed(std::span<const std::int32_t> tokens) const {
        return arch::gather_embeddings(graph.model.embed(), tokens, graph.be.capabilities().output);
    }
    // After the last layer: final = rmsnorm(h, final_norm), logits = final · lm_headᵀ.
    Tensor final_norm(const Tensor& h) {
        return graph.be.rmsnorm(h, graph.scale_of(graph.model.final_norm()), graph.c.rms_norm_eps);
    }
    Tensor logits(const Tensor& final_hidden) {
        graph.model.will_read(graph.model.lm_head());  // a streaming model's LM head (Model::will_read)
        return graph.be.matmul(final_hidden, graph.model.lm_head());
    }
};

void check_tokens(const ModelConfig& c, std::span<const std::int32_t> tokens) {
    KVASIR_CHECK(!tokens.empty(), ErrorCode::bad_input, "forward: no tokens");
    for (std::size_t i = 0; i < tokens.size(); ++i)
        KVASIR_CHECK(tokens[i] >= 0 && tokens[i] < c.vocab_size, ErrorCode::bad_input,
                     "forward: token {} at position {} is outside the vocabulary [0, {})", tokens[i], i, c.vocab_size);
}

void check_plans(const ModelConfig& c, const std::vector<RoutingPlan>* routing, std::int64_t t_count) {
    if (routing == nullptr) return;
    KVASIR_CHECK(static_cast<std::int64_t>(routing->size()) == c.num_layers, ErrorCode::bad_input,
                 "routing plan: {} layer entries for a model of {} layers", routing->size(), c.num_layers);
    for (std::int64_t l = 0; l < c.num_layers; ++l) {
        if (!c.is_moe(l)) continue;
        const RoutingPlan& p = (*routing)[static_cast<std::size_t>(l)];
        KVASIR_CHECK(p.ids.dtype() == DType::i32 && p.ids.view().rank() == 2 && p.ids.dim(0) == t_count &&
                         p.ids.dim(1) >= 1 && p.weights.shape() == p.ids.shape() && dtype_is_float(p.weights.dtype()),
                     ErrorCode::bad_input,
                     "routing plan of layer {}: ids {} ({}) / weights {} ({}) do not fit {} tokens (expected i32 ids "
                     "[T, k] and float weights of the same shape)",
                     l, shape_str(p.ids.shape()), dtype_name(p.ids.dtype()), shape_str(p.weights.shape()),
                     dtype_name(p.weights.dtype()), t_count);
        const std::int32_t* ids = p.ids.as<std::int32_t>();
        for (std::int64_t i = 0; i < p.ids.numel(); ++i)
            KVASIR_CHECK(ids[i] >= 0 && ids[i] < c.num_experts(), ErrorCode::bad_input,
                         "routing plan of layer {}: expert id {} outside [0, {})", l, ids[i], c.num_experts());
    }
}

// Runs tokens at positions p0 … through every layer with `cache`; fills `out`.
void run(Runner& r, std::vector<KvLayer>& cache, std::span<const std::int32_t> tokens, const ForwardOptions& opt,
         ForwardResult& out) {
    const ModelConfig& c = r.graph.c;
    const std::int64_t t_count = static_cast<std::int64_t>(tokens.size());
    const std::int64_t L = c.num_layers;
    // A device node keeps the pass's activations on the device (core/tensor.hpp):
    // what the host reads of them (the KV rows, a router's scores, the outputs
    // kept in `out`) comes back when it is read.
    const DeviceResidency residency;
    check_tokens(c, tokens);
    check_plans(c, opt.routing, t_count);
    if (opt.anchor_inputs != nullptr) {
        KVASIR_CHECK(static_cast<std::int64_t>(opt.anchor_inputs->size()) >= L, ErrorCode::bad_input,
                     "anchor inputs: {} entries for {} layers", opt.anchor_inputs->size(), L);
        for (std::int64_t l = 0; l < L; ++l) {
            const Tensor& a = (*opt.anchor_inputs)[static_cast<std::size_t>(l)];
            KVASIR_CHECK(a.shape() == Shape({t_count, c.hidden_size}) && dtype_is_float(a.dtype()), ErrorCode::bad_input,
                         "anchor input of layer {}: {} {} is not [{}, {}] float", l, dtype_name(a.dtype()),
                         shape_str(a.shape()), t_count, c.hidden_size);
        }
    }
    const std::int64_t p0 = cache.empty() ? 0 : cache.front().seen;
    std::vector<std::int64_t> pos(static_cast<std::size_t>(t_count));
    for (std::int64_t t = 0; t < t_count; ++t) pos[static_cast<std::size_t>(t)] = p0 + t;

    out = ForwardResult{};
    out.router_logits.resize(static_cast<std::size_t>(L));
    out.routing.resize(static_cast<std::size_t>(L));
    if (opt.keep_mlp_io) {
        out.mlp_input.resize(static_cast<std::size_t>(L));
        out.mlp_output.resize(static_cast<std::size_t>(L));
        out.mixer_output.resize(static_cast<std::size_t>(L));
    }
    Tensor h = r.embed(tokens);
    if (opt.keep_hidden) out.hidden.push_back(h);
    for (std::int64_t l = 0; l < L; ++l) {
        const auto li = static_cast<std::size_t>(l);
        const TensorView input = opt.anchor_inputs != nullptr ? (*opt.anchor_inputs)[li].view() : h.view();
        const RoutingPlan* plan = opt.routing != nullptr && c.is_moe(l) ? &(*opt.routing)[li] : nullptr;
        const arch::Segment seg{0, t_count, &cache[li]};
        arch::LayerIO io{pos, std::span<const arch::Segment>(&seg, 1), plan, out.router_logits[li], out.routing[li],
                         opt.keep_mlp_io ? &out.mlp_input[li] : nullptr, opt.keep_mlp_io ? &out.mlp_output[li] : nullptr,
                         opt.keep_mlp_io ? &out.mixer_output[li] : nullptr};
        if (opt.anchor_mlp_inputs != nullptr && li < opt.anchor_mlp_inputs->size() && !(*opt.anchor_mlp_inputs)[li].empty()) {
            const Tensor& a = (*opt.anchor_mlp_inputs)[li];
            KVASIR_CHECK(a.shape() == Shape({t_count, c.hidden_size}) && dtype_is_float(a.dtype()), ErrorCode::bad_input,
                         "MLP anchor of layer {}: {} {} is not [{}, {}] float", l, dtype_name(a.dtype()), shape_str(a.shape()),
                         t_count, c.hidden_size);
            io.mlp_anchor = &a;
        }
        h = r.architecture.layer(r.graph, l, input, io);
        cache[li].seen += t_count;
        if (opt.keep_hidden) out.hidden.push_back(h);
    }
    if (!opt.logits) return;
    out.final_hidden = r.final_norm(h);
    out.logits = r.logits(out.final_hidden);
}

std::vector<KvLayer> fresh_cache(const ModelConfig& c) {
    std::vector<KvLayer> cache(static_cast<std::size_t>(c.num_layers));
    for (auto& k : cache) k.init(c.num_kv_heads, c.attention_width());
    return cache;
}

}  // namespace

std::vector<Tensor> forward_batch(Backend& backend, const Model& model,
                                  std::span<const std::vector<std::int32_t>> sequences) {
    KVASIR_CHECK(!sequences.empty(), ErrorCode::bad_input, "forward_batch: no sequences");
    Runner r(backend, model);
    const ModelConfig& c = model.config();
    const std::int64_t L = c.num_layers;
    const DeviceResidency residency;  // as run()
    std::vector<std::int32_t> all;
    std::vector<std::int64_t> pos;
    std::vector<std::int64_t> row0;
    for (const auto& seq : sequences) {
        check_tokens(c, seq);
        row0.push_back(static_cast<std::int64_t>(all.size()));
        for (std::size_t t = 0; t < seq.size(); ++t) pos.push_back(static_cast<std::int64_t>(t));
        all.insert(all.end(), seq.begin(), seq.end());
    }
    std::vector<std::vector<KvLayer>> caches;
    for (std::size_t i = 0; i < sequences.size(); ++i) caches.push_back(fresh_cache(c));
    Tensor h = r.embed(all);
    std::vector<arch::Segment> segs(sequences.size());
    for (std::int64_t l = 0; l < L; ++l) {
        const auto li = static_cast<std::size_t>(l);
        for (std::size_t i = 0; i < sequences.size(); ++i)
            segs[i] = arch::Segment{row0[i], static_cast<std::int64_t>(sequences[i].size()), &caches[i][li]};
        Tensor router_logits;
        RoutingPlan routing;
        arch::LayerIO io{pos, segs, nullptr, router_logits, routing};
        h = r.architecture.layer(r.graph, l, h, io);
        for (std::size_t i = 0; i < sequences.size(); ++i)
            caches[i][li].seen += static_cast<std::int64_t>(sequences[i].size());
    }
    const Tensor logits = r.logits(r.final_norm(h));
    std::vector<Tensor> out;
    for (std::size_t i = 0; i < sequences.size(); ++i)
        out.push_back(arch::leading_rows(logits, row0[i], static_cast<std::int64_t>(sequences[i].size())));
    return out;
}

namespace {

bool same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (!same_bits(a[i].view(), b[i].view())) return false;
    return true;
}

// max |a − b| over positions; NaN when the non-finite patterns differ.
double max_abs_delta(const Tensor& a, const Tensor& b, const char* what) {
    KVASIR_CHECK(a.shape() == b.shape(), ErrorCode::bad_input, "run-to-run: {} shapes {} and {} differ", what,
                 shape_str(a.shape()), shape_str(b.shape()));
    return max_abs_difference(a.view(), b.view());
}

}  // namespace

// ---------------------------------------------------------------------------

ForwardResult forward(Backend& backend, const Model& model, std::span<const std::int32_t> tokens,
                      const ForwardOptions& options) {
    Runner r(backend, model);
    std::vector<KvLayer> cache = fresh_cache(model.config());
    ForwardResult out;
    run(r, cache, tokens, options, out);
    return out;
}

struct Decoder::Impl {
    Runner runner;
    std::vector<KvLayer> cache;
    std::vector<RoutingPlan> last_routing;
    Impl(Backend& b, const Model& m) : runner(b, m), cache(fresh_cache(m.config())) {}
};

Decoder::Decoder(Backend& backend, const Model& model) : impl_(std::make_unique<Impl>(backend, model)) {}
Decoder::~Decoder() = default;
Decoder::Decoder(Decoder&&) noexcept = default;
Decoder& Decoder::operator=(Decoder&&) noexcept = default;

Tensor Decoder::step(std::span<const std::int32_t> new_tokens, const std::vector<RoutingPlan>* routing) {
    return run_step(new_tokens, routing, true);
}

void Decoder::advance(std::span<const std::int32_t> new_tokens, const std::vector<RoutingPlan>* routing) {
    (void)run_step(new_tokens, routing, false);
}

Tensor Decoder::run_step(std::span<const std::int32_t> new_tokens, const std::vector<RoutingPlan>* routing, bool logits) {
    // Linear-attention state cannot be truncated: a mark keeps it to restore.
    const Mark before = mark();
    ForwardOptions opt;
    opt.routing = routing;
    opt.keep_hidden = false;
    opt.logits = logits;
    ForwardResult out;
    try {
        run(impl_->runner, impl_->cache, new_tokens, opt, out);
    } catch (...) {
        rewind(before);  // layers already run roll back
        throw;
    }
    impl_->last_routing = std::move(out.routing);
    return std::move(out.logits);
}

std::int64_t Decoder::position() const { return impl_->cache.empty() ? 0 : impl_->cache.front().seen; }
const std::vector<RoutingPlan>& Decoder::last_routing() const { return impl_->last_routing; }
void Decoder::reset() {
    for (auto& k : impl_->cache) {
        k.truncate(0);
        k.conv_history = Tensor();
        k.recurrent = Tensor();
    }
    impl_->last_routing.clear();
}

Decoder::Mark Decoder::mark() const {
    Mark m;
    m.position = position();
    for (const auto& k : impl_->cache) m.linear.emplace_back(k.conv_history, k.recurrent);
    return m;
}

void Decoder::rewind(const Mark& m) {
    KVASIR_CHECK(m.position <= position() && m.linear.size() == impl_->cache.size(), ErrorCode::bad_input,
                 "decoder: a mark at position {} cannot be rewound to from position {}", m.position, position());
    for (std::size_t i = 0; i < impl_->cache.size(); ++i) {
        impl_->cache[i].truncate(m.position);
        impl_->cache[i].conv_history = m.linear[i].first;
        impl_->cache[i].recurrent = m.linear[i].second;
    }
}

GenerateResult greedy_generate(Backend& backend, const Model& model, std::span<const std::int32_t> prompt, int n,
                               const std::vector<std::int32_t>* pinned_tokens,
                               const std::vector<std::vector<RoutingPlan>>* step_routing) {
    KVASIR_CHECK(n >= 1, ErrorCode::bad_input, "generate: {} steps (need at least 1)", n);
    KVASIR_CHECK(!prompt.empty(), ErrorCode::bad_input, "generate: empty prompt");
    if (pinned_tokens != nullptr)
        KVASIR_CHECK(static_cast<int>(pinned_tokens->size()) >= n - 1, ErrorCode::bad_input,
                     "generate: {} pinned tokens for {} steps (need {})", pinned_tokens->size(), n, n - 1);
    if (step_routing != nullptr)
        KVASIR_CHECK(static_cast<int>(step_routing->size()) >= n, ErrorCode::bad_input,
                     "generate: {} routing steps for {} steps", step_routing->size(), n);
    Decoder dec(backend, model);
    GenerateResult res;
    const std::int64_t v_count = model.config().vocab_size;
    std::int32_t next = 0;
    for (int i = 0; i < n; ++i) {
        const std::span<const std::int32_t> in = i == 0 ? prompt : std::span<const std::int32_t>(&next, 1);
        const Tensor lg = dec.step(in, step_routing != nullptr ? &(*step_routing)[static_cast<std::size_t>(i)] : nullptr);
        if (i == 0) res.logits = Tensor(lg.dtype(), {n, v_count});
        const std::int64_t last = lg.dim(0) - 1;
        const std::size_t row_bytes = static_cast<std::size_t>(v_count) * dtype_size(lg.dtype());
        std::memcpy(static_cast<std::byte*>(res.logits.raw()) + static_cast<std::size_t>(i) * row_bytes,
                    static_cast<const std::byte*>(lg.raw()) + static_cast<std::size_t>(last) * row_bytes, row_bytes);
        // Argmax: ties to the lower id, NaN never wins.
        std::int64_t best = -1;
        double top1 = -std::numeric_limits<double>::infinity(), top2 = top1;
        for (std::int64_t j = 0; j < v_count; ++j) {
            const double x = lg.at(last * v_count + j);
            if (std::isnan(x)) continue;
            if (best < 0 || x > top1) {
                top2 = best < 0 ? top2 : top1;
                top1 = x;
                best = j;
            } else if (x > top2) {
                top2 = x;
            }
        }
        KVASIR_CHECK(best >= 0, ErrorCode::backend_failure, "generate: step {} produced only NaN logits", i);
        const auto own = static_cast<std::int32_t>(best);
        res.tokens.push_back(own);
        res.margins.push_back(top1 - top2);
        res.routing.push_back(dec.last_routing());
        next = pinned_tokens != nullptr && i < static_cast<int>(pinned_tokens->size())
                   ? (*pinned_tokens)[static_cast<std::size_t>(i)]
                   : own;
        res.fed.push_back(next);
    }
    return res;
}

bool bit_identical(const ForwardResult& a, const ForwardResult& b) {
    if (!same_bits(a.hidden, b.hidden) || !same_bits(a.router_logits, b.router_logits) ||
        !same_bits(a.mlp_input, b.mlp_input) || !same_bits(a.mlp_output, b.mlp_output) ||
        !same_bits(a.final_hidden, b.final_hidden) || !same_bits(a.logits, b.logits) ||
        a.routing.size() != b.routing.size())
        return false;
    for (std::size_t l = 0; l < a.routing.size(); ++l)
        if (!same_bits(a.routing[l].ids, b.routing[l].ids) || !same_bits(a.routing[l].weights, b.routing[l].weights))
            return false;
    return true;
}

RunToRunDelta run_to_run_delta(const ForwardResult& a, const ForwardResult& b) {
    KVASIR_CHECK(a.hidden.size() == b.hidden.size() && a.router_logits.size() == b.router_logits.size() &&
                     a.routing.size() == b.routing.size(),
                 ErrorCode::bad_input, "run-to-run: the two results have different layouts ({} / {} hidden states)",
                 a.hidden.size(), b.hidden.size());
    RunToRunDelta d;
    d.bit_identical = bit_identical(a, b);
    d.logits_max_abs = max_abs_delta(a.logits, b.logits, "logits");
    d.final_max_abs = max_abs_delta(a.final_hidden, b.final_hidden, "final hidden");
    // A NaN (non-finite mismatch) sticks: nothing after it can look better.
    for (std::size_t i = 0; i < a.hidden.size() && !std::isnan(d.hidden_max_abs); ++i) {
        const double x = max_abs_delta(a.hidden[i], b.hidden[i], "hidden");
        if (std::isnan(x) || x > d.hidden_max_abs) {
            d.hidden_max_abs = x;
            d.hidden_worst = static_cast<std::int64_t>(i);
        }
    }
    for (std::size_t l = 0; l < a.router_logits.size() && !std::isnan(d.router_logits_max_abs); ++l) {
        if (a.router_logits[l].empty() && b.router_logits[l].empty()) continue;
        const double x = max_abs_delta(a.router_logits[l], b.router_logits[l], "router logits");
        if (std::isnan(x) || x > d.router_logits_max_abs) d.router_logits_max_abs = x;
    }
    for (std::size_t l = 0; l < a.routing.size(); ++l) {
        const Tensor& ia = a.routing[l].ids;
        const Tensor& ib = b.routing[l].ids;
        if (ia.empty() && ib.empty()) continue;
        KVASIR_CHECK(ia.shape() == ib.shape(), ErrorCode::bad_input, "run-to-run: routing shapes {} and {} differ at layer {}",
                     shape_str(ia.shape()), shape_str(ib.shape()), l);
        for (const bool differ : id_sets_differ(ia, ib)) d.routing_rows_differing += differ;
    }
    return d;
}

}  // namespace kvasir
