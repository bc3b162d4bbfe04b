#include "kvasir/backend/backend.hpp"

#include "kvasir/core/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <type_traits>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <tuple>

namespace kvasir {

// --- BackendSpec -------------------------------------------------------------

static bool is_name_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_';
}

BackendSpec BackendSpec::parse(std::string_view text) {
    BackendSpec spec;
    std::vector<std::string_view> parts;
    std::size_t start = 0;
    while (true) {
        const std::size_t colon = text.find(':', start);
        parts.push_back(text.substr(start, colon == std::string_view::npos ? colon : colon - start));
        if (colon == std::string_view::npos) break;
        start = colon + 1;
    }
    const auto bad = [&](std::string_view why) {
        fail(ErrorCode::bad_input, "backend '{}': {} (expected NAME[:DEVICE][:key=value,...], e.g. cpu:acc=f16)",
             text, why);
    };
    if (parts[0].empty() || !std::all_of(parts[0].begin(), parts[0].end(), is_name_char)) bad("invalid name");
    spec.name = std::string(parts[0]);
    for (std::size_t i = 1; i < parts.size(); ++i) {
        const std::string_view p = parts[i];
        if (p.empty()) bad("empty field");
        if (std::all_of(p.begin(), p.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; })) {
            if (spec.device_given || i != 1) bad("device index must come right after the name");
            if (p.size() > 4) bad("device index too large");
            spec.device = std::stoi(std::string(p));
            spec.device_given = true;
            continue;
        }
        std::size_t s = 0;
        while (s <= p.size()) {
            const std::size_t comma = p.find(',', s);
            const std::string_view kv = p.substr(s, comma == std::string_view::npos ? comma : comma - s);
            const std::size_t eq = kv.find('=');
            if (eq == std::string_view::npos || eq == 0 || eq + 1 == kv.size())
                bad(fmt::format("option '{}' is not key=value", kv));
            std::string key(kv.substr(0, eq));
            if (spec.options.count(key) != 0) bad(fmt::format("option '{}' given twice", key));
            spec.options.emplace(std::move(key), std::string(kv.substr(eq + 1)));
            if (comma == std::string_view::npos) break;
            s = comma + 1;
        }
    }
    return spec;
}

std::string BackendSpec::canonical() const {
    std::string out = name;
    if (device_given) out += fmt::format(":{}", device);
    bool first = true;
    for (const auto& [k, v] : options) {
        out += first ? ":" : ",";
        out += k + "=" + v;
        first = false;
    }
    return out;
}

bool apply_precision_option(const BackendSpec& spec, const std::string& key, const std::string& value,
                            Capabilities& caps) {
    if (key == "storage") {
        const auto t = parse_dtype(value);
        KVASIR_CHECK(t && (*t == DType::f32 || *t == DType::f16 || *t == DType::bf16), ErrorCode::bad_input,
                     "backend '{}': storage must be f32, f16 or bf16, not '{}'", spec.canonical(), value);
        caps.storage = *t;
        return true;
    }
    if (key == "acc") {
        const auto t = parse_dtype(value);
        KVASIR_CHECK(t && (*t == DType::f32 || *t == DType::f16), ErrorCode::bad_input,
                     "backend '{}': acc must be f32 or f16, not '{}' (f64 accumulation is cpu-ref)", spec.canonical(),
                     value);
        caps.accumulation = *t;
        return true;
    }
    return false;
}

// --- argument checks -----------------------------------------------------------

std::int64_t rows_of(const TensorView& x) {
    if (x.rank() == 0) return 1;
    const std::int64_t last = x.dim(-1);
    return last == 0 ? 0 : x.numel() / last;
}

void check_matmul_args(const TensorView& x, const TensorView& w) {
    KVASIR_CHECK(x.rank() >= 1 && w.rank() == 2, ErrorCode::bad_input, "matmul: x {} and w {} must be [.., K] and [N, K]",
                 shape_str(x.shape), shape_str(w.shape));
    KVASIR_CHECK(x.dim(-1) == w.dim(1), ErrorCode::bad_input, "matmul: x {} and w {} disagree on K",
                 shape_str(x.shape), shape_str(w.shape));
}

void check_same_shape(const char* op, const TensorView& a, const TensorView& b) {
    KVASIR_CHECK(a.shape == b.shape, ErrorCode::bad_input, "{}: shapes {} and {} differ", op, shape_str(a.shape),
                 shape_str(b.shape));
}

void check_rmsnorm_args(const TensorView& x, const TensorView& w) {
    KVASIR_CHECK(x.rank() >= 1 && w.rank() == 1 && w.dim(0) == x.dim(-1), ErrorCode::bad_input,
                 "rmsnorm: weight {} does not match x {}", shape_str(w.shape), shape_str(x.shape));
}

void check_rope_args(const TensorView& x, std::span<const std::int64_t> positions, const RopeParams& params) {
    KVASIR_CHECK(x.rank() == 3, ErrorCode::bad_input, "rope: x {} must be [T, H, D]", shape_str(x.shape));
    KVASIR_CHECK(x.dim(2) % 2 == 0, ErrorCode::bad_input, "rope: head dim {} must be even", x.dim(2));
    KVASIR_CHECK(static_cast<std::int64_t>(positions.size()) == x.dim(0), ErrorCode::bad_input,
                 "rope: {} positions for {} tokens", positions.size(), x.dim(0));
    KVASIR_CHECK(!params.inv_freq || static_cast<std::int64_t>(params.inv_freq->size()) == x.dim(2) / 2,
                 ErrorCode::bad_input, "rope: {} inverse frequencies for head dim {}",
                 params.inv_freq ? params.inv_freq->size() : 0, x.dim(2));
}

float rope_inv_freq_f32(const RopeParams& p, std::int64_t i, std::int64_t d) {
    if (p.inv_freq) return static_cast<float>((*p.inv_freq)[static_cast<std::size_t>(i)]);
    return std::pow(static_cast<float>(p.theta), -2.0f * static_cast<float>(i) / static_cast<float>(d));
}

double rope_inv_freq_f64(const RopeParams& p, std::int64_t i, std::int64_t d) {
    if (p.inv_freq) return (*p.inv_freq)[static_cast<std::size_t>(i)];
    return std::pow(p.theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
}

void check_moe_args(const TensorView& x, std::span<const ExpertWeights> experts, const RoutingPlan& plan) {
    KVASIR_CHECK(x.rank() == 2, ErrorCode::bad_input, "moe: x {} must be [T, H]", shape_str(x.shape));
    KVASIR_CHECK(!experts.empty(), ErrorCode::bad_input, "moe: no experts");
    const std::int64_t h = x.dim(1);
    for (std::size_t e = 0; e < experts.size(); ++e) {
        const ExpertWeights& ew = experts[e];
        KVASIR_CHECK(ew.gate.rank() == 2 && ew.up.shape == ew.gate.shape && ew.gate.dim(1) == h && ew.down.rank() == 2 &&
                         ew.down.dim(0) == h && ew.down.dim(1) == ew.gate.dim(0),
                     ErrorCode::bad_input, "moe: expert {} weights gate {} up {} down {} do not fit hidden size {}", e,
                     shape_str(ew.gate.shape), shape_str(ew.up.shape), shape_str(ew.down.shape), h);
        const std::int64_t i = ew.gate.dim(0);
        for (const auto& [b, n, what] : {std::tuple{&ew.gate_bias, i, "gate"}, std::tuple{&ew.up_bias, i, "up"},
                                         std::tuple{&ew.down_bias, h, "down"}})
            KVASIR_CHECK(b->data == nullptr || (b->rank() == 1 && b->dim(0) == n), ErrorCode::bad_input,
                         "moe: expert {} {} bias {} does not fit {}", e, what, shape_str(b->shape), n);
    }
    KVASIR_CHECK(plan.ids.dtype() == DType::i32 && plan.ids.view().rank() == 2 && plan.ids.dim(0) == x.dim(0) &&
                     plan.weights.shape() == plan.ids.shape(),
                 ErrorCode::bad_input, "moe: routing plan ids {} / weights {} do not fit {} tokens",
                 shape_str(plan.ids.shape()), shape_str(plan.weights.shape()), x.dim(0));
    const std::int32_t* ids = plan.ids.as<std::int32_t>();
    for (std::int64_t i = 0; i < plan.ids.numel(); ++i)
        KVASIR_CHECK(ids[i] >= 0 && ids[i] < static_cast<std::int32_t>(experts.size()), ErrorCode::bad_input,
                     "moe: routing plan names expert {} of {}", ids[i], experts.size());
}

Tensor linear(Backend& be, const TensorView& x, const TensorView& w, const TensorView& bias) {
    Tensor y = be.matmul(x, w);
    if (bias.data == nullptr && bias.device == nullptr) return y;  // absent
    return be.add(y, broadcast_rows(bias, rows_of(y.view())));
}

void check_sinks_args(const TensorView& q, const TensorView& sinks) {
    KVASIR_CHECK(sinks.rank() == 1 && q.rank() == 3 && sinks.dim(0) == q.dim(1), ErrorCode::bad_input,
                 "attention: sinks {} for q {} (one per query head)", shape_str(sinks.shape), shape_str(q.shape));
}

void check_attention_args(const TensorView& q, std::span<const TensorView> keys, std::span<const TensorView> values) {
    KVASIR_CHECK(q.rank() == 3, ErrorCode::bad_input, "attention: q {} must be [T, heads, D]", shape_str(q.shape));
    KVASIR_CHECK(!keys.empty() && keys.size() == values.size(), ErrorCode::bad_input,
                 "attention: {} key and {} value caches (one of each per kv head)", keys.size(), values.size());
    const std::int64_t nkv = static_cast<std::int64_t>(keys.size());
    KVASIR_CHECK(q.dim(1) % nkv == 0, ErrorCode::bad_input, "attention: {} query heads do not share {} kv heads evenly",
                 q.dim(1), nkv);
    const std::int64_t s_count = keys[0].rank() == 2 ? keys[0].dim(0) : -1;
    for (std::size_t g = 0; g < keys.size(); ++g)
        for (const TensorView* c : {&keys[g], &values[g]})
            KVASIR_CHECK(c->rank() == 2 && c->dim(0) == s_count && c->dim(1) == q.dim(2) && dtype_is_float(c->dtype),
                         ErrorCode::bad_input, "attention: kv head {} cache {} does not match [S, D] = [{}, {}] of q {}", g,
                         shape_str(c->shape), s_count, q.dim(2), shape_str(q.shape));
    KVASIR_CHECK(s_count >= q.dim(0), ErrorCode::bad_input, "attention: {} cached rows cannot hold {} new tokens", s_count,
                 q.dim(0));
}

// --- defaults --------------------------------------------------------------------

DType Backend::combine_dtype() const {
    return capabilities().accumulation == DType::f64 ? DType::f64 : DType::f32;
}

void select_topk(const TensorView& scores, const RouterParams& params, Tensor& ids, Tensor& chosen_scores) {
    KVASIR_CHECK(scores.rank() == 2, ErrorCode::bad_input, "router: scores {} must be [T, E]", shape_str(scores.shape));
    const std::int64_t t_count = scores.dim(0);
    const std::int64_t e_count = scores.dim(1);
    const int k = params.top_k;
    KVASIR_CHECK(k >= 1 && k <= e_count, ErrorCode::bad_input, "router: top-k {} out of range for {} experts", k, e_count);
    KVASIR_CHECK(params.n_group >= 1 && e_count % params.n_group == 0 && params.topk_group >= 1 &&
                     params.topk_group <= params.n_group,
                 ErrorCode::bad_input, "router: {} experts cannot form {} groups keeping {}", e_count, params.n_group,
                 params.topk_group);
    if (params.bias != nullptr)
        KVASIR_CHECK(params.bias->numel() == e_count, ErrorCode::bad_input, "router: bias has {} entries for {} experts",
                     params.bias->numel(), e_count);
    const std::int64_t group_size = e_count / params.n_group;
    KVASIR_CHECK(params.n_group == 1 || group_size >= 2, ErrorCode::bad_input, "router: groups of {} experts", group_size);
    KVASIR_CHECK(params.n_group == 1 || k <= params.topk_group * group_size, ErrorCode::bad_input,
                 "router: top-k {} exceeds the experts of {} groups", k, params.topk_group);

    ids = Tensor(DType::i32, {t_count, k});
    chosen_scores = Tensor(DType::f64, {t_count, k});
    std::vector<double> sel(static_cast<std::size_t>(e_count));
    std::vector<std::int64_t> order(static_cast<std::size_t>(e_count));
    // Strict weak order: higher selection score first, ties to the lower id.
    // NaN scores sort last so they are never preferred over a number.
    const auto better = [&](std::int64_t a, std::int64_t b) {
        const double sa = sel[static_cast<std::size_t>(a)], sb = sel[static_cast<std::size_t>(b)];
        const bool na = std::isnan(sa), nb = std::isnan(sb);
        if (na != nb) return nb;
        if (!na && sa != sb) return sa > sb;
        return a < b;
    };
    for (std::int64_t t = 0; t < t_count; ++t) {
        for (std::int64_t e = 0; e < e_count; ++e) {
            double s = scores.at(t * e_count + e);
            if (params.bias != nullptr) s += params.bias->at(e);
            sel[static_cast<std::size_t>(e)] = s;
        }
        if (params.n_group > 1) {
            // Group score = sum of its two best selection scores; keep the best groups.
            std::vector<std::pair<double, std::int64_t>> groups;
            for (std::int64_t g = 0; g < params.n_group; ++g) {
                std::vector<double> v(sel.begin() + g * group_size, sel.begin() + (g + 1) * group_size);
                std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
                groups.emplace_back(v[0] + v[1], g);
            }
            std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
                if (std::isnan(a.first) != std::isnan(b.first)) return std::isnan(b.first);
                return a.first > b.first;
            });
            std::vector<bool> keep(static_cast<std::size_t>(params.n_group), false);
            for (int g = 0; g < params.topk_group; ++g) keep[static_cast<std::size_t>(groups[static_cast<std::size_t>(g)].second)] = true;
            for (std::int64_t e = 0; e < e_count; ++e)
                if (!keep[static_cast<std::size_t>(e / group_size)])
                    sel[static_cast<std::size_t>(e)] = -std::numeric_limits<double>::infinity();
        }
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
        for (int j = 0; j < k; ++j) {
            const std::int64_t e = order[static_cast<std::size_t>(j)];
            ids.as<std::int32_t>()[t * k + j] = static_cast<std::int32_t>(e);
            chosen_scores.as<double>()[t * k + j] = scores.at(t * e_count + e);
        }
    }
}

RouterOutput Backend::route(const TensorView& logits, const RouterParams& params) {
    RouterOutput out;
    out.scores = params.scoring == RouterScoring::softmax ? softmax(logits) : sigmoid(logits);
    Tensor chosen;
    select_topk(out.scores.view(), params, out.ids, chosen);
    const Capabilities& caps = capabilities();
    const DType acc = caps.accumulation == DType::f64 ? DType::f64 : caps.accumulation;
    const std::int64_t t_count = chosen.dim(0);
    const std::int64_t k = chosen.dim(1);
    out.weights = Tensor(caps.output, {t_count, k});
    for (std::int64_t t = 0; t < t_count; ++t) {
        double sum = 0.0;
        for (std::int64_t j = 0; j < k; ++j) sum = round_to(acc, sum + chosen.at(t * k + j));
        for (std::int64_t j = 0; j < k; ++j) {
            double w = chosen.at(t * k + j);
            if (params.renormalize) w = round_to(caps.storage, w / sum);
            if (params.scaling != 1.0) w = round_to(caps.storage, w * params.scaling);
            out.weights.set(t * k + j, w);
        }
    }
    return out;
}

namespace {

// out[t] = Σ over the experts in ascending order of w[t,j] · y_e[row of t], in Acc,
// rounded to storage at the end.
template <typename Acc>
Tensor moe_combine(const Capabilities& caps, std::int64_t t_count, std::int64_t h, const std::vector<ExpertRows>& routed,
                   const std::vector<Tensor>& ys) {
    std::vector<Acc> acc(static_cast<std::size_t>(t_count * h), Acc{0});
    for (std::size_t e = 0; e < routed.size(); ++e) {
        const std::vector<std::pair<std::int64_t, double>>& rows = routed[e].rows;
        const Tensor& y = ys[e];
        for (std::size_t r = 0; r < rows.size(); ++r) {
            const Acc w = static_cast<Acc>(rows[r].second);
            Acc* dst = acc.data() + rows[r].first * h;
            const std::int64_t base = static_cast<std::int64_t>(r) * h;
            if (y.dtype() == DType::f32) {  // the common case read directly: the same values as at()
                const float* yp = y.as<float>() + base;
                for (std::int64_t i = 0; i < h; ++i) dst[i] += w * static_cast<Acc>(yp[i]);
            } else {
                for (std::int64_t i = 0; i < h; ++i) dst[i] += w * static_cast<Acc>(y.at(base + i));
            }
        }
    }
    Tensor out(caps.output, {t_count, h});
    if (caps.output == DType::f32 && caps.storage == DType::f32) {
        float* op = out.as<float>();
        for (std::int64_t i = 0; i < t_count * h; ++i) op[i] = static_cast<float>(acc[static_cast<std::size_t>(i)]);
    } else {
        for (std::int64_t i = 0; i < t_count * h; ++i) out.set(i, round_to(caps.storage, acc[static_cast<std::size_t>(i)]));
    }
    return out;
}

}  // namespace

void Backend::expert_ffns(std::span<ExpertJob> jobs) {
    for (ExpertJob& job : jobs) {
        const ExpertWeights& ew = *job.weights;
        // The biases (gpt-oss) added with this backend's add.
        const Tensor g = linear(*this, job.x, ew.gate, ew.gate_bias);
        const Tensor u = linear(*this, job.x, ew.up, ew.up_bias);
        const Tensor act = ew.activation.clamped ? clamped_swiglu(g, u, ew.activation.alpha, ew.activation.limit)
                                                 : swiglu(g, u);
        job.y = linear(*this, act, ew.down, ew.down_bias);
    }
}

std::vector<ExpertRows> route_rows(const TensorView& x, std::span<const ExpertWeights> experts, const RoutingPlan& plan,
                                   const std::vector<bool>* expert_filter) {
    check_moe_args(x, experts, plan);
    if (expert_filter != nullptr)
        KVASIR_CHECK(expert_filter->size() == experts.size(), ErrorCode::bad_input, "moe: expert filter has {} of {}",
                     expert_filter->size(), experts.size());
    const std::int64_t t_count = x.dim(0), k = plan.ids.dim(1);
    const std::int32_t* ids = plan.ids.as<std::int32_t>();
    std::vector<ExpertRows> out;
    for (std::size_t e = 0; e < experts.size(); ++e) {
        if (expert_filter != nullptr && !(*expert_filter)[e]) continue;
        ExpertRows mine{e, {}};
        for (std::int64_t t = 0; t < t_count; ++t)
            for (std::int64_t j = 0; j < k; ++j)
                if (ids[t * k + j] == static_cast<std::int32_t>(e)) mine.rows.emplace_back(t, plan.weights.at(t * k + j));
        if (!mine.rows.empty()) out.push_back(std::move(mine));
    }
    return out;
}

RoutedExperts routed_experts(std::span<const ExpertWeights> experts, std::span<const ExpertRows> routed, std::int64_t h) {
    RoutedExperts out;
    for (const ExpertRows& er : routed) {
        const ExpertWeights& ew = experts[er.expert];
        const TensorView shape_only{DType::f32, nullptr, {static_cast<std::int64_t>(er.rows.size()), h}};
        check_matmul_args(shape_only, ew.gate);
        check_matmul_args(shape_only, ew.up);
        KVASIR_CHECK(ew.down.dim(0) == h, ErrorCode::bad_input,
                     "moe: an expert's down projection gives {} columns for a hidden size of {}", ew.down.dim(0), h);
        out.weights.push_back(&ew);
        out.rows.push_back(static_cast<std::int64_t>(er.rows.size()));
        out.g_count += er.rows.size();
    }
    return out;
}

bool one_activation(std::span<const ExpertWeights* const> weights) {
    if (weights.empty()) return false;
    const ExpertActivation& first = weights.front()->activation;
    return std::all_of(weights.begin(), weights.end(), [&](const ExpertWeights* ew) {
        const ExpertActivation& a = ew->activation;
        return a.clamped == first.clamped && (!a.clamped || (a.alpha == first.alpha && a.limit == first.limit));
    });
}

ExpertLayout lay_out_experts(std::span<const ExpertWeights* const> weights, std::span<const std::int64_t> rows,
                             std::int64_t h, std::size_t align) {
    KVASIR_ASSERT(weights.size() == rows.size() && align > 0);
    constexpr std::int64_t kIntMax = (std::int64_t{1} << 31) - 1;
    const auto fits = [](std::initializer_list<std::int64_t> counts) {
        for (const std::int64_t c : counts)
            KVASIR_CHECK(c <= kIntMax, ErrorCode::unsupported, "moe: dimension {} exceeds the device kernels' 2^31-1 limit", c);
    };
    const auto padded = [&](std::int64_t n, std::int64_t row) {
        const std::size_t unit = std::lcm(align, static_cast<std::size_t>(std::max<std::int64_t>(row, 1)));
        return (static_cast<std::size_t>(n) + unit - 1) / unit * unit;
    };
    ExpertLayout out;
    for (std::size_t n = 0; n < weights.size(); ++n) {
        const ExpertWeights& ew = *weights[n];
        ExpertSlice sl{out.x_total, out.mid_total, out.y_total, rows[n], h, ew.gate.dim(0), ew.down.dim(0)};
        KVASIR_CHECK(ew.up.dim(0) == sl.i && ew.down.dim(1) == sl.i, ErrorCode::bad_input,
                     "moe: expert gate/up/down shapes disagree ({} / {} / {}x{})", sl.i, ew.up.dim(0), sl.out, ew.down.dim(1));
        fits({sl.rows, sl.h, sl.i, sl.out});
        fits({sl.rows * sl.h, sl.rows * sl.i, sl.rows * sl.out});
        check_expert_shapes(ew, sl.rows, sl.i);
        out.x_total += padded(sl.rows * sl.h, sl.h);
        out.mid_total += padded(sl.rows * sl.i, sl.i);
        out.y_total += padded(sl.rows * sl.out, sl.out);
        out.slices.push_back(sl);
    }
    fits({static_cast<std::int64_t>(out.x_total), static_cast<std::int64_t>(out.mid_total),
          static_cast<std::int64_t>(out.y_total)});
    return out;
}

std::vector<std::size_t> ExpertLayout::x_rows() const {
    std::vector<std::size_t> r;
    for (const ExpertSlice& sl : slices) r.push_back(sl.h > 0 ? sl.x / static_cast<std::size_t>(sl.h) : 0);
    return r;
}
std::vector<std::size_t> ExpertLayout::y_rows() const {
    std::vector<std::size_t> r;
    for (const ExpertSlice& sl : slices) r.push_back(sl.out > 0 ? sl.y / static_cast<std::size_t>(sl.out) : 0);
    return r;
}

std::vector<std::uint32_t> moe_device_table(std::span<const ExpertRows> routed, std::span<const std::size_t> x_row0,
                                            std::span<const std::size_t> y_row0, std::int64_t t_count) {
    KVASIR_ASSERT(x_row0.size() == routed.size() && y_row0.size() == routed.size());
    std::vector<std::uint32_t> table;
    std::vector<std::vector<std::pair<std::uint32_t, float>>> terms(static_cast<std::size_t>(t_count));
    const auto word = [](std::size_t v) {
        KVASIR_CHECK(v <= 0xFFFFFFFFu, ErrorCode::unsupported, "moe: row {} exceeds the device tables' 32-bit indices", v);
        return static_cast<std::uint32_t>(v);
    };
    for (std::size_t n = 0; n < routed.size(); ++n)
        for (std::size_t i = 0; i < routed[n].rows.size(); ++i) {
            const auto [t, w] = routed[n].rows[i];
            table.push_back(word(static_cast<std::size_t>(t)));
            table.push_back(word(x_row0[n] + i));
            terms[static_cast<std::size_t>(t)].emplace_back(word(y_row0[n] + i), static_cast<float>(w));
        }
    std::size_t at = 0;
    for (const auto& list : terms) {
        table.push_back(word(at));
        at += list.size();
    }
    table.push_back(word(at));
    for (const auto& list : terms)
        for (const auto& [row, w] : list) {
            table.push_back(row);
            table.push_back(std::bit_cast<std::uint32_t>(w));
        }
    return table;
}

Tensor Backend::moe_block(const TensorView& x, std::span<const ExpertWeights> experts, const RoutingPlan& plan,
                          const std::vector<bool>* expert_filter) {
    const std::vector<ExpertRows> routed = route_rows(x, experts, plan, expert_filter);
    const std::int64_t t_count = x.dim(0);
    const std::int64_t h = x.dim(1);
    const std::size_t row_bytes = static_cast<std::size_t>(h) * dtype_size(x.dtype);
    // Per expert with rows (ascending ids): its job, the rows gathered on the host.
    std::vector<ExpertJob> jobs;
    const auto* xb = static_cast<const std::byte*>(x.host_data());
    for (const ExpertRows& er : routed) {
        ExpertJob job;
        job.weights = &experts[er.expert];
        job.x = Tensor(x.dtype, {static_cast<std::int64_t>(er.rows.size()), h});
        for (std::size_t r = 0; r < er.rows.size(); ++r)
            std::memcpy(static_cast<std::byte*>(job.x.raw()) + r * row_bytes,
                        xb + static_cast<std::size_t>(er.rows[r].first) * row_bytes, row_bytes);
        jobs.push_back(std::move(job));
    }
    expert_ffns(jobs);
    std::vector<Tensor> ys;
    ys.reserve(jobs.size());
    for (ExpertJob& job : jobs) {
        KVASIR_ASSERT(job.y.shape().size() == 2 && job.y.dim(0) == job.x.dim(0) && job.y.dim(1) == h);
        ys.push_back(std::move(job.y));
    }
    if (combine_dtype() == DType::f64) return moe_combine<double>(capabilities(), t_count, h, routed, ys);
    return moe_combine<float>(capabilities(), t_count, h, routed, ys);
}

Tensor Backend::clamped_swiglu(const TensorView&, const TensorView&, double, double) {
    fail(ErrorCode::unsupported, "{}: clamped_swiglu (gpt-oss experts) has no kernel on this backend yet",
         capabilities().node);
}

void check_expert_shapes(const ExpertWeights& ew, std::int64_t rows, std::int64_t inner) {
    const TensorView act{DType::f32, nullptr, {rows, inner}};  // shape only: what the SwiGLU would give
    check_matmul_args(act, ew.down);
    if (ew.activation.clamped) check_clamped_swiglu_args(act, act, ew.activation.alpha, ew.activation.limit);
}

void check_clamped_swiglu_args(const TensorView& gate, const TensorView& up, double alpha, double limit) {
    check_same_shape("clamped_swiglu", gate, up);
    KVASIR_CHECK(std::isfinite(alpha) && std::isfinite(limit) && limit > 0, ErrorCode::bad_input,
                 "clamped_swiglu: alpha {} and limit {} must be finite, limit > 0", alpha, limit);
}

Tensor Backend::causal_conv1d_silu(const TensorView&, const TensorView&, const TensorView*) {
    fail(ErrorCode::unsupported, "{}: causal_conv1d_silu (Gated DeltaNet) has no kernel on this backend yet",
         capabilities().node);
}

GatedDeltaResult Backend::gated_delta_rule(const GatedDeltaInputs&) {
    fail(ErrorCode::unsupported, "{}: gated_delta_rule (Gated DeltaNet) has no kernel on this backend yet",
         capabilities().node);
}

namespace {

// row[j] = −inf for j in [from, to) of the row starting at flat index `base` (exact host data movement).
void fill_neg_inf(Tensor& t, std::int64_t base, std::int64_t from, std::int64_t to) {
    if (from >= to) return;
    switch (t.dtype()) {
        case DType::f64:
            std::fill(t.as<double>() + base + from, t.as<double>() + base + to, -std::numeric_limits<double>::infinity());
            return;
        case DType::f32:
            std::fill(t.as<float>() + base + from, t.as<float>() + base + to, -std::numeric_limits<float>::infinity());
            return;
        default:
            for (std::int64_t j = from; j < to; ++j) t.set(base + j, -std::numeric_limits<double>::infinity());
    }
}


}  // namespace

Tensor Backend::causal_attention_sinks(const TensorView& q, std::span<const TensorView> keys,
                                       std::span<const TensorView> values, double scale_by, const TensorView& sinks) {
    check_sinks_args(q, sinks);
    return run_attention(q, keys, values, scale_by, &sinks);
}

Tensor Backend::compose_attention(const TensorView& q, std::span<const TensorView> keys, std::span<const TensorView> values,
                                  double scale_by, const TensorView* sinks) {
    check_attention_args(q, keys, values);
    const std::int64_t t_count = q.dim(0), nh = q.dim(1), d = q.dim(2), nkv = static_cast<std::int64_t>(keys.size());
    const std::int64_t rep = nh / nkv, s_count = keys[0].dim(0), p0 = s_count - t_count;
    if (t_count == 0) return Tensor(capabilities().output, {0, nh * d});
    const std::size_t head_bytes = static_cast<std::size_t>(d) * dtype_size(q.dtype);
    const auto* qb = static_cast<const std::byte*>(q.host_data());

    // Scores of every head, [nh·T, S]; rows of kv head g are contiguous
    // (heads g·rep … g·rep+rep−1, each T rows).
    Tensor scores;
    for (std::int64_t g = 0; g < nkv; ++g) {
        Tensor qg(q.dtype, {rep * t_count, d});
        for (std::int64_t r = 0; r < rep; ++r)
            for (std::int64_t t = 0; t < t_count; ++t)
                std::memcpy(static_cast<std::byte*>(qg.raw()) + static_cast<std::size_t>(r * t_count + t) * head_bytes,
                            qb + static_cast<std::size_t>(t * nh + g * rep + r) * head_bytes, head_bytes);
        const Tensor sg = matmul(qg, keys[static_cast<std::size_t>(g)]);
        if (g == 0) scores = Tensor(sg.dtype(), {nh * t_count, s_count});
        KVASIR_CHECK(sg.dtype() == scores.dtype(), ErrorCode::backend_failure, "attention: mixed score dtypes");
        std::memcpy(static_cast<std::byte*>(scores.raw()) +
                        static_cast<std::size_t>(g * rep * t_count * s_count) * dtype_size(sg.dtype()),
                    sg.raw(), sg.nbytes());
    }
    Tensor scaled = scale(scores, scale_by);
    // The causal mask, written exactly: row (h, t) sees 0 … p0 + t.
    for (std::int64_t h = 0; h < nh; ++h)
        for (std::int64_t t = 0; t < t_count; ++t) fill_neg_inf(scaled, (h * t_count + t) * s_count, p0 + t + 1, s_count);
    Tensor probs;
    if (sinks == nullptr) {
        probs = softmax(scaled);
    } else {
        // One more column per row: the head's sink logit; softmax over S + 1, then the sink's column dropped.
        const std::int64_t rows = nh * t_count;
        const std::size_t es = dtype_size(scaled.dtype());
        Tensor widened(scaled.dtype(), {rows, s_count + 1});
        for (std::int64_t r = 0; r < rows; ++r) {
            std::memcpy(static_cast<std::byte*>(widened.raw()) + static_cast<std::size_t>(r * (s_count + 1)) * es,
                        static_cast<const std::byte*>(scaled.raw()) + static_cast<std::size_t>(r * s_count) * es,
                        static_cast<std::size_t>(s_count) * es);
            widened.set(r * (s_count + 1) + s_count, sinks->at(r / t_count));
        }
        const Tensor wp = softmax(widened);
        probs = Tensor(wp.dtype(), {rows, s_count});
        const std::size_t pe = dtype_size(wp.dtype());
        for (std::int64_t r = 0; r < rows; ++r)
            std::memcpy(static_cast<std::byte*>(probs.raw()) + static_cast<std::size_t>(r * s_count) * pe,
                        static_cast<const std::byte*>(wp.raw()) + static_cast<std::size_t>(r * (s_count + 1)) * pe,
                        static_cast<std::size_t>(s_count) * pe);
    }

    Tensor out;  // [T, nh·D], head-major within a row (transformers' transpose + reshape)
    const std::size_t pes = dtype_size(probs.dtype());
    for (std::int64_t g = 0; g < nkv; ++g) {
        const TensorView pg{probs.dtype(),
                            static_cast<const std::byte*>(probs.raw()) + static_cast<std::size_t>(g * rep * t_count * s_count) * pes,
                            {rep * t_count, s_count}};
        const Tensor og = matmul(pg, transposed(values[static_cast<std::size_t>(g)]));  // [rep·T, D]
        if (g == 0) out = Tensor(og.dtype(), {t_count, nh * d});
        KVASIR_CHECK(og.dtype() == out.dtype(), ErrorCode::backend_failure, "attention: mixed output dtypes");
        const std::size_t ob = static_cast<std::size_t>(d) * dtype_size(og.dtype());
        for (std::int64_t r = 0; r < rep; ++r)
            for (std::int64_t t = 0; t < t_count; ++t)
                std::memcpy(static_cast<std::byte*>(out.raw()) + static_cast<std::size_t>(t * nh + g * rep + r) * ob,
                            static_cast<const std::byte*>(og.raw()) + static_cast<std::size_t>(r * t_count + t) * ob, ob);
    }
    return out;
}

std::optional<TensorView> consecutive_parts(std::span<const TensorView> parts) {
    if (parts.empty() || parts.front().device == nullptr || parts.front().rank() != 2) return std::nullopt;
    const TensorView& first = parts.front();
    const std::size_t bytes = static_cast<std::size_t>(first.numel()) * dtype_size(first.dtype);
    for (std::size_t g = 0; g < parts.size(); ++g)
        if (parts[g].device != first.device || parts[g].dtype != first.dtype || parts[g].shape != first.shape ||
            parts[g].device_offset != first.device_offset + g * bytes)
            return std::nullopt;
    return first.part(0, {static_cast<std::int64_t>(parts.size()), first.dim(0), first.dim(1)});
}

std::optional<Tensor> Backend::kv_rows(const TensorView*, std::int64_t, const TensorView&) { return std::nullopt; }

void check_copy_columns_args(const TensorView& x, std::int64_t c0, std::int64_t n, std::int64_t step) {
    KVASIR_CHECK(x.rank() >= 1 && c0 >= 0 && n >= 0 && step >= 1 && (n == 0 || c0 + (n - 1) * step < x.shape.back()),
                 ErrorCode::internal, "copy_columns: {} columns from {} by {} of {}", n, c0, step, shape_str(x.shape));
}

void check_repeat_columns_args(const TensorView& x, std::int64_t times) {
    KVASIR_CHECK(times >= 0 && x.rank() >= 1, ErrorCode::internal, "repeat_columns: {} {} times", shape_str(x.shape), times);
}

bool zero_part(const TensorView& part) { return part.data == nullptr && part.device == nullptr; }

BlockCopy copy_columns_block(const TensorView& x, std::int64_t c0, std::int64_t n, std::int64_t step) {
    return {.rows = rows_of(x), .n = n, .src_cols = x.shape.back(), .src_c0 = c0, .src_step = step, .y_cols = n};
}

std::array<BlockCopy, 2> last_rows_blocks(const TensorView* prev, const TensorView& x, std::int64_t n) {
    const std::int64_t t_count = x.dim(0), cols = x.dim(1), from_x = std::min(t_count, n), from_prev = n - from_x;
    return {BlockCopy{.rows = from_x, .n = cols, .src_cols = cols, .src_r0 = t_count - from_x, .y_cols = cols, .y_r0 = from_prev},
            BlockCopy{.rows = prev != nullptr ? from_prev : 0, .n = cols, .src_cols = cols,
                      .src_r0 = prev != nullptr ? prev->dim(0) - from_prev : 0, .y_cols = cols}};
}

std::vector<BlockCopy> join_columns_blocks(std::span<const TensorView> parts) {
    std::int64_t cols = 0;
    for (const TensorView& p : parts) cols += p.shape.back();
    const std::int64_t rows = rows_of(parts.front());
    std::vector<BlockCopy> out;
    std::int64_t c0 = 0;
    for (const TensorView& p : parts) {
        out.push_back({.rows = zero_part(p) ? 0 : rows, .n = p.shape.back(), .src_cols = p.shape.back(), .y_cols = cols, .y_c0 = c0});
        c0 += p.shape.back();
    }
    return out;
}

BlockCopy repeat_columns_block(const TensorView& x, std::int64_t times) {
    const std::int64_t c = x.shape.back();
    return {.rows = rows_of(x), .n = times * c, .src_cols = c, .src_wrap = c, .y_cols = times * c};
}

void check_last_rows_args(const TensorView* prev, const TensorView& x, std::int64_t n) {
    KVASIR_CHECK(x.rank() == 2 && n >= 0 &&
                     (prev == nullptr || (prev->rank() == 2 && prev->dim(1) == x.dim(1) && prev->dtype == x.dtype)),
                 ErrorCode::internal, "last_rows: {} rows of [{}; {}]", n, prev != nullptr ? shape_str(prev->shape) : "zeros",
                 shape_str(x.shape));
    KVASIR_CHECK((prev != nullptr ? prev->dim(0) : n) + x.dim(0) >= n, ErrorCode::internal, "last_rows: {} rows of {} + {}",
                 n, prev != nullptr ? prev->dim(0) : n, x.dim(0));
}

std::int64_t check_join_columns_args(std::span<const TensorView> parts) {
    KVASIR_CHECK(!parts.empty(), ErrorCode::internal, "join_columns: no parts");
    std::int64_t cols = 0;
    for (const TensorView& p : parts) {
        KVASIR_CHECK(p.rank() >= 1 && p.dtype == parts.front().dtype && rows_of(p) == rows_of(parts.front()),
                     ErrorCode::internal, "join_columns: {} {} and {} {}", dtype_name(parts.front().dtype),
                     shape_str(parts.front().shape), dtype_name(p.dtype), shape_str(p.shape));
        cols += p.shape.back();
    }
    return cols;
}

Tensor Backend::join_columns(std::span<const TensorView> parts) {
    const std::int64_t cols = check_join_columns_args(parts), rows = rows_of(parts.front());
    const std::size_t es = dtype_size(parts.front().dtype);
    Tensor out(parts.front().dtype, {rows, cols});
    auto* dst = static_cast<std::byte*>(out.raw());
    std::int64_t c0 = 0;
    for (const TensorView& p : parts) {
        const std::int64_t cp = p.shape.back();
        if (zero_part(p)) {  // out is zero-filled
            c0 += cp;
            continue;
        }
        const auto* src = static_cast<const std::byte*>(p.host_data());
        for (std::int64_t r = 0; r < rows; ++r)
            std::memcpy(dst + static_cast<std::size_t>(r * cols + c0) * es, src + static_cast<std::size_t>(r * cp) * es,
                        static_cast<std::size_t>(cp) * es);
        c0 += cp;
    }
    return out;
}

Tensor Backend::repeat_columns(const TensorView& x, std::int64_t times) {
    check_repeat_columns_args(x, times);
    const std::int64_t rows = rows_of(x), c = x.shape.back();
    const std::size_t es = dtype_size(x.dtype), row = static_cast<std::size_t>(c) * es;
    Tensor out(x.dtype, {rows, times * c});
    const auto* src = static_cast<const std::byte*>(x.host_data());
    auto* dst = static_cast<std::byte*>(out.raw());
    for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < times; ++j)
            std::memcpy(dst + static_cast<std::size_t>(r * times + j) * row, src + static_cast<std::size_t>(r) * row, row);
    return out;
}

Tensor Backend::copy_columns(const TensorView& x, std::int64_t c0, std::int64_t n, std::int64_t step) {
    check_copy_columns_args(x, c0, n, step);
    const std::int64_t rows = rows_of(x), cols = x.shape.back();
    const std::size_t es = dtype_size(x.dtype);
    Tensor out(x.dtype, {rows, n});
    const auto* src = static_cast<const std::byte*>(x.host_data());
    auto* dst = static_cast<std::byte*>(out.raw());
    for (std::int64_t r = 0; r < rows; ++r) {
        if (step == 1) {
            std::memcpy(dst + static_cast<std::size_t>(r * n) * es, src + static_cast<std::size_t>(r * cols + c0) * es,
                        static_cast<std::size_t>(n) * es);
            continue;
        }
        for (std::int64_t j = 0; j < n; ++j)
            std::memcpy(dst + static_cast<std::size_t>(r * n + j) * es, src + static_cast<std::size_t>(r * cols + c0 + j * step) * es,
                        es);
    }
    return out;
}

Tensor Backend::last_rows(const TensorView* prev, const TensorView& x, std::int64_t n) {
    check_last_rows_args(prev, x, n);
    const std::int64_t t_count = x.dim(0), p_count = prev != nullptr ? prev->dim(0) : n;
    const std::size_t row = static_cast<std::size_t>(x.dim(1)) * dtype_size(x.dtype);
    Tensor out(x.dtype, {n, x.dim(1)});  // zero-filled: the rows of a null prev
    auto* dst = static_cast<std::byte*>(out.raw());
    for (std::int64_t r = 0; r < n; ++r) {
        const std::int64_t src = t_count - n + r;  // row of x; negative: row p_count + src of prev
        if (src >= 0)
            std::memcpy(dst + static_cast<std::size_t>(r) * row,
                        static_cast<const std::byte*>(x.host_data()) + static_cast<std::size_t>(src) * row, row);
        else if (prev != nullptr)
            std::memcpy(dst + static_cast<std::size_t>(r) * row,
                        static_cast<const std::byte*>(prev->host_data()) + static_cast<std::size_t>(p_count + src) * row, row);
    }
    return out;
}

Tensor Backend::add(const TensorView& a, const TensorView& b) {
    check_same_shape("add", a, b);
    const Capabilities& caps = capabilities();
    const DType acc = combine_dtype();
    Tensor out(caps.output, a.shape);
    const std::int64_t n = a.numel();
    for (std::int64_t i = 0; i < n; ++i) out.set(i, round_to(caps.storage, round_to(acc, a.at(i) + b.at(i))));
    return out;
}

Tensor Backend::mul(const TensorView& a, const TensorView& b) {
    check_same_shape("mul", a, b);
    const Capabilities& caps = capabilities();
    const DType acc = combine_dtype();
    Tensor out(caps.output, a.shape);
    const std::int64_t n = a.numel();
    for (std::int64_t i = 0; i < n; ++i)
        out.set(i, round_to(caps.storage, round_to(acc, round_to(caps.storage, a.at(i)) * round_to(caps.storage, b.at(i)))));
    return out;
}

Tensor Backend::scale(const TensorView& x, double s) {
    const Capabilities& caps = capabilities();
    const DType acc = combine_dtype();
    const double sc = round_to(acc, s);
    Tensor out(caps.output, x.shape);
    const std::int64_t n = x.numel();
    for (std::int64_t i = 0; i < n; ++i) out.set(i, round_to(caps.storage, round_to(acc, round_to(caps.storage, x.at(i)) * sc)));
    return out;
}


TransferStats TransferStats::operator-(const TransferStats& before) const {
    TransferStats d;
    const auto sub = [](std::uint64_t a, std::uint64_t b) { return a >= b ? a - b : 0; };
    d.uploads = sub(uploads, before.uploads);
    d.upload_bytes = sub(upload_bytes, before.upload_bytes);
    d.downloads = sub(downloads, before.downloads);
    d.download_bytes = sub(download_bytes, before.download_bytes);
    d.syncs = sub(syncs, before.syncs);
    d.launches = sub(launches, before.launches);
    d.allocations = sub(allocations, before.allocations);
    return d;
}

}  // namespace kvasir
