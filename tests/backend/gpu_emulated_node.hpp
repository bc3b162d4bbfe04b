// The GPU backend itself — gpu_backend_impl.inc's host code, its kernels —
// on the CPU emulation of a GPU (gpu_emulated_runtime.hpp): what cuda:N and
// hip:N run, without the device. Spec "gpu-emu[:0][:storage=…,acc=…,
// nondeterministic=1,weight_cache=MiB,resident=0,blas=emulated,tf32=0|1]",
// the options of cuda:N, blas=emulated being the runtime's stand-in BLAS
// (gpu_emulated_runtime.hpp, not cuBLAS); node names "gpu-emu:0…".
//
// Defined in gpu_emulated_node.cpp, linked into the test binaries that use
// it (CMakeLists.txt, kvasir_gpu_emulated_node).
#pragma once

#include "kvasir/backend/backend.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace kvasir::test {

std::unique_ptr<Backend> make_emulated_gpu_node(const std::string& spec);

// A node from any spec: the registry's create_backend, and
// make_emulated_gpu_node for "gpu-emu…" (a node the registry does not know).
std::unique_ptr<Backend> create_node(const std::string& spec);

// What the emulated device has seen, summed over every node of the process.
struct EmulatedDeviceCounts {
    std::uint64_t launches = 0;   // kernels run
    std::uint64_t syncs = 0;      // host waits for a stream
    std::uint64_t mallocs = 0;    // cudaMalloc calls that succeeded
    std::uint64_t frees = 0;      // cudaFree calls that succeeded
    std::uint64_t live_bytes = 0; // held by cudaMalloc'd buffers now
};
EmulatedDeviceCounts emulated_device_counts();

// The device's memory (totalGlobalMem; cudaMalloc fails beyond it): for the
// nodes made after the call. Returns the previous limit.
std::uint64_t set_emulated_device_memory(std::uint64_t bytes);

}  // namespace kvasir::test
