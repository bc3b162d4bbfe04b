// The hip backend: the shared GPU host code and kernels compiled by hipcc —
// the same source as cuda_backend.cu, with kernels/gpu/vendor.hpp mapping the
// CUDA runtime names to HIP. This file only picks the vendor and exports the
// registry's two entry points (see gpu_backend.hpp).
#define KVASIR_GPU_VENDOR_HIP 1
#include "kvasir/backend/gpu/gpu_backend_impl.inc"

namespace kvasir {

std::vector<BackendDevice> hip_probe(std::string& reason) { return gpu_hip::probe(reason); }
std::unique_ptr<Backend> make_hip_backend(const BackendSpec& spec) { return gpu_hip::make_backend(spec); }

}  // namespace kvasir
