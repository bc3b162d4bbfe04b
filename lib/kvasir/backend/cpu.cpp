// cpu: the f32 fast path of a CPU node, with storage/accumulation variants.
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/f16_round.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kvasir/backend/cpu_backends.hpp"
#include "kvasir/backend/llamacpp_activations.hpp"
#include "kvasir/backend/weight_cache.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/huge_pages.hpp"
#include "kvasir/core/immutable_memory.hpp"

#include <unistd.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

namespace kvasir {

std::string host_cpu_description() {
    std::string model = "unknown CPU";
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("model name", 0) == 0) {
            const auto colon = line.find(':');
            if (colon != std::string::npos) model = line.substr(colon + 2);
            break;
        }
    }
    const kernels::CpuIsa isa = kernels::cpu_isa();
    return fmt::format("{} ({} hw threads{})", model, std::thread::hardware_concurrency(),
                       kernels::cpu_has_avx2_fma() ? ", avx2 fma f16c" : isa == kernels::CpuIsa::neon ? ", neon" : "");
}

namespace {

// Sum with 8 interleaved partial sums folded pairwise: the order a 256-bit
// SIMD reduction produces. In f16 accumulation a single running sum, rounded
// to half after every add.
class Accumulator {
public:
    explicit Accumulator(bool f16) : f16_(f16) {}
    template <typename F>
    double sum(std::int64_t n, F term) const {
        if (f16_) {
            double acc = 0.0;
            for (std::int64_t i = 0; i < n; ++i) acc = kernels::round_f16_fast(acc + term(i));
            return acc;
        }
        float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        std::int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int l = 0; l < 8; ++l) lanes[l] += static_cast<float>(term(i + l));
        float s = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
        for (; i < n; ++i) s += static_cast<float>(term(i));
        return s;
    }

private:
    bool f16_;
};

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(const BackendSpec& spec) {
        KVASIR_CHECK(!spec.device_given || spec.device == 0, ErrorCode::bad_input, "backend '{}': cpu has one device (0)",
                     spec.canonical());
        int threads = omp_get_max_threads();
        std::optional<std::uint64_t> pack_budget;
        for (const auto& [key, value] : spec.options) {
            if (apply_precision_option(spec, key, value, caps_)) continue;
            if (key == "weight_cache") {
                pack_budget = parse_weight_cache_option(spec, value);
                continue;
            }
            if (key == "threads") {
                char* end = nullptr;
                const long n = std::strtol(value.c_str(), &end, 10);
                KVASIR_CHECK(end != value.c_str() && *end == '\0' && n >= 1 && n <= 1024, ErrorCode::bad_input,
                             "backend '{}': threads must be an integer in 1..1024, not '{}'", spec.canonical(), value);
                threads = static_cast<int>(n);
            } else if (key == "qdot") {
                KVASIR_CHECK(value == "llamacpp" || value == "off", ErrorCode::bad_input,
                             "backend '{}': qdot must be llamacpp or off, not '{}'", spec.canonical(), value);
                qdot_ = value == "llamacpp";
            } else if (key == "split_k") {
                KVASIR_CHECK(value == "shape" || value == "off", ErrorCode::bad_input,
                             "backend '{}': split_k must be shape or off, not '{}'", spec.canonical(), value);
                split_k_ = value == "shape";
            } else {
                fail(ErrorCode::bad_input,
                     "backend '{}': unknown option '{}' (cpu takes storage=, acc=, threads=, split_k=, qdot=, weight_cache=)", spec.canonical(),
                     key);
            }
        }
        KVASIR_CHECK(!split_k_ || (caps_.storage == DType::f32 && caps_.accumulation == DType::f32), ErrorCode::bad_input,
                     "backend '{}': split_k=shape is an f32 variant (no storage= or acc= with it)", spec.canonical());
        KVASIR_CHECK(!qdot_ || (caps_.storage == DType::f32 && caps_.accumulation == DType::f32 && !split_k_),
                     ErrorCode::bad_input,
                     "backend '{}': qdot=llamacpp is llama.cpp's f32 arithmetic (no storage=, acc= or split_k= with it)",
                     spec.canonical());
        fma_ = kernels::cpu_has_fma_kernels();
        BackendSpec canonical;
        canonical.name = "cpu";
        if (caps_.storage != DType::f32) canonical.options["storage"] = dtype_name(caps_.storage);
        if (caps_.accumulation != DType::f32) canonical.options["acc"] = dtype_name(caps_.accumulation);
        if (spec.options.count("threads") != 0) canonical.options["threads"] = std::to_string(threads);
        if (split_k_) canonical.options["split_k"] = "shape";
        if (qdot_) canonical.options["qdot"] = "llamacpp";
        if (pack_budget) canonical.options["weight_cache"] = std::to_string(*pack_budget >> 20);
        caps_.node = canonical.canonical();
        caps_.backend = "cpu";
        caps_.device = host_cpu_description();
        caps_.runtime = fmt::format("kvasir {} {} kernels, OpenMP {}", KVASIR_VERSION,
                                    kernels::cpu_has_avx2_fma() ? "avx2+fma" : fma_ ? "neon+fma" : "generic", _OPENMP);
        caps_.output = DType::f32;
        caps_.fma = caps_.accumulation == DType::f16 || fma_;
        caps_.threads = threads;
        caps_.deterministic = true;
        if (split_k_)
            caps_.extra.emplace_back("split_k", fmt::format("the K reduction is split in {} partial sums when x has fewer "
                                                            "than {} rows (a shape heuristic, as BLAS libraries choose)",
                                                            kSplitKParts, kSplitKRows));
        if (qdot_)
            caps_.extra.emplace_back("qdot", "llama.cpp's CPU dot products: activations quantised to Q8_0 / Q8_K (or "
                                             "rounded to f16 / bf16) for the weight's stored format, as its vec_dot_type");
        // Decode weights packed once (kernels::pack_gemv): only where the fused f32 GEMV runs (AVX2, NEON).
        const std::uint64_t budget = pack_budget.value_or(default_pack_budget());
        pack_ = caps_.accumulation == DType::f32 && fma_ && budget > 0;
        packed_ = std::make_unique<WeightCache<PackedWeights>>(pack_ ? budget : 0);
        caps_.extra.emplace_back(
            "weight_cache",
            budget == 0 ? std::string("off (weight_cache=0): the decode GEMV transposes every weight as it reads it")
                        : fmt::format("checkpoint weights a decode step (≤ {} rows) multiplies are packed once, k-major in "
                                      "groups of {} rows, in the narrowest exact format (a bf16 checkpoint stays bf16; the "
                                      "same bits), least recently used evicted first; budget {} MiB ({})",
                                      kernels::kGemvPackMaxRows, kernels::kGemvPackRows, budget >> 20,
                                      pack_budget ? fmt::format("weight_cache={}", budget >> 20) : std::string("1/8 of physical memory")));
    }

    std::optional<WeightCacheStats> weight_cache_stats() const override { return packed_->stats(); }

    const Capabilities& capabilities() const override { return caps_; }

    Tensor matmul(const TensorView& x, const TensorView& w) override {
        check_matmul_args(x, w);
        if (split_k_ && rows_of(x) < kSplitKRows && w.dim(1) >= 2 * kSplitKParts) return split_k_matmul(x, w);
        if (qdot_) {
            const WeightOrigin origin = weight_origin_of(w);
            if (origin != WeightOrigin::none) return whole_matmul(llamacpp_activations(x, origin).view(), w);
        }
        return whole_matmul(x, w);
    }

private:
    struct PackedWeights {
        kernels::WeightFormat panel = kernels::WeightFormat::f32;  // kernels::gemv_panel_format
        // Pages of its own (packed_pages), written first by pack_gemv's threads.
        std::shared_ptr<std::byte[]> data;
    };
    // Memory for packed weights: long-lived (as long as the cache keeps
    // them), apart from malloc's heap of short-lived tensors, handed back to
    // the system when the cache evicts them, and on huge pages: a decode
    // step streams them from DRAM, and on 4 KiB pages that stream pays a TLB
    // miss every 4 KiB (core/huge_pages.hpp; BENCHMARKS.md, stop 55). Their
    // first touch (by pack_gemv's threads) is most of what a copy costs on a
    // VM (BENCHMARKS.md "Stop 36").
    static std::shared_ptr<std::byte[]> packed_pages(std::size_t bytes) { return huge_page_buffer(bytes); }
    static std::uint64_t default_pack_budget() {
        const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) / 8 : 0;
    }
    std::unique_ptr<WeightCache<PackedWeights>> packed_;
    // f16/bf16 checkpoint weights are multiplied as they lie (the GEMV reads
    // them in place, 2 bytes a weight) until their kPackNarrowAfter-th decode
    // matmul, then packed: a copy is fresh memory, whose first touch costs
    // more than a few unpacked GEMVs save (~3.5 s/GB on the VM measured, where
    // packing every bf16 weight on first use made a real-size audit ~35 %
    // slower while decode ran 4× faster; BENCHMARKS.md "Stop 36"). Only
    // single-token matmuls count (prefill rows never do). f32 weights are
    // packed at once: their unpacked GEMV transposes 4-byte rows.
    static constexpr int kPackNarrowAfter = 8;
    std::mutex uses_mutex_;
    std::unordered_map<const void*, int> narrow_uses_;  // decode matmuls per narrow weight, saturating
    bool pack_ = false;  // decode weights are packed (f32 AVX2 arithmetic, a budget)

    // split_k=shape: a batch-VARIANT node by construction (a contrast for the
    // invariance step). Few rows → the K reduction in kSplitKParts
    // contiguous chunks, each a whole matmul, the partials summed pairwise in
    // f32; many rows → one pass. Every row's value then depends on how many
    // rows came with it, exactly the behaviour of a BLAS that picks split-K
    // by shape. Each result is still an f32 matmul within the usual bound.
    static constexpr std::int64_t kSplitKRows = 64;
    static constexpr int kSplitKParts = 4;
    Tensor split_k_matmul(const TensorView& x, const TensorView& w) {
        const std::int64_t t_count = rows_of(x), n_count = w.dim(0), k_count = w.dim(1);
        const Tensor xf = Tensor::convert(x, DType::f32), wf = Tensor::convert(w, DType::f32);
        const auto cols = [](const Tensor& m, std::int64_t rows, std::int64_t k, std::int64_t c0, std::int64_t n) {
            Tensor out(DType::f32, {rows, n});
            for (std::int64_t r = 0; r < rows; ++r)
                std::memcpy(out.as<float>() + r * n, m.as<float>() + r * k + c0, static_cast<std::size_t>(n) * sizeof(float));
            return out;
        };
        std::vector<Tensor> parts;
        const std::int64_t chunk = (k_count + kSplitKParts - 1) / kSplitKParts;
        for (std::int64_t c0 = 0; c0 < k_count; c0 += chunk) {
            const std::int64_t n = std::min(chunk, k_count - c0);
            parts.push_back(whole_matmul(cols(xf, t_count, k_count, c0, n), cols(wf, n_count, k_count, c0, n)));
        }
        Shape shape = x.shape;
        shape.back() = n_count;
        Tensor y(DType::f32, shape);
        float* yp = y.as<float>();
        for (std::int64_t i = 0; i < y.numel(); ++i) {
            float partial[kSplitKParts] = {0, 0, 0, 0};
            for (std::size_t p = 0; p < parts.size(); ++p) partial[p] = parts[p].as<float>()[i];
            yp[i] = (partial[0] + partial[1]) + (partial[2] + partial[3]);
        }
        return y;
    }

    // The packed copy of a checkpoint's f32, f16 or bf16 weight for the
    // decode GEMV (kept, from immutable memory only: a heap weight's address
    // may be reused with other bytes), in the narrowest format that holds its
    // rounded values exactly (a bf16 checkpoint stays 2 bytes a weight), or
    // null where packing does not apply. `use`: this call is a decode matmul
    // of w (counted towards packing a narrow weight; a probe does not count).
    std::shared_ptr<const PackedWeights> packed_weight(const TensorView& w, bool use) {
        if (!pack_ || !kernels::kernel_readable(w.dtype) || w.rank() != 2 ||
            !find_immutable(w.data, static_cast<std::size_t>(w.numel()) * dtype_size(w.dtype)))
            return nullptr;
        if (w.dtype != DType::f32) {  // a narrow weight is packed once it proved hot
            const std::lock_guard lock(uses_mutex_);
            int& n = narrow_uses_[w.data];
            if (use && n < kPackNarrowAfter) ++n;
            if (n < kPackNarrowAfter) return nullptr;
        }
        const std::int64_t n_count = w.dim(0), k_count = w.dim(1);
        const kernels::WeightFormat format = kernels::weight_format_of(w.dtype);
        const kernels::WeightRounding rounding = kernels::rounding_to(caps_.storage);
        const kernels::WeightFormat panel = kernels::gemv_panel_format(format, rounding);
        const auto bytes = static_cast<std::uint64_t>(kernels::gemv_packed_bytes(n_count, k_count, panel));
        return packed_->get(w, caps_.storage, bytes, [&] {
            PackedWeights p;
            p.panel = panel;
            p.data = packed_pages(static_cast<std::size_t>(bytes));
            kernels::pack_gemv(w.data, format, rounding, n_count, k_count, p.data.get(), caps_.threads);
            return p;
        });
    }

    // A decode step's experts (≤ kGemvPackMaxRows rows each) on packed f32
    // checkpoint weights: every gate and up GEMV in one parallel region, this
    // node's swiglu per expert, every down GEMV in a second region — two
    // thread meetings per MoE block instead of three per expert. Each GEMV is
    // the one matmul() runs (x rounded as gemv_packed rounds it, the
    // same groups), the activation this node's swiglu: the default's bits
    // (tests/backend/test_cpu_backends.cpp, CpuPacked.BatchedExpertsGiveTheDefaultsBits).
    void expert_ffns(std::span<ExpertJob> jobs) override {
        const auto plain = [&](const ExpertJob& j) {
            const ExpertWeights& ew = *j.weights;
            return j.x.dtype() == DType::f32 && j.x.shape().size() == 2 && j.x.dim(0) <= kernels::kGemvPackMaxRows &&
                   ew.gate_bias.data == nullptr && ew.up_bias.data == nullptr && ew.down_bias.data == nullptr &&
                   !ew.activation.clamped;
        };
        if (!pack_ || split_k_ || qdot_ || !std::all_of(jobs.begin(), jobs.end(), plain))
            return Backend::expert_ffns(jobs);
        std::vector<std::shared_ptr<const PackedWeights>> packs;  // gate, up, down per job
        for (const ExpertJob& j : jobs)
            for (const TensorView* w : {&j.weights->gate, &j.weights->up, &j.weights->down}) {
                if (w != &j.weights->down) check_matmul_args(j.x.view(), *w);
                packs.push_back(packed_weight(*w, false));  // a probe: the default's matmuls count the uses
                if (!packs.back()) return Backend::expert_ffns(jobs);
            }
        const kernels::WeightRounding rounding = kernels::rounding_to(caps_.storage);
        const auto rounded = [&](const Tensor& x) {  // gemv_packed's own rounding of x
            if (rounding == kernels::WeightRounding::none) return Tensor();
            Tensor r(DType::f32, x.shape());
            kernels::convert_rounded(x.as<float>(), kernels::WeightFormat::f32, rounding, r.as<float>(), r.numel());
            return r;
        };
        const std::size_t n = jobs.size();
        std::vector<Tensor> xr(n), gate(n), up(n);
        std::vector<kernels::PackedGemvJob> gemvs;
        for (std::size_t i = 0; i < n; ++i) {
            const Tensor& x = jobs[i].x;
            xr[i] = rounded(x);
            const float* xp = xr[i].numel() > 0 ? xr[i].as<float>() : x.as<float>();
            const std::int64_t t = x.dim(0), k = x.dim(1), inter = jobs[i].weights->gate.dim(0);
            gate[i] = Tensor(DType::f32, {t, inter});
            up[i] = Tensor(DType::f32, {t, jobs[i].weights->up.dim(0)});
            gemvs.push_back({xp, packs[3 * i]->data.get(), gate[i].as<float>(), t, inter, k, packs[3 * i]->panel});
            gemvs.push_back({xp, packs[3 * i + 1]->data.get(), up[i].as<float>(), t, up[i].dim(1), k, packs[3 * i + 1]->panel});
        }
        kernels::gemv_packed_batch(gemvs, caps_.threads, rounding);
        std::vector<Tensor> act(n);
        gemvs.clear();
        for (std::size_t i = 0; i < n; ++i) {
            act[i] = swiglu(gate[i], up[i]);
            check_matmul_args(act[i].view(), jobs[i].weights->down);
            xr[i] = rounded(act[i]);
            const float* ap = xr[i].numel() > 0 ? xr[i].as<float>() : act[i].as<float>();
            const std::int64_t t = act[i].dim(0), hid = jobs[i].weights->down.dim(0);
            jobs[i].y = Tensor(DType::f32, {t, hid});
            gemvs.push_back({ap, packs[3 * i + 2]->data.get(), jobs[i].y.as<float>(), t, hid, act[i].dim(1), packs[3 * i + 2]->panel});
        }
        kernels::gemv_packed_batch(gemvs, caps_.threads, rounding);
    }

    Tensor whole_matmul(const TensorView& x, const TensorView& w) {
        const std::int64_t t_count = rows_of(x), n_count = w.dim(0), k_count = w.dim(1);
        Shape shape = x.shape;
        shape.back() = n_count;
        Tensor y(DType::f32, shape);
        if (caps_.accumulation == DType::f32 && fma_) {
            // The weights are read where they lie (f32, f16 or bf16, e.g. a
            // memory-mapped checkpoint): the kernel converts them and rounds
            // them to the storage format while it packs them, no extra pass.
            // The kernel rounds f32 activations while it packs them and the
            // results as each job ends (io_rounding); activations in another
            // dtype are converted into a copy first (rounding twice changes
            // nothing). Same values as stored()/round_stored(), bit for bit.
            const kernels::WeightRounding rounding = kernels::rounding_to(caps_.storage);
            Tensor xs;
            const float* xp = nullptr;
            if (x.dtype == DType::f32) {
                xp = x.as<float>();
            } else if (kernels::kernel_readable(x.dtype)) {
                xs = Tensor(DType::f32, x.shape);
                kernels::convert_rounded(x.data, kernels::weight_format_of(x.dtype), rounding, xs.as<float>(), xs.numel());
                xp = xs.as<float>();
            } else {
                xs = stored(x);
                xp = xs.as<float>();
            }
            Tensor wf;  // only for weights in another dtype (f64): converted to f32 first
            const void* wp = w.data;
            kernels::WeightFormat format = kernels::weight_format_of(w.dtype);
            if (!kernels::kernel_readable(w.dtype)) {
                wf = Tensor::convert(w, DType::f32);
                wp = wf.raw();
                format = kernels::WeightFormat::f32;
            }
            // Decoding from a checkpoint's weights: their packed copy.
            if (t_count <= kernels::kGemvPackMaxRows)
                if (const auto packed = packed_weight(w, t_count == 1)) {
                    kernels::gemv_packed(xp, packed->data.get(), packed->panel, y.as<float>(), t_count, n_count,
                                              k_count, caps_.threads, rounding);
                    return y;
                }
            kernels::matmul_fma(xp, wp, format, rounding, y.as<float>(), t_count, n_count, k_count, caps_.threads,
                                 rounding);
            return y;
        }
        // f16 accumulation (emulated) and CPUs without AVX2/FMA: both operands
        // converted and rounded to storage first.
        Tensor x_kept, w_kept;
        const float* xs = stored_f32(x, x_kept);
        const float* ws = stored_f32(w, w_kept);
        if (caps_.accumulation == DType::f16)
            kernels::matmul_f16acc(xs, ws, y.as<float>(), t_count, n_count, k_count, caps_.threads);
        else
            kernels::matmul_f32_generic(xs, ws, y.as<float>(), t_count, n_count, k_count, caps_.threads);
        round_stored(y);
        return y;
    }

public:
    Tensor swiglu(const TensorView& gate, const TensorView& up) override {
        check_same_shape("swiglu", gate, up);
        const Tensor g = stored(gate), u = stored(up);
        Tensor y(DType::f32, gate.shape);
        const float* gp = g.as<float>();
        const float* upp = u.as<float>();
        float* yp = y.as<float>();
        for (std::int64_t i = 0; i < y.numel(); ++i) yp[i] = gp[i] / (1.0f + std::exp(-gp[i])) * upp[i];
        round_stored(y);
        return y;
    }

    Tensor clamped_swiglu(const TensorView& gate, const TensorView& up, double alpha, double limit) override {
        check_clamped_swiglu_args(gate, up, alpha, limit);
        const Tensor g = stored(gate), u = stored(up);
        Tensor y(DType::f32, gate.shape);
        const float* gp = g.as<float>();
        const float* upp = u.as<float>();
        float* yp = y.as<float>();
        const auto a = static_cast<float>(alpha), l = static_cast<float>(limit);
        for (std::int64_t i = 0; i < y.numel(); ++i) {
            const float gc = gp[i] > l ? l : gp[i];
            const float uc = upp[i] > l ? l : (upp[i] < -l ? -l : upp[i]);
            yp[i] = (uc + 1.0f) * (gc * (1.0f / (1.0f + std::exp(-(gc * a)))));
        }
        round_stored(y);
        return y;
    }

    Tensor softmax(const TensorView& x) override {
        KVASIR_CHECK(x.rank() >= 1, ErrorCode::bad_input, "softmax: scalar input");
        const Tensor xs = stored(x);
        Tensor y(DType::f32, x.shape);
        const std::int64_t cols = x.dim(-1), rows = rows_of(x);
        const float* xp = xs.as<float>();
        float* yp = y.as<float>();
        const Accumulator acc(caps_.accumulation == DType::f16);
        for (std::int64_t r = 0; r < rows; ++r) {
            const float* xr = xp + r * cols;
            float* yr = yp + r * cols;
            float m = -INFINITY;
            for (std::int64_t c = 0; c < cols; ++c) m = std::fmax(m, xr[c]);
            for (std::int64_t c = 0; c < cols; ++c) yr[c] = static_cast<float>(round_to(caps_.storage, std::exp(xr[c] - m)));
            const float s = static_cast<float>(acc.sum(cols, [&](std::int64_t c) { return static_cast<double>(yr[c]); }));
            for (std::int64_t c = 0; c < cols; ++c) yr[c] /= s;
        }
        round_stored(y);
        return y;
    }

    // Gated DeltaNet in f32 on inputs rounded to storage, the output rounded
    // to storage, the recurrent state kept f32. acc=f16: every running sum of
    // both ops is an f16 accumulator (linear_attention.hpp).
    Tensor causal_conv1d_silu(const TensorView& x, const TensorView& w, const TensorView* history) override {
        const Tensor xs = stored(x), ws = stored(w);
        const Tensor hs = history != nullptr ? stored(*history) : Tensor();
        const TensorView hv = hs.view();
        Tensor y = causal_conv1d_silu_ref<float>(xs, ws, history != nullptr ? &hv : nullptr,
                                                 caps_.accumulation == DType::f16);
        round_stored(y);
        return y;
    }
    GatedDeltaResult gated_delta_rule(const GatedDeltaInputs& in) override {
        const Tensor q = stored(in.q), k = stored(in.k), v = stored(in.v), a = stored(in.a), b = stored(in.b),
                     al = stored(in.a_log), dt = stored(in.dt_bias);
        // The recurrent state is f32 in every storage variant (as transformers
        // and the OpenCL kernel keep it): widened, never rounded to storage.
        const Tensor st = in.state != nullptr ? Tensor::convert(*in.state, DType::f32) : Tensor();
        const TensorView sv = st.view();
        GatedDeltaInputs f{q, k, v, a, b, al, dt, in.state != nullptr ? &sv : nullptr};
        GatedDeltaResult r = gated_delta_rule_ref<float>(f, caps_.accumulation == DType::f16);
        round_stored(r.out);
        return r;
    }

    // The fused kernel (kernels/cpu/attention.hpp: the default composition's
    // bits, computed on the unmasked part only) for acc=f32 on AVX2 + FMA or
    // NEON. acc=f16 and CPUs without either run the composition itself (Backend's
    // default): its matmul/softmax already accumulate as those variants promise.
    // The fused kernel takes sinks too (attention.hpp: the composition's bits, sink column included).
    Tensor run_attention(const TensorView& q, std::span<const TensorView> keys, std::span<const TensorView> values,
                         double scale, const TensorView* sinks) override {
        if (caps_.accumulation != DType::f32 || !fma_) return compose_attention(q, keys, values, scale, sinks);
        if (sinks == nullptr) return fused_attention(q, keys, values, scale, nullptr);
        const Tensor s32 = Tensor::convert(*sinks, DType::f32);  // as the composition writes them: the f32 value
        return fused_attention(q, keys, values, scale, &s32);
    }

private:
    Tensor fused_attention(const TensorView& q, std::span<const TensorView> keys, std::span<const TensorView> values,
                           double scale, const Tensor* sinks) {
        check_attention_args(q, keys, values);
        const std::int64_t t_count = q.dim(0), nh = q.dim(1), d = q.dim(2), nkv = static_cast<std::int64_t>(keys.size());
        const Tensor qs = stored(q);
        // The cache is f32 on this node; other dtypes are widened into copies
        // (the kernel rounds to storage as it reads, so no rounded copy).
        std::vector<Tensor> copies;
        copies.reserve(2 * keys.size());
        std::vector<const float*> kp, vp;
        for (std::size_t g = 0; g < keys.size(); ++g)
            for (auto [view, ptrs] : {std::pair{&keys[g], &kp}, std::pair{&values[g], &vp}}) {
                if (view->dtype == DType::f32) {
                    ptrs->push_back(view->as<float>());
                } else {
                    copies.push_back(Tensor::convert(*view, DType::f32));
                    ptrs->push_back(copies.back().as<float>());
                }
            }
        Tensor y(DType::f32, {t_count, nh * d});
        kernels::AttentionArgs a;
        a.q = qs.as<float>();
        a.keys = kp.data();
        a.values = vp.data();
        a.out = y.as<float>();
        a.t_count = t_count;
        a.heads = nh;
        a.kv_heads = nkv;
        a.dim = d;
        a.s_count = keys[0].dim(0);
        a.scale = static_cast<float>(scale);  // as scale() rounds it in the combine dtype, f32
        a.rounding = kernels::rounding_to(caps_.storage);
        a.threads = caps_.threads;
        a.sinks = sinks != nullptr ? sinks->as<float>() : nullptr;
        kernels::attention(a);
        return y;
    }

public:

    Tensor sigmoid(const TensorView& x) override {
        const Tensor xs = stored(x);
        Tensor y(DType::f32, x.shape);
        const float* xp = xs.as<float>();
        float* yp = y.as<float>();
        for (std::int64_t i = 0; i < y.numel(); ++i) yp[i] = 1.0f / (1.0f + std::exp(-xp[i]));
        round_stored(y);
        return y;
    }

    Tensor rmsnorm(const TensorView& x, const TensorView& weight, double eps) override {
        check_rmsnorm_args(x, weight);
        const Tensor xs = stored(x), ws = stored(weight);
        Tensor y(DType::f32, x.shape);
        const std::int64_t cols = x.dim(-1), rows = rows_of(x);
        const float* xp = xs.as<float>();
        const float* wp = ws.as<float>();
        float* yp = y.as<float>();
        const Accumulator acc(caps_.accumulation == DType::f16);
        for (std::int64_t r = 0; r < rows; ++r) {
            const float* xr = xp + r * cols;
            const float ss = static_cast<float>(acc.sum(cols, [&](std::int64_t c) {
                return static_cast<double>(xr[c] * xr[c]);
            }));
            const float inv = 1.0f / std::sqrt(ss / static_cast<float>(cols) + static_cast<float>(eps));
            for (std::int64_t c = 0; c < cols; ++c) yp[r * cols + c] = xr[c] * inv * wp[c];
        }
        round_stored(y);
        return y;
    }

    Tensor rope(const TensorView& x, std::span<const std::int64_t> positions, const RopeParams& params) override {
        check_rope_args(x, positions, params);
        const std::int64_t t_count = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
        const Tensor xs = stored(x);
        Tensor y(DType::f32, x.shape);
        const float* xp = xs.as<float>();
        float* yp = y.as<float>();
        for (std::int64_t t = 0; t < t_count; ++t) {
            const float pos = static_cast<float>(positions[static_cast<std::size_t>(t)]);
            for (std::int64_t i = 0; i < half; ++i) {
                // As GPU kernels do it: inverse frequency, angle and sin/cos all in f32.
                const float inv_freq = rope_inv_freq_f32(params, i, d);
                const float angle = pos * inv_freq;
                const float c = std::cos(angle), s = std::sin(angle);
                for (std::int64_t h = 0; h < heads; ++h) {
                    const std::int64_t base = (t * heads + h) * d;
                    const std::int64_t i0 = params.layout == RopeLayout::neox ? i : 2 * i;
                    const std::int64_t i1 = params.layout == RopeLayout::neox ? i + half : 2 * i + 1;
                    const float a = xp[base + i0], b = xp[base + i1];
                    yp[base + i0] = a * c - b * s;
                    yp[base + i1] = b * c + a * s;
                }
            }
        }
        round_stored(y);
        return y;
    }

private:
    // The input as this node would hold it: f32 values rounded to storage.
    Tensor stored(const TensorView& v) const {
        Tensor t = Tensor::convert(v, DType::f32);
        if (caps_.storage != DType::f32) round_stored(t);
        return t;
    }
    // stored(v)'s values: v itself when it already is (f32 on an f32-storage
    // node: no copy of a weight per call), else a copy kept in `keep`.
    const float* stored_f32(const TensorView& v, Tensor& keep) const {
        if (v.dtype == DType::f32 && caps_.storage == DType::f32) return static_cast<const float*>(v.data);
        keep = stored(v);
        return keep.as<float>();
    }
    void round_stored(Tensor& t) const {
        if (caps_.storage == DType::f32) return;
        float* p = t.as<float>();
        if (fma_) {
            // The kernels' vector rounding, in place: the same bits as
            // round_to (tested: CpuPacked.InKernelRoundingMatchesRoundTo).
            kernels::convert_rounded(p, kernels::WeightFormat::f32, kernels::rounding_to(caps_.storage), p, t.numel());
            return;
        }
        for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(round_to(caps_.storage, p[i]));
    }

    Capabilities caps_;
    bool fma_ = false;  // the fused kernels run here (kernels::cpu_has_fma_kernels)
    bool split_k_ = false;
    bool qdot_ = false;  // qdot=llamacpp (llamacpp_activations.hpp)
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendSpec& spec) { return std::make_unique<CpuBackend>(spec); }

}  // namespace kvasir
