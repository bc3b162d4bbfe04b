#include "kvasir/model/safetensors.hpp"

#include "kvasir/core/error.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <set>
#include <utility>

namespace kvasir {

// ===========================================================================
// dtypes
// ===========================================================================
namespace {

struct DTypeRow {
    SafetensorsDType st;
    const char* name;
    unsigned bits;
};

// Order = enum order, so the table can be indexed by the enum value.
constexpr std::array<DTypeRow, 22> kDTypes{{
    {SafetensorsDType::BOOL, "BOOL", 8},
    {SafetensorsDType::F4, "F4", 4},
    {SafetensorsDType::F6_E2M3, "F6_E2M3", 6},
    {SafetensorsDType::F6_E3M2, "F6_E3M2", 6},
    {SafetensorsDType::U8, "U8", 8},
    {SafetensorsDType::I8, "I8", 8},
    {SafetensorsDType::F8_E5M2, "F8_E5M2", 8},
    {SafetensorsDType::F8_E4M3, "F8_E4M3", 8},
    {SafetensorsDType::F8_E8M0, "F8_E8M0", 8},
    {SafetensorsDType::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {SafetensorsDType::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {SafetensorsDType::I16, "I16", 16},
    {SafetensorsDType::U16, "U16", 16},
    {SafetensorsDType::F16, "F16", 16},
    {SafetensorsDType::BF16, "BF16", 16},
    {SafetensorsDType::I32, "I32", 32},
    {SafetensorsDType::U32, "U32", 32},
    {SafetensorsDType::F32, "F32", 32},
    {SafetensorsDType::C64, "C64", 64},
    {SafetensorsDType::F64, "F64", 64},
    {SafetensorsDType::I64, "I64", 64},
    {SafetensorsDType::U64, "U64", 64},
}};

const DTypeRow& row_of(SafetensorsDType t) noexcept { return kDTypes[static_cast<std::size_t>(t)]; }

}  // namespace

const char* safetensors_dtype_name(SafetensorsDType t) noexcept { return row_of(t).name; }
unsigned safetensors_dtype_bits(SafetensorsDType t) noexcept { return row_of(t).bits; }

std::optional<SafetensorsDType> parse_safetensors_dtype(std::string_view s) noexcept {
    for (const auto& r : kDTypes)
        if (s == r.name) return r.st;
    return std::nullopt;
}

std::optional<DType> to_kvasir_dtype(SafetensorsDType t) noexcept {
    switch (t) {
        case SafetensorsDType::F64: return DType::f64;
        case SafetensorsDType::F32: return DType::f32;
        case SafetensorsDType::F16: return DType::f16;
        case SafetensorsDType::BF16: return DType::bf16;
        case SafetensorsDType::I32: return DType::i32;
        default: return std::nullopt;
    }
}

SafetensorsDType to_safetensors_dtype(DType t) noexcept {
    switch (t) {
        case DType::f64: return SafetensorsDType::F64;
        case DType::f32: return SafetensorsDType::F32;
        case DType::f16: return SafetensorsDType::F16;
        case DType::bf16: return SafetensorsDType::BF16;
        case DType::i32: return SafetensorsDType::I32;
    }
    return SafetensorsDType::F32;
}

// ===========================================================================
// helpers: message escaping, UTF-8, JSON error text
// ===========================================================================
namespace {

using json = nlohmann::json;

// Render bytes from an untrusted file for a one-line message: printable ASCII
// and well-formed UTF-8 pass through; control characters, quotes, backslashes
// and broken UTF-8 become escapes; long text is cut. This keeps the "one line
// naming the file and the problem" contract whatever a tensor is called.
std::string escape(std::string_view s, std::size_t max_bytes = 160) {
    std::string out;
    out.reserve(std::min(s.size(), max_bytes) + 8);
    std::size_t i = 0;
    while (i < s.size()) {
        if (out.size() >= max_bytes) {
            out += "...";
            break;
        }
        const auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c < 0x7f) {
            if (c == '\'' || c == '\\') out += '\\';
            out += static_cast<char>(c);
            ++i;
            continue;
        }
        // A well-formed multi-byte UTF-8 sequence is kept (names may be non-ASCII).
        std::size_t len = 0;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) len = 3;
        else if (c >= 0xF0 && c <= 0xF4) len = 4;
        bool ok = len > 0 && i + len <= s.size();
        for (std::size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
        if (ok) {
            out.append(s.substr(i, len));
            i += len;
        } else {
            out += fmt::format("\\x{:02x}", c);
            ++i;
        }
    }
    return out;
}

std::string q(std::string_view s) { return "'" + escape(s) + "'"; }

// Index of the first byte that is not part of strict UTF-8 (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF), or npos. The same
// acceptance as Rust's str::from_utf8, which the reference applies.
std::size_t utf8_invalid_at(std::string_view s) noexcept {
    std::size_t i = 0;
    const std::size_t n = s.size();
    auto at = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    while (i < n) {
        const unsigned c = at(i);
        if (c < 0x80) {
            ++i;
            continue;
        }
        std::size_t len;
        unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c == 0xE0) len = 3, lo = 0xA0;
        else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) len = 3;
        else if (c == 0xED) len = 3, hi = 0x9F;
        else if (c == 0xF0) len = 4, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3) len = 4;
        else if (c == 0xF4) len = 4, hi = 0x8F;
        else return i;
        if (i + len > n) return i;
        if (at(i + 1) < lo || at(i + 1) > hi) return i;
        for (std::size_t k = 2; k < len; ++k)
            if ((at(i + k) & 0xC0) != 0x80) return i;
        i += len;
    }
    return std::string::npos;
}

// nlohmann's parse_error text without its "[json.exception.parse_error.101] "
// prefix, escaped (the "last read" part quotes raw input) and bounded.
std::string json_error_text(const nlohmann::detail::exception& ex) {
    std::string_view w = ex.what();
    if (const auto p = w.find("] "); p != std::string_view::npos && !w.empty() && w.front() == '[') w.remove_prefix(p + 2);
    return escape(w, 200);
}

std::uint64_t read_le64(const std::byte* p) noexcept {
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint64_t>(p[i]);
    return v;
}

// The value kinds a SAX handler sees; used to word "X is not Y" errors.
const char* kind_word(int k) {
    static constexpr const char* words[] = {"null", "a boolean", "a negative number", "an integer",
                                            "a non-integer number", "a string", "an object", "an array"};
    return words[k];
}
enum Kind { k_null, k_bool, k_negative, k_unsigned, k_float, k_string, k_object, k_array };

// ===========================================================================
// Header parsing: a SAX handler that builds the tensor table directly and
// stops at the first deviation from the schema. Nothing is buffered beyond
// the entries themselves, and since unknown fields are refused at their key,
// the parser never descends more than three levels.
// ===========================================================================
struct RawEntry {
    SafetensorsDType dtype = SafetensorsDType::F32;
    std::vector<std::uint64_t> shape;
    std::uint64_t begin = 0, end = 0;
};

struct ParsedHeader {
    std::map<std::string, RawEntry, std::less<>> tensors;
    std::map<std::string, std::string> metadata;
};

class HeaderSax {
public:
    explicit HeaderSax(ParsedHeader& out) : out_(out) {}
    std::string error;  // set when parsing stopped; the message without "FILE: "

    bool null() { return value(k_null); }
    bool boolean(bool) { return value(k_bool); }
    bool number_integer(std::int64_t v) {
        // nlohmann reports only numbers written with a minus sign here. "-0"
        // arrives as 0; the reference (serde_json) reads it as the float -0.0
        // and refuses it, so it is refused as a non-integer too.
        if (v == 0) {
            text_ = "-0";
            return value(k_float);
        }
        text_ = std::to_string(v);
        return value(k_negative);
    }
    bool number_unsigned(std::uint64_t v) { return value(k_unsigned, v); }
    bool number_float(double, const std::string& s) {
        text_ = s;
        return value(k_float);
    }
    bool string(std::string& s) { return value(k_string, 0, &s); }
    bool binary(json::binary_t&) { return stop("header holds a binary value"); }  // not produced by JSON text

    bool start_object(std::size_t) {
        if (depth_ == 0) {
            depth_ = 1;
            return true;
        }
        if (depth_ == 1) {
            depth_ = 2;
            if (!top_is_meta_) entry_ = RawEntry{}, seen_ = 0;
            return true;
        }
        return value(k_object);
    }
    bool end_object() {
        if (depth_ == 2 && !top_is_meta_) {
            static constexpr const char* fields[] = {"dtype", "shape", "data_offsets"};
            for (int f = 0; f < 3; ++f)
                if (!(seen_ & (1u << f))) return stop(fmt::format("tensor {}: missing field \"{}\"", q(top_key_), fields[f]));
            out_.tensors.emplace(top_key_, std::move(entry_));
        }
        --depth_;
        return true;
    }
    bool start_array(std::size_t) {
        if (depth_ == 2 && !top_is_meta_ && (field_ == f_shape || field_ == f_offsets)) {
            depth_ = 3;
            array_.clear();
            return true;
        }
        return value(k_array);
    }
    bool end_array() {
        // Only arrays we entered reach here: value(k_array) refuses all others.
        if (field_ == f_offsets) {
            if (array_.size() != 2)
                return bad_offsets(fmt::format("has {} element{}", array_.size(), array_.size() == 1 ? "" : "s"));
            entry_.begin = array_[0];
            entry_.end = array_[1];
        } else {
            entry_.shape = array_;
        }
        depth_ = 2;
        return true;
    }
    bool key(std::string& k) {
        if (depth_ == 1) {
            if (k == "__metadata__") {
                if (meta_seen_) return stop("duplicate key \"__metadata__\"");
                meta_seen_ = true;
                top_is_meta_ = true;
            } else {
                if (out_.tensors.count(k) != 0) return stop(fmt::format("duplicate tensor name {}", q(k)));
                top_is_meta_ = false;
            }
            top_key_ = k;
            return true;
        }
        if (top_is_meta_) {
            if (out_.metadata.count(k) != 0) return stop(fmt::format("duplicate key {} in __metadata__", q(k)));
            meta_key_ = k;
            return true;
        }
        if (k == "dtype") field_ = f_dtype;
        else if (k == "shape") field_ = f_shape;
        else if (k == "data_offsets") field_ = f_offsets;
        else return stop(fmt::format("tensor {}: unexpected field {} (allowed: dtype, shape, data_offsets)", q(top_key_), q(k)));
        const unsigned bit = 1u << field_;
        if (seen_ & bit) return stop(fmt::format("tensor {}: duplicate field {}", q(top_key_), q(k)));
        seen_ |= bit;
        return true;
    }
    bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) {
        if (error.empty()) error = fmt::format("header is not valid JSON (at byte {} of the header): {}", position, json_error_text(ex));
        return false;
    }

private:
    enum Field { f_dtype = 0, f_shape = 1, f_offsets = 2 };

    bool stop(std::string msg) {
        error = std::move(msg);
        return false;
    }
    bool bad_offsets(const std::string& why) {
        return stop(fmt::format("tensor {}: data_offsets must be an array of 2 non-negative integers, but it {}", q(top_key_), why));
    }

    // Every value (scalar, or the start of an object/array we do not enter).
    bool value(int kind, std::uint64_t u = 0, std::string* s = nullptr) {
        switch (depth_) {
            case 0: return stop(fmt::format("header is not a JSON object (it is {})", kind_word(kind)));
            case 1:
                if (top_is_meta_) {
                    if (kind == k_null) return true;  // "__metadata__": null means none, as in the reference
                    return stop(fmt::format("__metadata__ is not an object of strings (it is {})", kind_word(kind)));
                }
                return stop(fmt::format("tensor {}: entry is not an object (it is {})", q(top_key_), kind_word(kind)));
            case 2:
                if (top_is_meta_) {
                    if (kind != k_string)
                        return stop(fmt::format("__metadata__ is not an object of strings: value of {} is {}", q(meta_key_), kind_word(kind)));
                    out_.metadata.emplace(meta_key_, std::move(*s));
                    return true;
                }
                if (field_ == f_dtype) {
                    if (kind != k_string) return stop(fmt::format("tensor {}: dtype is not a string (it is {})", q(top_key_), kind_word(kind)));
                    const auto dt = parse_safetensors_dtype(*s);
                    if (!dt) return stop(fmt::format("tensor {}: unknown dtype {}", q(top_key_), q(*s)));
                    entry_.dtype = *dt;
                    return true;
                }
                if (field_ == f_shape)
                    return stop(fmt::format("tensor {}: shape must be an array of non-negative integers, but it is {}", q(top_key_), kind_word(kind)));
                return bad_offsets(fmt::format("is {}", kind_word(kind)));
            default:  // 3: an element of shape or data_offsets
                if (kind == k_unsigned) {
                    if (field_ == f_offsets && array_.size() == 2) return bad_offsets("has more than 2 elements");
                    array_.push_back(u);
                    return true;
                }
                if (field_ == f_offsets) {
                    if (kind == k_negative) return bad_offsets(fmt::format("holds the negative number {}", text_));
                    if (kind == k_float) return bad_offsets(fmt::format("holds {}, which is not an integer", escape(text_, 40)));
                    return bad_offsets(fmt::format("holds {}", kind_word(kind)));
                }
                if (kind == k_negative) return stop(fmt::format("tensor {}: negative dimension {} in shape", q(top_key_), text_));
                if (kind == k_float)
                    return stop(fmt::format("tensor {}: shape dimension {} is not an integer", q(top_key_), escape(text_, 40)));
                return stop(fmt::format("tensor {}: shape must be an array of non-negative integers, but holds {}", q(top_key_), kind_word(kind)));
        }
    }

    ParsedHeader& out_;
    int depth_ = 0;  // 1: in the root object; 2: in __metadata__ or an entry; 3: in shape/data_offsets
    std::string top_key_, meta_key_, text_;
    bool top_is_meta_ = false, meta_seen_ = false;
    Field field_ = f_dtype;
    unsigned seen_ = 0;
    RawEntry entry_;
    std::vector<std::uint64_t> array_;
};

// product(shape) × bits / 8, or nullopt on u64 overflow; `whole` tells whether
// the bit count is a whole number of bytes (sub-byte dtypes).
std::optional<std::uint64_t> byte_size(const std::vector<std::uint64_t>& shape, unsigned bits, bool& whole) {
    std::uint64_t n = 1;
    for (std::uint64_t d : shape)
        if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
    std::uint64_t total_bits = 0;
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(bits), &total_bits)) return std::nullopt;
    whole = total_bits % 8 == 0;
    return total_bits / 8;
}

std::string shape_text(const std::vector<std::uint64_t>& s) {
    // Bounded: a shape with thousands of dims is itself a sign of a hostile file.
    if (s.size() > 8) return fmt::format("[{}, ... ({} dims)]", fmt::join(s.begin(), s.begin() + 8, ", "), s.size());
    return fmt::format("[{}]", fmt::join(s, ", "));
}

std::size_t page_size() {
    static const auto p = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    return p;
}

// madvise over the pages that cover [p, p+n). Advice only: failures ignored.
void advise(const std::byte* p, std::size_t n, int advice) {
    if (n == 0) return;
    const auto page = page_size();
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const auto start = a - a % page;
    ::madvise(reinterpret_cast<void*>(start), (a + n) - start, advice);
}

}  // namespace

// ===========================================================================
// SafetensorsFile
// ===========================================================================
struct SafetensorsFile::Impl {
    std::string path;
    std::unique_ptr<MappedFile> map;  // null when parsing a caller's buffer
    std::span<const std::byte> bytes;
    std::uint64_t header_len = 0;
    std::map<std::string, SafetensorsTensorInfo, std::less<>> tensors;
    std::vector<std::string> names;
    std::map<std::string, std::string> metadata;
    // Aligned copies of misaligned tensors. std::map nodes never move, so a
    // view handed out stays valid while other copies are added.
    mutable std::mutex mu;
    mutable std::map<std::string, Tensor, std::less<>> aligned;

    [[noreturn]] void bad(const std::string& msg) const { fail(ErrorCode::bad_input, "{}: {}", escape(path, 400), msg); }
    void build();
};

void SafetensorsFile::Impl::build() {
    const std::uint64_t size = bytes.size();
    if (size < 8) bad(fmt::format("file is too short to be safetensors ({} bytes; the header length alone takes 8)", size));
    header_len = read_le64(bytes.data());
    if (header_len > kSafetensorsMaxHeader)
        bad(fmt::format("header length {} exceeds the {}-byte limit", header_len, kSafetensorsMaxHeader));
    // header_len ≤ 1e8, so 8 + header_len cannot overflow.
    if (8 + header_len > size)
        bad(fmt::format("header length {} runs past the end of the file ({} bytes)", header_len, size));

    const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<std::size_t>(header_len));
    if (const auto at = utf8_invalid_at(text); at != std::string::npos)
        bad(fmt::format("header is not valid UTF-8 (byte {} of the header)", at));
    // nlohmann silently skips a leading UTF-8 byte-order mark; JSON (RFC 8259)
    // and the reference do not allow one.
    if (text.starts_with("\xEF\xBB\xBF")) bad("header is not valid JSON: it starts with a UTF-8 byte-order mark");
    // nlohmann also takes a NUL byte for the end of input, which would accept
    // "{...}\0<anything>". A raw NUL is never valid JSON text (inside strings
    // it must be escaped), so refuse it before parsing.
    if (const auto nul = text.find('\0'); nul != std::string_view::npos)
        bad(fmt::format("header is not valid JSON: NUL byte at byte {} of the header", nul));

    ParsedHeader parsed;
    HeaderSax sax(parsed);
    bool ok = false;
    try {
        ok = json::sax_parse(text.begin(), text.end(), &sax, json::input_format_t::json, /*strict=*/true);
    } catch (const std::exception& e) {  // the parser reports through parse_error; belt and braces
        bad(fmt::format("header is not valid JSON: {}", escape(e.what(), 200)));
    }
    if (!ok) bad(sax.error.empty() ? std::string("header is not valid JSON") : sax.error);

    // --- layout: the tensors must tile the data buffer exactly -------------
    const std::uint64_t data_start = 8 + header_len;
    const std::uint64_t buffer = size - data_start;
    struct Item {
        const std::string* name;
        const RawEntry* e;
    };
    std::vector<Item> items;
    items.reserve(parsed.tensors.size());
    for (const auto& [name, e] : parsed.tensors) {
        if (e.begin > e.end)
            bad(fmt::format("tensor {}: data_offsets [{}, {}] are reversed (begin > end)", q(name), e.begin, e.end));
        items.push_back({&name, &e});
    }
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
        if (a.e->begin != b.e->begin) return a.e->begin < b.e->begin;
        if (a.e->end != b.e->end) return a.e->end < b.e->end;
        return *a.name < *b.name;
    });
    std::uint64_t pos = 0;
    const std::string* prev = nullptr;
    for (const Item& it : items) {
        const RawEntry& e = *it.e;
        const std::string& name = *it.name;
        if (e.begin < pos)
            bad(fmt::format("tensor {}: data_offsets [{}, {}] overlap tensor {}, which ends at {}", q(name), e.begin, e.end,
                            q(*prev), pos));
        if (e.begin > pos)
            bad(fmt::format("tensor {}: gap of {} bytes before data_offsets [{}, {}] (tensor data must be contiguous from 0)",
                            q(name), e.begin - pos, e.begin, e.end));
        if (e.end > buffer)
            bad(fmt::format("tensor {}: data_offsets [{}, {}] run past the end of the data buffer ({} bytes)", q(name), e.begin,
                            e.end, buffer));
        bool whole = true;
        const auto need = byte_size(e.shape, safetensors_dtype_bits(e.dtype), whole);
        if (!need)
            bad(fmt::format("tensor {}: shape {} of {} overflows 64-bit size arithmetic", q(name), shape_text(e.shape),
                            safetensors_dtype_name(e.dtype)));
        if (!whole)
            bad(fmt::format("tensor {}: shape {} of {} is not a whole number of bytes", q(name), shape_text(e.shape),
                            safetensors_dtype_name(e.dtype)));
        if (*need != e.end - e.begin)
            bad(fmt::format("tensor {}: data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}", q(name), e.begin,
                            e.end, e.end - e.begin, shape_text(e.shape), safetensors_dtype_name(e.dtype), *need));
        for (std::uint64_t d : e.shape)
            if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
                bad(fmt::format("tensor {}: dimension {} is too large", q(name), d));
        pos = e.end;
        prev = &name;
    }
    if (pos != buffer)
        bad(fmt::format("data buffer has {} trailing bytes not covered by any tensor (tensors end at {}, buffer is {} bytes)",
                        buffer - pos, pos, buffer));

    for (auto& [name, e] : parsed.tensors) {
        SafetensorsTensorInfo ti;
        ti.name = name;
        ti.dtype = e.dtype;
        ti.shape.assign(e.shape.begin(), e.shape.end());
        ti.offset = data_start + e.begin;
        ti.nbytes = e.end - e.begin;
        names.push_back(name);
        tensors.emplace(name, std::move(ti));
    }
    metadata = std::move(parsed.metadata);
}

SafetensorsFile::SafetensorsFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::open(const std::string& path) {
    auto impl = std::make_unique<Impl>();
    impl->path = path;
    impl->map = std::make_unique<MappedFile>(path);
    impl->bytes = impl->map->bytes();
    // Checkpoint access is "a few tensors out of many": no speculative
    // read-around, which would drag in the neighbours of every touched page.
    // view() asks for each used tensor's own range explicitly (MADV_WILLNEED).
    if (!impl->bytes.empty()) advise(impl->bytes.data(), impl->bytes.size(), MADV_RANDOM);
    impl->build();
    return SafetensorsFile(std::move(impl));
}

SafetensorsFile SafetensorsFile::parse(std::span<const std::byte> bytes, std::string name) {
    auto impl = std::make_unique<Impl>();
    impl->path = std::move(name);
    impl->bytes = bytes;
    impl->build();
    return SafetensorsFile(std::move(impl));
}

const std::string& SafetensorsFile::path() const { return impl_->path; }
std::uint64_t SafetensorsFile::file_size() const { return impl_->bytes.size(); }
std::uint64_t SafetensorsFile::header_size() const { return impl_->header_len; }
std::uint64_t SafetensorsFile::data_offset() const { return 8 + impl_->header_len; }
const std::vector<std::string>& SafetensorsFile::names() const { return impl_->names; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return impl_->metadata; }
const MappedFile* SafetensorsFile::mapping() const { return impl_->map.get(); }

bool SafetensorsFile::contains(std::string_view name) const { return impl_->tensors.find(name) != impl_->tensors.end(); }

const SafetensorsTensorInfo& SafetensorsFile::info(std::string_view name) const {
    const auto it = impl_->tensors.find(name);
    if (it == impl_->tensors.end()) impl_->bad(fmt::format("no tensor named {}", q(name)));
    return it->second;
}

std::span<const std::byte> SafetensorsFile::raw(std::string_view name) const {
    const auto& ti = info(name);
    const auto span = impl_->bytes.subspan(static_cast<std::size_t>(ti.offset), static_cast<std::size_t>(ti.nbytes));
    if (impl_->map) advise(span.data(), span.size(), MADV_WILLNEED);  // as view(): the caller is about to read it
    return span;
}

TensorView SafetensorsFile::view(std::string_view name) const {
    const auto& ti = info(name);
    const auto dt = ti.kvasir_dtype();
    if (!dt)
        fail(ErrorCode::unsupported, "{}: tensor {} has dtype {}, which kvasir does not compute with (supported: F64, F32, F16, BF16, I32)",
             escape(impl_->path, 400), q(name), safetensors_dtype_name(ti.dtype));
    const std::byte* p = impl_->bytes.data() + ti.offset;
    const auto n = static_cast<std::size_t>(ti.nbytes);
    if (impl_->map) advise(p, n, MADV_WILLNEED);
    if (n != 0 && reinterpret_cast<std::uintptr_t>(p) % dtype_size(*dt) != 0) {
        // A typed pointer must be aligned; copy this tensor once (see header).
        std::lock_guard lock(impl_->mu);
        auto it = impl_->aligned.find(name);
        if (it == impl_->aligned.end()) {
            Tensor copy(*dt, ti.shape);
            std::memcpy(copy.raw(), p, n);
            it = impl_->aligned.emplace(std::string(name), std::move(copy)).first;
        }
        return it->second.view();
    }
    return TensorView{*dt, p, ti.shape};
}

// ===========================================================================
// Index (model.safetensors.index.json)
// ===========================================================================
namespace {

// SAX handler for the index: keeps "weight_map", skips every other top-level
// value (bounded nesting), refuses duplicate keys where they matter.
class IndexSax {
public:
    explicit IndexSax(std::map<std::string, std::string>& out) : out_(out) {}
    std::string error;
    bool have_map = false;

    bool null() { return value(k_null); }
    bool boolean(bool) { return value(k_bool); }
    bool number_integer(std::int64_t) { return value(k_negative); }
    bool number_unsigned(std::uint64_t) { return value(k_unsigned); }
    bool number_float(double, const std::string&) { return value(k_float); }
    bool string(std::string& s) { return value(k_string, &s); }
    bool binary(json::binary_t&) { return stop("index holds a binary value"); }
    bool start_object(std::size_t) { return open(k_object); }
    bool start_array(std::size_t) { return open(k_array); }
    bool end_object() { return close(); }
    bool end_array() { return close(); }
    bool key(std::string& k) {
        if (skip_ > 0) return true;
        if (depth_ == 1) {
            if (!top_keys_.insert(k).second) return stop(fmt::format("duplicate key {}", q(k)));
            in_map_key_ = (k == "weight_map");
            return true;
        }
        // depth 2, inside weight_map
        if (out_.count(k) != 0) return stop(fmt::format("tensor {} appears twice in weight_map", q(k)));
        tensor_ = k;
        return true;
    }
    bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) {
        if (error.empty()) error = fmt::format("index is not valid JSON (at byte {}): {}", position, json_error_text(ex));
        return false;
    }

private:
    // A real index nests two levels; ignored values may nest, but not without
    // bound (serde_json, behind the reference tools, stops at 128 as well).
    static constexpr int kMaxSkipDepth = 128;

    bool stop(std::string msg) {
        error = std::move(msg);
        return false;
    }
    bool open(int kind) {
        if (skip_ > 0) {
            if (++skip_ > kMaxSkipDepth) return stop(fmt::format("index nests deeper than {} levels", kMaxSkipDepth));
            return true;
        }
        if (depth_ == 0) {
            if (kind != k_object) return stop("index is not a JSON object (it is an array)");
            depth_ = 1;
            return true;
        }
        if (depth_ == 1) {
            if (!in_map_key_) {
                skip_ = 1;
                return true;
            }
            if (kind != k_object) return stop("weight_map is not an object (it is an array)");
            depth_ = 2;
            have_map = true;
            return true;
        }
        return stop(fmt::format("weight_map value of tensor {} is not a string (it is {})", q(tensor_), kind_word(kind)));
    }
    bool close() {
        if (skip_ > 0) {
            --skip_;
            return true;
        }
        --depth_;
        return true;
    }
    bool value(int kind, std::string* s = nullptr) {
        if (skip_ > 0) return true;
        if (depth_ == 0) return stop(fmt::format("index is not a JSON object (it is {})", kind_word(kind)));
        if (depth_ == 1) {
            if (in_map_key_) return stop(fmt::format("weight_map is not an object (it is {})", kind_word(kind)));
            return true;  // some other top-level scalar: ignored
        }
        if (kind != k_string)
            return stop(fmt::format("weight_map value of tensor {} is not a string (it is {})", q(tensor_), kind_word(kind)));
        out_.emplace(tensor_, std::move(*s));
        return true;
    }

    std::map<std::string, std::string>& out_;
    std::set<std::string> top_keys_;
    std::string tensor_;
    int depth_ = 0, skip_ = 0;
    bool in_map_key_ = false;
};

// A shard name must name a file directly inside the checkpoint directory.
bool plain_file_name(std::string_view s) {
    if (s.empty() || s == "." || s == "..") return false;
    return s.find_first_of(std::string_view("/\\\0", 3)) == std::string_view::npos;
}

}  // namespace

std::map<std::string, std::string> parse_safetensors_index(std::span<const std::byte> bytes, const std::string& name) {
    auto bad = [&](const std::string& msg) { fail(ErrorCode::bad_input, "{}: {}", escape(name, 400), msg); };
    if (bytes.size() > kSafetensorsMaxHeader)
        bad(fmt::format("index is {} bytes, more than the {}-byte limit", bytes.size(), kSafetensorsMaxHeader));
    const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    if (const auto at = utf8_invalid_at(text); at != std::string::npos) bad(fmt::format("index is not valid UTF-8 (byte {})", at));
    // Python's json (what transformers reads the index with) refuses a BOM; nlohmann would skip it.
    if (text.starts_with("\xEF\xBB\xBF")) bad("index is not valid JSON: it starts with a UTF-8 byte-order mark");
    if (const auto nul = text.find('\0'); nul != std::string_view::npos)  // nlohmann would stop there (see the header)
        bad(fmt::format("index is not valid JSON: NUL byte at byte {}", nul));
    std::map<std::string, std::string> map;
    IndexSax sax(map);
    bool ok = false;
    try {
        ok = json::sax_parse(text.begin(), text.end(), &sax, json::input_format_t::json, true);
    } catch (const std::exception& e) {
        bad(fmt::format("index is not valid JSON: {}", escape(e.what(), 200)));
    }
    if (!ok) bad(sax.error.empty() ? std::string("index is not valid JSON") : sax.error);
    if (!sax.have_map) bad("index has no \"weight_map\" object");
    if (map.empty()) bad("weight_map is empty");
    for (const auto& [tensor, shard] : map)
        if (!plain_file_name(shard))
            bad(fmt::format("tensor {} maps to shard {}, which is not a plain file name inside the checkpoint directory",
                            q(tensor), q(shard)));
    return map;
}

// ===========================================================================
// SafetensorsCheckpoint
// ===========================================================================
struct SafetensorsCheckpoint::Impl {
    std::string path;        // as given
    std::string index_path;  // empty for a single file
    std::map<std::string, std::string, std::less<>> tensor_shard;  // tensor → shard path
    std::vector<std::string> names;
    std::vector<std::string> shard_files;
    std::map<std::string, std::vector<std::string>> shard_tensors;  // shard path → tensors the index puts there
    mutable std::mutex mu;
    mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> open;  // stable addresses

    const SafetensorsFile& shard(const std::string& shard_path) const;
    const SafetensorsFile& file_of(std::string_view tensor) const;
};

const SafetensorsFile& SafetensorsCheckpoint::Impl::shard(const std::string& shard_path) const {
    std::lock_guard lock(mu);
    if (auto it = open.find(shard_path); it != open.end()) return *it->second;
    const auto st = shard_tensors.find(shard_path);
    if (st == shard_tensors.end()) fail(ErrorCode::bad_input, "{}: {} is not one of its shards", escape(path, 400), q(shard_path));
    auto f = std::make_unique<SafetensorsFile>(SafetensorsFile::open(shard_path));
    for (const auto& t : st->second)
        if (!f->contains(t))
            fail(ErrorCode::bad_input, "{}: tensor {} is mapped to shard {}, which does not contain it", escape(index_path, 400), q(t),
                 q(std::filesystem::path(shard_path).filename().string()));
    return *open.emplace(shard_path, std::move(f)).first->second;
}

const SafetensorsFile& SafetensorsCheckpoint::Impl::file_of(std::string_view tensor) const {
    const auto it = tensor_shard.find(tensor);
    if (it == tensor_shard.end()) fail(ErrorCode::bad_input, "{}: no tensor named {}", escape(path, 400), q(tensor));
    return shard(it->second);
}

SafetensorsCheckpoint::SafetensorsCheckpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsCheckpoint::SafetensorsCheckpoint(SafetensorsCheckpoint&&) noexcept = default;
SafetensorsCheckpoint& SafetensorsCheckpoint::operator=(SafetensorsCheckpoint&&) noexcept = default;
SafetensorsCheckpoint::~SafetensorsCheckpoint() = default;

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::string& path) {
    namespace fs = std::filesystem;
    auto impl = std::make_unique<Impl>();
    impl->path = path;
    const std::string shown = escape(path, 400);
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    if (ec || !fs::exists(status)) fail(ErrorCode::bad_input, "{}: no such file or directory", shown);

    fs::path index;
    fs::path single;
    if (fs::is_directory(status)) {
        const fs::path dir(path);
        if (fs::is_regular_file(dir / "model.safetensors", ec)) single = dir / "model.safetensors";
        else if (fs::is_regular_file(dir / "model.safetensors.index.json", ec)) index = dir / "model.safetensors.index.json";
        else fail(ErrorCode::bad_input, "{}: directory holds neither model.safetensors nor model.safetensors.index.json", shown);
    } else if (std::string_view(path).ends_with(".index.json")) {
        index = path;
    } else {
        single = path;
    }

    if (!single.empty()) {
        const std::string p = single.string();
        auto f = std::make_unique<SafetensorsFile>(SafetensorsFile::open(p));
        impl->names = f->names();
        for (const auto& n : impl->names) impl->tensor_shard.emplace(n, p);
        impl->shard_tensors[p] = impl->names;
        impl->shard_files = {p};
        impl->open.emplace(p, std::move(f));
        return SafetensorsCheckpoint(std::move(impl));
    }

    impl->index_path = index.string();
    const MappedFile index_file(impl->index_path);
    const auto map = parse_safetensors_index(index_file.bytes(), impl->index_path);
    const fs::path dir = index.parent_path();
    for (const auto& [tensor, shard] : map) {
        const std::string p = (dir / shard).string();
        impl->tensor_shard.emplace(tensor, p);
        impl->shard_tensors[p].push_back(tensor);
        impl->names.push_back(tensor);  // map order = sorted
    }
    for (const auto& [p, tensors] : impl->shard_tensors) {
        // Existence only: a stat, so a missing shard is reported at open time
        // while mapping still waits until a tensor of the shard is used.
        if (!fs::is_regular_file(p, ec))
            fail(ErrorCode::bad_input, "{}: shard {} (holding tensor {}) is missing or not a regular file", escape(impl->index_path, 400),
                 q(fs::path(p).filename().string()), q(tensors.front()));
        impl->shard_files.push_back(p);
    }
    return SafetensorsCheckpoint(std::move(impl));
}

const std::string& SafetensorsCheckpoint::path() const { return impl_->path; }
bool SafetensorsCheckpoint::sharded() const { return !impl_->index_path.empty(); }
const std::vector<std::string>& SafetensorsCheckpoint::names() const { return impl_->names; }
const std::vector<std::string>& SafetensorsCheckpoint::shard_files() const { return impl_->shard_files; }
bool SafetensorsCheckpoint::contains(std::string_view name) const {
    return impl_->tensor_shard.find(name) != impl_->tensor_shard.end();
}

const std::string& SafetensorsCheckpoint::shard_of(std::string_view name) const {
    const auto it = impl_->tensor_shard.find(name);
    if (it == impl_->tensor_shard.end()) fail(ErrorCode::bad_input, "{}: no tensor named {}", escape(impl_->path, 400), q(name));
    return it->second;
}

const SafetensorsTensorInfo& SafetensorsCheckpoint::info(std::string_view name) const { return impl_->file_of(name).info(name); }
TensorView SafetensorsCheckpoint::view(std::string_view name) const { return impl_->file_of(name).view(name); }
std::span<const std::byte> SafetensorsCheckpoint::raw(std::string_view name) const { return impl_->file_of(name).raw(name); }

std::uint64_t SafetensorsCheckpoint::bytes_of(std::span<const std::string> names) const {
    std::set<std::string_view> distinct(names.begin(), names.end());
    std::uint64_t total = 0;
    for (std::string_view n : distinct) total += info(n).nbytes;  // ≤ the file sizes: no overflow
    return total;
}

std::vector<std::string> SafetensorsCheckpoint::open_shards() const {
    std::lock_guard lock(impl_->mu);
    std::vector<std::string> out;
    for (const auto& [p, f] : impl_->open) out.push_back(p);
    return out;
}

const SafetensorsFile& SafetensorsCheckpoint::shard(const std::string& shard_path) const { return impl_->shard(shard_path); }

void SafetensorsCheckpoint::verify() const {
    for (const auto& p : impl_->shard_files) impl_->shard(p);
}

// ===========================================================================
// Writer
// ===========================================================================
namespace {

// Closes/unlinks the temporary file unless released: every early exit
// (exception included) leaves no temporary behind.
class TempFile {
public:
    TempFile(std::string p, int fd) : path_(std::move(p)), fd_(fd) {}
    ~TempFile() {
        if (fd_ >= 0) ::close(fd_);
        if (!path_.empty()) ::unlink(path_.c_str());
    }
    TempFile(const TempFile&) = delete;
    TempFile& operator=(const TempFile&) = delete;
    int fd() const { return fd_; }
    const std::string& path() const { return path_; }
    int close() {
        const int r = ::close(fd_);
        fd_ = -1;
        return r;
    }
    void release() { path_.clear(); }

private:
    std::string path_;
    int fd_;
};

void write_all(int fd, const std::byte* p, std::size_t n, const std::string& shown) {
    while (n > 0) {
        // Bounded chunks: write() moves at most ~2 GiB per call on Linux anyway.
        const std::size_t chunk = std::min<std::size_t>(n, std::size_t{1} << 30);
        const ssize_t w = ::write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            fail(ErrorCode::bad_input, "{}: cannot write: {}", shown, std::strerror(errno));
        }
        if (w == 0) fail(ErrorCode::bad_input, "{}: cannot write: no progress", shown);
        p += w;
        n -= static_cast<std::size_t>(w);
    }
}

}  // namespace

void write_safetensors(const std::string& path, const std::map<std::string, TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
    namespace fs = std::filesystem;
    const std::string shown = escape(path, 400);
    auto bad = [&](const std::string& msg) { fail(ErrorCode::bad_input, "{}: {}", shown, msg); };

    // --- validate and lay out -----------------------------------------------
    struct Out {
        const std::string* name;
        const TensorView* view;
        std::uint64_t nbytes;
    };
    std::vector<Out> order;
    order.reserve(tensors.size());
    for (const auto& [name, v] : tensors) {
        if (name == "__metadata__") bad("\"__metadata__\" cannot be a tensor name");
        if (utf8_invalid_at(name) != std::string::npos) bad(fmt::format("tensor name {} is not valid UTF-8", q(name)));
        std::uint64_t numel = 1;
        for (std::int64_t d : v.shape) {
            if (d < 0) bad(fmt::format("tensor {}: negative dimension in shape {}", q(name), shape_str(v.shape)));
            if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(d), &numel))
                bad(fmt::format("tensor {}: shape {} overflows", q(name), shape_str(v.shape)));
        }
        std::uint64_t nbytes = 0;
        if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(dtype_size(v.dtype)), &nbytes))
            bad(fmt::format("tensor {}: shape {} overflows", q(name), shape_str(v.shape)));
        if (nbytes != 0 && v.data == nullptr) bad(fmt::format("tensor {}: view has no data", q(name)));
        order.push_back({&name, &v, nbytes});
    }
    for (const auto& [k, v] : metadata)
        if (utf8_invalid_at(k) != std::string::npos || utf8_invalid_at(v) != std::string::npos)
            bad(fmt::format("__metadata__ entry {} is not valid UTF-8", q(k)));
    // Largest element first, then name: with an 8-aligned data start every
    // tensor then starts at a multiple of its element size.
    std::stable_sort(order.begin(), order.end(), [](const Out& a, const Out& b) {
        return dtype_size(a.view->dtype) > dtype_size(b.view->dtype);
    });

    json header = json::object();  // std::map-backed: keys come out sorted
    if (!metadata.empty()) header["__metadata__"] = metadata;
    std::uint64_t offset = 0;
    for (const Out& o : order) {
        header[*o.name] = {{"dtype", safetensors_dtype_name(to_safetensors_dtype(o.view->dtype))},
                           {"shape", o.view->shape},
                           {"data_offsets", {offset, offset + o.nbytes}}};
        offset += o.nbytes;
    }
    std::string text = header.dump();  // inputs are UTF-8-checked above, so dump() cannot throw
    text.append((8 - text.size() % 8) % 8, ' ');
    if (text.size() > kSafetensorsMaxHeader)
        bad(fmt::format("header would be {} bytes, more than readers accept ({})", text.size(), kSafetensorsMaxHeader));

    // --- write a temporary file next to the target ---------------------------
    const fs::path target(path);
    const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    static std::atomic<unsigned> counter{0};
    int fd = -1;
    std::string tmp;
    for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
        const auto stamp = static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count());
        tmp = (dir / fmt::format(".{}.tmp-{}-{}-{:x}", target.filename().string(), ::getpid(), counter++, stamp & 0xffffff)).string();
        // O_EXCL: never clobber anything; mode 0666 lets the umask decide, as for any new file.
        fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) bad(fmt::format("cannot create a temporary file in {}: {}", escape(dir.string(), 400), std::strerror(errno)));
    }
    if (fd < 0) bad("cannot create a unique temporary file");
    TempFile temp(tmp, fd);

    std::array<std::byte, 8> len{};
    for (int i = 0; i < 8; ++i) len[static_cast<std::size_t>(i)] = static_cast<std::byte>((text.size() >> (8 * i)) & 0xff);
    write_all(fd, len.data(), len.size(), shown);
    write_all(fd, reinterpret_cast<const std::byte*>(text.data()), text.size(), shown);
    for (const Out& o : order)
        write_all(fd, static_cast<const std::byte*>(o.view->data), static_cast<std::size_t>(o.nbytes), shown);
    if (::fsync(fd) != 0) bad(fmt::format("cannot fsync: {}", std::strerror(errno)));
    if (temp.close() != 0) bad(fmt::format("cannot close: {}", std::strerror(errno)));
    if (::rename(tmp.c_str(), path.c_str()) != 0) bad(fmt::format("cannot rename the temporary file into place: {}", std::strerror(errno)));
    temp.release();
    // Make the rename itself durable.
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) bad(fmt::format("written, but cannot open its directory to fsync it: {}", std::strerror(errno)));
    const int r = ::fsync(dfd);
    const int err = errno;
    ::close(dfd);
    if (r != 0) bad(fmt::format("written, but fsync of its directory failed: {}", std::strerror(err)));
}

}  // namespace kvasir
