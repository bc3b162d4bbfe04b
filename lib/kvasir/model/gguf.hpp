// GGUF (llama.cpp's model file format), versions 2 and 3: the container
// reader (metadata, tensor infos, bounds checks). What the names mean — the
// llama.cpp tensor roles and the architecture hyperparameters — is in
// gguf_arch.hpp.
//
// File layout (all little-endian):
//   "GGUF" u32 version u64 n_tensors u64 n_kv
//   n_kv × { string key, u32 value_type, value }
//   n_tensors × { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
//   padding to `general.alignment` (default 32), then the data section;
//   tensor i's bytes are [data_start + offset_i, + nbytes_i).
// A string is u64 length + bytes (no terminator). An array value is
// u32 element_type, u64 count, count elements (arrays of arrays refused).
// Version 1 used 32-bit counts and is refused; v2 and v3 share one layout (v3
// only added big-endian files, which are refused as well).
//
// Trust. A model file is untrusted input. The parser never reads outside the
// given bytes, never allocates what a header merely claims (every count is
// first bounded by what the remaining bytes could hold), does all size
// arithmetic overflow-checked, and rejects anything malformed with
// Error(bad_input) and one line "FILE: problem". Names echoed in messages are
// escaped and truncated so a hostile name cannot forge extra lines.
//
// Validation (beyond well-formedness): no duplicate keys or tensor names;
// general.alignment, when present, is a u32 non-zero power of two; 1 ≤ n_dims
// ≤ 4 (a 0-dim tensor is refused: ggml never writes one, and every ggml type
// needs a row, ne[0], to lay out its blocks); the product of the non-zero dims
// is ≤ 2^62 (so the row-major Shape is valid for kvasir::Tensor); ne[0] is a
// multiple of the type's block size; the type id is one ggml defines; every
// offset is a multiple of the alignment; every tensor's bytes lie inside the
// file; no two tensors' bytes overlap. Bools must be 0 or 1.
//
// Dimension order. ggml lists dims fastest-first: ne[0] is the contiguous
// (row) length. `GgufTensor::ne` keeps that order as in the file;
// `GgufTensor::shape` is the same dims reversed — the row-major Shape that
// kvasir::Tensor and numpy use. E.g. a [n_ff, n_embd] HF weight is stored with
// ne = {n_embd, n_ff}, shape = {n_ff, n_embd}; an expert stack
// blk.N.ffn_up_exps has ne = {n_embd, n_ff_exp, n_expert} and
// shape = {n_expert, n_ff_exp, n_embd}.
#pragma once

#include "kvasir/core/tensor.hpp"
#include "kvasir/model/mapped_file.hpp"
#include "kvasir/model/quant.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kvasir {

// ---------------------------------------------------------------------------
// Metadata values
// ---------------------------------------------------------------------------

// GGUF metadata value types, numbered as in the file.
enum class GgufType : std::uint32_t {
    u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
    string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};
// "u8", "i8", ..., "bool", "string", "array", "u64", "i64", "f64"; "?" otherwise.
std::string_view gguf_type_name(GgufType type) noexcept;

// One metadata value: a scalar of any non-array type, or an array of one.
// Alternatives of `Scalar` and `Array` are ordered like GgufType without
// `array` (index 0..8 = type 0..8, index 9..11 = type 10..12).
class GgufValue {
public:
    using Scalar = std::variant<std::uint8_t, std::int8_t, std::uint16_t, std::int16_t, std::uint32_t,
                                std::int32_t, float, bool, std::string, std::uint64_t, std::int64_t, double>;
    using Array = std::variant<std::vector<std::uint8_t>, std::vector<std::int8_t>, std::vector<std::uint16_t>,
                               std::vector<std::int16_t>, std::vector<std::uint32_t>, std::vector<std::int32_t>,
                               std::vector<float>, std::vector<bool>, std::vector<std::string>,
                               std::vector<std::uint64_t>, std::vector<std::int64_t>, std::vector<double>>;

    explicit GgufValue(Scalar v) : value_(std::move(v)) {}
    explicit GgufValue(Array v) : value_(std::move(v)) {}

    GgufType type() const noexcept;        // GgufType::array for arrays
    bool is_array() const noexcept { return value_.index() == 1; }
    GgufType array_type() const noexcept;  // element type; only meaningful for arrays
    std::size_t array_size() const noexcept;  // 0 for scalars

    const Scalar* scalar() const noexcept { return std::get_if<Scalar>(&value_); }
    const Array* array() const noexcept { return std::get_if<Array>(&value_); }

    // The value as an integer if it is a scalar of any integer type whose
    // value fits in int64 (a u64 above 2^63−1 does not).
    std::optional<std::int64_t> as_int() const noexcept;
    // The value as a double if it is an f32 or f64 scalar.
    std::optional<double> as_float() const noexcept;

    // Short human-readable rendering for `inspect`: scalars in full (strings
    // quoted, escaped, cut at 64 bytes), arrays as "[u32 × 151936: 1, 2, …]".
    std::string summary(std::size_t max_items = 6) const;

private:
    std::variant<Scalar, Array> value_;
};

// ---------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------

struct GgufTensor {
    std::string name;
    std::string file;               // the GgufFile's name, for error messages
    std::vector<std::int64_t> ne;   // ggml order: ne[0] is the contiguous row length; 1 ≤ size ≤ 4
    Shape shape;                    // row-major: ne reversed
    GgmlType type = GgmlType::F32;
    std::uint64_t offset = 0;       // as stored: relative to the data section
    std::uint64_t file_offset = 0;  // absolute: data section start + offset
    std::size_t nbytes = 0;         // rows × (ne[0] / block_size) × block_bytes
    std::int64_t numel = 0;
    const std::byte* data = nullptr;  // into the mapping / parsed span; not aligned beyond the file's alignment

    std::int64_t row_length() const noexcept { return ne[0]; }
    std::int64_t rows() const noexcept { return ne[0] == 0 ? 0 : numel / ne[0]; }
    std::span<const std::byte> bytes() const noexcept { return {data, nbytes}; }
};

// ---------------------------------------------------------------------------
// The file
// ---------------------------------------------------------------------------

class GgufFile {
public:
    // Parse `bytes` (a whole GGUF file). Borrows: tensor data pointers point
    // into `bytes`, which must outlive the GgufFile. `name` is used as FILE in
    // every error message. Throws Error(bad_input) on any malformation.
    static GgufFile parse(std::span<const std::byte> bytes, std::string name);
    // Map `path` read-only (zero copy) and parse it; the GgufFile owns the
    // mapping, so tensor data stays valid for its lifetime (moves included).
    static GgufFile open(const std::string& path);

    GgufFile(GgufFile&&) noexcept = default;
    GgufFile& operator=(GgufFile&&) noexcept = default;
    GgufFile(const GgufFile&) = delete;
    GgufFile& operator=(const GgufFile&) = delete;

    const std::string& name() const noexcept { return name_; }
    std::uint32_t version() const noexcept { return version_; }     // 2 or 3
    std::uint32_t alignment() const noexcept { return alignment_; }  // general.alignment or 32
    std::uint64_t data_start() const noexcept { return data_start_; }  // file offset of the data section
    std::size_t file_size() const noexcept { return file_size_; }

    // --- metadata ---------------------------------------------------------
    const std::vector<std::string>& keys() const noexcept { return keys_; }  // in file order
    bool has(std::string_view key) const { return find(key) != nullptr; }
    const GgufValue* find(std::string_view key) const;  // nullptr when absent
    // Throws Error(bad_input) "FILE: metadata key 'K' is missing".
    const GgufValue& get(std::string_view key) const;

    // Typed getters: the key must exist and hold exactly that type, otherwise
    // Error(bad_input) "FILE: metadata key 'K' is a u32, not a string".
    std::uint8_t get_u8(std::string_view key) const;
    std::int8_t get_i8(std::string_view key) const;
    std::uint16_t get_u16(std::string_view key) const;
    std::int16_t get_i16(std::string_view key) const;
    std::uint32_t get_u32(std::string_view key) const;
    std::int32_t get_i32(std::string_view key) const;
    std::uint64_t get_u64(std::string_view key) const;
    std::int64_t get_i64(std::string_view key) const;
    float get_f32(std::string_view key) const;
    double get_f64(std::string_view key) const;
    bool get_bool(std::string_view key) const;
    const std::string& get_string(std::string_view key) const;

    // Width-agnostic getters for hyperparameters, whose integer width varies
    // between converters: any integer type whose value fits int64 / f32 or f64.
    std::int64_t get_int(std::string_view key) const;
    double get_float(std::string_view key) const;

    // Array getters: the key must hold an array of exactly that element type.
    std::span<const std::uint8_t> get_array_u8(std::string_view key) const;
    std::span<const std::int8_t> get_array_i8(std::string_view key) const;
    std::span<const std::uint16_t> get_array_u16(std::string_view key) const;
    std::span<const std::int16_t> get_array_i16(std::string_view key) const;
    std::span<const std::uint32_t> get_array_u32(std::string_view key) const;
    std::span<const std::int32_t> get_array_i32(std::string_view key) const;
    std::span<const std::uint64_t> get_array_u64(std::string_view key) const;
    std::span<const std::int64_t> get_array_i64(std::string_view key) const;
    std::span<const float> get_array_f32(std::string_view key) const;
    std::span<const double> get_array_f64(std::string_view key) const;
    const std::vector<bool>& get_array_bool(std::string_view key) const;
    std::span<const std::string> get_array_string(std::string_view key) const;

    // --- tensors ----------------------------------------------------------
    const std::vector<GgufTensor>& tensors() const noexcept { return tensors_; }  // in file order
    const GgufTensor* find_tensor(std::string_view name) const;  // nullptr when absent
    // Throws Error(bad_input) "FILE: no tensor 'NAME'".
    const GgufTensor& tensor(std::string_view name) const;

private:
    GgufFile() = default;
    template <typename T>
    const T& get_scalar(std::string_view key, GgufType expected) const;
    template <typename T>
    const std::vector<T>& get_array(std::string_view key, GgufType expected) const;

    std::string name_;
    std::optional<MappedFile> mapping_;  // set by open(); MappedFile moves keep the address
    std::size_t file_size_ = 0;
    std::uint32_t version_ = 0;
    std::uint32_t alignment_ = 32;
    std::uint64_t data_start_ = 0;
    std::vector<std::string> keys_;
    std::vector<GgufValue> values_;  // parallel to keys_
    std::map<std::string, std::size_t, std::less<>> key_index_;
    std::vector<GgufTensor> tensors_;
    std::map<std::string, std::size_t, std::less<>> tensor_index_;
};

// A whole GGUF tensor as an owning f32 Tensor with the row-major shape
// (`tensor.shape`, i.e. ggml's ne reversed). F32 is copied bit for bit (NaN
// payloads included); F16/BF16 widen exactly.
// Throws Error(unsupported) "FILE: tensor 'NAME' has type T; ..." for a type
// that cannot be dequantised, and Error(bad_input) if the tensor's geometry is
// inconsistent (not possible for a tensor produced by GgufFile).
Tensor dequantize(const GgufTensor& tensor);

}  // namespace kvasir
