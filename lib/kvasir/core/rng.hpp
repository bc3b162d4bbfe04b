// Seeded, bit-reproducible inputs.
//
// Every node of an audit regenerates its inputs from (seed, tensor name)
// instead of receiving them, so the generator must give the same bits on every
// machine, compiler and thread count, and must be reproducible outside C++
// (scripts/rng_reference.py is an independent stdlib-only Python version; it
// writes fixtures/rng_vectors.json, which tests/core/test_rng.cpp replays).
//
// ---------------------------------------------------------------------------
// The exact definition (version "kvasir-rng/1"). Changing anything below
// changes every input of every audit: bump the version and regenerate the
// fixtures.
// ---------------------------------------------------------------------------
//
// Block function: Philox4x32-10 (Salmon et al., SC'11) with the Random123
//   constants: round multipliers M0 = 0xD2511F53, M1 = 0xCD9E8D57; Weyl key
//   increments W0 = 0x9E3779B9, W1 = 0xBB67AE85; 10 rounds. One round maps
//   (c0,c1,c2,c3) with key (k0,k1) to
//     (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0))
//   where hi/lo are the upper/lower 32 bits of the 64-bit product; the key is
//   bumped (k0 += W0, k1 += W1, mod 2^32) between rounds (9 bumps in all).
//   rng.cpp calls Random123's r123::Philox4x32_R<10> (Debian librandom123-dev)
//   for it; the tensor fill's block kernel (rng_math.hpp, compiled per ISA)
//   runs the same rounds in SIMD lanes and is tested against it; the
//   definition is spelled out here for scripts/rng_reference.py.
//
// Stream of a tensor: stream = tensor_stream_id(name) = FNV-1a 64 over the
//   name's bytes (UTF-8 as given, no normalisation, no terminator):
//   h = 0xcbf29ce484222325; for each byte: h ^= byte; h *= 0x100000001b3.
//
// Element i (i = 0, 1, 2, ... the flat row-major index in a tensor):
//   block b = i / 4, lane l = i % 4,
//   key     = (seed & 0xffffffff, seed >> 32),
//   counter = (b & 0xffffffff, b >> 32, stream & 0xffffffff, stream >> 32),
//   bits(i) = philox4x32_10(counter, key)[l].
//
// Uniform: uniform(i) = (bits(i) + 0.5) * 2^-32, computed in double (exact:
//   33 significant bits). Strictly inside (0,1): min 2^-33, max 1 - 2^-33.
//
// Normal (Box–Muller on lane pairs of the same block): lanes (0,1) form one
//   pair and lanes (2,3) the other. For a pair with uniforms (ua, ub) taken
//   from its first and second lane:
//     r = sqrt(-2 * det_log(ua)),
//     (s, c) = det_sincos_2pi(ub)           (sin and cos of 2*pi*ub)
//     normal of the first lane = r * c, of the second lane = r * s.
//   All in double; sqrt is IEEE (correctly rounded). |z| <= sqrt(66 ln 2) ≈ 6.77.
//
// Tensors: seeded_normal writes mean + stddev * normal(i) and seeded_uniform
//   writes lo + (hi - lo) * uniform(i), both evaluated in double in exactly
//   that order, then rounded ONCE (RNE) to the tensor dtype (kvasir::round_to
//   semantics; f32 by the IEEE double->float conversion). Rounding can land a
//   uniform on lo or hi itself.
//
// ---------------------------------------------------------------------------
// Why no libm: std::log/std::sin differ in the last bit between glibc, musl,
// Apple, MSVC and GPU runtimes, which would make "the same input" differ per
// node. det_log and det_sincos_2pi use only +, -, *, / and exact exponent
// manipulation, in a fixed order, so any IEEE-754 binary64 implementation
// without excess precision or contraction (this project builds with
// -ffp-contract=off; Python floats never fuse) gets identical bits.
//
// det_log(x): x = m * 2^k with m in [sqrt(1/2), sqrt(2)): take the frexp
//   mantissa mf in [0.5, 1) and exponent k; if mf < 0x1.6a09e667f3bcdp-1 then
//   m = 2*mf, k = k - 1, else m = mf. Then, in this order:
//     f = m - 1 (exact), s = f / (2 + f), z = s*s, hfsq = 0.5*f*f,
//     p = L1 + z*(L2 + z*(L3 + ... + z*(L10 + z*L11))), R = z*p,
//     log x = k*LN2_HI + (f - (hfsq - (s*(hfsq + R) + k*LN2_LO))),
//   Lj = 2/(2j+1) rounded to double (atanh series), LN2_HI = ln 2 truncated to
//   32 bits (k*LN2_HI is exact), LN2_LO = the double nearest ln 2 - LN2_HI.
// det_sincos_2pi(u): q = floor(4u + 0.5), f = u - q*0.25 (exact, |f| <= 1/8),
//   z = f*f, ps = S1 + z*(S2 + ... + z*S9), sn = f*H + f*(T + z*ps),
//   pc = C1 + z*(C2 + ... + z*C10), cs = 1 + z*pc, where Sj / Cj are the
//   doubles nearest the Taylor coefficients -+(2 pi)^n / n! of sin(2 pi f)
//   (n = 3..19) and cos(2 pi f) (n = 2..20), H = 2 pi truncated to 20 bits
//   (f*H is exact for every f on the 2^-33 grid of uniform()) and T = the
//   double nearest 2 pi - H. The quadrant q mod 4 then gives (sin, cos) =
//   (sn, cs), (cs, -sn), (-sn, -cs), (-cs, sn) for 0, 1, 2, 3.
//   The hex values of every constant are in rng.cpp and in the script, which
//   re-derives each of them from exact rationals.
//
// Accuracy, measured against long-double logl/sinl/cosl (sin/cos on the
// exactly reduced argument) over every 61st of the 2^32 possible uniforms:
// det_log max 0.84 ulp (also < 0.8 ulp on samples of the whole double range),
// det_sincos_2pi max 1.31 ulp. test_rng.cpp (DetMath.*) asserts < 1 ulp and
// < 1.5 ulp on its own samples.
#pragma once

#include "kvasir/core/tensor.hpp"

#include <array>
#include <cstdint>
#include <string_view>

namespace kvasir {

// Philox4x32-10 block: 4 words of output for one counter under one key.
std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter,
                                           std::array<std::uint32_t, 2> key) noexcept;

// FNV-1a 64 of the name's bytes: the per-tensor stream of the counter.
std::uint64_t tensor_stream_id(std::string_view name) noexcept;

// The deterministic transcendental functions of the normal transform (see
// above). det_log is defined for every double: log(+0) = -inf, log(x<0) = NaN,
// log(+inf) = +inf. det_sincos_2pi expects u in [0,1] (what uniform() gives);
// outside that the quadrant reduction still runs but is no longer exact.
double det_log(double x) noexcept;
void det_sincos_2pi(double u, double& sin_out, double& cos_out) noexcept;

// (seed, tensor name) -> an infinite, randomly indexable sequence.
class SeededStream {
public:
    SeededStream(std::uint64_t seed, std::string_view tensor_name) noexcept;

    std::uint32_t bits(std::uint64_t i) const noexcept;  // 32 random bits of element i
    double uniform(std::uint64_t i) const noexcept;      // in the open interval (0,1)
    double normal(std::uint64_t i) const noexcept;       // standard normal

    // Block b = elements 4b .. 4b+3 at once (what the tensor fill uses).
    std::array<std::uint32_t, 4> block(std::uint64_t b) const noexcept;
    static std::array<double, 4> normals_of_block(const std::array<std::uint32_t, 4>& bits) noexcept;

    std::uint64_t seed() const noexcept { return seed_; }
    std::uint64_t stream() const noexcept { return stream_; }

private:
    std::uint64_t seed_;
    std::uint64_t stream_;
};

double uniform_from_bits(std::uint32_t bits) noexcept;  // (bits + 0.5) * 2^-32

// Tensors of a float dtype (f64/f32/f16/bf16; i32 is refused with bad_input),
// element i = the flat row-major index. `threads` = 0 uses
// std::thread::hardware_concurrency(); the result is bit-identical for every
// thread count. Throws bad_input for a non-finite mean/stddev/lo/hi or lo > hi.
Tensor seeded_normal(std::uint64_t seed, std::string_view name, Shape shape, double mean, double stddev,
                     DType dtype = DType::f32, unsigned threads = 0);
Tensor seeded_uniform(std::uint64_t seed, std::string_view name, Shape shape, double lo, double hi,
                      DType dtype = DType::f32, unsigned threads = 0);

// The tensor fill's own f16/bf16 encoders (single RNE rounding from double,
// bit-identical to store_from_f64 for every non-NaN input); exposed for tests.
namespace rng_detail {
std::uint16_t f16_bits(double x) noexcept;
std::uint16_t bf16_bits(double x) noexcept;
}  // namespace rng_detail

}  // namespace kvasir
