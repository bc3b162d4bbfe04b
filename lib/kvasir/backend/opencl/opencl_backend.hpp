// opencl: every OpenCL device of every platform as an audit node — PoCL on a
// CPU here, Adreno/Mali phone GPUs and desktop GPUs elsewhere.
//
// Why this backend exists: its kernels are compiled at run time by the
// device's own OpenCL compiler (LLVM inside PoCL, the vendor's compiler on a
// phone) and reduce in the order a work-group wants, which is not the CPU's.
// Those are exactly the differences the audit has to see and bound.
//
// Devices. Numbered in one global order: all devices of platform 0 (in
// clGetDeviceIDs order), then platform 1, ... — "opencl:N" is the N-th. The
// order is the ICD loader's and is stable for one machine configuration.
//
// Spec: "opencl[:N][:storage=f32|f16|bf16,acc=f32|f16]" (N defaults to 0).
//   storage=f32   tensors are f32 buffers.
//   storage=f16   tensors live on the device as half buffers, read with
//                 vload_half and written with vstore_half_rte. Those are core
//                 OpenCL 1.x built-ins, so this variant works on EVERY device,
//                 with or without cl_khr_fp16: half is a memory format here,
//                 all arithmetic stays f32. Inputs are rounded to half on the
//                 host (single RNE rounding from the caller's dtype).
//   storage=bf16  OpenCL has no bf16 type: inputs are rounded to bf16 on the
//                 host (kvasir::round_to) and uploaded as the f32 values they
//                 represent; every kernel store rounds to bf16 (RNE, bit ops
//                 in common.cl), so results AND intermediates a kernel writes
//                 and reads back (softmax's exponentials) are what a
//                 bf16-storing device would hold.
//   acc=f16       the running sums of matmul, softmax and rmsnorm are `half`
//                 variables, rounded to half after every add (each step is
//                 fma in f32, then convert_half_rte — the contract of
//                 backend.hpp). Needs half ARITHMETIC, i.e. cl_khr_fp16; on a
//                 device without it (PoCL on x86 reports none) asking for it
//                 is Error(unsupported) naming the device.
//
// Numerics, stated so the capabilities can be honest:
//   * `#pragma OPENCL FP_CONTRACT OFF` in every program: OpenCL C may
//     otherwise contract a*b+c into one rounding at the compiler's whim,
//     which would make the result depend on the device compiler's mood. The
//     sums that SHOULD be fused (matmul's dot products, rmsnorm's sum of
//     squares) call fma() explicitly: Capabilities::fma = true. fma() is
//     correctly rounded on every conformant device (software-emulated where
//     the hardware lacks it: slower, never different).
//   * No fast-math flags (-cl-fast-relaxed-math, -cl-mad-enable, ...): only
//     "-cl-std=CL1.2" (CL1.1 on a 1.1-only device) plus our -D switches.
//     Division, sqrt, exp, pow, sin and cos therefore keep the accuracy the
//     OpenCL 1.2 spec guarantees in the full profile (§7.4, single precision):
//     x/y ≤ 2.5 ulp, sqrt ≤ 3 ulp, exp ≤ 3 ulp, pow ≤ 16 ulp, sin/cos ≤ 4 ulp;
//     + - * and fma are correctly rounded. tests/backend/test_opencl.cpp
//     derives its bounds from these figures.
//   * matmul: a 16×16 work-group (8×8 on devices whose work-groups are
//     smaller than 256) computes a 16×128 output tile; x and w tiles are
//     staged in local memory 16 columns of k at a time (TILE_K); each
//     work-item owns 8 consecutive outputs, each ONE fma chain over k in
//     ascending order. So the order differs from the cpu backend's 8
//     interleaved SIMD lanes (results are not bit-identical) while staying
//     deterministic and independent of the tile shape.
//   * softmax/rmsnorm: one work-group per row; each work-item reduces a
//     strided slice of the row, then a power-of-two tree in local memory.
//   * Gated DeltaNet (linear_attention.cl): causal_conv1d_silu is one
//     work-item per (t, c), the K taps one fma chain in ascending order, then
//     silu with the device's exp and division. gated_delta_rule is one
//     work-group (the row width) per value head running the tokens in
//     sequence: q/k l2norm (a strided fold plus a tree, as rmsnorm), softplus
//     (threshold 20), exp and sigmoid on the device, each work-item owning
//     state columns (dk-term fma chains). The recurrent state is an f32
//     buffer in EVERY storage variant: returned as f32 and uploaded exactly
//     when handed back (it is the op's carried result, not a stored
//     activation), so chunked and whole calls give the same bits. acc=f16
//     does not reach these ops (f32 sums, as on the cpu backend).
//   * causal_attention (attention.cl): one row-wide work-group per (query
//     row, head) over the keys that row sees — scores, the softmax and P·V in
//     the orders of matmul.cl and rows.cl, intermediates rounded to storage
//     where the composition stores them — so the composition's bits
//     (backend.hpp) without its [heads·T, S] score tensor. The kv heads are
//     stacked into one buffer on the host; head dims > 512 run the composition.
//     On a CPU device (PoCL: a work-group's items run one after another) with
//     f32 accumulation and head dims a multiple of 16, one work-item per
//     (query row, head) computes the same values by the same operations:
//     keys in 16-key panels laid out by the host, 16 chains per vector, the
//     softmax's strided partials and trees walked in order.
//   * Deterministic: no atomics, no split-K, fixed work-group shapes chosen
//     per device at backend creation.
//
// Programs are compiled once per (device context, source, build options) and
// cached for the life of the process; the per-device context, queue and cache
// are shared by all backends created for that device. A failing build is
// Error(backend_failure) carrying the first 40 lines of the device's build
// log. Every OpenCL call is checked; a failure is Error(backend_failure)
// naming the call, the CL error name and code, and file:line.
//
// The kernels live in kernels/opencl/*.cl and are embedded into the binary at
// build time (cmake/KvasirBackends.cmake generates a C++ source from them), so
// a binary never goes looking for .cl files at run time.
//
// Thread safety: one backend serialises its own ops; separate backends for
// the same device may be used from different threads (OpenCL API calls are
// thread safe, the program cache is locked, kernels are per backend).
#pragma once

#include "kvasir/backend/backend.hpp"
#include "kvasir/backend/registry.hpp"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

// Every device of every OpenCL platform, in the global order described above;
// BackendDevice::name is "<device name> (<platform name>)". Never throws: no
// ICD loader platform (CL_PLATFORM_NOT_FOUND_KHR, -1001), no device, or any
// failing query gives an empty list and sets `reason` to one line saying why.
std::vector<BackendDevice> opencl_probe(std::string& reason);

// Create a node from "opencl[:N][:storage=...,acc=...]".
//   Error(bad_input)     unknown option or value; device index out of range
//                        (the message lists the available devices).
//   Error(unsupported)   no OpenCL platform/device at all; acc=f16 on a device
//                        without cl_khr_fp16.
//   Error(backend_failure) context/queue creation or kernel build failed.
// Kernels are built lazily, on the first op that needs them.
std::unique_ptr<Backend> make_opencl_backend(const BackendSpec& spec);

// Test hook: compile arbitrary OpenCL C `source` for device `device` with
// `options` (plus -cl-std=...), bypassing the cache; returns normally when
// the build succeeds. A failure throws exactly what a kernel build failure in
// an op throws (Error(backend_failure) with the build log), which is what
// tests/backend/test_opencl.cpp checks by feeding it a syntax error.
void opencl_build_program_for_test(int device, std::string_view source, std::string_view options = {});

namespace opencl_embedded {
// Defined in a source generated at build time from kernels/opencl/*.cl:
// the text of kernels/opencl/<name> ("matmul.cl", ...), empty if no such file.
std::string_view kernel_source(std::string_view name);
// Space-separated names of the embedded files (for error messages).
std::string_view kernel_names();
}  // namespace opencl_embedded

}  // namespace kvasir
