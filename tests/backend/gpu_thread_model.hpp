// The CUDA execution model on the CPU: the GPU thread model that the
// kernels of kernels/gpu/ops.cuh run on when there is no GPU (each GPU thread
// a fiber with its own stack, __syncthreads a switch back to the block's
// scheduler, blocks one after another so a function-static array is exactly
// one block's shared memory; see emu::launch), and the CUDA keywords
// #defined for the host compiler.
//
// Two users, each including this header last, after every other header (it
// #defines threadIdx, __global__, ...):
//  * gpu_emulation.hpp: the kernels on their own (namespace kvasir::gpu_host);
//  * gpu_emulated_runtime.hpp: the GPU backend's whole host code
//    (gpu_backend_impl.inc) on an emulated device (gpu_emulated_node.cpp).
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
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
