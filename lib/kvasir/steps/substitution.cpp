#include "kvasir/steps/substitution.hpp"

#include "kvasir/backend/forwarding.hpp"
#include "kvasir/backend/registry.hpp"
#include "kvasir/core/dtype.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/immutable_memory.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/model/requant.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace kvasir {

namespace {

constexpr std::string_view kKeys[] = {"requant", "kv", "topk", "skip_layer", "perturb", "perturb_seed"};

const char* kv_name(Substitution::Kv kv) {
    switch (kv) {
        case Substitution::Kv::f16: return "f16";
        case Substitution::Kv::fp8_e4m3: return "fp8";
        case Substitution::Kv::none: break;
    }
    return "none";
}

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

// What the substitution does to one matrix the forward pass multiplies by.
struct Role {
    std::string stream;    // "layer 3 o_proj", "layer 1 expert 5 down", "lm_head": names the perturbation
    bool quantise = false;  // requant applies (llama-quantize would quantise it)
    bool zero = false;      // skip_layer: an output projection of the skipped layer
};

struct Entry {
    Role role;
    Tensor copy;  // empty until first use
    ImmutableRegistration registration;
};

class SubstitutedBackend final : private detail::OwnedInner, public ForwardingBackend {
public:
    SubstitutedBackend(std::unique_ptr<Backend> inner, const Model& model, const Substitution& sub, std::string_view spec)
        : detail::OwnedInner{std::move(inner)},
          ForwardingBackend(*OwnedInner::inner),
          sub_(sub),
          caps_(OwnedInner::inner->capabilities()) {
        const ModelConfig& c = model.config();
        const std::string node(spec);
        KVASIR_CHECK(sub.skip_layer < c.num_layers, ErrorCode::bad_input,
                     "node '{}': skip_layer={} but the model has {} layers", node, sub.skip_layer, c.num_layers);
        if (sub.top_k > 0) {
            KVASIR_CHECK(c.num_experts() > 0, ErrorCode::bad_input, "node '{}': topk needs a model with MoE layers", node);
            KVASIR_CHECK(sub.top_k < c.top_k(), ErrorCode::bad_input,
                         "node '{}': topk={} is not below the model's {} experts per token", node, sub.top_k, c.top_k());
        }
        const bool touches_weights = sub.requant || sub.perturb > 0 || sub.skip_layer >= 0;
        for (std::int64_t l = 0; touches_weights && l < c.num_layers; ++l) {
            const LayerWeights& w = model.layer(l);
            const bool skipped = l == sub.skip_layer;
            KVASIR_CHECK(!skipped || !present(w.o_bias), ErrorCode::unsupported,
                         "node '{}': skip_layer={}: the layer's output projection has a bias, which a zero "
                         "projection would not remove", node, l);
            for (const auto& [view, name] : w.named_views()) {
                const std::string_view n = name;
                if (!present(*view) || view->rank() != 2 || n == "linear_attn conv1d") continue;
                const bool output = n == "o_proj" || n == "linear_attn out_proj" || n == "mlp down_proj" ||
                                    n == "shared expert down_proj";
                add(*view, Role{fmt::format("layer {} {}", l, n), n != "router (gate)", skipped && output});
            }
            for (std::size_t e = 0; e < w.experts.size(); ++e) {
                const ExpertWeights& x = w.experts[e];
                add(x.gate, Role{fmt::format("layer {} expert {} gate", l, e), true, false});
                add(x.up, Role{fmt::format("layer {} expert {} up", l, e), true, false});
                add(x.down, Role{fmt::format("layer {} expert {} down", l, e), true, skipped});
                if (skipped && present(x.down_bias)) add(x.down_bias, Role{"", false, true});
            }
        }
        // Tied: the LM head is the token embedding, which llama-quantize
        // --token-embedding-type f32 keeps and the embedding gather reads as it is.
        if (touches_weights && !c.tie_word_embeddings) add(model.lm_head(), Role{"lm_head", true, false});

        BackendSpec name = BackendSpec::parse(caps_.node);
        for (auto& [k, v] : sub.options()) name.options[k] = v;
        caps_.node = name.canonical();
        std::string what;
        for (const auto& [k, v] : sub.options()) what += (what.empty() ? "" : ",") + k + "=" + v;
        caps_.extra.emplace_back("substitution", what);
    }

    const Capabilities& capabilities() const override { return caps_; }

    Tensor matmul(const TensorView& x, const TensorView& w) override { return ForwardingBackend::inner().matmul(x, substituted(w)); }

    Tensor moe_block(const TensorView& x, std::span<const ExpertWeights> experts, const RoutingPlan& plan,
                     const std::vector<bool>* filter) override {
        std::vector<ExpertWeights> mine(experts.begin(), experts.end());
        for (ExpertWeights& e : mine) {
            e.gate = substituted(e.gate);
            e.up = substituted(e.up);
            e.down = substituted(e.down);
            e.down_bias = substituted(e.down_bias);
        }
        if (sub_.top_k <= 0 || plan.ids.dim(1) <= sub_.top_k) return ForwardingBackend::inner().moe_block(x, mine, plan, filter);
        return ForwardingBackend::inner().moe_block(x, mine, truncated(plan), filter);
    }

    // The keys and values rounded as the substitution says, then the inner node's attention.
    Tensor run_attention(const TensorView& q, std::span<const TensorView> keys, std::span<const TensorView> values,
                         double scale, const TensorView* sinks) override {
        if (sub_.kv == Substitution::Kv::none) return ForwardingBackend::run_attention(q, keys, values, scale, sinks);
        const Rounded r(*this, keys, values);
        return ForwardingBackend::run_attention(q, r.keys, r.values, scale, sinks);
    }
    std::optional<Tensor> kv_rows(const TensorView* cache, std::int64_t keep, const TensorView& rows) override {
        if (sub_.kv != Substitution::Kv::none) return std::nullopt;  // the cache stays on the host, where it is rounded
        return ForwardingBackend::inner().kv_rows(cache, keep, rows);
    }

private:
    void add(const TensorView& w, Role role) {
        if (!present(w) || w.data == nullptr) return;
        if (!role.zero && !(role.quantise && sub_.requant) && !(sub_.perturb > 0 && !role.stream.empty())) return;
        auto entry = std::make_unique<Entry>();
        entry->role = std::move(role);
        entries_.emplace(w.data, std::move(entry));  // the first role of a shared matrix wins
    }

    // w's substituted copy (made on first use), or w itself.
    TensorView substituted(const TensorView& w) {
        if (w.data == nullptr) return w;
        std::lock_guard lock(mu_);
        const auto it = entries_.find(w.data);
        if (it == entries_.end()) return w;
        Entry& e = *it->second;
        if (e.copy.empty()) {
            e.copy = transformed(w, e.role);
            e.registration = ImmutableRegistration(e.copy.raw(), e.copy.nbytes());
        }
        KVASIR_ASSERT(e.copy.shape() == w.shape);
        return e.copy.view();
    }

    Tensor transformed(const TensorView& w, const Role& role) const {
        Tensor out(DType::f32, w.shape);
        if (role.zero) return out;
        auto* v = static_cast<float*>(out.raw());
        const std::int64_t n = w.numel();
        // Row by row in parallel: every row's result is independent of the split
        // (the RMS is a sum in row order; the noise is the same for every thread
        // count, rng.hpp).
        const std::int64_t rows = w.dim(0), cols = w.dim(1);
        if (sub_.perturb > 0) {
            std::vector<double> row_sumsq(static_cast<std::size_t>(rows));
#pragma omp parallel for schedule(static)
            for (std::int64_t r = 0; r < rows; ++r) {
                double acc = 0;
                for (std::int64_t c = 0; c < cols; ++c) acc += w.at(r * cols + c) * w.at(r * cols + c);
                row_sumsq[static_cast<std::size_t>(r)] = acc;
            }
            double sumsq = 0;
            for (double x : row_sumsq) sumsq += x;
            const double sd = sub_.perturb * std::sqrt(sumsq / static_cast<double>(std::max<std::int64_t>(n, 1)));
            const Tensor noise =
                seeded_normal(sub_.perturb_seed, "substitution/perturb/" + role.stream, w.shape, 0.0, 1.0, DType::f64, 0);
            const double* z = noise.as<double>();
#pragma omp parallel for schedule(static)
            for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(w.at(i) + sd * z[i]);
        } else {
#pragma omp parallel for schedule(static)
            for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(w.at(i));
        }
        if (role.quantise && sub_.requant) {
            const GgmlType target = *sub_.requant;
#pragma omp parallel for schedule(dynamic, 16)
            for (std::int64_t r = 0; r < rows; ++r) requantize_rows(target, v + r * cols, v + r * cols, 1, cols);
        }
        return out;
    }

    // The plan's first top_k experts per token, weights rescaled to the
    // plan's full sum (in f64, stored in the plan's dtype).
    RoutingPlan truncated(const RoutingPlan& plan) const {
        const std::int64_t t_count = plan.ids.dim(0), k = plan.ids.dim(1), kk = sub_.top_k;
        RoutingPlan out{Tensor(DType::i32, {t_count, kk}), Tensor(plan.weights.dtype(), {t_count, kk})};
        const TensorView w = plan.weights.view();
        for (std::int64_t t = 0; t < t_count; ++t) {
            double all = 0, kept = 0;
            for (std::int64_t j = 0; j < k; ++j) (j < kk ? kept : all) += w.at(t * k + j);
            all += kept;
            const double f = kept != 0 ? all / kept : 1.0;
            for (std::int64_t j = 0; j < kk; ++j) {
                static_cast<std::int32_t*>(out.ids.raw())[t * kk + j] = plan.ids.as<std::int32_t>()[t * k + j];
                store_from_f64(out.weights.dtype(), out.weights.raw(), static_cast<std::size_t>(t * kk + j),
                               w.at(t * k + j) * f);
            }
        }
        return out;
    }

    // Every K and V row rounded to the cache's format, in the views' dtypes.
    struct Rounded {
        std::vector<Tensor> held;
        std::vector<TensorView> keys, values;
        Rounded(const SubstitutedBackend& b, std::span<const TensorView> k, std::span<const TensorView> v) {
            held.reserve(k.size() + v.size());
            for (std::span<const TensorView> part : {k, v})
                for (const TensorView& c : part) {
                    Tensor r(c.dtype, c.shape);
                    for (std::int64_t i = 0; i < c.numel(); ++i) {
                        const double x = c.at(i);
                        store_from_f64(c.dtype, r.raw(), static_cast<std::size_t>(i),
                                       b.sub_.kv == Substitution::Kv::f16 ? round_to_f16(x) : round_to_fp8_e4m3(x));
                    }
                    held.push_back(std::move(r));
                }
            for (std::size_t i = 0; i < held.size(); ++i) (i < k.size() ? keys : values).push_back(held[i].view());
        }
    };

    Substitution sub_;
    Capabilities caps_;
    std::mutex mu_;
    std::map<const void*, std::unique_ptr<Entry>> entries_;
};

template <typename T>
T parse_number(const BackendSpec& spec, const std::string& key, const std::string& text) {
    T value{};
    const char* end = text.data() + text.size();
    const auto [p, ec] = std::from_chars(text.data(), end, value);
    KVASIR_CHECK(ec == std::errc() && p == end, ErrorCode::bad_input, "backend '{}': {}={} is not a number",
                 spec.canonical(), key, text);
    return value;
}

}  // namespace

bool Substitution::empty() const {
    return !requant && kv == Kv::none && top_k == 0 && skip_layer < 0 && perturb == 0;
}

std::vector<std::pair<std::string, std::string>> Substitution::options() const {
    std::vector<std::pair<std::string, std::string>> out;
    if (requant) out.emplace_back("requant", lower(ggml_type_name(*requant)));
    if (kv != Kv::none) out.emplace_back("kv", kv_name(kv));
    if (top_k > 0) out.emplace_back("topk", std::to_string(top_k));
    if (skip_layer >= 0) out.emplace_back("skip_layer", std::to_string(skip_layer));
    if (perturb > 0) {
        out.emplace_back("perturb", fmt::format("{}", perturb));
        if (perturb_seed != 0) out.emplace_back("perturb_seed", std::to_string(perturb_seed));
    }
    return out;
}

bool is_substitution_key(std::string_view key) noexcept {
    return std::find(std::begin(kKeys), std::end(kKeys), key) != std::end(kKeys);
}

Substitution take_substitution(BackendSpec& spec) {
    const BackendSpec given = spec;
    Substitution s;
    for (auto it = spec.options.begin(); it != spec.options.end();) {
        const auto& [key, value] = *it;
        if (!is_substitution_key(key)) {
            ++it;
            continue;
        }
        if (key == "requant") {
            s.requant = parse_quant_type(value);
            KVASIR_CHECK(s.requant.has_value(), ErrorCode::bad_input,
                         "backend '{}': requant must be q8_0, q5_0, q4_k or mxfp4, not '{}'", given.canonical(), value);
        } else if (key == "kv") {
            const std::string v = lower(value);
            KVASIR_CHECK(v == "f16" || v == "fp8", ErrorCode::bad_input, "backend '{}': kv must be f16 or fp8, not '{}'",
                         given.canonical(), value);
            s.kv = v == "f16" ? Substitution::Kv::f16 : Substitution::Kv::fp8_e4m3;
        } else if (key == "topk") {
            s.top_k = parse_number<std::int64_t>(given, key, value);
            KVASIR_CHECK(s.top_k >= 1, ErrorCode::bad_input, "backend '{}': topk must be ≥ 1", given.canonical());
        } else if (key == "skip_layer") {
            s.skip_layer = parse_number<std::int64_t>(given, key, value);
            KVASIR_CHECK(s.skip_layer >= 0, ErrorCode::bad_input, "backend '{}': skip_layer must be ≥ 0", given.canonical());
        } else if (key == "perturb") {
            s.perturb = parse_number<double>(given, key, value);
            KVASIR_CHECK(std::isfinite(s.perturb) && s.perturb > 0 && s.perturb <= 1, ErrorCode::bad_input,
                         "backend '{}': perturb must be in (0, 1], a fraction of each weight's RMS", given.canonical());
        } else {
            s.perturb_seed = parse_number<std::uint64_t>(given, key, value);
        }
        it = spec.options.erase(it);
    }
    KVASIR_CHECK(s.perturb_seed == 0 || s.perturb > 0, ErrorCode::bad_input, "backend '{}': perturb_seed without perturb",
                 given.canonical());
    return s;
}

std::unique_ptr<Backend> create_node(std::string_view text, const Model* model) {
    BackendSpec spec = BackendSpec::parse(text);
    const Substitution sub = take_substitution(spec);
    auto inner = create_backend(spec);
    if (sub.empty()) return inner;
    KVASIR_CHECK(model != nullptr, ErrorCode::bad_input, "node '{}': a substitution needs the model it substitutes "
                 "(this command runs ops, not a model)", text);
    return std::make_unique<SubstitutedBackend>(std::move(inner), *model, sub, text);
}

}  // namespace kvasir
