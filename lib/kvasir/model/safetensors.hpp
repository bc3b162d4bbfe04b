// safetensors: the format and the reader of one file. Sharded Hugging Face
// checkpoints are in safetensors_checkpoint.hpp, the atomic canonical writer
// in safetensors_writer.hpp.
//
// File format (https://huggingface.co/docs/safetensors):
//
//   [ u64 little-endian N ][ N bytes: UTF-8 JSON header ][ data buffer ]
//
// The header is a JSON object mapping tensor names to
//   {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
// with offsets relative to the start of the data buffer, plus an optional
// "__metadata__" object of string → string.
//
// Trust model: every byte of a model file is untrusted. The reader
//  * maps the file (MappedFile) and never reads it whole: opening a file reads
//    the 8-byte prefix and the header pages only; a tensor's pages are touched
//    when (and only when) the caller reads that tensor's view;
//  * never allocates from a size the file merely claims: the header length is
//    checked against the real file size before the header is looked at, and
//    the JSON is parsed as a stream (SAX) straight into the tensor table, so
//    memory is proportional to the number of tensors actually described, not
//    to any number written in the header;
//  * validates exactly what the reference implementation (the Rust
//    `safetensors` crate, 0.8) validates, and a little more (see below); every
//    rejection is an Error(bad_input) whose message is ONE line
//    "FILE: problem", naming the tensor where one is involved. Names taken
//    from the file are escaped in messages, so a name holding a newline or
//    control characters cannot break the one-line rule or the terminal.
//
// Validation (reference behaviour unless marked "stricter"):
//  * file ≥ 8 bytes; header length N ≤ 100,000,000; 8 + N ≤ file size;
//  * header is valid UTF-8 (strict: no overlong forms, no surrogates), then a
//    single JSON object (whitespace around it allowed, nothing else);
//  * "__metadata__": absent, null, or an object of string → string;
//  * every other key is a tensor whose value is an object with exactly the
//    fields dtype (one of the dtype names below, case-sensitive), shape (array
//    of non-negative integers) and data_offsets (array of exactly 2
//    non-negative integers). Floats such as 8.0, numbers beyond u64, booleans
//    and null are rejected. Stricter: unknown fields are rejected (the
//    reference ignores them);
//  * stricter: a key repeated anywhere in the header (tensor name, metadata
//    key, entry field) is rejected. The reference keeps the last occurrence;
//    two parsers disagreeing about which duplicate wins is a classic parser
//    differential, so an ambiguous header is refused instead;
//  * begin ≤ end; sorted by (begin, end) the tensors tile the data buffer:
//    each begins where the previous one ended (no gap, no overlap), the first
//    at 0, and the last ends exactly at the buffer end (file size − 8 − N);
//  * end − begin == product(shape) × dtype bits / 8, all in overflow-checked
//    u64 arithmetic (sub-byte dtypes must end on a byte boundary). Stricter: a
//    dimension above 2^63−1 is rejected even when another dimension is 0
//    (kvasir shapes are int64).
//
// Alignment: a valid file may place a tensor at an offset that is not a
// multiple of its element size (the format has no padding). view() never
// hands out a misaligned typed pointer (undefined behaviour in C++): such a
// tensor is copied once into an aligned buffer owned by the file object.
// Files written by write_safetensors (and by the Python library) are always
// aligned, so the copy never happens for them.
#pragma once

#include "kvasir/core/tensor.hpp"
#include "kvasir/model/mapped_file.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

// Largest header the reader accepts (the reference's MAX_HEADER_SIZE).
inline constexpr std::uint64_t kSafetensorsMaxHeader = 100'000'000;

// Every element type the safetensors format (0.8) defines, as spelled in headers.
enum class SafetensorsDType : std::uint8_t {
    BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
    I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64,
};

const char* safetensors_dtype_name(SafetensorsDType t) noexcept;             // "F32", "BF16", ...
std::optional<SafetensorsDType> parse_safetensors_dtype(std::string_view s) noexcept;  // exact spelling
unsigned safetensors_dtype_bits(SafetensorsDType t) noexcept;                // F4 → 4, F6_* → 6, C64 → 64
// The kvasir DType a tensor of this type is viewed as: F64/F32/F16/BF16 and
// I32 (written by captures) map one to one; every other type has none.
std::optional<DType> to_kvasir_dtype(SafetensorsDType t) noexcept;
SafetensorsDType to_safetensors_dtype(DType t) noexcept;

struct SafetensorsTensorInfo {
    std::string name;
    SafetensorsDType dtype = SafetensorsDType::F32;
    Shape shape;
    std::uint64_t offset = 0;  // absolute byte offset in the file (8 + N + begin)
    std::uint64_t nbytes = 0;  // end − begin

    std::optional<DType> kvasir_dtype() const noexcept { return to_kvasir_dtype(dtype); }
};

// One safetensors file. Movable; views stay valid across moves (the mapping
// and the aligned copies live behind a stable pointer) and for the lifetime of
// the object (for parse(): of the caller's buffer too). All const methods are
// thread-safe.
class SafetensorsFile {
public:
    // Map `path` and validate its header. The mapping is advised MADV_RANDOM:
    // the kernel then reads only pages that are touched (or asked for by
    // view(), see there) and never speculatively reads neighbouring tensors.
    static SafetensorsFile open(const std::string& path);
    // Validate a safetensors image held in memory. `bytes` is borrowed and
    // must outlive the returned object; `name` stands for the file in
    // messages. Used by the fuzz target and for in-memory captures.
    static SafetensorsFile parse(std::span<const std::byte> bytes, std::string name);

    SafetensorsFile(SafetensorsFile&&) noexcept;
    SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
    ~SafetensorsFile();

    const std::string& path() const;                     // or the name given to parse()
    std::uint64_t file_size() const;
    std::uint64_t header_size() const;                   // N
    std::uint64_t data_offset() const;                   // 8 + N
    const std::vector<std::string>& names() const;       // sorted (byte order)
    bool contains(std::string_view name) const;
    // Throws Error(bad_input) "FILE: no tensor named 'x'" when absent.
    const SafetensorsTensorInfo& info(std::string_view name) const;
    const std::map<std::string, std::string>& metadata() const;  // __metadata__, empty when absent
    // One __metadata__ value; nullopt when the key is absent.
    std::optional<std::string> metadata_value(const std::string& key) const;

    // A typed view of the tensor. Zero copy: `data` points into the mapping
    // (or the caller's buffer), except for a misaligned tensor (see above).
    // A dtype with no kvasir counterpart (U8, F8_E4M3, BOOL, ...) is refused
    // with Error(unsupported) naming the dtype and the tensor. For a mapped
    // file, asks the kernel to read the tensor's own pages ahead
    // (MADV_WILLNEED over exactly its byte range): a sequential scan then
    // does not pay one synchronous fault per 4 KB page under MADV_RANDOM,
    // and nothing outside the tensor is read.
    TensorView view(std::string_view name) const;
    // The tensor's raw bytes, any dtype (no alignment promise); advised
    // MADV_WILLNEED like view().
    std::span<const std::byte> raw(std::string_view name) const;

    // The underlying mapping (residency checks, drop_pages()); null for parse().
    const MappedFile* mapping() const;

private:
    struct Impl;
    explicit SafetensorsFile(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace kvasir
