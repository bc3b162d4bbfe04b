// The cuda backend: the shared GPU host code and kernels compiled by nvcc.
// Everything is in gpu_backend_impl.inc; this file only picks the vendor and
// exports the registry's two entry points (see gpu_backend.hpp).
#define KVASIR_GPU_VENDOR_CUDA 1
#include "kvasir/backend/gpu/gpu_backend_impl.inc"

namespace kvasir {

std::vector<BackendDevice> cuda_probe(std::string& reason) { return gpu_cuda::probe(reason); }
std::unique_ptr<Backend> make_cuda_backend(const BackendSpec& spec) { return gpu_cuda::make_backend(spec); }

}  // namespace kvasir
