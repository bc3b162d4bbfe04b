// The CUDA runtime as the GPU backend's shared host code uses it (the names
// kernels/gpu/vendor.hpp lists), on the CPU, for KVASIR_GPU_VENDOR_EMU: the
// backend's real host code (gpu_backend_impl.inc — staging, the pool, the
// weight cache, residency, the grouped MoE block, the counters) runs against
// it with the real kernels on the emulated thread model (gpu_thread_model.hpp).
//
// A model of the device, strict where the host code could go wrong:
//  * device memory is host memory from cudaMalloc (256-byte aligned), known
//    to the device: cudaFree of anything else is an error; a memory limit
//    (EmulatedDevice::memory_limit, the reported totalGlobalMem) makes
//    cudaMalloc fail as a full device does;
//  * a stream is a queue: copies, memsets and kernels run in order when the
//    host waits for it (cudaStreamSynchronize, cudaStreamDestroy, cudaFree),
//    never before. A host buffer an async copy reads must live until then,
//    a download is only there after the wait — as on a GPU, where the host
//    code must not rely on a copy having happened;
//  * a launch is checked as the vendor checks it (block size 1…1024, grid
//    x < 2^31, y and z ≤ 65535); a bad one is the next cudaGetLastError;
//  * blocks run in an order of their own each launch (a GPU promises none),
//    so a kernel whose bits depend on the order shows it.
//
// Include this header (after every other header: it #defines the CUDA
// keywords), then define KVASIR_GPU_VENDOR_EMU and include
// gpu_backend_impl.inc: tests/backend/gpu_emulated_node.cpp.
#pragma once

#include "tests/backend/gpu_thread_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace kvasir::gpu_emu {

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
};
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
constexpr unsigned cudaStreamNonBlocking = 1;

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct cudaDeviceProp {
    char name[256] = "kvasir GPU emulation (the CPU, tests/backend/gpu_emulated_runtime.hpp)";
    int major = 0, minor = 0;
    int multiProcessorCount = 4;
    int maxThreadsPerMultiProcessor = 2048;
    std::size_t totalGlobalMem = 0;
};

// Work enqueued on a stream, run when the host waits for it.
struct EmulatedStream {
    std::vector<std::function<void()>> queue;
    void drain() {
        // Moved out first: a task never enqueues, but a throwing one must not
        // leave the rest to run twice.
        std::vector<std::function<void()>> run;
        run.swap(queue);
        for (const auto& task : run) task();
    }
};
using cudaStream_t = EmulatedStream*;

// The one emulated device, with what a test may set and read.
struct EmulatedDevice {
    std::uint64_t memory_limit = std::uint64_t{4} << 30;  // totalGlobalMem; cudaMalloc beyond it fails
    std::uint64_t allocated = 0;                         // bytes held by cudaMalloc'd buffers now
    std::uint64_t mallocs = 0, frees = 0;                // calls that succeeded
    std::uint64_t launches = 0;                          // kernels run
    std::uint64_t syncs = 0;                             // cudaStreamSynchronize calls
    std::map<void*, std::size_t> buffers;                // live allocations
    std::set<EmulatedStream*> streams;
    cudaError_t last_error = cudaSuccess;  // sticky until cudaGetLastError
    std::uint64_t order_seed = 0x9e3779b97f4a7c15ull;

    static EmulatedDevice& get() {
        static EmulatedDevice device;
        return device;
    }
    void drain_all() {
        for (EmulatedStream* s : streams) s->drain();
    }
    cudaError_t fail(cudaError_t e) {
        last_error = e;
        return e;
    }
};

inline const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    }
    return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    }
    return "unknown error";
}
inline cudaError_t cudaGetLastError() {
    EmulatedDevice& d = EmulatedDevice::get();
    const cudaError_t e = d.last_error;
    d.last_error = cudaSuccess;
    return e;
}

inline cudaError_t cudaGetDeviceCount(int* count) {
    *count = 1;
    return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int device) {
    return device == 0 ? cudaSuccess : EmulatedDevice::get().fail(cudaErrorInvalidDevice);
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    if (device != 0) return EmulatedDevice::get().fail(cudaErrorInvalidDevice);
    *prop = cudaDeviceProp{};
    prop->totalGlobalMem = EmulatedDevice::get().memory_limit;
    return cudaSuccess;
}
inline cudaError_t cudaRuntimeGetVersion(int* v) {
    *v = 0;
    return cudaSuccess;
}
inline cudaError_t cudaDriverGetVersion(int* v) {
    *v = 0;
    return cudaSuccess;
}

inline cudaError_t cudaMalloc(void** p, std::size_t bytes) {
    EmulatedDevice& d = EmulatedDevice::get();
    if (bytes == 0 || d.allocated > d.memory_limit || bytes > d.memory_limit - d.allocated) return d.fail(cudaErrorMemoryAllocation);
    *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (*p == nullptr) return d.fail(cudaErrorMemoryAllocation);
    d.buffers[*p] = bytes;
    d.allocated += bytes;
    ++d.mallocs;
    return cudaSuccess;
}
// Synchronous, as cudaFree is: what is enqueued runs first.
inline cudaError_t cudaFree(void* p) {
    EmulatedDevice& d = EmulatedDevice::get();
    if (p == nullptr) return cudaSuccess;
    const auto it = d.buffers.find(p);
    if (it == d.buffers.end()) return d.fail(cudaErrorInvalidValue);
    d.drain_all();
    d.allocated -= it->second;
    d.buffers.erase(it);
    std::free(p);
    ++d.frees;
    return cudaSuccess;
}

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
    *s = new EmulatedStream;
    EmulatedDevice::get().streams.insert(*s);
    return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    EmulatedDevice& d = EmulatedDevice::get();
    if (d.streams.erase(s) == 0) return d.fail(cudaErrorInvalidValue);
    s->drain();  // the work enqueued completes, then the stream goes
    delete s;
    return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    EmulatedDevice& d = EmulatedDevice::get();
    if (d.streams.count(s) == 0) return d.fail(cudaErrorInvalidValue);
    s->drain();
    ++d.syncs;
    return cudaSuccess;
}

inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind, cudaStream_t s) {
    if (EmulatedDevice::get().streams.count(s) == 0) return EmulatedDevice::get().fail(cudaErrorInvalidValue);
    s->queue.push_back([=] { std::memcpy(dst, src, bytes); });
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t s) {
    if (EmulatedDevice::get().streams.count(s) == 0) return EmulatedDevice::get().fail(cudaErrorInvalidValue);
    s->queue.push_back([=] { std::memset(p, value, bytes); });
    return cudaSuccess;
}

// kernel<<<grid, threads, 0, stream>>>(args...): checked as the vendor checks
// a launch, then enqueued; the arguments are copied now, as a launch does.
template <typename... Params, typename... Args>
void kg_launch(void (*kernel)(Params...), dim3 grid, unsigned threads, cudaStream_t stream, Args... args) {
    EmulatedDevice& d = EmulatedDevice::get();
    if (d.streams.count(stream) == 0) {
        d.fail(cudaErrorInvalidValue);
        return;
    }
    if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu ||
        grid.y > 65535 || grid.z > 65535) {
        d.fail(cudaErrorInvalidConfiguration);
        return;
    }
    const std::uint64_t seed = ++d.order_seed;
    stream->queue.push_back([=, &d] {
        ++d.launches;
        ::emu::launch_any_order(seed, ::emu::Dim3{grid.x, grid.y, grid.z}, threads, kernel, static_cast<Params>(args)...);
    });
}

struct KgVendor {
    static constexpr const char* kName = "gpu-emu";
    static constexpr const char* kUpper = "GPU-EMU";
    static std::string arch(const cudaDeviceProp&) { return "emulated"; }
    static std::string version(int) { return "none"; }
    static std::string compiler() { return "the host compiler"; }
    static const char* offload_archs() { return "none (CPU emulation)"; }
};

// A stand-in for the vendor BLAS (blas=emulated — not cuBLAS): an f32
// sgemm enqueued on the node's stream that picks its summation by the shape,
// as cuBLAS picks its kernel: for a product of at most 16 rows, K in four
// slices whose fma chains are added at the end (split-K), else one fma chain
// in ascending k; tf32=1 rounds the inputs to TF32's 10-bit fraction first.
// So a row's bits depend on the rows computed with it (batch-variant), and
// the host code's blas= path — its capabilities, attention as the
// composition of its own matmuls, experts one matmul at a time — runs here.
struct KgBlas {
    static constexpr bool kAvailable = true;
    static constexpr const char* kName = "emulated";
    static constexpr const char* kWhyAbsent = "";
    using Status = int;
    static constexpr Status kOk = 0;
    static const char* status_string(Status) { return "emulated BLAS: no stream (create not called)"; }
    Status create(cudaStream_t stream, bool tf32) {
        stream_ = stream;
        tf32_ = tf32;
        return kOk;
    }
    void destroy() noexcept { stream_ = nullptr; }
    // y[T, N] = x[T, K] · w[N, K]ᵀ, row-major, on the stream.
    Status sgemm_xwt(const float* x, const float* w, float* y, int t_count, int n_count, int k_count) {
        if (stream_ == nullptr) return 1;
        const bool tf32 = tf32_;
        stream_->queue.push_back([=] {
            ++EmulatedDevice::get().launches;
            const auto in = [tf32](float v) { return tf32 ? round_to_tf32(v) : v; };
            const int slices = t_count <= 16 && k_count >= 4 ? 4 : 1;
            const int chunk = (k_count + slices - 1) / slices;
            for (int t = 0; t < t_count; ++t)
                for (int n = 0; n < n_count; ++n) {
                    float sum = 0.0f;
                    for (int s = 0; s < slices; ++s) {
                        float acc = 0.0f;
                        for (int k = s * chunk; k < std::min(k_count, (s + 1) * chunk); ++k)
                            acc = std::fma(in(x[std::size_t(t) * k_count + k]), in(w[std::size_t(n) * k_count + k]), acc);
                        sum = s == 0 ? acc : sum + acc;
                    }
                    y[std::size_t(t) * n_count + n] = sum;
                }
        });
        return kOk;
    }
    static std::string version() { return "stand-in (tests/backend/gpu_emulated_runtime.hpp)"; }

private:
    // Round to nearest even at TF32's 10-bit fraction (finite values).
    static float round_to_tf32(float v) {
        std::uint32_t b;
        std::memcpy(&b, &v, sizeof b);
        if ((b & 0x7f800000u) == 0x7f800000u) return v;
        b += 0xfffu + ((b >> 13) & 1u);
        b &= ~0x1fffu;
        std::memcpy(&v, &b, sizeof v);
        return v;
    }
    cudaStream_t stream_ = nullptr;
    bool tf32_ = false;
};

}  // namespace kvasir::gpu_emu
