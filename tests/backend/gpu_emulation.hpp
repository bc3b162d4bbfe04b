// The GPU kernels (kernels/gpu/ops.cuh) compiled for the host and run on a CPU
// emulation of the CUDA execution model, for machines without a GPU.
//
// kernels/gpu/ops.cuh has no vendor #ifdef, so it compiles for a third target
// besides nvcc and hipcc: this emulation (each GPU thread a fiber with its own
// stack, __syncthreads a switch back to the block's scheduler, blocks one
// after another so a function-static array is exactly one block's shared
// memory; see emu::launch). It runs the real kernel source — tiling, bounds,
// reduction trees, split-K atomics.
//
// Two users:
//  * tests/backend/test_gpu.cpp, for what the kernels promise beyond the
//    backend contract (EmulatedKernels.*), and to check that a real device
//    gives the emulation's bits;
//  * tests/backend/test_conformance.cpp runs the backend contract on
//    EmulatedGpuBackend below: the host glue of gpu_backend_impl.inc redone
//    without a vendor runtime — the same argument checks, the same staging
//    (inputs rounded once to storage), the same kernels with the same launch
//    geometry, the Backend defaults for route/moe_block/add.
//
// Include this header in one translation unit per test binary, after every
// other header: it #defines the CUDA keywords (threadIdx, __global__, ...).
#pragma once

#include "kvasir/backend/backend.hpp"
#include "kvasir/core/error.hpp"

#include <algorithm>
#include <ucontext.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <random>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define KVASIR_EMU_ASM_SWITCH 1
#else
#define KVASIR_EMU_ASM_SWITCH 0
#endif

namespace emu {
struct Dim3 {
    unsigned x = 1, y = 1, z = 1;
};
// What the running GPU thread reads as threadIdx, blockIdx, blockDim, gridDim:
// set by the scheduler below before it resumes a thread.
inline Dim3 thread_idx, block_idx, block_dim, grid_dim;

namespace detail {
constexpr std::size_t kStackBytes = 64 * 1024;  // a kernel frame needs a few KiB

struct Fiber {
    bool done = false;
#if KVASIR_EMU_ASM_SWITCH
    void* sp = nullptr;
#else
    ucontext_t context;
#endif
};
inline std::vector<Fiber> fibers;
inline unsigned current = 0;
inline const std::function<void()>* body = nullptr;  // the kernel applied to its arguments

// Fiber stacks, kept between launches; only the pages a fiber touches are
// ever faulted in.
inline std::byte* stack(unsigned t) {
    static std::vector<std::unique_ptr<std::byte[]>> stacks;
    while (stacks.size() <= t) stacks.push_back(std::make_unique<std::byte[]>(kStackBytes));
    return stacks[t].get();
}

#if KVASIR_EMU_ASM_SWITCH
// Why not ucontext: swapcontext saves and restores the signal mask, a system
// call per switch, and a 64×64 tile of a K = 2048 matmul switches 256 threads
// twice per 16 k: the system calls took most of the emulation's time. This
// switch is the x86-64 SysV one: push the callee-saved registers on the
// current stack, store the stack pointer in *from, load `to`, pop what was
// pushed there, return into that fiber. Weak, so that two objects defining
// it link into one binary.
extern "C" void kvasir_emu_switch(void** from, void* to);
asm(R"(
    .text
    .weak kvasir_emu_switch
    .type kvasir_emu_switch, @function
kvasir_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kvasir_emu_switch, .-kvasir_emu_switch
)");

inline void* scheduler_sp = nullptr;

// Entered by kvasir_emu_switch's `ret` on a fresh stack; never returns.
[[noreturn]] inline void fiber_main() {
    (*body)();
    fibers[current].done = true;
    kvasir_emu_switch(&fibers[current].sp, scheduler_sp);
    __builtin_unreachable();
}

// A fresh stack as kvasir_emu_switch leaves one: six zeroed registers, then
// fiber_main as the return address, then a slot standing for fiber_main's own
// return address, so that it starts with the stack aligned as after a call.
inline void start(unsigned t) {
    auto* top = reinterpret_cast<void**>(stack(t) + kStackBytes);  // 16-byte aligned
    top[-1] = nullptr;
    top[-2] = reinterpret_cast<void*>(&fiber_main);
    for (int r = 3; r <= 8; ++r) top[-r] = nullptr;
    fibers[t].done = false;
    fibers[t].sp = top - 8;
}
inline void resume(unsigned t) { kvasir_emu_switch(&scheduler_sp, fibers[t].sp); }
inline void yield() { kvasir_emu_switch(&fibers[current].sp, scheduler_sp); }
#else
// Portable (and what AddressSanitizer understands): ucontext.
inline ucontext_t scheduler;

inline void fiber_main() {
    (*body)();
    fibers[current].done = true;  // then back to the scheduler through uc_link
}

// Out of line: getcontext returns twice, which would make every local of
// the caller suspect (-Wclobbered).
[[gnu::noinline]] inline void start(unsigned t) {
    Fiber& f = fibers[t];
    f.done = false;
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = stack(t);
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = &scheduler;
    makecontext(&f.context, fiber_main, 0);
}
inline void resume(unsigned t) { swapcontext(&scheduler, &fibers[t].context); }
inline void yield() { swapcontext(&fibers[current].context, &scheduler); }
#endif
}  // namespace detail

// A block's threads are fibers on the calling thread, each with its own stack
// and control flow. The scheduler runs thread 0, 1, ... each until its next
// __syncthreads (or its end), then starts the next round: a barrier is
// exactly "every thread of the block has arrived". Running each thread alone
// up to the barrier is also the schedule least kind to a missing
// __syncthreads (thread 0 sees none of the others' shared-memory writes, and
// overwrites what they have not read yet), and it is deterministic. A
// __syncthreads that only part of the block reaches (undefined on a GPU) is
// an exception here. Blocks run one after another, so a function-static
// __shared__ array is exactly one block's shared memory.
//
// launch_any_order runs the blocks in an order drawn from `seed` (a
// permutation of the grid), as a GPU may: what a kernel's result owes to the
// order blocks finish in (split-K's atomicAdd) then shows.
// Kernel launches so far on this thread (the GPU node's transfer_stats()
// launches, for the emulation: a test reads the difference around a call).
inline thread_local std::uint64_t launches = 0;

template <typename Kernel, typename... Args>
void launch_any_order(std::uint64_t seed, Dim3 grid, unsigned threads, Kernel kernel, Args... args) {
    ++launches;
    const std::function<void()> run = [&] { kernel(args...); };
    detail::body = &run;
    grid_dim = grid;
    block_dim = {threads, 1, 1};
    detail::fibers.assign(threads, {});
    std::vector<Dim3> blocks;
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) blocks.push_back({x, y, z});
    if (seed != 0) std::shuffle(blocks.begin(), blocks.end(), std::mt19937_64(seed));
    for (const Dim3& b : blocks) {
        block_idx = b;
        for (unsigned t = 0; t < threads; ++t) detail::start(t);
        for (bool running = true; running;) {
            unsigned finished = 0;
            for (unsigned t = 0; t < threads; ++t) {
                detail::current = t;
                thread_idx = {t, 0, 0};
                detail::resume(t);
                finished += detail::fibers[t].done ? 1 : 0;
            }
            if (finished != 0 && finished != threads)
                throw std::logic_error("emulated GPU: __syncthreads reached by only part of a block");
            running = finished == 0;
        }
    }
}

// Blocks in grid order (x fastest), one after another.
template <typename Kernel, typename... Args>
void launch(Dim3 grid, unsigned threads, Kernel kernel, Args... args) {
    launch_any_order(0, grid, threads, kernel, args...);
}

inline void syncthreads() { detail::yield(); }
}  // namespace emu

#define __global__
#define __device__
#define __shared__ static
#define __launch_bounds__(n)
#define threadIdx ::emu::thread_idx
#define blockIdx ::emu::block_idx
#define blockDim ::emu::block_dim
#define gridDim ::emu::grid_dim
inline void __syncthreads() { ::emu::syncthreads(); }
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
using std::min;

#include "kernels/gpu/ops.cuh"  // and math.cuh, in namespace kvasir::gpu_host

namespace kvasir::test {

// A GPU node whose device is the emulation: spec "gpu-emu[:storage=…,acc=…,
// nondeterministic=1]", the options of cuda/hip without blas=.
class EmulatedGpuBackend final : public Backend {
public:
    explicit EmulatedGpuBackend(const std::string& spec_text) {
        const BackendSpec spec = BackendSpec::parse(spec_text);
        KVASIR_CHECK(spec.name == "gpu-emu" && !spec.device_given, ErrorCode::bad_input, "not a gpu-emu spec: {}",
                     spec_text);
        BackendSpec canonical;
        canonical.name = spec.name;
        for (const auto& [key, value] : spec.options) {
            if (apply_precision_option(spec, key, value, caps_)) {
                if (value != "f32") canonical.options[key] = value;
                continue;
            }
            KVASIR_CHECK(key == "nondeterministic" && (value == "0" || value == "1"), ErrorCode::bad_input,
                         "gpu-emu: unknown option {}={}", key, value);
            nondeterministic_ = value == "1";
            if (nondeterministic_) canonical.options[key] = value;
        }
        storage_ = caps_.storage == DType::f16 ? gpu_host::kStoreF16
                   : caps_.storage == DType::bf16 ? gpu_host::kStoreBF16
                                                  : gpu_host::kStoreF32;
        caps_.node = canonical.canonical();
        caps_.backend = "gpu-emu";
        caps_.device = "CPU emulation of the CUDA execution model (tests/backend/gpu_emulation.hpp)";
        caps_.runtime = "kernels/gpu/ops.cuh compiled by the host compiler";
        caps_.output = DType::f32;
        caps_.fma = true;
        caps_.threads = gpu_host::kMatmulThreads;
        caps_.deterministic = !nondeterministic_;
    }

    const Capabilities& capabilities() const override { return caps_; }

    Tensor matmul(const TensorView& x, const TensorView& w) override {
        check_matmul_args(x, w);
        const std::int64_t t_count = rows_of(x), n_count = w.dim(0), k_count = w.dim(1);
        Shape shape = x.shape;
        shape.back() = n_count;
        // K = 0: every output is an empty sum, +0; and split-K would divide by
        // a zero chunk ((k + chunk - 1) / chunk with chunk = 0).
        if (t_count == 0 || n_count == 0 || k_count == 0) return Tensor(DType::f32, shape);
        const std::vector<float> xs = stage(x), ws = stage(w);
        std::vector<float> y(static_cast<std::size_t>(t_count * n_count), 0.0f);
        const int t = static_cast<int>(t_count), n = static_cast<int>(n_count), k = static_cast<int>(k_count);
        // One launch with the tiling the device takes for this shape: the
        // host code slices T into launches of 65535 tiles, far beyond any
        // test's T.
        gpu_host::with_tiling(gpu_host::matmul_tiling(t, n), [&]<class Tl>(Tl) {
            using gpu_host::matmul_kernel;
            const emu::Dim3 tiles{static_cast<unsigned>((n + Tl::tn - 1) / Tl::tn),
                                  static_cast<unsigned>((t + Tl::tm - 1) / Tl::tm), 1};
            if (nondeterministic_) {
                // The blocks in an order of their own each launch, as a GPU may
                // run them: the atomics then add the partial sums in that order.
                const int chunk = gpu_host::split_k_chunk(k);
                emu::launch_any_order(schedule_(), {tiles.x, tiles.y, static_cast<unsigned>((k + chunk - 1) / chunk)},
                                      gpu_host::kMatmulThreads, matmul_kernel<Tl, false, true>, xs.data(), ws.data(),
                                      y.data(), t, n, k, chunk, storage_);
                launch_elementwise(y.size(), gpu_host::store_kernel, y.data(), y.size(), storage_);
            } else if (caps_.accumulation == DType::f16) {
                emu::launch(tiles, gpu_host::kMatmulThreads, matmul_kernel<Tl, true, false>, xs.data(), ws.data(), y.data(),
                            t, n, k, std::max(k, 1), storage_);
            } else {
                emu::launch(tiles, gpu_host::kMatmulThreads, matmul_kernel<Tl, false, false>, xs.data(), ws.data(),
                            y.data(), t, n, k, std::max(k, 1), storage_);
            }
        });
        return Tensor::from_f32(y, shape);
    }

    Tensor swiglu(const TensorView& gate, const TensorView& up) override {
        check_same_shape("swiglu", gate, up);
        const std::vector<float> g = stage(gate), u = stage(up);
        std::vector<float> y(g.size());
        launch_elementwise(y.size(), gpu_host::swiglu_kernel, g.data(), u.data(), y.data(), y.size(), storage_);
        return Tensor::from_f32(y, gate.shape);
    }

    Tensor clamped_swiglu(const TensorView& gate, const TensorView& up, double alpha, double limit) override {
        check_clamped_swiglu_args(gate, up, alpha, limit);
        const std::vector<float> g = stage(gate), u = stage(up);
        std::vector<float> y(g.size());
        launch_elementwise(y.size(), gpu_host::clamped_swiglu_kernel, g.data(), u.data(), y.data(), y.size(),
                           static_cast<float>(alpha), static_cast<float>(limit), storage_);
        return Tensor::from_f32(y, gate.shape);
    }

    // add / mul / scale on the kernels, when gpu_backend_impl.inc runs them
    // there: add on operands already in storage format (here, with no device
    // results, any f32/f16/bf16 tensor on an f32 node), mul and scale always.
    Tensor add(const TensorView& a, const TensorView& b) override {
        check_same_shape("add", a, b);
        const auto exact = [&](const TensorView& v) {
            return caps_.storage == DType::f32 && (v.dtype == DType::f32 || v.dtype == DType::f16 || v.dtype == DType::bf16);
        };
        if (!exact(a) || !exact(b)) return Backend::add(a, b);
        const std::vector<float> as = stage(a), bs = stage(b);
        std::vector<float> y(as.size());
        launch_elementwise(y.size(), gpu_host::add_kernel, as.data(), bs.data(), y.data(), y.size(), storage_);
        return Tensor::from_f32(y, a.shape);
    }
    Tensor mul(const TensorView& a, const TensorView& b) override {
        check_same_shape("mul", a, b);
        const std::vector<float> as = stage(a), bs = stage(b);
        std::vector<float> y(as.size());
        launch_elementwise(y.size(), gpu_host::mul_kernel, as.data(), bs.data(), y.data(), y.size(), storage_);
        return Tensor::from_f32(y, a.shape);
    }
    Tensor scale(const TensorView& x, double s) override {
        const std::vector<float> xs = stage(x);
        std::vector<float> y(xs.size());
        launch_elementwise(y.size(), gpu_host::scale_kernel, xs.data(), y.data(), y.size(), static_cast<float>(s), storage_);
        return Tensor::from_f32(y, x.shape);
    }

    // The GPU node's MoE block inside a DeviceResidency scope, as
    // gpu_backend_impl.inc runs it: the routed rows gathered by
    // moe_gather_kernel into lay_out_experts' slices, every expert's gate and
    // up in one grouped_matmul_kernel launch, the (clamped) SwiGLU, every down
    // in a second grouped launch (split-K runs expert by expert: the
    // default's ops), the combine by moe_combine_kernel, on the table
    // moe_device_table makes.
    Tensor moe_block(const TensorView& x, std::span<const ExpertWeights> experts, const RoutingPlan& plan,
                     const std::vector<bool>* expert_filter = nullptr) override {
        if (!DeviceResidency::active() || nondeterministic_ ||
            (caps_.storage != DType::f32 &&
             std::any_of(experts.begin(), experts.end(), [](const ExpertWeights& ew) { return ew.has_biases(); })))
            return Backend::moe_block(x, experts, plan, expert_filter);
        const std::vector<ExpertRows> routed = route_rows(x, experts, plan, expert_filter);
        const std::int64_t t_count = x.dim(0), h = x.dim(1);
        const RoutedExperts chosen = routed_experts(experts, routed, h);
        const ExpertLayout layout = lay_out_experts(chosen.weights, chosen.rows, h, 64);
        if (layout.empty()) return Backend::moe_block(x, experts, plan, expert_filter);
        const std::vector<std::uint32_t> table = moe_device_table(routed, layout.x_rows(), layout.y_rows(), t_count);
        const std::vector<float> xs = stage(x);
        // Zero-filled: the empty sums (K = 0) are +0 without a launch.
        std::vector<float> xb(layout.x_total), g(layout.mid_total), u(layout.mid_total), a(layout.mid_total),
            yb(layout.y_total);
        launch_elementwise(chosen.g_count * static_cast<std::size_t>(h), gpu_host::moe_gather_kernel, xs.data(), table.data(),
                           xb.data(), chosen.g_count, static_cast<int>(h));
        std::vector<std::vector<float>> staged;  // gate, up, down, gate bias, up bias, down bias per expert
        std::vector<gpu_host::ExpertWeightsOnDevice> on_device;
        for (const ExpertWeights* ew : chosen.weights)
            for (const TensorView* w : {&ew->gate, &ew->up, &ew->down, &ew->gate_bias, &ew->up_bias, &ew->down_bias})
                staged.push_back(w->data != nullptr ? stage(*w) : std::vector<float>());
        const auto on = [&](std::size_t k) { return staged[k].empty() ? nullptr : staged[k].data(); };
        for (std::size_t n = 0; n < chosen.weights.size(); ++n)
            on_device.push_back({on(6 * n), on(6 * n + 1), on(6 * n + 2), on(6 * n + 3), on(6 * n + 4), on(6 * n + 5)});
        std::vector<gpu_host::MatmulJob> gate_up, down;
        gpu_host::expert_matmul_jobs(layout, on_device.data(), xb.data(), g.data(), u.data(), a.data(), yb.data(), gate_up,
                                     down);
        launch_grouped(gate_up);
        // gpt-oss's biases (f32 storage): in the grouped jobs' epilogue, and by
        // add_rows_kernel where a slice had no job (an empty sum: zeros).
        const auto add_bias = [&](std::vector<float>& y, std::size_t at, const float* bias, std::int64_t rows, std::int64_t cols) {
            const std::size_t count = static_cast<std::size_t>(rows * cols);
            if (bias == nullptr || count == 0) return;
            launch_elementwise(count, gpu_host::add_rows_kernel, y.data() + at, bias, y.data() + at, count,
                               static_cast<std::size_t>(cols), storage_);
        };
        for (std::size_t n = 0; n < layout.slices.size(); ++n) {
            const ExpertSlice& sl = layout.slices[n];
            if (sl.h > 0) continue;
            add_bias(g, sl.mid, on_device[n].gate_bias, sl.rows, sl.i);
            add_bias(u, sl.mid, on_device[n].up_bias, sl.rows, sl.i);
        }
        // One activation over the whole intermediate buffer when every expert
        // shares it (its padding is zeros here, garbage on the device: never read).
        const auto activate = [&](const ExpertActivation& act, std::size_t at, std::size_t count) {
            if (act.clamped)
                launch_elementwise(count, gpu_host::clamped_swiglu_kernel, g.data() + at, u.data() + at, a.data() + at, count,
                                   static_cast<float>(act.alpha), static_cast<float>(act.limit), storage_);
            else
                launch_elementwise(count, gpu_host::swiglu_kernel, g.data() + at, u.data() + at, a.data() + at, count, storage_);
        };
        if (one_activation(chosen.weights))
            activate(chosen.weights.front()->activation, 0, layout.mid_total);
        else
            for (std::size_t n = 0; n < layout.slices.size(); ++n)
                activate(chosen.weights[n]->activation, layout.slices[n].mid,
                         static_cast<std::size_t>(layout.slices[n].rows * layout.slices[n].i));
        launch_grouped(down);
        for (std::size_t n = 0; n < layout.slices.size(); ++n)
            if (layout.slices[n].i == 0)
                add_bias(yb, layout.slices[n].y, on_device[n].down_bias, layout.slices[n].rows, layout.slices[n].out);
        std::vector<float> out(static_cast<std::size_t>(t_count * h));
        launch_elementwise(out.size(), gpu_host::moe_combine_kernel, yb.data(), table.data(), out.data(), chosen.g_count,
                           static_cast<int>(t_count), static_cast<int>(h), storage_);
        return Tensor::from_f32(out, {t_count, h});
    }

    // One grouped_matmul_kernel launch of `jobs` with the tiling the device
    // picks for them.
    void launch_grouped(std::vector<gpu_host::MatmulJob> jobs) {
        const gpu_host::GroupedLaunch launch = gpu_host::plan_grouped(jobs);
        const int count = static_cast<int>(jobs.size());
        if (launch.tiles == 0) return;
        gpu_host::with_tiling(launch.tiling, [&]<class Tl>(Tl) {
            const emu::Dim3 grid{static_cast<unsigned>(launch.tiles), 1, 1};
            if (caps_.accumulation == DType::f16)
                emu::launch(grid, gpu_host::kMatmulThreads, gpu_host::grouped_matmul_kernel<Tl, true>,
                            static_cast<const gpu_host::MatmulJob*>(jobs.data()), count, storage_);
            else
                emu::launch(grid, gpu_host::kMatmulThreads, gpu_host::grouped_matmul_kernel<Tl, false>,
                            static_cast<const gpu_host::MatmulJob*>(jobs.data()), count, storage_);
        });
    }

    // The GPU node's data movement (copy_columns, last_rows, join_columns,
    // repeat_columns) inside a DeviceResidency scope, on copy_block_kernel
    // block by block (backend.hpp BlockCopy); the device moves its own
    // results, already in storage format: here, f32 on an f32 node.
    bool moves_on_the_kernel(std::initializer_list<const TensorView*> in) const {
        return DeviceResidency::active() && caps_.storage == DType::f32 &&
               std::all_of(in.begin(), in.end(), [](const TensorView* v) { return v == nullptr || v->dtype == DType::f32; });
    }
    static void copy_block(const float* src, float* y, const BlockCopy& b) {
        launch_elementwise(static_cast<std::size_t>(b.rows * b.n), gpu_host::copy_block_kernel, src, y, static_cast<int>(b.rows),
                           static_cast<int>(b.n), static_cast<int>(b.src_cols), static_cast<int>(b.src_r0),
                           static_cast<int>(b.src_c0), static_cast<int>(b.src_step), static_cast<int>(b.src_wrap),
                           static_cast<int>(b.y_cols), static_cast<int>(b.y_r0), static_cast<int>(b.y_c0));
    }
    using Backend::copy_columns;
    Tensor copy_columns(const TensorView& x, std::int64_t c0, std::int64_t n, std::int64_t step) override {
        check_copy_columns_args(x, c0, n, step);
        if (!moves_on_the_kernel({&x})) return Backend::copy_columns(x, c0, n, step);
        const std::int64_t rows = rows_of(x);
        const std::vector<float> xs = stage(x);
        std::vector<float> y(static_cast<std::size_t>(rows * n));
        copy_block(xs.data(), y.data(), copy_columns_block(x, c0, n, step));
        return Tensor::from_f32(y, {rows, n});
    }
    Tensor last_rows(const TensorView* prev, const TensorView& x, std::int64_t n) override {
        check_last_rows_args(prev, x, n);
        if (!moves_on_the_kernel({prev, &x})) return Backend::last_rows(prev, x, n);
        const std::int64_t cols = x.dim(1);
        const std::array<BlockCopy, 2> blocks = last_rows_blocks(prev, x, n);
        const std::vector<float> xs = stage(x);
        std::vector<float> y(static_cast<std::size_t>(n * cols));  // zeros: the rows of a null prev
        copy_block(xs.data(), y.data(), blocks[0]);
        if (prev != nullptr) {
            const std::vector<float> ps = stage(*prev);
            copy_block(ps.data(), y.data(), blocks[1]);
        }
        return Tensor::from_f32(y, {n, cols});
    }
    Tensor join_columns(std::span<const TensorView> parts) override {
        const std::int64_t cols = check_join_columns_args(parts), rows = rows_of(parts.front());
        if (!DeviceResidency::active() || caps_.storage != DType::f32 || parts.front().dtype != DType::f32)
            return Backend::join_columns(parts);
        std::vector<float> y(static_cast<std::size_t>(rows * cols));  // zeros: the zero parts
        const std::vector<BlockCopy> blocks = join_columns_blocks(parts);
        for (std::size_t i = 0; i < parts.size(); ++i) {
            if (zero_part(parts[i])) continue;
            const std::vector<float> ps = stage(parts[i]);
            copy_block(ps.data(), y.data(), blocks[i]);
        }
        return Tensor::from_f32(y, {rows, cols});
    }
    Tensor repeat_columns(const TensorView& x, std::int64_t times) override {
        check_repeat_columns_args(x, times);
        if (!moves_on_the_kernel({&x})) return Backend::repeat_columns(x, times);
        const std::int64_t rows = rows_of(x), cols = times * x.shape.back();
        const std::vector<float> xs = stage(x);
        std::vector<float> y(static_cast<std::size_t>(rows * cols));
        copy_block(xs.data(), y.data(), repeat_columns_block(x, times));
        return Tensor::from_f32(y, {rows, cols});
    }

    // The GPU node's device KV cache (inside a DeviceResidency scope) on
    // kv_cache_rows_kernel, in host memory here.
    std::optional<Tensor> kv_rows(const TensorView* cache, std::int64_t keep, const TensorView& rows) override {
        if (!DeviceResidency::active()) return std::nullopt;
        const std::int64_t heads = rows.dim(1), t_count = rows.dim(0), d = rows.dim(2), s_out = keep + t_count;
        const std::int64_t s_cache = cache != nullptr ? cache->dim(1) : 0;
        const std::vector<float> rs = stage(rows), cs = cache != nullptr ? stage(*cache) : std::vector<float>();
        std::vector<float> y(static_cast<std::size_t>(heads * s_out * d));
        launch_elementwise(y.size(), gpu_host::kv_cache_rows_kernel, cs.empty() ? rs.data() : cs.data(), rs.data(), y.data(),
                           static_cast<int>(heads), static_cast<int>(s_cache), static_cast<int>(keep),
                           static_cast<int>(t_count), static_cast<int>(d));
        return Tensor::from_f32(y, {heads, s_out, d});
    }

    Tensor softmax(const TensorView& x) override {
        KVASIR_CHECK(x.rank() >= 1, ErrorCode::bad_input, "softmax: scalar input");
        const std::int64_t rows = rows_of(x), cols = x.dim(-1);
        if (x.numel() == 0) return Tensor(DType::f32, x.shape);
        const std::vector<float> xs = stage(x);
        std::vector<float> y(xs.size());
        const emu::Dim3 grid{static_cast<unsigned>(rows), 1, 1};
        if (caps_.accumulation == DType::f16)
            emu::launch(grid, gpu_host::kReduceThreads, gpu_host::softmax_kernel<true>, xs.data(), y.data(),
                        static_cast<int>(cols), storage_);
        else
            emu::launch(grid, gpu_host::kReduceThreads, gpu_host::softmax_kernel<false>, xs.data(), y.data(),
                        static_cast<int>(cols), storage_);
        return Tensor::from_f32(y, x.shape);
    }

    Tensor sigmoid(const TensorView& x) override {
        const std::vector<float> xs = stage(x);
        std::vector<float> y(xs.size());
        launch_elementwise(y.size(), gpu_host::sigmoid_kernel, xs.data(), y.data(), y.size(), storage_);
        return Tensor::from_f32(y, x.shape);
    }

    Tensor rmsnorm(const TensorView& x, const TensorView& weight, double eps) override {
        check_rmsnorm_args(x, weight);
        const std::int64_t rows = rows_of(x), cols = x.dim(-1);
        if (x.numel() == 0) return Tensor(DType::f32, x.shape);
        const std::vector<float> xs = stage(x), ws = stage(weight);
        std::vector<float> y(xs.size());
        const emu::Dim3 grid{static_cast<unsigned>(rows), 1, 1};
        const float eps32 = static_cast<float>(eps);
        if (caps_.accumulation == DType::f16)
            emu::launch(grid, gpu_host::kReduceThreads, gpu_host::rmsnorm_kernel<true>, xs.data(), ws.data(), y.data(),
                        static_cast<int>(cols), eps32, storage_);
        else
            emu::launch(grid, gpu_host::kReduceThreads, gpu_host::rmsnorm_kernel<false>, xs.data(), ws.data(), y.data(),
                        static_cast<int>(cols), eps32, storage_);
        return Tensor::from_f32(y, x.shape);
    }

    Tensor rope(const TensorView& x, std::span<const std::int64_t> positions, const RopeParams& params) override {
        check_rope_args(x, positions, params);
        const std::int64_t t_count = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
        if (x.numel() == 0) return Tensor(DType::f32, x.shape);
        // Inverse frequencies and positions on the host, as the host code does.
        std::vector<float> inv_freq(static_cast<std::size_t>(half)), pos(static_cast<std::size_t>(t_count));
        for (std::int64_t i = 0; i < half; ++i) inv_freq[static_cast<std::size_t>(i)] = rope_inv_freq_f32(params, i, d);
        for (std::int64_t t = 0; t < t_count; ++t)
            pos[static_cast<std::size_t>(t)] = static_cast<float>(positions[static_cast<std::size_t>(t)]);
        const std::vector<float> xs = stage(x);
        std::vector<float> y(xs.size());
        launch_elementwise(static_cast<std::size_t>(t_count * heads * half), gpu_host::rope_kernel, xs.data(), pos.data(),
                           inv_freq.data(), y.data(), static_cast<int>(t_count), static_cast<int>(heads),
                           static_cast<int>(d), params.layout == RopeLayout::neox ? 1 : 0, storage_);
        return Tensor::from_f32(y, x.shape);
    }

    // Gated DeltaNet: the host logic of gpu_backend_impl.inc (checks, staging,
    // the f32 state not rounded, zeros when absent) with the same kernels and
    // launch geometry: the conv elementwise, the delta rule one block of
    // kReduceThreads per value head.
    Tensor causal_conv1d_silu(const TensorView& x, const TensorView& w, const TensorView* history) override {
        check_conv1d_args(x, w, history);
        const std::int64_t t_count = x.dim(0), channels = x.dim(1), k_count = w.shape.back();
        if (x.numel() == 0) return Tensor(DType::f32, x.shape);
        const std::vector<float> xs = stage(x), ws = stage(w);
        const std::vector<float> hs = history != nullptr ? stage(*history) : std::vector<float>();
        std::vector<float> y(xs.size());
        const bool f16 = caps_.accumulation == DType::f16;
        launch_elementwise(y.size(), f16 ? gpu_host::causal_conv1d_silu_kernel<true> : gpu_host::causal_conv1d_silu_kernel<false>,
                           xs.data(), ws.data(),
                           history != nullptr ? hs.data() : static_cast<const float*>(nullptr), y.data(),
                           static_cast<int>(t_count), static_cast<int>(channels), static_cast<int>(k_count), storage_);
        return Tensor::from_f32(y, x.shape);
    }

    GatedDeltaResult gated_delta_rule(const GatedDeltaInputs& in) override {
        check_gated_delta_args(in);
        const std::int64_t t_count = in.q.dim(0), nk = in.q.dim(1), dk = in.q.dim(2), nv = in.v.dim(1),
                           dv = in.v.dim(2);
        std::vector<float> state(static_cast<std::size_t>(nv * dk * dv), 0.0f);
        if (in.state != nullptr)
            for (std::size_t i = 0; i < state.size(); ++i) state[i] = static_cast<float>(in.state->at(static_cast<std::int64_t>(i)));
        std::vector<float> out(static_cast<std::size_t>(t_count * nv * dv));
        if (t_count > 0 && nv * dv > 0) {
            const std::vector<float> q = stage(in.q), k = stage(in.k), v = stage(in.v), a = stage(in.a), b = stage(in.b),
                                     al = stage(in.a_log), dt = stage(in.dt_bias);
            std::vector<float> work(static_cast<std::size_t>(nv * 2 * dk));
            const bool f16 = caps_.accumulation == DType::f16;
            emu::launch({static_cast<unsigned>(nv), 1, 1}, gpu_host::kReduceThreads,
                        f16 ? gpu_host::gated_delta_kernel<true> : gpu_host::gated_delta_kernel<false>,
                        q.data(), k.data(), v.data(), a.data(), b.data(), al.data(), dt.data(), state.data(), out.data(),
                        work.data(), static_cast<int>(t_count), static_cast<int>(nk), static_cast<int>(nv),
                        static_cast<int>(dk), static_cast<int>(dv), storage_);
        }
        return {Tensor::from_f32(out, {t_count, nv, dv}), Tensor::from_f32(state, {nv, dk, dv})};
    }

private:
    // Causal attention: gpu_backend_impl.inc's host logic (checks, the kv
    // heads staged one after another, the composition beyond kAttnMaxDim)
    // with attention_kernel at its launch geometry, one block per (row, head).
    // With sinks: the same, the sinks staged as the host stages them.
    Tensor run_attention(const TensorView& q, std::span<const TensorView> keys, std::span<const TensorView> values,
                         double scale, const TensorView* sinks) override {
        check_attention_args(q, keys, values);
        const std::int64_t t_count = q.dim(0), nh = q.dim(1), d = q.dim(2), nkv = static_cast<std::int64_t>(keys.size());
        const std::int64_t s_count = keys[0].dim(0);
        if (t_count == 0) return Tensor(DType::f32, {0, nh * d});
        if (d > gpu_host::kAttnMaxDim)
            return compose_attention(q, keys, values, scale, sinks);
        const std::vector<float> sk = sinks ? stage(*sinks) : std::vector<float>();
        const float* sp = sinks ? sk.data() : nullptr;
        const std::vector<float> qs = stage(q);
        std::vector<float> ks, vs;
        for (std::size_t g = 0; g < keys.size(); ++g) {
            const std::vector<float> kg = stage(keys[g]), vg = stage(values[g]);
            ks.insert(ks.end(), kg.begin(), kg.end());
            vs.insert(vs.end(), vg.begin(), vg.end());
        }
        std::vector<float> y(static_cast<std::size_t>(t_count * nh * d));
        const emu::Dim3 grid{static_cast<unsigned>(t_count * nh), 1, 1};
        const int t = static_cast<int>(t_count), h = static_cast<int>(nh), g = static_cast<int>(nkv),
                  dim = static_cast<int>(d), s = static_cast<int>(s_count);
        if (caps_.accumulation == DType::f16)
            emu::launch(grid, gpu_host::kReduceThreads, gpu_host::attention_kernel<true>, qs.data(), ks.data(), vs.data(),
                        y.data(), t, h, g, dim, s, static_cast<float>(scale), storage_, sp);
        else
            emu::launch(grid, gpu_host::kReduceThreads, gpu_host::attention_kernel<false>, qs.data(), ks.data(),
                        vs.data(), y.data(), t, h, g, dim, s, static_cast<float>(scale), storage_, sp);
        return Tensor::from_f32(y, {t_count, nh * d});
    }

    // The elementwise kernels loop with a grid stride, so every element gets
    // the same arithmetic whatever the grid; the host launches ⌈n/256⌉ blocks,
    // the emulation at most 8 to keep thread creation cheap.
    template <typename Kernel, typename... Args>
    static void launch_elementwise(std::size_t n, Kernel kernel, Args... args) {
        if (n == 0) return;
        const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>((n + 255) / 256, 8));
        emu::launch({blocks, 1, 1}, 256, kernel, args...);
    }

    // The input as the node holds it: rounded ONCE to storage from whatever
    // dtype the view has, as gpu_backend_impl.inc's stage().
    std::vector<float> stage(const TensorView& v) const {
        std::vector<float> h(static_cast<std::size_t>(v.numel()));
        for (std::size_t i = 0; i < h.size(); ++i)
            h[i] = v.dtype == DType::f32 ? gpu_host::kg_store(v.as<float>()[i], storage_)
                                         : static_cast<float>(round_to(caps_.storage, v.at(static_cast<std::int64_t>(i))));
        return h;
    }

    Capabilities caps_;
    bool nondeterministic_ = false;
    // A new block order for every split-K launch (reproducible from run to run of the test binary).
    std::uint64_t schedules_ = 0;
    std::uint64_t schedule_() { return 0x9E3779B97F4A7C15ull * ++schedules_; }
    int storage_ = gpu_host::kStoreF32;
};

}  // namespace kvasir::test
