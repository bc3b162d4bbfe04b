// ggml tensor types and their dequantisation to f32.
//
// A GGUF tensor stores its elements in one of ggml's types: plain floats
// (F32, F16, BF16), integers, or block-quantised formats in which a fixed
// number of consecutive elements of one row (the "block": 32 for Q8_0, 256
// for the "K" super-blocks) share scale factors. Everything the audit does
// happens on f32/f64 values, so quantised weights are expanded here once, on
// the CPU, exactly as the reference implementation expands them.
//
// Exactness. The output is bit-identical to the public reference (ggml's
// dequantize_row_* and the `gguf` Python package's gguf/quants.py), and not by
// luck of operation order: every product these formats form is exact in f32.
// An f16 scale has an 11-bit significand; Q8_0's int8 quant adds ≤ 8 bits;
// Q4_K's d·sc·q adds 6 + 4 bits (≤ 21 in all) and dmin·m 6 bits; Q6_K's
// d·scale·q adds 7 + 6 bits (≤ 24). So each value is the correctly rounded
// result of the exact real expression — one rounding at most, in Q4_K's final
// subtraction — and any evaluation order, with or without FMA, gives the same
// bits. tests/model/test_gguf.cpp checks every fixture tensor at 0 ulp against
// gguf.quants.dequantize. (A non-finite f16 scale yields inf/NaN as in the
// reference; NaN payloads are then not compared.)
//
// Block layouts (little-endian; "f16" is an IEEE binary16 scale):
//   Q8_0  32 elements / 34 bytes:  f16 d, int8 q[32];            y = q·d
//   Q5_0  32 elements / 22 bytes:  f16 d, u32 qh, u8 qs[16];     y = (q − 16)·d, q 5 bits
//   Q4_K 256 elements / 144 bytes: f16 d, f16 dmin, u8 scales[12], u8 qs[128]
//         eight sub-blocks of 32, each with a 6-bit scale sc and 6-bit min m
//         (packed as described in dequantize_row_q4_k); sub-block 2p takes the
//         low nibbles of qs[32p..32p+31], sub-block 2p+1 the high nibbles;
//         y = (d·sc)·q − (dmin·m)
//   Q6_K 256 elements / 210 bytes: u8 ql[128], u8 qh[64], int8 scales[16], f16 d
//         a 6-bit q = low 4 bits from ql, high 2 bits from qh, minus 32;
//         sixteen sub-blocks of 16 with an int8 scale each; y = (d·scale)·q
#pragma once

#include "kvasir/core/tensor.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace kvasir {

// ggml's type ids as stored in a GGUF tensor info. Ids that no current ggml
// assigns (4 and 5 were the removed Q4_2/Q4_3, 31–33 and 36–38 the removed
// repacked variants) are not listed: a file using them is rejected.
enum class GgmlType : std::uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
    Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
    IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
    I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
    TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40, Q1_0 = 41,
};

// Storage geometry of a type: `block_size` consecutive elements of one row
// occupy `block_bytes` bytes. Plain types have block_size 1.
struct GgmlTypeTraits {
    GgmlType type;
    std::string_view name;    // ggml's spelling: "F32", "Q4_K", "BF16", ...
    std::uint32_t block_size;
    std::uint32_t block_bytes;
};

// Traits of a raw type id read from a file; nullopt for an id ggml does not
// define (the caller reports it as an unknown type).
std::optional<GgmlTypeTraits> ggml_type_traits(std::uint32_t id) noexcept;
// Traits of a known type (never fails for an enumerator).
GgmlTypeTraits ggml_traits(GgmlType type) noexcept;
// "Q4_K" etc.; "?" for a value outside the enumeration.
std::string_view ggml_type_name(GgmlType type) noexcept;

// Whether dequantize_row() (and gguf.hpp's dequantize()) handle `type`: F32, F16, BF16,
// Q8_0, Q5_0, Q4_K, Q6_K and MXFP4. Other known types can be listed (inspect) but not
// expanded.
bool ggml_type_dequantizable(GgmlType type) noexcept;
// The dequantizable types as one comma-separated string, for error messages.
std::string_view ggml_dequantizable_types() noexcept;

// Expand `n` elements (a whole number of blocks) stored at `src` into f32 at
// `dst`. `src` needs no alignment (reads go through memcpy: GGUF offsets are
// aligned only to the file's alignment, which may be 1). The caller
// guarantees that src holds n / block_size · block_bytes readable bytes.
// Throws Error(unsupported) for a type outside ggml_type_dequantizable() and
// Error(internal) when n is not a multiple of the block size.
void dequantize_row(GgmlType type, const std::byte* src, float* dst, std::int64_t n);

// The per-format kernels (same contract as dequantize_row, n a multiple of
// the format's block size). Exposed for tests and for backends that want to
// expand one row at a time.
void dequantize_row_q8_0(const std::byte* src, float* dst, std::int64_t n) noexcept;
void dequantize_row_q5_0(const std::byte* src, float* dst, std::int64_t n) noexcept;
void dequantize_row_q4_k(const std::byte* src, float* dst, std::int64_t n) noexcept;
void dequantize_row_q6_k(const std::byte* src, float* dst, std::int64_t n) noexcept;
// MXFP4 as ggml stores it (block_mxfp4, 32 elements / 17 bytes): u8 e (e8m0),
// u8 qs[16]; y[j] = kvalues[qs[j] & 15]·2^(e−128) and y[j+16] =
// kvalues[qs[j] >> 4]·2^(e−128), kvalues = 2·e2m1 (ggml's
// dequantize_row_mxfp4 and gguf.quants.MXFP4). Every product is exact in
// f32 (a 2-bit significand times a power of two) except where it overflows.
void dequantize_row_mxfp4(const std::byte* src, float* dst, std::int64_t n) noexcept;
// ggml_e8m0_to_fp32_half: an MXFP4 block's scale 2^(e − 128), built from its
// bits (a denormal for e < 2) — what its quants are multiplied by.
float e8m0_half(std::uint8_t e) noexcept;
// ggml's kvalues_mxfp4: e2m1 doubled, as int8 — nibble 8 is +0, not −0.
inline constexpr float kMxfp4Kvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// MXFP4 as Hugging Face checkpoints store it (gpt-oss `*_blocks` U8 [..., G, 16]
// and `*_scales` U8 [..., G]): `groups` groups of 32 values; byte j of group g
// holds value 2j in its low nibble and 2j+1 in its high nibble, e2m1
// (transformers' FP4_VALUES), scaled by 2^(scale − 127) — transformers'
// _convert_moe_packed_tensors (integrations/mxfp4.py) bit for bit: each
// value is ldexp(e2m1, scale − 127), exact (down to f32 denormals), ±inf only
// where it overflows (scale 255 with |v| ≥ 1). dst holds groups·32 floats.
void dequantize_mxfp4_hf(const std::uint8_t* blocks, const std::uint8_t* scales, std::int64_t groups,
                         float* dst) noexcept;

// An MXFP4 pair of a Hugging Face checkpoint, checked: both U8, blocks
// [P..., R, G, 16] and scales [P..., R, G] with `want_rows` = P…·R rows of
// `want_cols` = 32·G values (the config's shape), raw sizes as the shapes say.
// Error(bad_input) "FILE: MXFP4 tensor 'NAME' ..." naming the tensor
// otherwise. The rows come out as views of the two raw buffers.
struct Mxfp4Pair {
    const std::uint8_t* blocks = nullptr;  // rows × groups × 16 bytes
    const std::uint8_t* scales = nullptr;  // rows × groups bytes
    std::int64_t rows = 0, groups = 0;
    // Row r expanded to groups·32 floats at dst (dequantize_mxfp4_hf).
    void row(std::int64_t r, float* dst) const noexcept;
};
struct SafetensorsTensorInfo;
Mxfp4Pair check_mxfp4_pair(const std::string& file, const SafetensorsTensorInfo& blocks, std::span<const std::byte> blocks_raw,
                           const SafetensorsTensorInfo& scales, std::span<const std::byte> scales_raw,
                           const Shape& blocks_shape);


}  // namespace kvasir
