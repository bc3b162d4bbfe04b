// The safetensors format and the reader of one file (safetensors.hpp): the
// dtype table, the SAX header parser that builds the tensor table, the layout
// checks, and SafetensorsFile (mapping, views, aligned copies).
#include "kvasir/model/safetensors.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/model/safetensors_text.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>

namespace kvasir {

using namespace safetensors_detail;

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

namespace {

using json = nlohmann::json;

std::uint64_t read_le64(const std::byte* p) noexcept {
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint64_t>(p[i]);
    return v;
}

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
std::optional<std::string> SafetensorsFile::metadata_value(const std::string& key) const {
    const auto it = impl_->metadata.find(key);
    if (it == impl_->metadata.end()) return std::nullopt;
    return it->second;
}
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

}  // namespace kvasir
