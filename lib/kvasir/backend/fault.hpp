// Fault injection: a Backend decorator that breaks an otherwise good node in
// one controlled way, so that the audit's verdicts can be shown to catch what
// they claim to catch (a perturbation of a chosen size → unfit at the size the
// tolerances name; a NaN → error; a flipped routing decision; a flipped bit in
// a weight). Deterministic: the same spec and the same call sequence inject
// the same fault, on every machine.
//
// Spec syntax (options of the cpu backend; the registry routes cpu specs with
// a fault option to make_cpu_with_fault()):
//
//   cpu:fault=perturb[,fault_size=1e-3][,fault_seed=N][,fault_op=matmul]
//       EVERY output element of EVERY call of fault_op (default matmul) is
//       multiplied by (1 ± fault_size), the sign drawn per element from the
//       counter-based RNG (seed fault_seed, stream "fault/perturb/<FNV-1a
//       hash of the clean output>": the same inputs get the same signs on
//       every run, so the node stays deterministic), then rounded to the output dtype. So the relative error of each
//       element is exactly fault_size (up to the output rounding) — the
//       per-op error a real backend shows, at a size the user picks —
//       and errors are incoherent (random signs), as cross-backend errors are.
//   cpu:fault=nan[,fault_op=matmul][,fault_call=0][,fault_index=0]
//       ONE element (fault_index modulo the element count) of the output of
//       call number fault_call (0-based) of fault_op becomes NaN.
//   cpu:fault=route[,fault_call=0|all][,fault_token=0|all]
//       In call fault_call of route() (every call: all), token fault_token
//       (modulo T; every token: all) gets its
//       k-th choice replaced by its (k+1)-th: the best-scoring expert (score
//       + bias, ignoring groups) that top-k did not pick. Its combine weights
//       are recomputed from the scores as route() does (renormalised and
//       scaled per RouterParams). Every other row is the inner backend's,
//       bit for bit. Refused at route() time when k equals the expert count
//       (there is no (k+1)-th expert).
//   cpu:fault=bitflip[,fault_call=0][,fault_index=0][,fault_bit=B]
//       The weight matrix read by matmul call number fault_call is replaced,
//       for that call and every later call reading the same memory, by a
//       copy with bit B of element fault_index (modulo its element count)
//       flipped — the original weights (often a read-only mmap) are never
//       touched. B counts from the least significant bit of the element's
//       storage (0 … width−1); the default is the top mantissa bit (f32 22,
//       f16 9, bf16 6, f64 51), which changes the value by a factor in
//       [0.5, 1.5]: a silent corruption, not an obvious NaN. An exponent bit
//       (f32: 23…30) scales it by a power of two instead.
//
//   cpu:fault=segv|hang|oom[,fault_op=matmul][,fault_call=0]
//       What an immature driver does to the process running it: in call
//       fault_call of fault_op the process gets SIGSEGV (segv), the call
//       never returns (hang), or it allocates and touches memory without
//       bound, 64 MiB at a time (oom; it also makes itself the kernel OOM
//       killer's first choice). For the audit's process isolation: in a
//       child process each is that node's error; with --in-process each
//       takes the audit down, as a real crash would.
//   cpu:fault=internal[,fault_op=matmul][,fault_call=0]
//       That call throws Error(internal): a stand-in for a bug of this tool
//       inside a step, which must end audit, capture and compare with exit
//       3 instead of being blamed on the node.
//
// fault_op is one of matmul, swiglu, softmax, sigmoid, rmsnorm, rope,
// moe_block, add, mul, scale. Options that do not belong to the chosen kind
// are refused (Error(bad_input)), so a typo never yields a clean node.
//
// Composite ops. moe_block and route are, on the inner backend, compositions
// of matmul/swiglu and softmax/sigmoid. When the fault targets an op they are
// composed of, the decorator runs the default composition (Backend::moe_block
// / Backend::route) on ITSELF, so the fault reaches the expert matmuls and the
// router's softmax; otherwise it forwards them to the inner backend untouched.
//
// Capabilities: the inner backend's, with node = the inner node plus the fault
// options (e.g. "cpu:fault=perturb,fault_size=1e-3") and extra "fault" = a
// one-line description.
#pragma once

#include "kvasir/backend/backend.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvasir {

enum class FaultKind { none, perturb, nan, route, bitflip, segv, hang, oom, internal };

// fault_call=all / fault_token=all.
inline constexpr std::int64_t kEvery = -1;

struct FaultSpec {
    FaultKind kind = FaultKind::none;
    double size = 1e-3;             // perturb: relative size
    std::uint64_t seed = 0x5eed;    // perturb: RNG seed
    std::string op = "matmul";      // perturb, nan: target op
    std::int64_t call = 0;          // nan, route, bitflip: which call (0-based); kEvery (route): every call
    std::int64_t index = 0;         // nan: output element; bitflip: weight element
    std::int64_t token = 0;         // route: token row; kEvery: every row
    int bit = -1;                   // bitflip: bit to flip; -1 = top mantissa bit of the dtype
    // The options exactly as given (key → value), for the node name.
    std::vector<std::pair<std::string, std::string>> options;
};

// The fault options (keys starting with "fault") of `spec`, removed from
// `*rest` when given. FaultKind::none when there is no "fault" key; a
// "fault_*" key without "fault", an unknown key, a bad value or a key that
// does not apply to the kind → Error(bad_input) naming the spec.
FaultSpec parse_fault_spec(const BackendSpec& spec, BackendSpec* rest = nullptr);

// "perturb: every matmul output ×(1 ± 1e-3), seed 24301" etc.
std::string describe(const FaultSpec& fault);

class FaultBackend final : public Backend {
public:
    FaultBackend(std::unique_ptr<Backend> inner, FaultSpec fault);

    const Capabilities& capabilities() const override { return caps_; }
    std::optional<WeightCacheStats> weight_cache_stats() const override { return inner_->weight_cache_stats(); }
    std::optional<TransferStats> transfer_stats() const override { return inner_->transfer_stats(); }
    Tensor matmul(const TensorView& x, const TensorView& w) override;
    Tensor swiglu(const TensorView& gate, const TensorView& up) override;
    Tensor clamped_swiglu(const TensorView& gate, const TensorView& up, double alpha, double limit) override;
    Tensor softmax(const TensorView& x) override;
    Tensor sigmoid(const TensorView& x) override;
    Tensor rmsnorm(const TensorView& x, const TensorView& weight, double eps) override;
    Tensor rope(const TensorView& x, std::span<const std::int64_t> positions, const RopeParams& params) override;
    RouterOutput route(const TensorView& logits, const RouterParams& params) override;
    Tensor moe_block(const TensorView& x, std::span<const ExpertWeights> experts, const RoutingPlan& plan,
                     const std::vector<bool>* expert_filter = nullptr) override;
    Tensor add(const TensorView& a, const TensorView& b) override;
    Tensor mul(const TensorView& a, const TensorView& b) override;
    Tensor scale(const TensorView& x, double s) override;
    // Gated DeltaNet: both ops are fault targets (fault_op=causal_conv1d,
    // fault_op=gated_delta: their bounds in step 1 must catch a broken
    // kernel); the delta rule's output is the target, its carried state is
    // passed on untouched.
    Tensor causal_conv1d_silu(const TensorView& x, const TensorView& w, const TensorView* h) override {
        return after("causal_conv1d", inner_->causal_conv1d_silu(x, w, h));
    }
    GatedDeltaResult gated_delta_rule(const GatedDeltaInputs& in) override {
        GatedDeltaResult r = inner_->gated_delta_rule(in);
        r.out = after("gated_delta", std::move(r.out));
        return r;
    }
    // The inner backend's fused attention, or — when the fault targets one of
    // the ops it is composed of (matmul, scale, softmax; bitflip) — the
    // default composition through this wrapper, so those faults and their
    // call numbers are what they were before the op was fused. With sinks: the
    // default composition through this wrapper.
    Tensor run_attention(const TensorView& q, std::span<const TensorView> k, std::span<const TensorView> v, double s,
                         const TensorView* sinks) override;

    const FaultSpec& fault() const { return fault_; }
    // One line per injected fault, in order ("nan: matmul call 0 element 5"),
    // for tests and for debugging an audit.
    const std::vector<std::string>& injections() const { return log_; }
    // Op outputs corrupted so far: a perturbed or NaN'd output, a matmul that
    // read the flipped weight, a routed row whose choice was swapped.
    std::optional<std::int64_t> injected_faults() const override { return injected_; }

private:
    Tensor after(const char* op, Tensor out);  // applies perturb / nan to op's output
    bool composes(const char* composite) const;
    // route: token t of this call takes its (k+1)-th expert for its k-th.
    void swap_kth(RouterOutput& out, const RouterParams& params, std::int64_t call, std::int64_t t);
    static constexpr std::size_t kMaxLog = 256;  // injections() keeps the first ones

    std::unique_ptr<Backend> inner_;
    FaultSpec fault_;
    Capabilities caps_;
    std::vector<std::string> log_;
    std::int64_t injected_ = 0;
    std::int64_t op_calls_ = 0;      // calls of fault_.op so far
    std::int64_t route_calls_ = 0;
    std::int64_t matmul_calls_ = 0;  // bitflip
    const void* flipped_source_ = nullptr;  // bitflip: the weight memory that is corrupted
    Tensor flipped_copy_;
    Shape flipped_shape_;
    DType flipped_dtype_ = DType::f32;
};

std::unique_ptr<Backend> make_fault_backend(std::unique_ptr<Backend> inner, FaultSpec fault);

// The registry's factory for "cpu" specs: strips the fault options, builds the
// cpu backend with make_cpu_backend() from the rest (so "cpu:acc=f16,fault=nan"
// is a faulty f16-accumulating node) and wraps it. Without a fault option it
// returns the plain cpu backend. Error(bad_input) for a name other than cpu.
std::unique_ptr<Backend> make_cpu_with_fault(const BackendSpec& spec);

}  // namespace kvasir
