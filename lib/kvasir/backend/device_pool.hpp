// Device memory a node reuses (issue #38): the buffers an op frees are kept
// by size and handed to the next op that asks for that size, so a warm
// forward pass allocates nothing — cudaFree synchronises the whole device
// and cudaMalloc / clCreateBuffer take the driver's locks, per op, which is
// a large share of what a GPU node spent outside its kernels. Written once
// for every device backend (OpenCL, and the CUDA/HIP source
// gpu_backend_impl.inc) and device agnostic: a buffer is an opaque handle
// (a cl_mem, a device pointer) and the backend gives the function that
// frees one; compiled once by the host compiler (device_pool.cpp), as
// weight_cache.cpp is, so the GPU compilers see no template of it.
//
// Sizes are kept in classes of 256 bytes (cudaMalloc's alignment): a buffer
// of a class serves any request of that class, exactly — activations of one
// shape recur at every layer and step. Bounded: at most `cap` bytes are kept
// idle; a buffer given back beyond that is freed at once, and a node whose
// allocation fails frees every idle buffer and tries once more. Reuse is safe on
// one in-order queue or stream: an op enqueued after a buffer came back runs
// after every use of it that was enqueued before.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace kvasir {

class DevicePool {
public:
    using Release = void (*)(void* handle);  // frees one device allocation; never throws

    DevicePool(std::uint64_t cap_bytes, Release release) : cap_(cap_bytes), release_(release) {}
    ~DevicePool();  // frees every idle buffer
    DevicePool(const DevicePool&) = delete;
    DevicePool& operator=(const DevicePool&) = delete;

    // `bytes` rounded up to its class (a multiple of 256, at least 256).
    static std::uint64_t size_class(std::uint64_t bytes);
    // An idle buffer of exactly this class (`bytes` is a class), or null:
    // the caller allocates one of `bytes` and gives it back here when done.
    void* take(std::uint64_t bytes);
    // Keeps `handle` (a buffer of class `bytes`) idle for reuse, or frees it
    // when that would keep more than the cap.
    void give(void* handle, std::uint64_t bytes);

    // Frees every idle buffer: what a node does before it retries an
    // allocation the device refused (the idle buffers may be what it lacks).
    void release_idle();

    std::uint64_t idle_bytes() const { return idle_bytes_; }
    std::uint64_t reused() const { return reused_; }  // takes served from the idle buffers

private:
    std::uint64_t cap_;
    Release release_;
    std::map<std::uint64_t, std::vector<void*>> idle_;
    std::uint64_t idle_bytes_ = 0, reused_ = 0;
};

// The default cap: this share of the device's memory, at most 1 GiB.
std::uint64_t default_device_pool_cap(std::uint64_t device_memory_bytes);

}  // namespace kvasir
