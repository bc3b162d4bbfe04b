// cpu-ref: the f64 oracle. Every op is the textbook loop in double; read this
// file next to any kernel to see what that kernel must compute. The matmul's
// loop is in kernels/cpu/matmul.hpp (matmul_f64_*): blocked for speed, the
// same sums in the same order, bit for bit.
#include "kvasir/backend/cpu_backends.hpp"

#include "kernels/cpu/matmul.hpp"
#include "kvasir/core/error.hpp"

#include <omp.h>

#include <cmath>
#include <vector>

namespace kvasir {
namespace {

class CpuRefBackend final : public Backend {
public:
    explicit CpuRefBackend(const BackendSpec& spec) {
        for (const auto& [key, value] : spec.options) {
            if (key == "acc" && value == "f64") continue;
            if (key == "storage" && value == "f64") continue;
            fail(ErrorCode::bad_input,
                 "backend '{}': cpu-ref is the f64 oracle and takes no variants (option {}={}); use cpu:{}={}",
                 spec.canonical(), key, value, key, value);
        }
        KVASIR_CHECK(!spec.device_given || spec.device == 0, ErrorCode::bad_input, "backend '{}': cpu-ref has one device (0)",
                     spec.canonical());
        caps_.node = "cpu-ref";
        caps_.backend = "cpu-ref";
        caps_.device = host_cpu_description();
        // The arithmetic is the textbook loop on every ISA (matmul.hpp); only
        // the matmul's blocking differs.
        const kernels::CpuIsa isa = kernels::cpu_isa();
        caps_.runtime = fmt::format("kvasir {} f64 textbook order{}", KVASIR_VERSION,
                                    isa == kernels::CpuIsa::generic ? "" : fmt::format(", blocked {} matmul", kernels::cpu_isa_name(isa)));
        caps_.storage = DType::f64;
        caps_.accumulation = DType::f64;
        caps_.output = DType::f64;
        caps_.fma = false;
        caps_.threads = omp_get_max_threads();
        caps_.deterministic = true;
    }

    const Capabilities& capabilities() const override { return caps_; }

    Tensor matmul(const TensorView& x, const TensorView& w) override {
        check_matmul_args(x, w);
        const std::int64_t t_count = rows_of(x), n_count = w.dim(0), k_count = w.dim(1);
        Shape shape = x.shape;
        shape.back() = n_count;
        Tensor y(DType::f64, shape);
        KVASIR_CHECK(w.dtype != DType::i32, ErrorCode::bad_input, "matmul: integer weights");
        // x widened once (T×K); w is read in place, widened panel by panel
        // inside the kernel: never a full-size f64 copy of the weights.
        const Tensor xd = Tensor::convert(x, DType::f64);
        kernels::matmul_f64(xd.as<double>(), w.data, w.dtype, y.as<double>(), t_count, n_count, k_count, caps_.threads);
        return y;
    }

    Tensor swiglu(const TensorView& gate, const TensorView& up) override {
        check_same_shape("swiglu", gate, up);
        Tensor y(DType::f64, gate.shape);
        double* yp = y.as<double>();
        for (std::int64_t i = 0; i < gate.numel(); ++i) {
            const double g = gate.at(i);
            yp[i] = g / (1.0 + std::exp(-g)) * up.at(i);
        }
        return y;
    }

    Tensor clamped_swiglu(const TensorView& gate, const TensorView& up, double alpha, double limit) override {
        check_clamped_swiglu_args(gate, up, alpha, limit);
        Tensor y(DType::f64, gate.shape);
        double* yp = y.as<double>();
        for (std::int64_t i = 0; i < gate.numel(); ++i) {
            const double g = gate.at(i), u = up.at(i);
            const double gc = g > limit ? limit : g;
            const double uc = u > limit ? limit : (u < -limit ? -limit : u);
            yp[i] = (uc + 1.0) * (gc * (1.0 / (1.0 + std::exp(-(gc * alpha)))));
        }
        return y;
    }

    Tensor softmax(const TensorView& x) override {
        KVASIR_CHECK(x.rank() >= 1, ErrorCode::bad_input, "softmax: scalar input");
        Tensor y(DType::f64, x.shape);
        const std::int64_t cols = x.dim(-1), rows = rows_of(x);
        double* yp = y.as<double>();
        for (std::int64_t r = 0; r < rows; ++r) {
            double m = -INFINITY;
            for (std::int64_t c = 0; c < cols; ++c) m = std::fmax(m, x.at(r * cols + c));
            double s = 0.0;
            for (std::int64_t c = 0; c < cols; ++c) {
                // fmax skips a NaN when finding m, but exp(NaN - m) is NaN and
                // poisons the sum, so a NaN input still yields an all-NaN row.
                yp[r * cols + c] = std::exp(x.at(r * cols + c) - m);
                s += yp[r * cols + c];
            }
            for (std::int64_t c = 0; c < cols; ++c) yp[r * cols + c] /= s;
        }
        return y;
    }

    Tensor causal_conv1d_silu(const TensorView& x, const TensorView& w, const TensorView* history) override {
        return causal_conv1d_silu_ref<double>(x, w, history);
    }
    GatedDeltaResult gated_delta_rule(const GatedDeltaInputs& in) override { return gated_delta_rule_ref<double>(in); }

    // The textbook definition in f64, query row by query row over its
    // unmasked keys only. Every sum is sequential in ascending index from +0,
    // so this is also the default composition's result bit for bit (its
    // masked terms are exact zeros: exp(−inf) = 0, +0 added to a sum).
    // With sinks: the default composition (in f64, with this node's ops).
    Tensor run_attention(const TensorView& q, std::span<const TensorView> keys, std::span<const TensorView> values,
                         double scale, const TensorView* sinks) override {
        if (sinks != nullptr) return compose_attention(q, keys, values, scale, sinks);
        check_attention_args(q, keys, values);
        const std::int64_t t_count = q.dim(0), nh = q.dim(1), d = q.dim(2), s_count = keys[0].dim(0);
        const std::int64_t rep = nh / static_cast<std::int64_t>(keys.size()), p0 = s_count - t_count;
        Tensor y(DType::f64, {t_count, nh * d});
        double* yp = y.as<double>();
        // Widened once (exact), read as plain doubles.
        const Tensor qd = Tensor::convert(q, DType::f64);
        std::vector<Tensor> kd, vd;
        for (std::size_t g = 0; g < keys.size(); ++g) {
            kd.push_back(Tensor::convert(keys[g], DType::f64));
            vd.push_back(Tensor::convert(values[g], DType::f64));
        }
        // Keys transposed (kt[j·S + s]) so the dots of consecutive keys are
        // independent vector lanes, and each output row's d sums advance
        // together over the keys: every sum still runs in ascending index
        // from +0, so the bits are the textbook loop's.
        std::vector<std::vector<double>> kt(keys.size(), std::vector<double>(static_cast<std::size_t>(s_count * d)));
        for (std::size_t g = 0; g < keys.size(); ++g) {
            const double* k = kd[g].as<double>();
            for (std::int64_t s = 0; s < s_count; ++s)
                for (std::int64_t j = 0; j < d; ++j) kt[g][static_cast<std::size_t>(j * s_count + s)] = k[s * d + j];
        }
        const double* qp = qd.as<double>();
        const int team = kernels::threads_for_work(
            caps_.threads, 4.0 * static_cast<double>(t_count * nh * d) * static_cast<double>(s_count - t_count / 2));
#pragma omp parallel for schedule(dynamic) num_threads(team) if (team > 1)
        for (std::int64_t row = 0; row < t_count * nh; ++row) {
            const std::int64_t t = row / nh, h = row % nh, n = p0 + t + 1;
            const double* k = kt[static_cast<std::size_t>(h / rep)].data();
            const double* v = vd[static_cast<std::size_t>(h / rep)].as<double>();
            std::vector<double> p(static_cast<std::size_t>(n), 0.0);
            double* pp = p.data();
            for (std::int64_t j = 0; j < d; ++j) {
                const double qj = qp[row * d + j];
                const double* kj = k + j * s_count;
                for (std::int64_t s = 0; s < n; ++s) pp[s] += qj * kj[s];
            }
            double m = -INFINITY;
            for (std::int64_t s = 0; s < n; ++s) {
                pp[s] *= scale;
                m = std::fmax(m, pp[s]);
            }
            double sum = 0.0;
            for (std::int64_t s = 0; s < n; ++s) sum += (pp[s] = std::exp(pp[s] - m));
            for (std::int64_t s = 0; s < n; ++s) pp[s] /= sum;
            double* o = yp + row * d;
            for (std::int64_t i = 0; i < d; ++i) o[i] = 0.0;
            for (std::int64_t s = 0; s < n; ++s) {
                const double ps = pp[s];
                const double* vs = v + s * d;
                for (std::int64_t i = 0; i < d; ++i) o[i] += ps * vs[i];
            }
        }
        return y;
    }

    Tensor sigmoid(const TensorView& x) override {
        Tensor y(DType::f64, x.shape);
        double* yp = y.as<double>();
        for (std::int64_t i = 0; i < x.numel(); ++i) yp[i] = 1.0 / (1.0 + std::exp(-x.at(i)));
        return y;
    }

    Tensor rmsnorm(const TensorView& x, const TensorView& weight, double eps) override {
        check_rmsnorm_args(x, weight);
        Tensor y(DType::f64, x.shape);
        const std::int64_t cols = x.dim(-1), rows = rows_of(x);
        double* yp = y.as<double>();
        for (std::int64_t r = 0; r < rows; ++r) {
            double ss = 0.0;
            for (std::int64_t c = 0; c < cols; ++c) ss += x.at(r * cols + c) * x.at(r * cols + c);
            const double inv = 1.0 / std::sqrt(ss / static_cast<double>(cols) + eps);
            for (std::int64_t c = 0; c < cols; ++c) yp[r * cols + c] = x.at(r * cols + c) * inv * weight.at(c);
        }
        return y;
    }

    Tensor rope(const TensorView& x, std::span<const std::int64_t> positions, const RopeParams& params) override {
        check_rope_args(x, positions, params);
        const std::int64_t t_count = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
        Tensor y(DType::f64, x.shape);
        double* yp = y.as<double>();
        for (std::int64_t t = 0; t < t_count; ++t) {
            const double pos = static_cast<double>(positions[static_cast<std::size_t>(t)]);
            for (std::int64_t i = 0; i < half; ++i) {
                const double inv_freq = rope_inv_freq_f64(params, i, d);
                const double angle = pos * inv_freq;
                const double c = std::cos(angle), s = std::sin(angle);
                for (std::int64_t h = 0; h < heads; ++h) {
                    const std::int64_t base = (t * heads + h) * d;
                    const std::int64_t i0 = params.layout == RopeLayout::neox ? i : 2 * i;
                    const std::int64_t i1 = params.layout == RopeLayout::neox ? i + half : 2 * i + 1;
                    const double a = x.at(base + i0), b = x.at(base + i1);
                    yp[base + i0] = a * c - b * s;
                    yp[base + i1] = b * c + a * s;
                }
            }
        }
        return y;
    }

private:
    Capabilities caps_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_ref_backend(const BackendSpec& spec) { return std::make_unique<CpuRefBackend>(spec); }

}  // namespace kvasir
