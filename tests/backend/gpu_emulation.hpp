// The GPU kernels (kernels/gpu/ops.cuh) compiled for the host, in namespace
// kvasir::gpu_host, to run on the CPU emulation of the CUDA execution model
// (gpu_thread_model.hpp: emu::launch) — the real kernel source, its tiling,
// bounds, reduction trees and split-K atomics, launched one by one:
// tests/backend/test_gpu.cpp's EmulatedKernels.* check what the kernels
// promise beyond the backend contract (one fma chain per output whatever the
// tiling, a grouped launch's jobs, split-K's slices).
//
// The GPU node itself — its host code and these kernels — runs on an
// emulated device as gpu-emu: gpu_emulated_node.hpp.
//
// Include this header in one translation unit per test binary, after every
// other header: it #defines the CUDA keywords (threadIdx, __global__, ...).
#pragma once

#include "tests/backend/gpu_thread_model.hpp"

#include "kernels/gpu/ops.cuh"  // and math.cuh, in namespace kvasir::gpu_host
