// The vendor shim: the ONLY file where CUDA and HIP differ.
//
// Shared GPU code (kernels/gpu/ops.cuh, lib/kvasir/backend/gpu/gpu_backend_impl.inc)
// is written once against CUDA runtime names. A translation unit selects its
// vendor by defining exactly one of
//   KVASIR_GPU_VENDOR_CUDA   compiled by nvcc  (lib/kvasir/backend/gpu/cuda_backend.cu)
//   KVASIR_GPU_VENDOR_HIP    compiled by hipcc (lib/kvasir/backend/gpu/hip_backend.hip)
//   KVASIR_GPU_VENDOR_EMU    compiled by the host compiler for the tests: the
//                            same host code and kernels on the CPU emulation of
//                            the GPU (tests/backend/gpu_emulated_runtime.hpp,
//                            which declares the runtime names itself)
// before including this header. For HIP every cudaX used by the shared code
// is #defined to its hipX twin (the two APIs are deliberately congruent; the
// list below is exactly what the shared code uses — add a line when you use a
// new call). Kernel syntax (__global__, <<<>>>, __shared__, __syncthreads,
// atomicAdd) is common to both compilers and needs no mapping.
//
// Besides names, a vendor provides (struct KgVendor):
//   kName / kUpper       "cuda"/"CUDA" or "hip"/"HIP", for node names and messages
//   arch(prop)           "sm_90" (compute capability) or "gfx90a:sramecc+:xnack-" (gcnArchName)
//   version(v)           decodes the runtime/driver version integer
//   compiler()           the device compiler that built this object
//   offload_archs()      the device code this object carries
// and a vendor BLAS (struct KgBlas): cuBLAS for CUDA; for HIP it reports
// itself unavailable (Debian 12 ships no hipBLAS), and the backend refuses
// blas= before ever calling it.
//
// Everything compiled for a vendor lives in namespace kvasir::KG_NS
// (gpu_cuda / gpu_hip), so the two objects link into one binary.
#pragma once

#if defined(KVASIR_GPU_VENDOR_CUDA) + defined(KVASIR_GPU_VENDOR_HIP) + defined(KVASIR_GPU_VENDOR_EMU) != 1
#error "define exactly one of KVASIR_GPU_VENDOR_CUDA, KVASIR_GPU_VENDOR_HIP and KVASIR_GPU_VENDOR_EMU"
#endif

#include <cstdio>
#include <string>

// The device code this object carries, e.g. "sm_80 sm_90 compute_90"; set by
// cmake/KvasirGpu.cmake and shown in the capabilities.
#ifndef KVASIR_GPU_OFFLOAD_ARCHS
#define KVASIR_GPU_OFFLOAD_ARCHS "unknown"
#endif

#if defined(KVASIR_GPU_VENDOR_EMU)  // ------------------------------------------ EMU

// The runtime names, kg_launch, KgVendor and KgBlas are declared in
// kvasir::gpu_emu by tests/backend/gpu_emulated_runtime.hpp, included first.
#define KG_NS gpu_emu

#elif defined(KVASIR_GPU_VENDOR_HIP)  // ---------------------------------------- HIP

#include <hip/hip_runtime.h>

#define KG_NS gpu_hip

#define cudaDeviceProp hipDeviceProp_t
#define cudaDriverGetVersion hipDriverGetVersion
#define cudaError_t hipError_t
#define cudaFree hipFree
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaGetErrorName hipGetErrorName
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaMalloc hipMalloc
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemsetAsync hipMemsetAsync
#define cudaRuntimeGetVersion hipRuntimeGetVersion
#define cudaSetDevice hipSetDevice
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStream_t hipStream_t
#define cudaSuccess hipSuccess

namespace kvasir::KG_NS {

struct KgVendor {
    static constexpr const char* kName = "hip";
    static constexpr const char* kUpper = "HIP";
    static std::string arch(const hipDeviceProp_t& p) { return p.gcnArchName; }
    // HIP_VERSION layout: major·10^7 + minor·10^5 + patch.
    static std::string version(int v) {
        return std::to_string(v / 10000000) + "." + std::to_string(v / 100000 % 100) + "." + std::to_string(v % 100000);
    }
    static std::string compiler() {
        return "hipcc " + std::to_string(HIP_VERSION_MAJOR) + "." + std::to_string(HIP_VERSION_MINOR) + " (clang " +
               __clang_version__ + ")";
    }
    static const char* offload_archs() { return KVASIR_GPU_OFFLOAD_ARCHS; }
};

// No vendor BLAS in this build: Debian 12 has no libhipblas-dev/librocblas-dev.
struct KgBlas {
    static constexpr bool kAvailable = false;
    static constexpr const char* kName = "hipblas";
    static constexpr const char* kWhyAbsent = "hipBLAS is not built in (Debian 12 ships no libhipblas-dev)";
    using Status = int;
    static constexpr Status kOk = 0;
    static const char* status_string(Status) { return "hipBLAS not built"; }
    Status create(hipStream_t, bool) { return 1; }
    void destroy() noexcept {}
    Status sgemm_xwt(const float*, const float*, float*, int, int, int) { return 1; }
    static std::string version() { return "none"; }
};

}  // namespace kvasir::KG_NS

#else  // ---------------------------------------------------------------------- CUDA

#include <cublas_v2.h>
#include <cuda_runtime.h>

#define KG_NS gpu_cuda

namespace kvasir::KG_NS {

struct KgVendor {
    static constexpr const char* kName = "cuda";
    static constexpr const char* kUpper = "CUDA";
    static std::string arch(const cudaDeviceProp& p) { return "sm_" + std::to_string(p.major * 10 + p.minor); }
    // CUDA version layout: major·1000 + minor·10.
    static std::string version(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }
    static std::string compiler() {
        return "nvcc " + std::to_string(__CUDACC_VER_MAJOR__) + "." + std::to_string(__CUDACC_VER_MINOR__) + "." +
               std::to_string(__CUDACC_VER_BUILD__);
    }
    static const char* offload_archs() { return KVASIR_GPU_OFFLOAD_ARCHS; }
};

// cuBLAS sgemm, the vendor fast path. tf32: CUBLAS_TF32_TENSOR_OP_MATH lets
// cuBLAS round the inputs to TF32 (10-bit fraction, u = 2^-11) for tensor
// cores while accumulating in f32; off, CUBLAS_DEFAULT_MATH is cuBLAS's
// ordinary f32 SGEMM (TF32 only when asked for; NVIDIA_TF32_OVERRIDE can only
// disable it). cuBLAS documents bit-wise reproducible results run to run on
// one GPU model with one stream per handle, which is what a node has.
struct KgBlas {
    static constexpr bool kAvailable = true;
    static constexpr const char* kName = "cublas";
    static constexpr const char* kWhyAbsent = "";
    using Status = cublasStatus_t;
    static constexpr Status kOk = CUBLAS_STATUS_SUCCESS;
    static const char* status_string(Status s) { return cublasGetStatusString(s); }

    Status create(cudaStream_t stream, bool tf32) {
        Status s = cublasCreate(&handle_);
        if (s != kOk) return s;
        s = cublasSetStream(handle_, stream);
        if (s != kOk) return s;
        return cublasSetMathMode(handle_, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    }
    void destroy() noexcept {
        if (handle_ != nullptr) (void)cublasDestroy(handle_);
        handle_ = nullptr;
    }
    // y[T, N] = x[T, K] · w[N, K]ᵀ, all row-major. cuBLAS is column-major, so
    // it computes yᵀ[N, T] = w · xᵀ: A = w read as K×N column-major and
    // transposed, B = x read as K×T column-major.
    Status sgemm_xwt(const float* x, const float* w, float* y, int t_count, int n_count, int k_count) {
        const float one = 1.0f, zero = 0.0f;
        return cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, n_count, t_count, k_count, &one, w, k_count, x, k_count,
                           &zero, y, n_count);
    }
    static std::string version() {
        return std::to_string(CUBLAS_VER_MAJOR) + "." + std::to_string(CUBLAS_VER_MINOR) + "." +
               std::to_string(CUBLAS_VER_PATCH);
    }

private:
    cublasHandle_t handle_ = nullptr;
};

}  // namespace kvasir::KG_NS

#endif

#if !defined(KVASIR_GPU_VENDOR_EMU)
namespace kvasir::KG_NS {

// kernel<<<grid, threads, 0, stream>>>(args...): the shared host code's one
// launch statement (a launch through the kernel's host address, as both
// compilers allow). The emulation's kg_launch enqueues the kernel on its
// stream for the CPU instead.
template <typename... Params, typename... Args>
void kg_launch(void (*kernel)(Params...), dim3 grid, unsigned threads, cudaStream_t stream, Args... args) {
    kernel<<<grid, threads, 0, stream>>>(args...);
}

}  // namespace kvasir::KG_NS
#endif
