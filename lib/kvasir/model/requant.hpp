// Quantisation to ggml block formats, as llama.cpp's llama-quantize writes
// them: the other direction of quant.hpp, for the substitution variants that
// stand for a worker running a re-quantised copy of the model
// (steps/substitution.hpp, `cpu:requant=q4_k`).
//
// Bits. Each quantiser reproduces ggml's reference quantiser
// (quantize_row_q8_0_ref, quantize_row_q5_0_ref, quantize_row_q4_K_ref with
// its make_qkx2_quants search, quantize_row_mxfp4_ref) — the function
// llama-quantize runs when no importance matrix is given — operation for
// operation, every product rounded before the add that consumes it (as
// llama.cpp's -O3 -march=native build computes them: fusing Q4_K's
// products, or Q5_0's x·id + 16.5, changes blocks — measured).
// tests/cli/test_substitution.sh quantises a random model with
// llama-quantize --pure and requires these blocks to equal its blocks byte
// for byte, tensor by tensor, for every format here.
//
// Which format a row gets (llama-quant.cpp's tensor_type_fallback): a row
// whose length is not a multiple of the target's block falls back — Q4_K to
// Q5_0 (32-element blocks), a 32-element format to F16 — and a fallback that
// still does not fit is F16.
#pragma once

#include "kvasir/model/quant.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kvasir {

// The formats quantize_row() writes: Q8_0, Q5_0, Q4_K, MXFP4.
bool ggml_type_quantizable(GgmlType type) noexcept;
// "q8_0" / "Q8_0" etc. (case-insensitive) of a quantizable type; nullopt otherwise.
std::optional<GgmlType> parse_quant_type(std::string_view name) noexcept;

// Quantise `n` floats (a whole number of blocks of `type`) into `dst`
// (n / block_size · block_bytes bytes). Error(unsupported) for a type
// outside ggml_type_quantizable(), Error(internal) for a partial block.
void quantize_row(GgmlType type, const float* src, std::byte* dst, std::int64_t n);

// The format llama-quantize stores a row of `row_length` elements in when
// asked for `target` (see the fallback rule above): target, Q5_0 or F16.
GgmlType quant_type_for_row(GgmlType target, std::int64_t row_length) noexcept;

// Each of `rows` rows of `row_length` floats quantised to
// quant_type_for_row(target, row_length) and expanded back to f32 exactly as
// llama.cpp expands it (dequantize_row; F16: round to nearest even). src and
// dst may be the same buffer.
void requantize_rows(GgmlType target, const float* src, float* dst, std::int64_t rows, std::int64_t row_length);

}  // namespace kvasir
