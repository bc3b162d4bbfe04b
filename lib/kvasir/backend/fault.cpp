#include "kvasir/backend/fault.hpp"

#include "kvasir/backend/cpu_backends.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/rng.hpp"

#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>

namespace kvasir {

namespace {

const std::vector<std::string>& fault_ops() {
    static const std::vector<std::string> ops = {"matmul", "swiglu", "clamped_swiglu", "softmax", "sigmoid", "rmsnorm",
                                                 "rope",   "moe_block", "add", "mul", "scale", "causal_attention", "causal_conv1d",
                                                 "gated_delta"};
    return ops;
}

// FNV-1a 64 of a tensor's bytes (dtype and shape included).
std::uint64_t content_hash(const Tensor& t) {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&h](const void* p, std::size_t n) {
        const auto* b = static_cast<const unsigned char*>(p);
        for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    };
    const int dt = static_cast<int>(t.dtype());
    mix(&dt, sizeof dt);
    for (const std::int64_t d : t.shape()) mix(&d, sizeof d);
    mix(t.raw(), t.nbytes());
    return h;
}

std::int64_t parse_count(const BackendSpec& spec, const std::string& key, const std::string& v, std::int64_t max) {
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    KVASIR_CHECK(end != v.c_str() && *end == '\0' && errno == 0 && n >= 0 && n <= max, ErrorCode::bad_input,
                 "backend '{}': {} must be an integer in 0..{}, not '{}'", spec.canonical(), key, max, v);
    return n;
}

}  // namespace

FaultSpec parse_fault_spec(const BackendSpec& spec, BackendSpec* rest) {
    FaultSpec f;
    if (rest != nullptr) {
        *rest = spec;
        rest->options.clear();
    }
    std::map<std::string, std::string> given;
    for (const auto& [k, v] : spec.options) {
        if (k.rfind("fault", 0) == 0)
            given.emplace(k, v);
        else if (rest != nullptr)
            rest->options.emplace(k, v);
    }
    if (given.empty()) return f;
    const auto kind = given.find("fault");
    KVASIR_CHECK(kind != given.end(), ErrorCode::bad_input,
                 "backend '{}': '{}' without fault= (fault=perturb|nan|route|bitflip|segv|hang|oom|internal)", spec.canonical(), given.begin()->first);
    const std::string& k = kind->second;
    std::vector<std::string> allowed;
    if (k == "perturb") {
        f.kind = FaultKind::perturb;
        allowed = {"fault_size", "fault_seed", "fault_op"};
    } else if (k == "nan") {
        f.kind = FaultKind::nan;
        allowed = {"fault_op", "fault_call", "fault_index"};
    } else if (k == "route") {
        f.kind = FaultKind::route;
        allowed = {"fault_call", "fault_token"};
    } else if (k == "bitflip") {
        f.kind = FaultKind::bitflip;
        allowed = {"fault_call", "fault_index", "fault_bit"};
    } else if (k == "segv" || k == "hang" || k == "oom" || k == "internal") {
        f.kind = k == "segv" ? FaultKind::segv : k == "hang" ? FaultKind::hang : k == "oom" ? FaultKind::oom : FaultKind::internal;
        allowed = {"fault_op", "fault_call"};
    } else {
        fail(ErrorCode::bad_input, "backend '{}': fault must be perturb, nan, route, bitflip, segv, hang, oom or internal, not '{}'",
             spec.canonical(), k);
    }
    for (const auto& [key, v] : given) {
        f.options.emplace_back(key, v);
        if (key == "fault") continue;
        KVASIR_CHECK(std::find(allowed.begin(), allowed.end(), key) != allowed.end(), ErrorCode::bad_input,
                     "backend '{}': option '{}' does not apply to fault={} (it takes {})", spec.canonical(), key, k,
                     fmt::join(allowed, ", "));
        if (key == "fault_size") {
            char* end = nullptr;
            const double s = std::strtod(v.c_str(), &end);
            KVASIR_CHECK(end != v.c_str() && *end == '\0' && std::isfinite(s) && s > 0 && s <= 1, ErrorCode::bad_input,
                         "backend '{}': fault_size must be a number in (0, 1], not '{}'", spec.canonical(), v);
            f.size = s;
        } else if (key == "fault_seed") {
            char* end = nullptr;
            errno = 0;
            const unsigned long long s = std::strtoull(v.c_str(), &end, 10);
            KVASIR_CHECK(end != v.c_str() && *end == '\0' && errno == 0 && v[0] != '-', ErrorCode::bad_input,
                         "backend '{}': fault_seed must be an unsigned integer, not '{}'", spec.canonical(), v);
            f.seed = s;
        } else if (key == "fault_op") {
            KVASIR_CHECK(std::find(fault_ops().begin(), fault_ops().end(), v) != fault_ops().end(), ErrorCode::bad_input,
                         "backend '{}': fault_op must be one of {}, not '{}'", spec.canonical(), fmt::join(fault_ops(), ", "), v);
            f.op = v;
        } else if (key == "fault_call") {
            f.call = (v == "all" && f.kind == FaultKind::route) ? kEvery : parse_count(spec, key, v, std::int64_t{1} << 40);
        } else if (key == "fault_index") {
            f.index = parse_count(spec, key, v, std::int64_t{1} << 62);
        } else if (key == "fault_token") {
            f.token = v == "all" ? kEvery : parse_count(spec, key, v, std::int64_t{1} << 40);
        } else if (key == "fault_bit") {
            f.bit = static_cast<int>(parse_count(spec, key, v, 63));
        }
    }
    return f;
}

std::string describe(const FaultSpec& f) {
    switch (f.kind) {
        case FaultKind::none: return "none";
        case FaultKind::perturb:
            return fmt::format("perturb: every {} output element x(1 +/- {:g}), random signs, seed {}", f.op, f.size, f.seed);
        case FaultKind::nan: return fmt::format("nan: element {} of {} call {}", f.index, f.op, f.call);
        case FaultKind::route:
            return fmt::format("route: token {} of route call {} takes its (k+1)-th expert for its k-th",
                               f.token == kEvery ? std::string("every") : std::to_string(f.token),
                               f.call == kEvery ? std::string("every") : std::to_string(f.call));
        case FaultKind::bitflip:
            return fmt::format("bitflip: bit {} of weight element {} read by matmul call {}",
                               f.bit < 0 ? std::string("(top mantissa)") : std::to_string(f.bit), f.index, f.call);
        case FaultKind::segv: return fmt::format("segv: the process gets SIGSEGV in {} call {}", f.op, f.call);
        case FaultKind::hang: return fmt::format("hang: {} call {} never returns", f.op, f.call);
        case FaultKind::oom: return fmt::format("oom: {} call {} allocates memory without bound", f.op, f.call);
        case FaultKind::internal:
            return fmt::format("internal: {} call {} throws Error(internal), as a bug of this tool would", f.op, f.call);
    }
    return "none";
}

FaultBackend::FaultBackend(std::unique_ptr<Backend> inner, FaultSpec fault) : inner_(std::move(inner)), fault_(std::move(fault)) {
    KVASIR_ASSERT(inner_ != nullptr);
    caps_ = inner_->capabilities();
    BackendSpec node = BackendSpec::parse(caps_.node);
    for (const auto& [k, v] : fault_.options) node.options[k] = v;
    caps_.node = node.canonical();
    caps_.extra.emplace_back("fault", describe(fault_));
}

namespace {

bool output_fault(FaultKind k) {
    return k == FaultKind::perturb || k == FaultKind::nan || k == FaultKind::segv || k == FaultKind::hang ||
           k == FaultKind::oom || k == FaultKind::internal;
}

// The process faults: what an immature driver does to the process running
// it. None returns.
[[noreturn]] void crash_process(FaultKind kind) {
    if (kind == FaultKind::segv) {
        std::raise(SIGSEGV);
        std::abort();  // a SIGSEGV handler that returned
    }
    if (kind == FaultKind::hang)
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    // oom: make this process the kernel's first choice should memory run
    // out before a limit stops it, then take memory page by page, forever.
    if (std::FILE* f = std::fopen("/proc/self/oom_score_adj", "w")) {
        std::fputs("1000", f);
        std::fclose(f);
    }
    static std::vector<std::unique_ptr<char[]>> hoard;
    constexpr std::size_t kChunk = std::size_t{64} << 20;
    for (;;) {
        hoard.push_back(std::make_unique<char[]>(kChunk));
        std::memset(hoard.back().get(), 1, kChunk);  // resident, not just reserved
    }
}

}  // namespace

bool FaultBackend::composes(const char* composite) const {
    const std::string c = composite;
    if (c == "moe_block")
        return fault_.kind == FaultKind::bitflip || (output_fault(fault_.kind) && (fault_.op == "matmul" || fault_.op == "swiglu"));
    if (c == "route") return output_fault(fault_.kind) && (fault_.op == "softmax" || fault_.op == "sigmoid");
    if (c == "causal_attention")
        return fault_.kind == FaultKind::bitflip ||
               (output_fault(fault_.kind) && (fault_.op == "matmul" || fault_.op == "scale" || fault_.op == "softmax"));
    return false;
}

Tensor FaultBackend::after(const char* op, Tensor out) {
    if (!output_fault(fault_.kind) || fault_.op != op) return out;
    const std::int64_t call = op_calls_++;
    if (fault_.kind == FaultKind::internal) {
        KVASIR_CHECK(call != fault_.call, ErrorCode::internal, "fault=internal: {} call {} (a stand-in for a bug of kvasir-equiv)", op, call);
        return out;
    }
    if (fault_.kind == FaultKind::segv || fault_.kind == FaultKind::hang || fault_.kind == FaultKind::oom) {
        if (call == fault_.call) crash_process(fault_.kind);
        return out;
    }
    const std::int64_t n = out.numel();
    if (fault_.kind == FaultKind::perturb) {
        // ±size with a per-element random sign: |relative error| = size for
        // every element, signs incoherent between elements and calls. The
        // sign stream is keyed by the content of the clean output, not by the
        // call number: the same inputs get the same perturbation on every
        // run, so the faulty node is deterministic, as real backends are
        // (a determinism failure must not mask what the fault is about).
        const SeededStream rng(fault_.seed, fmt::format("fault/perturb/{:016x}", content_hash(out)));
        for (std::int64_t i = 0; i < n; ++i) {
            const double sign = (rng.bits(static_cast<std::uint64_t>(i)) & 1u) != 0 ? 1.0 : -1.0;
            out.set(i, out.at(i) * (1.0 + sign * fault_.size));
        }
        if (call == 0) log_.push_back(fmt::format("perturb: {} outputs x(1 +/- {:g}) from call 0 on", op, fault_.size));
        if (n > 0) ++injected_;
        return out;
    }
    if (call == fault_.call && n > 0) {
        const std::int64_t i = fault_.index % n;
        out.set(i, std::numeric_limits<double>::quiet_NaN());
        ++injected_;
        log_.push_back(fmt::format("nan: {} call {} element {} of {}", op, call, i, shape_str(out.shape())));
    }
    return out;
}

Tensor FaultBackend::matmul(const TensorView& x, const TensorView& w) {
    if (fault_.kind != FaultKind::bitflip) return after("matmul", inner_->matmul(x, w));
    const std::int64_t call = matmul_calls_++;
    if (call == fault_.call && flipped_source_ == nullptr) {
        const std::int64_t n = w.numel();
        KVASIR_CHECK(n > 0, ErrorCode::bad_input, "fault=bitflip: matmul call {} reads an empty weight", call);
        const std::size_t width = dtype_size(w.dtype);
        int bit = fault_.bit;
        if (bit < 0) {
            switch (w.dtype) {
                case DType::f64: bit = 51; break;
                case DType::f32: bit = 22; break;
                case DType::f16: bit = 9; break;
                case DType::bf16: bit = 6; break;
                case DType::i32: bit = 30; break;
            }
        }
        KVASIR_CHECK(bit < static_cast<int>(8 * width), ErrorCode::bad_input, "fault=bitflip: bit {} does not exist in a {}-bit {} weight",
                     bit, 8 * width, dtype_name(w.dtype));
        Tensor copy(w.dtype, w.shape);
        std::memcpy(copy.raw(), w.data, copy.nbytes());
        const std::int64_t i = fault_.index % n;
        const double before = copy.at(i);
        auto* p = static_cast<std::byte*>(copy.raw()) + static_cast<std::size_t>(i) * width;
        // Flip through an integer of the element's width: memcpy keeps this
        // free of aliasing rules and independent of the host's endianness.
        if (width == 2) {
            std::uint16_t u;
            std::memcpy(&u, p, 2);
            u = static_cast<std::uint16_t>(u ^ (1u << bit));
            std::memcpy(p, &u, 2);
        } else if (width == 4) {
            std::uint32_t u;
            std::memcpy(&u, p, 4);
            u ^= std::uint32_t{1} << bit;
            std::memcpy(p, &u, 4);
        } else {
            std::uint64_t u;
            std::memcpy(&u, p, 8);
            u ^= std::uint64_t{1} << bit;
            std::memcpy(p, &u, 8);
        }
        log_.push_back(fmt::format("bitflip: matmul call {} weight {} {} element {} bit {}: {} -> {}", call, shape_str(w.shape),
                                   dtype_name(w.dtype), i, bit, before, copy.at(i)));
        flipped_source_ = w.data;
        flipped_shape_ = w.shape;
        flipped_dtype_ = w.dtype;
        flipped_copy_ = std::move(copy);
    }
    if (flipped_source_ != nullptr && w.data == flipped_source_ && w.shape == flipped_shape_ && w.dtype == flipped_dtype_) {
        ++injected_;
        return inner_->matmul(x, flipped_copy_.view());
    }
    return inner_->matmul(x, w);
}

Tensor FaultBackend::swiglu(const TensorView& gate, const TensorView& up) { return after("swiglu", inner_->swiglu(gate, up)); }
Tensor FaultBackend::clamped_swiglu(const TensorView& gate, const TensorView& up, double alpha, double limit) {
    return after("clamped_swiglu", inner_->clamped_swiglu(gate, up, alpha, limit));
}
Tensor FaultBackend::softmax(const TensorView& x) { return after("softmax", inner_->softmax(x)); }
Tensor FaultBackend::sigmoid(const TensorView& x) { return after("sigmoid", inner_->sigmoid(x)); }
Tensor FaultBackend::rmsnorm(const TensorView& x, const TensorView& weight, double eps) {
    return after("rmsnorm", inner_->rmsnorm(x, weight, eps));
}
Tensor FaultBackend::rope(const TensorView& x, std::span<const std::int64_t> positions, const RopeParams& params) {
    return after("rope", inner_->rope(x, positions, params));
}
Tensor FaultBackend::add(const TensorView& a, const TensorView& b) { return after("add", inner_->add(a, b)); }
Tensor FaultBackend::mul(const TensorView& a, const TensorView& b) { return after("mul", inner_->mul(a, b)); }
Tensor FaultBackend::scale(const TensorView& x, double s) { return after("scale", inner_->scale(x, s)); }

Tensor FaultBackend::moe_block(const TensorView& x, std::span<const ExpertWeights> experts, const RoutingPlan& plan,
                               const std::vector<bool>* expert_filter) {
    if (composes("moe_block")) return Backend::moe_block(x, experts, plan, expert_filter);
    return after("moe_block", inner_->moe_block(x, experts, plan, expert_filter));
}

Tensor FaultBackend::run_attention(const TensorView& q, std::span<const TensorView> k, std::span<const TensorView> v,
                                   double s, const TensorView* sinks) {
    if (sinks != nullptr || composes("causal_attention")) return compose_attention(q, k, v, s, sinks);
    return after("causal_attention", inner_->causal_attention(q, k, v, s));
}

RouterOutput FaultBackend::route(const TensorView& logits, const RouterParams& params) {
    if (composes("route")) return Backend::route(logits, params);
    RouterOutput out = inner_->route(logits, params);
    if (fault_.kind != FaultKind::route) return out;
    const std::int64_t call = route_calls_++;
    if (call != fault_.call && fault_.call != kEvery) return out;
    const std::int64_t t_count = out.ids.dim(0), k = out.ids.dim(1), e_count = out.scores.dim(1);
    KVASIR_CHECK(k < e_count, ErrorCode::bad_input, "fault=route: top-{} of {} experts leaves no (k+1)-th expert to swap in", k,
                 e_count);
    KVASIR_CHECK(t_count > 0, ErrorCode::bad_input, "fault=route: route call {} has no tokens", call);
    if (fault_.token == kEvery) {
        for (std::int64_t t = 0; t < t_count; ++t) swap_kth(out, params, call, t);
    } else {
        swap_kth(out, params, call, fault_.token % t_count);
    }
    return out;
}

void FaultBackend::swap_kth(RouterOutput& out, const RouterParams& params, std::int64_t call, std::int64_t t) {
    const std::int64_t k = out.ids.dim(1), e_count = out.scores.dim(1);
    std::int32_t* ids = out.ids.as<std::int32_t>();
    // The (k+1)-th choice: best selection score (score + bias) among the
    // experts top-k left out; NaN never preferred; ties to the lower id.
    std::int64_t best = -1;
    double best_score = 0;
    for (std::int64_t e = 0; e < e_count; ++e) {
        if (std::find(ids + t * k, ids + (t + 1) * k, static_cast<std::int32_t>(e)) != ids + (t + 1) * k) continue;
        double s = out.scores.at(t * e_count + e);
        if (params.bias != nullptr) s += params.bias->at(e);
        if (std::isnan(s)) continue;
        if (best < 0 || s > best_score) best = e, best_score = s;
    }
    if (best < 0) {  // every left-out score is NaN: take the lowest left-out id
        for (std::int64_t e = 0; e < e_count && best < 0; ++e)
            if (std::find(ids + t * k, ids + (t + 1) * k, static_cast<std::int32_t>(e)) == ids + (t + 1) * k) best = e;
    }
    const std::int32_t replaced = ids[t * k + k - 1];
    ids[t * k + k - 1] = static_cast<std::int32_t>(best);
    // Weights of the row from the scores, the way the default route() forms them.
    std::vector<double> w(static_cast<std::size_t>(k));
    double sum = 0;
    for (std::int64_t j = 0; j < k; ++j) {
        w[static_cast<std::size_t>(j)] = out.scores.at(t * e_count + ids[t * k + j]);
        sum += w[static_cast<std::size_t>(j)];
    }
    for (std::int64_t j = 0; j < k; ++j) {
        double v = w[static_cast<std::size_t>(j)];
        if (params.renormalize) v /= sum;
        v *= params.scaling;
        out.weights.set(t * k + j, v);
    }
    ++injected_;
    if (log_.size() < kMaxLog) log_.push_back(fmt::format("route: call {} token {} expert {} -> {}", call, t, replaced, best));
}

std::unique_ptr<Backend> make_fault_backend(std::unique_ptr<Backend> inner, FaultSpec fault) {
    KVASIR_CHECK(fault.kind != FaultKind::none, ErrorCode::internal, "make_fault_backend without a fault");
    return std::make_unique<FaultBackend>(std::move(inner), std::move(fault));
}

std::unique_ptr<Backend> make_cpu_with_fault(const BackendSpec& spec) {
    KVASIR_CHECK(spec.name == "cpu", ErrorCode::bad_input, "backend '{}': fault injection is a variant of cpu only",
                 spec.canonical());
    BackendSpec rest;
    FaultSpec fault = parse_fault_spec(spec, &rest);
    std::unique_ptr<Backend> inner = make_cpu_backend(rest);
    if (fault.kind == FaultKind::none) return inner;
    return make_fault_backend(std::move(inner), std::move(fault));
}

}  // namespace kvasir
