// The two CPU backends.
//
//  cpu-ref  the oracle: plain loops, every product and sum in f64, inputs read
//           exactly, results returned as f64. No FMA contraction (the whole
//           project builds with -ffp-contract=off), no reassociation.
//  cpu      the fast path a CPU node would run: f32 with AVX2/FMA kernels
//           (runtime dispatch, portable fallback), OpenMP threads over output
//           rows so results do not depend on the thread count. Variants:
//             storage=f32|f16|bf16  tensors rounded to this between ops
//             acc=f32|f16           f16: the running sum is rounded to half
//                                   after every accumulate (emulates an
//                                   F16-accumulating device, bit for bit)
//             threads=N             OpenMP threads (default: all)
#pragma once

#include "kvasir/backend/backend.hpp"

#include <memory>

namespace kvasir {

std::unique_ptr<Backend> make_cpu_ref_backend(const BackendSpec& spec);
std::unique_ptr<Backend> make_cpu_backend(const BackendSpec& spec);

// Short description of the host CPU ("AMD EPYC, 2 threads, avx2 fma f16c").
std::string host_cpu_description();

}  // namespace kvasir
