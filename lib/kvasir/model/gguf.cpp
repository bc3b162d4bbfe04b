// GGUF reader: the container (gguf.hpp) — header, metadata values, tensor
// infos and their bounds; the llama.cpp naming is in gguf_arch.cpp. The parser
// is a single forward pass over a byte span with a cursor that refuses to move
// past the end; every length and count is checked against the bytes that
// remain *before* anything is allocated for it.
#include "kvasir/model/gguf.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/model/gguf_text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <map>
#include <type_traits>
#include <utility>

namespace kvasir {

using namespace gguf_detail;

namespace {

constexpr std::uint32_t kDefaultAlignment = 32;
// Element-count ceiling shared with shape_numel(): a tensor whose non-zero dims
// multiply past it is rejected, so every Shape we hand out is valid.
constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 62;
// The smallest encodings, used to bound header counts by the bytes left:
// a KV pair is at least key length (8) + value type (4) + a 1-byte value; a
// tensor info at least name length (8) + n_dims (4) + one dim (8) + type (4)
// + offset (8).
constexpr std::uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr std::uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
constexpr std::size_t kMaxDims = 4;

bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }
bool checked_add(std::uint64_t a, std::uint64_t b, std::uint64_t& out) { return !__builtin_add_overflow(a, b, &out); }

// Fixed encoded size of a scalar value type; 0 for string/array.
std::uint64_t fixed_size(GgufType t) {
    switch (t) {
        case GgufType::u8: case GgufType::i8: case GgufType::boolean: return 1;
        case GgufType::u16: case GgufType::i16: return 2;
        case GgufType::u32: case GgufType::i32: case GgufType::f32: return 4;
        case GgufType::u64: case GgufType::i64: case GgufType::f64: return 8;
        default: return 0;
    }
}

bool known_type(std::uint32_t t) { return t <= static_cast<std::uint32_t>(GgufType::f64); }

// Bounds-checked little-endian cursor over the file. Every failure names the
// file and the byte offset where the problem sits.
class Cursor {
public:
    Cursor(std::span<const std::byte> bytes, const std::string& file) : bytes_(bytes), file_(file) {}

    std::size_t pos() const { return pos_; }
    std::size_t remaining() const { return bytes_.size() - pos_; }

    // Make sure n more bytes exist; `what` describes them for the message.
    void need(std::uint64_t n, std::string_view what) const {
        if (n > remaining())
            fail(ErrorCode::bad_input, "{}: {} at byte {} runs past the end of the file ({} bytes needed, {} left)",
                 file_, what, pos_, n, remaining());
    }

    template <typename T>
    T read(std::string_view what) {
        need(sizeof(T), what);
        // Assemble little-endian bytes explicitly: correct on any host and
        // free of alignment assumptions.
        std::uint64_t v = 0;
        for (std::size_t i = 0; i < sizeof(T); ++i)
            v |= static_cast<std::uint64_t>(std::to_integer<std::uint8_t>(bytes_[pos_ + i])) << (8 * i);
        pos_ += sizeof(T);
        if constexpr (std::is_same_v<T, float>) {
            return std::bit_cast<float>(static_cast<std::uint32_t>(v));
        } else if constexpr (std::is_same_v<T, double>) {
            return std::bit_cast<double>(v);
        } else {
            return static_cast<T>(v);
        }
    }

    std::string read_string(std::string_view what) {
        const auto len = read<std::uint64_t>(what);
        if (len > remaining())
            fail(ErrorCode::bad_input, "{}: {} at byte {} has length {}, past the end of the file ({} bytes left)",
                 file_, what, pos_ - 8, len, remaining());
        std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<std::size_t>(len));
        pos_ += static_cast<std::size_t>(len);
        return s;
    }

private:
    std::span<const std::byte> bytes_;
    const std::string& file_;
    std::size_t pos_ = 0;
};

struct ValueReader {
    Cursor& cur;
    const std::string& file;
    const std::string& key;

    bool read_bool(std::string_view what) {
        const auto at = cur.pos();
        const auto b = cur.read<std::uint8_t>(what);
        if (b > 1)
            fail(ErrorCode::bad_input, "{}: metadata key '{}': bool at byte {} is {}, not 0 or 1", file,
                 printable(key), at, b);
        return b == 1;
    }

    GgufValue::Scalar scalar(GgufType t) {
        const std::string what = fmt::format("value of metadata key '{}'", printable(key));
        switch (t) {
            case GgufType::u8: return cur.read<std::uint8_t>(what);
            case GgufType::i8: return cur.read<std::int8_t>(what);
            case GgufType::u16: return cur.read<std::uint16_t>(what);
            case GgufType::i16: return cur.read<std::int16_t>(what);
            case GgufType::u32: return cur.read<std::uint32_t>(what);
            case GgufType::i32: return cur.read<std::int32_t>(what);
            case GgufType::f32: return cur.read<float>(what);
            case GgufType::boolean: return read_bool(what);
            case GgufType::string: return cur.read_string(what);
            case GgufType::u64: return cur.read<std::uint64_t>(what);
            case GgufType::i64: return cur.read<std::int64_t>(what);
            case GgufType::f64: return cur.read<double>(what);
            case GgufType::array: break;
        }
        KVASIR_ASSERT(false);
        return std::uint8_t{0};
    }

    template <typename T>
    std::vector<T> elements(std::uint64_t n, std::string_view what) {
        std::vector<T> out;
        out.reserve(static_cast<std::size_t>(n));  // bounded by the bytes left (checked by the caller)
        for (std::uint64_t i = 0; i < n; ++i) {
            if constexpr (std::is_same_v<T, bool>)
                out.push_back(read_bool(what));
            else if constexpr (std::is_same_v<T, std::string>)
                out.push_back(cur.read_string(what));
            else
                out.push_back(cur.read<T>(what));
        }
        return out;
    }

    GgufValue::Array array() {
        const auto at = cur.pos();
        const auto raw_type = cur.read<std::uint32_t>(fmt::format("array type of metadata key '{}'", printable(key)));
        if (raw_type == static_cast<std::uint32_t>(GgufType::array))
            fail(ErrorCode::bad_input, "{}: metadata key '{}' at byte {} is an array of arrays (nested arrays are not supported)",
                 file, printable(key), at);
        if (!known_type(raw_type))
            fail(ErrorCode::bad_input, "{}: metadata key '{}' at byte {} is an array of unknown value type {}", file,
                 printable(key), at, raw_type);
        const auto t = static_cast<GgufType>(raw_type);
        const auto n = cur.read<std::uint64_t>(fmt::format("array length of metadata key '{}'", printable(key)));
        // Strings take at least their 8-byte length each.
        const std::uint64_t min_elem = t == GgufType::string ? 8 : fixed_size(t);
        if (n > cur.remaining() / min_elem)
            fail(ErrorCode::bad_input,
                 "{}: metadata key '{}': array of {} {} at byte {} runs past the end of the file ({} bytes left)", file,
                 printable(key), n, gguf_type_name(t), at, cur.remaining());
        const std::string what = fmt::format("element of metadata array '{}'", printable(key));
        switch (t) {
            case GgufType::u8: return elements<std::uint8_t>(n, what);
            case GgufType::i8: return elements<std::int8_t>(n, what);
            case GgufType::u16: return elements<std::uint16_t>(n, what);
            case GgufType::i16: return elements<std::int16_t>(n, what);
            case GgufType::u32: return elements<std::uint32_t>(n, what);
            case GgufType::i32: return elements<std::int32_t>(n, what);
            case GgufType::f32: return elements<float>(n, what);
            case GgufType::boolean: return elements<bool>(n, what);
            case GgufType::string: return elements<std::string>(n, what);
            case GgufType::u64: return elements<std::uint64_t>(n, what);
            case GgufType::i64: return elements<std::int64_t>(n, what);
            case GgufType::f64: return elements<double>(n, what);
            case GgufType::array: break;
        }
        KVASIR_ASSERT(false);
        return std::vector<std::uint8_t>{};
    }
};

}  // namespace

namespace gguf_detail {

std::string printable(std::string_view s, std::size_t max_len) {
    std::string out;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (out.size() >= max_len) {
            out += "...";
            break;
        }
        const auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'')
            out += static_cast<char>(c);
        else
            out += fmt::format("\\x{:02x}", c);
    }
    return out;
}

}  // namespace gguf_detail

// ---------------------------------------------------------------------------
// GgufValue
// ---------------------------------------------------------------------------

std::string_view gguf_type_name(GgufType type) noexcept {
    static constexpr std::array<std::string_view, 13> names = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                                              "bool", "string", "array", "u64", "i64", "f64"};
    const auto i = static_cast<std::uint32_t>(type);
    return i < names.size() ? names[i] : std::string_view("?");
}

namespace {
// Variant index ↔ GgufType: indices 0..8 are types 0..8, 9..11 are 10..12.
GgufType type_of_index(std::size_t index) {
    return static_cast<GgufType>(index < 9 ? index : index + 1);
}
}  // namespace

GgufType GgufValue::type() const noexcept {
    if (const auto* s = scalar()) return type_of_index(s->index());
    return GgufType::array;
}

GgufType GgufValue::array_type() const noexcept {
    if (const auto* a = array()) return type_of_index(a->index());
    return GgufType::array;
}

std::size_t GgufValue::array_size() const noexcept {
    if (const auto* a = array()) return std::visit([](const auto& v) { return v.size(); }, *a);
    return 0;
}

std::optional<std::int64_t> GgufValue::as_int() const noexcept {
    const auto* s = scalar();
    if (s == nullptr) return std::nullopt;
    return std::visit(
        [](const auto& v) -> std::optional<std::int64_t> {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, std::uint64_t>) {
                if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
                return static_cast<std::int64_t>(v);
            } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
                return static_cast<std::int64_t>(v);
            } else {
                return std::nullopt;
            }
        },
        *s);
}

std::optional<double> GgufValue::as_float() const noexcept {
    const auto* s = scalar();
    if (s == nullptr) return std::nullopt;
    if (const auto* f = std::get_if<float>(s)) return *f;
    if (const auto* d = std::get_if<double>(s)) return *d;
    return std::nullopt;
}

namespace {
template <typename T>
std::string render(const T& v) {
    if constexpr (std::is_same_v<T, std::string>)
        return fmt::format("'{}'", printable(v, 64));
    else if constexpr (std::is_same_v<T, bool>)
        return v ? "true" : "false";
    else if constexpr (std::is_same_v<T, std::uint8_t> || std::is_same_v<T, std::int8_t>)
        return fmt::format("{}", static_cast<int>(v));
    else
        return fmt::format("{}", v);
}
}  // namespace

std::string GgufValue::summary(std::size_t max_items) const {
    if (const auto* s = scalar()) return std::visit([](const auto& v) { return render(v); }, *s);
    return std::visit(
        [&](const auto& vec) {
            std::string out = fmt::format("[{} × {}", gguf_type_name(array_type()), vec.size());
            for (std::size_t i = 0; i < vec.size() && i < max_items; ++i) {
                out += i == 0 ? ": " : ", ";
                if constexpr (std::is_same_v<std::decay_t<decltype(vec)>, std::vector<bool>>)
                    out += render<bool>(vec[i]);
                else
                    out += render(vec[i]);
            }
            if (vec.size() > max_items) out += ", …";
            return out + "]";
        },
        *array());
}

// ---------------------------------------------------------------------------
// GgufFile
// ---------------------------------------------------------------------------

namespace {

// The magic and the version (2 or 3); the cursor past them.
std::uint32_t read_magic_and_version(Cursor& cur, std::span<const std::byte> bytes, const std::string& file) {
    if (bytes.size() < 4)
        fail(ErrorCode::bad_input, "{}: not a GGUF file (only {} bytes, the magic alone needs 4)", file, bytes.size());
    if (std::memcmp(bytes.data(), "GGUF", 4) != 0) {
        std::string magic;
        for (int i = 0; i < 4; ++i) magic += printable(std::string_view(reinterpret_cast<const char*>(bytes.data()) + i, 1));
        fail(ErrorCode::bad_input, "{}: not a GGUF file (magic is '{}', expected 'GGUF')", file, magic);
    }
    cur.read<std::uint32_t>("magic");
    const auto version = cur.read<std::uint32_t>("GGUF version");
    if (version == 1)
        fail(ErrorCode::bad_input,
             "{}: GGUF version 1 is not supported (obsolete 32-bit layout; re-convert the model with a current llama.cpp)",
             file);
    if (version != 2 && version != 3) {
        // A big-endian file has its version byte-swapped (0x03000000).
        if ((version & 0xffffu) == 0 && (version >> 24) >= 1 && (version >> 24) <= 3)
            fail(ErrorCode::bad_input, "{}: big-endian GGUF files are not supported", file);
        fail(ErrorCode::bad_input, "{}: unsupported GGUF version {} (this reader handles versions 2 and 3)", file,
             version);
    }
    return version;
}

// Both counts bounded by what the rest of the file could hold, before any
// loop or reservation trusts them.
void check_counts(const Cursor& cur, std::uint64_t n_kv, std::uint64_t n_tensors, const std::string& file) {
    if (n_kv > cur.remaining() / kMinKvBytes)
        fail(ErrorCode::bad_input,
             "{}: metadata count {} is impossible: the {} bytes after the header hold at most {} key/value pairs", file,
             n_kv, cur.remaining(), cur.remaining() / kMinKvBytes);
    if (n_tensors > cur.remaining() / kMinTensorInfoBytes)
        fail(ErrorCode::bad_input,
             "{}: tensor count {} is impossible: the {} bytes after the header hold at most {} tensor infos", file,
             n_tensors, cur.remaining(), cur.remaining() / kMinTensorInfoBytes);
    if (n_kv * kMinKvBytes + n_tensors * kMinTensorInfoBytes > cur.remaining())  // no overflow: both bounded above
        fail(ErrorCode::bad_input, "{}: {} metadata entries and {} tensor infos cannot fit in the {} bytes after the header",
             file, n_kv, n_tensors, cur.remaining());
}

// general.alignment (a non-zero power of two, u32) or the default.
std::uint32_t alignment_of(const GgufValue* a, const std::string& file) {
    if (a == nullptr) return kDefaultAlignment;
    const auto* v = a->scalar() ? std::get_if<std::uint32_t>(a->scalar()) : nullptr;
    if (v == nullptr) fail(ErrorCode::bad_input, "{}: general.alignment is a {}, not a u32", file, gguf_type_name(a->type()));
    if (*v == 0 || (*v & (*v - 1)) != 0)
        fail(ErrorCode::bad_input, "{}: general.alignment {} is not a non-zero power of two", file, *v);
    return *v;
}

// Tensor info `i` at the cursor: name (not one of `known`), dimensions, ggml
// type and data offset, with its element count and byte size (every step
// checked). Its place in the data section is set later (place_tensors).
GgufTensor read_tensor_info(Cursor& cur, std::uint64_t i, const std::map<std::string, std::size_t, std::less<>>& known,
                            const std::string& file) {
    const auto at = cur.pos();
    GgufTensor t;
    t.file = file;
    t.name = cur.read_string(fmt::format("name of tensor {}", i));
    const std::string pname = printable(t.name);
    if (known.count(t.name) != 0) fail(ErrorCode::bad_input, "{}: duplicate tensor name '{}' at byte {}", file, pname, at);
    const auto n_dims = cur.read<std::uint32_t>(fmt::format("dimension count of tensor '{}'", pname));
    if (n_dims == 0 || n_dims > kMaxDims)
        fail(ErrorCode::bad_input, "{}: tensor '{}' has {} dimensions (ggml tensors have 1 to {})", file, pname, n_dims,
             kMaxDims);
    std::uint64_t nonzero_product = 1;
    bool any_zero = false;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
        const auto ne = cur.read<std::uint64_t>(fmt::format("dimension {} of tensor '{}'", d, pname));
        if (ne > kMaxElements)
            fail(ErrorCode::bad_input, "{}: tensor '{}' dimension {} is {}, above the 2^62 limit", file, pname, d, ne);
        if (ne == 0) {
            any_zero = true;
        } else if (!checked_mul(nonzero_product, ne, nonzero_product) || nonzero_product > kMaxElements) {
            fail(ErrorCode::bad_input, "{}: tensor '{}' dimensions multiply past 2^62 elements", file, pname);
        }
        t.ne.push_back(static_cast<std::int64_t>(ne));
    }
    t.numel = any_zero ? 0 : static_cast<std::int64_t>(nonzero_product);
    const auto type_at = cur.pos();
    const auto raw_type = cur.read<std::uint32_t>(fmt::format("type of tensor '{}'", pname));
    const auto traits = ggml_type_traits(raw_type);
    if (!traits)
        fail(ErrorCode::bad_input, "{}: tensor '{}' has unknown ggml type {} at byte {}", file, pname, raw_type, type_at);
    t.type = traits->type;
    if (t.ne[0] % traits->block_size != 0)
        fail(ErrorCode::bad_input, "{}: tensor '{}' row length {} is not a multiple of the {} block size {}", file, pname,
             t.ne[0], traits->name, traits->block_size);
    t.offset = cur.read<std::uint64_t>(fmt::format("data offset of tensor '{}'", pname));
    // nbytes = rows × blocks-per-row × block_bytes, every step checked.
    const std::uint64_t row_blocks = static_cast<std::uint64_t>(t.ne[0]) / traits->block_size;
    std::uint64_t row_bytes = 0;
    std::uint64_t nbytes = 0;
    const std::uint64_t rows = t.ne[0] == 0 ? 0 : static_cast<std::uint64_t>(t.numel) / static_cast<std::uint64_t>(t.ne[0]);
    if (!checked_mul(row_blocks, traits->block_bytes, row_bytes) || !checked_mul(rows, row_bytes, nbytes) ||
        nbytes > std::numeric_limits<std::size_t>::max())
        fail(ErrorCode::bad_input, "{}: tensor '{}' byte size overflows", file, pname);
    t.nbytes = static_cast<std::size_t>(nbytes);
    t.shape.assign(t.ne.rbegin(), t.ne.rend());
    return t;
}

// Every tensor's data inside the file, at an aligned offset of the data
// section that starts at `data_start`, and no two sharing bytes (legal files
// lay tensors out back to back: overlap means a corrupt or crafted header).
void place_tensors(std::vector<GgufTensor>& tensors, std::span<const std::byte> bytes, std::uint64_t data_start,
                   std::uint32_t alignment, const std::string& file) {
    for (auto& t : tensors) {
        const std::string pname = printable(t.name);
        if (t.offset % alignment != 0)
            fail(ErrorCode::bad_input, "{}: tensor '{}' data offset {} is not a multiple of the alignment {}", file, pname,
                 t.offset, alignment);
        std::uint64_t begin = 0;
        std::uint64_t end = 0;
        if (!checked_add(data_start, t.offset, begin) || !checked_add(begin, t.nbytes, end) || end > bytes.size())
            fail(ErrorCode::bad_input,
                 "{}: tensor '{}' data (offset {} + {} bytes after the data section at {}) runs past the end of the file "
                 "({} bytes)",
                 file, pname, t.offset, t.nbytes, data_start, bytes.size());
        t.file_offset = begin;
        t.data = bytes.data() + begin;
    }
    std::vector<const GgufTensor*> by_offset;
    by_offset.reserve(tensors.size());
    for (const auto& t : tensors)
        if (t.nbytes != 0) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(), [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
    for (std::size_t i = 1; i < by_offset.size(); ++i) {
        const GgufTensor& a = *by_offset[i - 1];
        const GgufTensor& b = *by_offset[i];
        if (a.offset + a.nbytes > b.offset)  // no overflow: both ranges were checked inside the file
            fail(ErrorCode::bad_input, "{}: tensors '{}' and '{}' overlap in the data section", file, printable(a.name),
                 printable(b.name));
    }
}

}  // namespace

GgufFile GgufFile::parse(std::span<const std::byte> bytes, std::string name) {
    GgufFile f;
    f.name_ = std::move(name);
    f.file_size_ = bytes.size();
    const std::string& file = f.name_;
    Cursor cur(bytes, file);

    f.version_ = read_magic_and_version(cur, bytes, file);
    const auto n_tensors = cur.read<std::uint64_t>("tensor count");
    const auto n_kv = cur.read<std::uint64_t>("metadata count");
    check_counts(cur, n_kv, n_tensors, file);

    f.keys_.reserve(static_cast<std::size_t>(n_kv));
    f.values_.reserve(static_cast<std::size_t>(n_kv));
    for (std::uint64_t i = 0; i < n_kv; ++i) {
        const auto at = cur.pos();
        std::string key = cur.read_string(fmt::format("key of metadata entry {}", i));
        if (f.key_index_.count(key) != 0)
            fail(ErrorCode::bad_input, "{}: duplicate metadata key '{}' at byte {}", file, printable(key), at);
        const auto type_at = cur.pos();
        const auto raw_type = cur.read<std::uint32_t>(fmt::format("value type of metadata key '{}'", printable(key)));
        if (!known_type(raw_type))
            fail(ErrorCode::bad_input, "{}: metadata key '{}' has unknown value type {} at byte {}", file, printable(key),
                 raw_type, type_at);
        ValueReader vr{cur, file, key};
        const auto t = static_cast<GgufType>(raw_type);
        GgufValue value = t == GgufType::array ? GgufValue(vr.array()) : GgufValue(vr.scalar(t));
        f.key_index_.emplace(key, f.keys_.size());
        f.keys_.push_back(std::move(key));
        f.values_.push_back(std::move(value));
    }
    f.alignment_ = alignment_of(f.find("general.alignment"), file);

    f.tensors_.reserve(static_cast<std::size_t>(n_tensors));
    for (std::uint64_t i = 0; i < n_tensors; ++i) {
        GgufTensor t = read_tensor_info(cur, i, f.tensor_index_, file);
        f.tensor_index_.emplace(t.name, f.tensors_.size());
        f.tensors_.push_back(std::move(t));
    }

    std::uint64_t data_start = 0;
    if (!checked_add(cur.pos(), f.alignment_ - 1, data_start)) fail(ErrorCode::bad_input, "{}: data section offset overflows", file);
    data_start -= data_start % f.alignment_;
    f.data_start_ = data_start;
    place_tensors(f.tensors_, bytes, data_start, f.alignment_, file);
    return f;
}

GgufFile GgufFile::open(const std::string& path) {
    MappedFile mapping(path);
    GgufFile f = parse(mapping.bytes(), path);
    f.mapping_.emplace(std::move(mapping));  // the move keeps the mapped address: tensor pointers stay valid
    return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
    const auto it = key_index_.find(key);
    return it == key_index_.end() ? nullptr : &values_[it->second];
}

const GgufValue& GgufFile::get(std::string_view key) const {
    const auto* v = find(key);
    if (v == nullptr) fail(ErrorCode::bad_input, "{}: metadata key '{}' is missing", name_, printable(key));
    return *v;
}

namespace {
std::string describe(const GgufValue& v) {
    if (v.is_array()) return fmt::format("an array of {}", gguf_type_name(v.array_type()));
    return fmt::format("a {}", gguf_type_name(v.type()));
}
}  // namespace

template <typename T>
const T& GgufFile::get_scalar(std::string_view key, GgufType expected) const {
    const GgufValue& v = get(key);
    const auto* s = v.scalar();
    const T* p = s ? std::get_if<T>(s) : nullptr;
    if (p == nullptr)
        fail(ErrorCode::bad_input, "{}: metadata key '{}' is {}, not a {}", name_, printable(key), describe(v),
             gguf_type_name(expected));
    return *p;
}

template <typename T>
const std::vector<T>& GgufFile::get_array(std::string_view key, GgufType expected) const {
    const GgufValue& v = get(key);
    const auto* a = v.array();
    const std::vector<T>* p = a ? std::get_if<std::vector<T>>(a) : nullptr;
    if (p == nullptr)
        fail(ErrorCode::bad_input, "{}: metadata key '{}' is {}, not an array of {}", name_, printable(key),
             describe(v), gguf_type_name(expected));
    return *p;
}

std::uint8_t GgufFile::get_u8(std::string_view k) const { return get_scalar<std::uint8_t>(k, GgufType::u8); }
std::int8_t GgufFile::get_i8(std::string_view k) const { return get_scalar<std::int8_t>(k, GgufType::i8); }
std::uint16_t GgufFile::get_u16(std::string_view k) const { return get_scalar<std::uint16_t>(k, GgufType::u16); }
std::int16_t GgufFile::get_i16(std::string_view k) const { return get_scalar<std::int16_t>(k, GgufType::i16); }
std::uint32_t GgufFile::get_u32(std::string_view k) const { return get_scalar<std::uint32_t>(k, GgufType::u32); }
std::int32_t GgufFile::get_i32(std::string_view k) const { return get_scalar<std::int32_t>(k, GgufType::i32); }
std::uint64_t GgufFile::get_u64(std::string_view k) const { return get_scalar<std::uint64_t>(k, GgufType::u64); }
std::int64_t GgufFile::get_i64(std::string_view k) const { return get_scalar<std::int64_t>(k, GgufType::i64); }
float GgufFile::get_f32(std::string_view k) const { return get_scalar<float>(k, GgufType::f32); }
double GgufFile::get_f64(std::string_view k) const { return get_scalar<double>(k, GgufType::f64); }
bool GgufFile::get_bool(std::string_view k) const { return get_scalar<bool>(k, GgufType::boolean); }
const std::string& GgufFile::get_string(std::string_view k) const {
    return get_scalar<std::string>(k, GgufType::string);
}

std::int64_t GgufFile::get_int(std::string_view key) const {
    const GgufValue& v = get(key);
    const auto i = v.as_int();
    if (!i)
        fail(ErrorCode::bad_input, "{}: metadata key '{}' is {}, not an integer that fits in i64", name_,
             printable(key), describe(v));
    return *i;
}

double GgufFile::get_float(std::string_view key) const {
    const GgufValue& v = get(key);
    const auto x = v.as_float();
    if (!x) fail(ErrorCode::bad_input, "{}: metadata key '{}' is {}, not a f32 or f64", name_, printable(key), describe(v));
    return *x;
}

std::span<const std::uint8_t> GgufFile::get_array_u8(std::string_view k) const { return get_array<std::uint8_t>(k, GgufType::u8); }
std::span<const std::int8_t> GgufFile::get_array_i8(std::string_view k) const { return get_array<std::int8_t>(k, GgufType::i8); }
std::span<const std::uint16_t> GgufFile::get_array_u16(std::string_view k) const { return get_array<std::uint16_t>(k, GgufType::u16); }
std::span<const std::int16_t> GgufFile::get_array_i16(std::string_view k) const { return get_array<std::int16_t>(k, GgufType::i16); }
std::span<const std::uint32_t> GgufFile::get_array_u32(std::string_view k) const { return get_array<std::uint32_t>(k, GgufType::u32); }
std::span<const std::int32_t> GgufFile::get_array_i32(std::string_view k) const { return get_array<std::int32_t>(k, GgufType::i32); }
std::span<const std::uint64_t> GgufFile::get_array_u64(std::string_view k) const { return get_array<std::uint64_t>(k, GgufType::u64); }
std::span<const std::int64_t> GgufFile::get_array_i64(std::string_view k) const { return get_array<std::int64_t>(k, GgufType::i64); }
std::span<const float> GgufFile::get_array_f32(std::string_view k) const { return get_array<float>(k, GgufType::f32); }
std::span<const double> GgufFile::get_array_f64(std::string_view k) const { return get_array<double>(k, GgufType::f64); }
const std::vector<bool>& GgufFile::get_array_bool(std::string_view k) const { return get_array<bool>(k, GgufType::boolean); }
std::span<const std::string> GgufFile::get_array_string(std::string_view k) const {
    return get_array<std::string>(k, GgufType::string);
}

const GgufTensor* GgufFile::find_tensor(std::string_view tensor_name) const {
    const auto it = tensor_index_.find(tensor_name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(std::string_view tensor_name) const {
    const auto* t = find_tensor(tensor_name);
    if (t == nullptr) fail(ErrorCode::bad_input, "{}: no tensor '{}'", name_, printable(tensor_name));
    return *t;
}

Tensor dequantize(const GgufTensor& t) {
    const GgmlTypeTraits tr = ggml_traits(t.type);
    if (!ggml_type_dequantizable(t.type))
        fail(ErrorCode::unsupported, "{}: tensor '{}' has type {}, which cannot be dequantised (supported: {})", t.file,
             t.name, tr.name, ggml_dequantizable_types());
    // Re-validate the geometry rather than trust the struct: a GgufTensor can
    // be built by hand, and a wrong nbytes here would mean an out-of-bounds read.
    KVASIR_CHECK(!t.ne.empty() && t.ne[0] >= 0 && t.ne[0] % tr.block_size == 0, ErrorCode::bad_input,
                 "{}: tensor '{}' row length is not a multiple of the {} block size {}", t.file, t.name, tr.name,
                 tr.block_size);
    const std::int64_t numel = shape_numel(t.shape);
    const std::int64_t row = t.ne[0];
    const std::int64_t rows = row == 0 ? 0 : numel / row;
    const auto row_bytes = static_cast<std::size_t>(row / tr.block_size) * tr.block_bytes;
    KVASIR_CHECK(numel == t.numel && (row == 0 || static_cast<std::size_t>(rows) * row_bytes == t.nbytes) &&
                     (t.nbytes == 0 || t.data != nullptr),
                 ErrorCode::bad_input, "{}: tensor '{}' byte size {} does not match its shape {} and type {}", t.file,
                 t.name, t.nbytes, shape_str(t.shape), tr.name);
    Tensor out(DType::f32, t.shape);
    float* dst = out.as<float>();
    for (std::int64_t r = 0; r < rows; ++r)
        dequantize_row(t.type, t.data + static_cast<std::size_t>(r) * row_bytes, dst + r * row, row);
    return out;
}

}  // namespace kvasir
