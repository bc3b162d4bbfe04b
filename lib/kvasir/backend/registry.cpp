#include "kvasir/backend/registry.hpp"

#include "kvasir/backend/cpu_backends.hpp"
#include "kvasir/backend/fault.hpp"
#include "kvasir/core/error.hpp"

#include <fmt/format.h>

#include <functional>

#if defined(KVASIR_HAVE_OPENCL)
#include "kvasir/backend/opencl/opencl_backend.hpp"
#endif
#if defined(KVASIR_HAVE_CUDA) || defined(KVASIR_HAVE_HIP)
#include "kvasir/backend/gpu/gpu_backend.hpp"
#endif

namespace kvasir {
namespace {

struct BackendEntry {
    const char* name;
    const char* description;
    bool compiled;
    const char* not_compiled_reason;
    std::function<std::vector<BackendDevice>(std::string&)> probe;  // fills reason when no device
    std::function<std::unique_ptr<Backend>(const BackendSpec&)> make;
};

std::vector<BackendDevice> host_device(std::string&) { return {BackendDevice{0, host_cpu_description()}}; }

const std::vector<BackendEntry>& entries() {
    static const std::vector<BackendEntry> table = {
        {"cpu-ref", "f64 oracle: plain loops, f64 accumulation", true, "", host_device, make_cpu_ref_backend},
        {"cpu", "f32 SIMD + threads, FMA; variants storage=f32|f16|bf16, acc=f32|f16, fault=… (injection)", true, "",
         host_device, make_cpu_with_fault},
#if defined(KVASIR_HAVE_OPENCL)
        {"opencl", "OpenCL devices, kernels compiled at run time", true, "", opencl_probe, make_opencl_backend},
#else
        {"opencl", "OpenCL devices, kernels compiled at run time", false,
         "not compiled: no OpenCL ICD loader at build time", nullptr, nullptr},
#endif
#if defined(KVASIR_HAVE_CUDA)
        {"cuda", "NVIDIA GPUs, kernels shared with hip", true, "", cuda_probe, make_cuda_backend},
#else
        {"cuda", "NVIDIA GPUs, kernels shared with hip", false, "not compiled: nvcc not found at build time", nullptr,
         nullptr},
#endif
#if defined(KVASIR_HAVE_HIP)
        {"hip", "AMD GPUs (ROCm), same kernel source as cuda", true, "", hip_probe, make_hip_backend},
#else
        {"hip", "AMD GPUs (ROCm), same kernel source as cuda", false, "not compiled: hipcc not found at build time",
         nullptr, nullptr},
#endif
    };
    return table;
}

const BackendEntry* find_entry(std::string_view name) {
    for (const BackendEntry& e : entries())
        if (name == e.name) return &e;
    return nullptr;
}

}  // namespace

std::string known_backend_names() {
    std::string out;
    for (const BackendEntry& e : entries()) out += (out.empty() ? "" : ", ") + std::string(e.name);
    return out;
}

std::vector<BackendStatus> list_backends() {
    std::vector<BackendStatus> out;
    for (const BackendEntry& e : entries()) {
        BackendStatus s;
        s.name = e.name;
        s.description = e.description;
        s.compiled = e.compiled;
        if (!e.compiled) {
            s.reason = e.not_compiled_reason;
        } else {
            try {
                s.devices = e.probe(s.reason);
            } catch (const Error& err) {
                s.devices.clear();
                s.reason = err.what();
            }
            s.available = !s.devices.empty();
            if (!s.available && s.reason.empty()) s.reason = "no device found";
        }
        out.push_back(std::move(s));
    }
    return out;
}

std::unique_ptr<Backend> create_backend(const BackendSpec& spec) {
    const BackendEntry* e = find_entry(spec.name);
    if (e == nullptr)
        fail(ErrorCode::bad_input, "unknown backend '{}' (known: {})", spec.canonical(), known_backend_names());
    if (!e->compiled) fail(ErrorCode::unsupported, "backend '{}' is absent: {}", spec.canonical(), e->not_compiled_reason);
    return e->make(spec);
}

std::unique_ptr<Backend> create_backend(std::string_view spec) { return create_backend(BackendSpec::parse(spec)); }

std::vector<std::string> default_nodes() {
    std::vector<std::string> nodes;
    for (const BackendStatus& s : list_backends()) {
        if (!s.available) continue;
        if (s.name == "cpu-ref" || s.name == "cpu") {
            nodes.push_back(s.name);
            continue;
        }
        for (const BackendDevice& d : s.devices) nodes.push_back(fmt::format("{}:{}", s.name, d.index));
    }
    nodes.push_back("cpu:acc=f16");
    return nodes;
}

}  // namespace kvasir
