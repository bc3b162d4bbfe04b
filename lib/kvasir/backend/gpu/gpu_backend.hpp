// The GPU backends: `cuda` (NVIDIA) and `hip` (AMD ROCm), one source for both.
//
// How it is built (cmake/KvasirGpu.cmake): the host code in
// gpu_backend_impl.inc and the kernels in kernels/gpu/ops.cuh are compiled
// twice — by nvcc in cuda_backend.cu and by hipcc in hip_backend.hip — with
// kernels/gpu/vendor.hpp mapping the CUDA runtime names to HIP for the second.
// Each compilation lives in its own namespace (kvasir::gpu_cuda,
// kvasir::gpu_hip) and exports the two functions below, which the registry
// calls when KVASIR_HAVE_CUDA / KVASIR_HAVE_HIP is defined.
//
// Node spec: cuda[:DEVICE][:key=value,...] (hip likewise). Options:
//   storage=f32|f16|bf16   tensors rounded to this format on upload, by every
//                          kernel on output, and inside ops where a storage
//                          device would round (softmax's exponentials). Device
//                          buffers are f32 holding storage-rounded values: the
//                          same numbers a half/bfloat16 buffer holds, with no
//                          dependency on cuda_fp16/hip_fp16 conversion code.
//   acc=f32|f16            reduction precision. f16: the running sum is
//                          rounded to half after every add — bit-identical to
//                          cpu:acc=f16 in matmul.
//   nondeterministic=0|1   1: matmul splits K over up to 8 blocks that
//                          atomicAdd their partial sums, so the summation
//                          order, and the last bits, change from run to run.
//                          Capabilities say deterministic=false.
//   blas=cublas            (cuda only) matmul by cublasSgemm, the vendor fast
//   tf32=0|1               path; tf32=1 lets cuBLAS use TF32 tensor cores
//                          (inputs rounded to a 10-bit fraction). The node name
//                          always states tf32. hip has no vendor BLAS in this
//                          build: Debian 12 ships no hipBLAS (blas= is refused).
// Options are validated before the device is looked for, so a malformed spec
// is Error(bad_input) on every machine; a valid spec without a device is
// Error(unsupported) "no CUDA device: <why>".
//
// Numerics shared by both vendors (details in kernels/gpu/ops.cuh):
//   * f32 accumulation with explicit fmaf, one fixed order per reduction, no
//     compiler contraction: fma=true in the capabilities means exactly the
//     fmaf calls in the kernels (cuBLAS uses FFMA/tensor-core MMA likewise).
//   * exp, sin, cos are kvasir's own (kernels/gpu/math.cuh), not the vendors'
//     libm, so cuda and hip produce the same bits from the same inputs.
//   * Gated DeltaNet (causal_conv1d_silu, gated_delta_rule): kernels too —
//     the conv one thread per (token, channel), the delta rule one block per
//     value head with the tokens in order and the f32 state in global memory;
//     their sums in the acc= dtype (as the cpu node), the state f32 and never
//     rounded to storage. Checked on the CPU emulation only; never run on a GPU yet.
//   * causal_attention: attention_kernel, one block per (query row, head)
//     over the keys it sees, the bits of the node's own matmul/scale/softmax
//     composition; checked on the CPU emulation only.
//   * route(), moe_block() and add() are the Backend defaults built on these
//     ops (combine in f32 on the host, ascending expert order). Weights are
//     uploaded per call: nothing is cached on the device between ops.
#pragma once

#include "kvasir/backend/registry.hpp"

#include <memory>
#include <string>
#include <vector>

namespace kvasir {

// Devices of the vendor on this machine. No driver, no device, or a runtime
// that fails to initialise: an empty list and `reason` says why ("no CUDA
// device: cudaGetDeviceCount: cudaErrorNoDevice (no CUDA-capable device is
// detected)"). Never throws, never aborts.
std::vector<BackendDevice> cuda_probe(std::string& reason);
std::vector<BackendDevice> hip_probe(std::string& reason);

// Create a node from its spec (name "cuda"/"hip"). Error(bad_input) for a bad
// option or combination, Error(unsupported) when no such device exists,
// Error(backend_failure) when the runtime fails to set it up.
std::unique_ptr<Backend> make_cuda_backend(const BackendSpec& spec);
std::unique_ptr<Backend> make_hip_backend(const BackendSpec& spec);

}  // namespace kvasir
