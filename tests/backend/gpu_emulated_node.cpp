// The GPU backend's host code (lib/kvasir/backend/gpu/gpu_backend_impl.inc)
// and kernels compiled by the host compiler for the CPU emulation of a GPU:
// the same source nvcc and hipcc compile, with kernels/gpu/vendor.hpp's third
// vendor, whose runtime is tests/backend/gpu_emulated_runtime.hpp.
#include "tests/backend/gpu_emulated_node.hpp"

// Every header the host code includes, before the runtime #defines the CUDA
// keywords.
#include "kvasir/backend/device_pool.hpp"
#include "kvasir/backend/gpu/gpu_backend.hpp"
#include "kvasir/backend/registry.hpp"
#include "kvasir/backend/weight_cache.hpp"
#include "kvasir/core/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tests/backend/gpu_emulated_runtime.hpp"  // last: it #defines the CUDA keywords

#define KVASIR_GPU_VENDOR_EMU 1
#include "kvasir/backend/gpu/gpu_backend_impl.inc"

namespace kvasir::test {

std::unique_ptr<Backend> make_emulated_gpu_node(const std::string& spec) {
    return gpu_emu::make_backend(BackendSpec::parse(spec));
}

std::unique_ptr<Backend> create_node(const std::string& spec) {
    return BackendSpec::parse(spec).name == gpu_emu::KgVendor::kName ? make_emulated_gpu_node(spec) : create_backend(spec);
}

EmulatedDeviceCounts emulated_device_counts() {
    const gpu_emu::EmulatedDevice& d = gpu_emu::EmulatedDevice::get();
    return {d.launches, d.syncs, d.mallocs, d.frees, d.allocated};
}

std::uint64_t set_emulated_device_memory(std::uint64_t bytes) {
    return std::exchange(gpu_emu::EmulatedDevice::get().memory_limit, bytes);
}

}  // namespace kvasir::test
