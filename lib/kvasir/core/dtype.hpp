// Element types and the exact conversions between them.
//
// Everything here is bit-exact and platform independent: software IEEE
// round-to-nearest-even, no reliance on compiler half types or on F16C. The
// SIMD kernels may use hardware conversions, which round the same way; tests
// pin the two together.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvasir {

enum class DType : std::uint8_t { f64, f32, f16, bf16, i32 };

std::size_t dtype_size(DType t) noexcept;
const char* dtype_name(DType t) noexcept;           // "f64", "f32", "f16", "bf16", "i32"
std::optional<DType> parse_dtype(std::string_view);  // accepts the names above, case-insensitive
bool dtype_is_float(DType t) noexcept;

// --- bit conversions -------------------------------------------------------
std::uint16_t f32_to_f16_bits(float x) noexcept;    // RNE; overflow → ±inf; NaN stays NaN (quiet)
float f16_bits_to_f32(std::uint16_t h) noexcept;    // exact
std::uint16_t f32_to_bf16_bits(float x) noexcept;   // RNE; NaN stays NaN (quiet)
float bf16_bits_to_f32(std::uint16_t h) noexcept;   // exact

// --- rounding in place -----------------------------------------------------
// Round a double to the nearest value representable in `t` (single rounding,
// RNE, IEEE overflow to ±inf, gradual underflow), returned as double. For f64
// this is the identity. This is how a backend "stores" a value at its storage
// precision and how f16 accumulation is emulated: acc = round_to(f16, acc + p).
double round_to(DType t, double x) noexcept;
double round_to_f16(double x) noexcept;
double round_to_bf16(double x) noexcept;
// OCP FP8 E4M3 ("e4m3fn": bias 7, 3 mantissa bits, subnormals down to 2^−9,
// no infinities), saturating: x rounded to the nearest representable value
// (ties to an even mantissa) and clamped to ±448, as a KV cache stored in fp8
// with scale 1 holds it. NaN stays NaN; ±0 keeps its sign.
double round_to_fp8_e4m3(double x) noexcept;
// ggml's nearest_int: the integer nearest f (ties to even) read from the
// mantissa of f + 1.5·2^23 — exact for |f| < 2^22, as llama.cpp computes it.
// ggml_nearest_int_of_product(a, b) is the same for a·b with the product
// contracted into the adder's FMA (rounded once), as llama.cpp's -O3
// -march=native build compiles nearest_int(a * b).
int ggml_nearest_int(float f) noexcept;
int ggml_nearest_int_of_product(float a, float b) noexcept;

// Read element i of a buffer of type t as double (exact for every float type).
double load_as_f64(DType t, const void* data, std::size_t i) noexcept;
// Store x into element i, rounding to t (integers: round-to-nearest, saturating).
void store_from_f64(DType t, void* data, std::size_t i, double x) noexcept;

}  // namespace kvasir
