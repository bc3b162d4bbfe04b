// GGUF reader: fixture files written by gguf-py (scripts/make_gguf_fixtures.py)
// read back bit-exactly, the llama.cpp name mapping and hyperparameters, and a
// catalogue of malformed files built by patching a small valid file in memory.
#include "kvasir/core/error.hpp"
#include "kvasir/model/gguf.hpp"
#include "kvasir/model/gguf_arch.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/model/quant.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <vector>

using namespace kvasir;

namespace {

const std::string kFixtures = std::string(KVASIR_SOURCE_DIR) + "/fixtures/gguf/";

std::vector<std::byte> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    EXPECT_TRUE(in.good()) << path;
    std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> out(c.size());
    if (!c.empty()) std::memcpy(out.data(), c.data(), c.size());
    return out;
}

// ULP distance between two floats of the same sign domain (monotone mapping).
std::int64_t ulp_distance(float a, float b) {
    auto key = [](float x) {
        const auto u = std::bit_cast<std::int32_t>(x);
        return u < 0 ? std::int64_t{std::numeric_limits<std::int32_t>::min()} - u : std::int64_t{u};
    };
    return std::llabs(key(a) - key(b));
}

// ---------------------------------------------------------------------------
// A small valid GGUF built by hand, with the byte position of every field the
// malformed-file tests patch.
// ---------------------------------------------------------------------------
struct Builder {
    std::vector<std::byte> b;
    std::size_t pos() const { return b.size(); }
    void u8(std::uint8_t v) { b.push_back(std::byte{v}); }
    void u32(std::uint32_t v) {
        for (int i = 0; i < 4; ++i) u8(static_cast<std::uint8_t>(v >> (8 * i)));
    }
    void u64(std::uint64_t v) {
        for (int i = 0; i < 8; ++i) u8(static_cast<std::uint8_t>(v >> (8 * i)));
    }
    void f32(float v) { u32(std::bit_cast<std::uint32_t>(v)); }
    std::size_t str(std::string_view s) {  // returns the position of the length field
        const auto at = pos();
        u64(s.size());
        for (char c : s) u8(static_cast<std::uint8_t>(c));
        return at;
    }
    void pad_to(std::size_t align) {
        while (b.size() % align != 0) u8(0);
    }
};

struct Layout {
    std::vector<std::byte> bytes;
    std::size_t version, n_tensors, n_kv;
    std::size_t align_value;   // u32 value of general.alignment
    std::size_t key_ax;        // length field of key "a.x"
    std::size_t key_ay;        // length field of key "a.y"
    std::size_t ay_type;       // value type of "a.y"
    std::size_t bool_byte;     // the bool value of "a.y"
    std::size_t arr_type, arr_count;
    std::size_t str_len;       // length field of the string value of "a.s"
    std::size_t t_name[2], t_ndims[2], t_ne[2], t_type[2], t_offset[2];
    std::size_t data_start;
};

// 5 KV pairs, two tensors: t0 F32 ne=[32,2] at offset 0 (256 bytes) and t1
// Q8_0 ne=[32] at offset 256 (34 bytes). The file ends exactly at t1's end.
Layout valid_file() {
    Builder w;
    Layout L{};
    w.u8('G'); w.u8('G'); w.u8('U'); w.u8('F');
    L.version = w.pos(); w.u32(3);
    L.n_tensors = w.pos(); w.u64(2);
    L.n_kv = w.pos(); w.u64(5);
    w.str("general.alignment"); w.u32(4); L.align_value = w.pos(); w.u32(32);
    L.key_ax = w.str("a.x"); w.u32(4); w.u32(7);
    L.key_ay = w.str("a.y"); L.ay_type = w.pos(); w.u32(7); L.bool_byte = w.pos(); w.u8(1);
    w.str("a.arr"); w.u32(9); L.arr_type = w.pos(); w.u32(4); L.arr_count = w.pos(); w.u64(3);
    w.u32(1); w.u32(2); w.u32(3);
    w.str("a.s"); w.u32(8); L.str_len = w.str("hello");
    const char* names[2] = {"t0", "t1"};
    const std::vector<std::uint64_t> ne[2] = {{32, 2}, {32}};
    const std::uint32_t types[2] = {0, 8};
    const std::uint64_t offsets[2] = {0, 256};
    for (int i = 0; i < 2; ++i) {
        L.t_name[i] = w.str(names[i]);
        L.t_ndims[i] = w.pos(); w.u32(static_cast<std::uint32_t>(ne[i].size()));
        L.t_ne[i] = w.pos();
        for (auto d : ne[i]) w.u64(d);
        L.t_type[i] = w.pos(); w.u32(types[i]);
        L.t_offset[i] = w.pos(); w.u64(offsets[i]);
    }
    w.pad_to(32);
    L.data_start = w.pos();
    for (int i = 0; i < 64; ++i) w.f32(static_cast<float>(i) * 0.5f);
    w.u8(0x00); w.u8(0x38);  // f16 0.5
    for (int i = 0; i < 32; ++i) w.u8(static_cast<std::uint8_t>(i - 16));
    L.bytes = std::move(w.b);
    return L;
}

void put_u32(std::vector<std::byte>& b, std::size_t at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) b[at + i] = std::byte{static_cast<std::uint8_t>(v >> (8 * i))};
}
void put_u64(std::vector<std::byte>& b, std::size_t at, std::uint64_t v) {
    for (int i = 0; i < 8; ++i) b[at + i] = std::byte{static_cast<std::uint8_t>(v >> (8 * i))};
}

GgufFile parse(const std::vector<std::byte>& b) { return GgufFile::parse(b, "mem.gguf"); }

// The file must be rejected with bad_input and ONE line "mem.gguf: ..."
// containing `needle`.
void expect_bad(const std::vector<std::byte>& b, const std::string& needle) {
    try {
        parse(b);
        ADD_FAILURE() << "accepted a malformed file; expected an error containing: " << needle;
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(e.code(), ErrorCode::bad_input) << msg;
        EXPECT_EQ(msg.rfind("mem.gguf: ", 0), 0u) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
        EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected: " << needle;
    }
}

}  // namespace

// ---------------------------------------------------------------------------
// The hand-built file itself
// ---------------------------------------------------------------------------

TEST(GgufParse, HandBuiltFileReadsBack) {
    const Layout L = valid_file();
    const GgufFile f = parse(L.bytes);
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.alignment(), 32u);
    EXPECT_EQ(f.data_start(), L.data_start);
    EXPECT_EQ(f.keys(), (std::vector<std::string>{"general.alignment", "a.x", "a.y", "a.arr", "a.s"}));
    EXPECT_EQ(f.get_u32("a.x"), 7u);
    EXPECT_TRUE(f.get_bool("a.y"));
    ASSERT_EQ(f.tensors().size(), 2u);
    const GgufTensor& t0 = f.tensor("t0");
    EXPECT_EQ(t0.ne, (std::vector<std::int64_t>{32, 2}));
    EXPECT_EQ(t0.shape, (Shape{2, 32}));
    EXPECT_EQ(t0.nbytes, 256u);
    EXPECT_EQ(t0.file_offset, L.data_start);
    EXPECT_EQ(t0.data, L.bytes.data() + L.data_start);
    const Tensor d0 = dequantize(t0);
    EXPECT_EQ(d0.shape(), (Shape{2, 32}));
    EXPECT_EQ(d0.as<float>()[33], 16.5f);
    const Tensor d1 = dequantize(f.tensor("t1"));
    EXPECT_EQ(d1.shape(), (Shape{32}));
    EXPECT_EQ(d1.as<float>()[0], -8.0f);
    EXPECT_EQ(d1.as<float>()[31], 7.5f);
}

TEST(GgufParse, Version2IsAccepted) {
    Layout L = valid_file();
    put_u32(L.bytes, L.version, 2);
    const GgufFile f = parse(L.bytes);
    EXPECT_EQ(f.version(), 2u);
    EXPECT_EQ(f.tensors().size(), 2u);
}

TEST(GgufParse, ZeroSizedTensorIsAccepted) {
    Layout L = valid_file();
    put_u64(L.bytes, L.t_ne[0] + 8, 0);  // t0: ne = [32, 0] → 0 bytes
    const GgufFile f = parse(L.bytes);
    EXPECT_EQ(f.tensor("t0").numel, 0);
    EXPECT_EQ(f.tensor("t0").nbytes, 0u);
    EXPECT_EQ(dequantize(f.tensor("t0")).numel(), 0);
}

// ---------------------------------------------------------------------------
// Malformed files: each must fail with one clear line, never crash.
// ---------------------------------------------------------------------------

TEST(GgufMalformed, BadMagic) {
    Layout L = valid_file();
    L.bytes[0] = std::byte{'X'};
    expect_bad(L.bytes, "not a GGUF file (magic is 'XGUF'");
}

TEST(GgufMalformed, EmptyFile) { expect_bad({}, "not a GGUF file"); }

TEST(GgufMalformed, Version1) {
    Layout L = valid_file();
    put_u32(L.bytes, L.version, 1);
    expect_bad(L.bytes, "GGUF version 1 is not supported");
}

TEST(GgufMalformed, Version99) {
    Layout L = valid_file();
    put_u32(L.bytes, L.version, 99);
    expect_bad(L.bytes, "unsupported GGUF version 99");
}

TEST(GgufMalformed, BigEndian) {
    Layout L = valid_file();
    put_u32(L.bytes, L.version, 0x03000000u);
    expect_bad(L.bytes, "big-endian");
}

TEST(GgufMalformed, TensorCountAbsurd) {
    Layout L = valid_file();
    put_u64(L.bytes, L.n_tensors, std::uint64_t{1} << 60);
    expect_bad(L.bytes, "tensor count 1152921504606846976 is impossible");
    put_u64(L.bytes, L.n_tensors, ~std::uint64_t{0});
    expect_bad(L.bytes, "tensor count 18446744073709551615 is impossible");
}

TEST(GgufMalformed, KvCountAbsurd) {
    Layout L = valid_file();
    put_u64(L.bytes, L.n_kv, std::uint64_t{1} << 62);
    expect_bad(L.bytes, "metadata count 4611686018427387904 is impossible");
}

TEST(GgufMalformed, KvCountOneTooMany) {
    // Plausible by the size bound, so the parser reads the first tensor info
    // as a key/value pair and must still fail cleanly.
    Layout L = valid_file();
    put_u64(L.bytes, L.n_kv, 6);
    EXPECT_THROW(parse(L.bytes), Error);
}

TEST(GgufMalformed, KeyLengthPastEof) {
    Layout L = valid_file();
    put_u64(L.bytes, L.key_ax, 1u << 20);
    expect_bad(L.bytes, "key of metadata entry 1 at byte");
    put_u64(L.bytes, L.key_ax, ~std::uint64_t{0});
    expect_bad(L.bytes, "past the end of the file");
}

TEST(GgufMalformed, StringValueLengthPastEof) {
    Layout L = valid_file();
    put_u64(L.bytes, L.str_len, L.bytes.size());
    expect_bad(L.bytes, "value of metadata key 'a.s' at byte");
}

TEST(GgufMalformed, ArrayLengthPastEof) {
    Layout L = valid_file();
    put_u64(L.bytes, L.arr_count, std::uint64_t{1} << 61);
    expect_bad(L.bytes, "metadata key 'a.arr': array of 2305843009213693952 u32");
    put_u64(L.bytes, L.arr_count, ~std::uint64_t{0});  // count × 4 would overflow
    expect_bad(L.bytes, "runs past the end of the file");
}

TEST(GgufMalformed, StringArrayLengthPastEof) {
    Layout L = valid_file();
    put_u32(L.bytes, L.arr_type, 8);  // array of strings: 8 bytes per element at least
    put_u64(L.bytes, L.arr_count, L.bytes.size() / 8 + 1);
    expect_bad(L.bytes, "array of");
}

TEST(GgufMalformed, NestedArray) {
    Layout L = valid_file();
    put_u32(L.bytes, L.arr_type, 9);
    expect_bad(L.bytes, "metadata key 'a.arr' at byte");
    expect_bad(L.bytes, "nested arrays are not supported");
}

TEST(GgufMalformed, UnknownValueType) {
    Layout L = valid_file();
    put_u32(L.bytes, L.ay_type, 13);
    expect_bad(L.bytes, "metadata key 'a.y' has unknown value type 13");
}

TEST(GgufMalformed, UnknownArrayElementType) {
    Layout L = valid_file();
    put_u32(L.bytes, L.arr_type, 0xdeadbeef);
    expect_bad(L.bytes, "array of unknown value type 3735928559");
}

TEST(GgufMalformed, BoolNotZeroOrOne) {
    Layout L = valid_file();
    L.bytes[L.bool_byte] = std::byte{2};
    expect_bad(L.bytes, "bool at byte");
}

TEST(GgufMalformed, AlignmentZero) {
    Layout L = valid_file();
    put_u32(L.bytes, L.align_value, 0);
    expect_bad(L.bytes, "general.alignment 0 is not a non-zero power of two");
}

TEST(GgufMalformed, AlignmentNotPowerOfTwo) {
    Layout L = valid_file();
    put_u32(L.bytes, L.align_value, 48);
    expect_bad(L.bytes, "general.alignment 48 is not a non-zero power of two");
}

TEST(GgufMalformed, AlignmentWrongType) {
    Layout L = valid_file();
    // general.alignment as an i32 (type 5) instead of u32: same 4-byte size.
    put_u32(L.bytes, L.align_value - 4, 5);
    expect_bad(L.bytes, "general.alignment is a i32, not a u32");
}

TEST(GgufMalformed, TooManyDims) {
    Layout L = valid_file();
    put_u32(L.bytes, L.t_ndims[0], 5);
    expect_bad(L.bytes, "tensor 't0' has 5 dimensions (ggml tensors have 1 to 4)");
}

TEST(GgufMalformed, ZeroDims) {
    // Decision: refused. ggml never writes a 0-dim tensor and every type
    // needs a row (ne[0]) to lay out its blocks.
    Layout L = valid_file();
    put_u32(L.bytes, L.t_ndims[0], 0);
    expect_bad(L.bytes, "tensor 't0' has 0 dimensions");
}

TEST(GgufMalformed, DimensionProductOverflow) {
    Layout L = valid_file();
    put_u64(L.bytes, L.t_ne[0], std::uint64_t{1} << 32);
    put_u64(L.bytes, L.t_ne[0] + 8, std::uint64_t{1} << 32);  // 2^64 elements
    expect_bad(L.bytes, "tensor 't0' dimensions multiply past 2^62 elements");
}

TEST(GgufMalformed, SingleDimensionTooLarge) {
    Layout L = valid_file();
    put_u64(L.bytes, L.t_ne[0], ~std::uint64_t{0} - 31);  // "negative" as int64
    expect_bad(L.bytes, "above the 2^62 limit");
}

TEST(GgufMalformed, ByteSizeOverflowWithinElementLimit) {
    // 2^62 F32 elements are allowed by the element limit, but 2^64 bytes are
    // not representable: the size arithmetic must catch it, not wrap.
    Layout L = valid_file();
    put_u64(L.bytes, L.t_ne[0], std::uint64_t{1} << 31);
    put_u64(L.bytes, L.t_ne[0] + 8, std::uint64_t{1} << 31);
    expect_bad(L.bytes, "tensor 't0' byte size overflows");
}

TEST(GgufMalformed, UnknownGgmlType) {
    Layout L = valid_file();
    put_u32(L.bytes, L.t_type[1], 99);
    expect_bad(L.bytes, "tensor 't1' has unknown ggml type 99");
    put_u32(L.bytes, L.t_type[1], 4);  // the removed Q4_2
    expect_bad(L.bytes, "unknown ggml type 4");
}

TEST(GgufMalformed, RowNotMultipleOfBlockSize) {
    Layout L = valid_file();
    put_u64(L.bytes, L.t_ne[1], 48);  // Q8_0 blocks are 32
    expect_bad(L.bytes, "tensor 't1' row length 48 is not a multiple of the Q8_0 block size 32");
    Layout K = valid_file();
    put_u32(K.bytes, K.t_type[0], 12);  // t0 as Q4_K: row 32 < 256
    expect_bad(K.bytes, "row length 32 is not a multiple of the Q4_K block size 256");
}

TEST(GgufMalformed, OffsetMisaligned) {
    Layout L = valid_file();
    put_u64(L.bytes, L.t_offset[1], 257);
    expect_bad(L.bytes, "tensor 't1' data offset 257 is not a multiple of the alignment 32");
}

TEST(GgufMalformed, DataPastEof) {
    Layout L = valid_file();
    put_u64(L.bytes, L.t_offset[1], 288);  // aligned, but 288 + 34 > data size 290
    expect_bad(L.bytes, "tensor 't1' data (offset 288 + 34 bytes");
    put_u64(L.bytes, L.t_offset[1], ~std::uint64_t{0} & ~std::uint64_t{31});  // data_start + offset wraps
    expect_bad(L.bytes, "runs past the end of the file");
}

TEST(GgufMalformed, TensorsOverlap) {
    Layout L = valid_file();
    put_u64(L.bytes, L.t_offset[1], 224);  // inside t0's 256 bytes
    expect_bad(L.bytes, "tensors 't0' and 't1' overlap");
}

TEST(GgufMalformed, DuplicateTensorNames) {
    Layout L = valid_file();
    L.bytes[L.t_name[1] + 8 + 1] = std::byte{'0'};  // "t1" → "t0"
    expect_bad(L.bytes, "duplicate tensor name 't0'");
}

TEST(GgufMalformed, DuplicateKeys) {
    Layout L = valid_file();
    L.bytes[L.key_ay + 8 + 2] = std::byte{'x'};  // "a.y" → "a.x"
    expect_bad(L.bytes, "duplicate metadata key 'a.x'");
}

TEST(GgufMalformed, HostileNameIsEscapedInMessage) {
    Layout L = valid_file();
    L.bytes[L.t_name[1] + 8 + 1] = std::byte{'\n'};
    put_u32(L.bytes, L.t_type[1], 99);
    expect_bad(L.bytes, "tensor 't\\x0a' has unknown ggml type 99");
}

TEST(GgufMalformed, EveryTruncationOfHandBuiltFileThrows) {
    const Layout L = valid_file();
    for (std::size_t n = 0; n < L.bytes.size(); ++n) {
        const std::vector<std::byte> cut(L.bytes.begin(), L.bytes.begin() + static_cast<std::ptrdiff_t>(n));
        EXPECT_THROW(parse(cut), Error) << "prefix length " << n;
    }
    EXPECT_NO_THROW(parse(L.bytes));
}

TEST(GgufMalformed, EveryTruncationOfFixtureThrowsUnlessOnlyPaddingIsLost) {
    // gguf-py pads after the last tensor; cutting only that padding leaves a
    // valid file. Every shorter prefix must throw Error (never crash).
    const auto bytes = read_bytes(kFixtures + "types.gguf");
    const GgufFile whole = GgufFile::parse(bytes, "types.gguf");
    std::size_t needed = 0;
    for (const auto& t : whole.tensors()) needed = std::max<std::size_t>(needed, t.file_offset + t.nbytes);
    ASSERT_GT(needed, 0u);
    for (std::size_t n = 0; n <= bytes.size(); ++n) {
        const std::span<const std::byte> cut(bytes.data(), n);
        if (n < needed) {
            EXPECT_THROW(GgufFile::parse(cut, "cut.gguf"), Error) << "prefix length " << n;
        } else {
            EXPECT_NO_THROW(GgufFile::parse(cut, "cut.gguf")) << "prefix length " << n;
        }
    }
}

TEST(GgufMalformed, SingleByteCorruptionsNeverCrash) {
    // Every byte of the header region replaced by a few interesting values:
    // must parse or throw kvasir::Error, nothing else. (ASan builds make this
    // a memory-safety check.)
    const Layout L = valid_file();
    const std::uint8_t values[] = {0x00, 0x01, 0x7f, 0x80, 0xff};
    for (std::size_t i = 0; i < L.data_start; ++i) {
        for (std::uint8_t v : values) {
            std::vector<std::byte> b = L.bytes;
            b[i] = std::byte{v};
            try {
                const GgufFile f = parse(b);
                for (const auto& t : f.tensors())
                    if (ggml_type_dequantizable(t.type)) (void)dequantize(t);
            } catch (const Error&) {
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Typed getters and their errors
// ---------------------------------------------------------------------------

TEST(GgufMetadata, WrongTypeAndMissingKeyErrors) {
    const Layout L = valid_file();
    const GgufFile f = parse(L.bytes);
    try {
        (void)f.get_string("a.x");
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input);
        EXPECT_STREQ(e.what(), "mem.gguf: metadata key 'a.x' is a u32, not a string");
    }
    try {
        (void)f.get_array_f32("a.arr");
        FAIL();
    } catch (const Error& e) {
        EXPECT_STREQ(e.what(), "mem.gguf: metadata key 'a.arr' is an array of u32, not an array of f32");
    }
    try {
        (void)f.get_u32("nope");
        FAIL();
    } catch (const Error& e) {
        EXPECT_STREQ(e.what(), "mem.gguf: metadata key 'nope' is missing");
    }
    try {
        (void)f.tensor("nope");
        FAIL();
    } catch (const Error& e) {
        EXPECT_STREQ(e.what(), "mem.gguf: no tensor 'nope'");
    }
    EXPECT_EQ(f.get_int("a.x"), 7);
    EXPECT_THROW((void)f.get_int("a.s"), Error);
    EXPECT_THROW((void)f.get_float("a.x"), Error);
    EXPECT_EQ(f.find("nope"), nullptr);
    EXPECT_EQ(f.find_tensor("nope"), nullptr);
}

TEST(GgufMetadata, EveryValueTypeReadsBack) {
    const GgufFile f = GgufFile::open(kFixtures + "types.gguf");
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.alignment(), 64u);
    EXPECT_EQ(f.data_start() % 64, 0u);
    EXPECT_EQ(f.get_string("general.architecture"), "test");
    EXPECT_EQ(f.get_u8("test.u8"), 200);
    EXPECT_EQ(f.get_i8("test.i8"), -100);
    EXPECT_EQ(f.get_u16("test.u16"), 60000);
    EXPECT_EQ(f.get_i16("test.i16"), -30000);
    EXPECT_EQ(f.get_u32("test.u32"), 4000000000u);
    EXPECT_EQ(f.get_i32("test.i32"), -2000000000);
    EXPECT_EQ(f.get_f32("test.f32"), 0.1f);
    EXPECT_TRUE(f.get_bool("test.bool_true"));
    EXPECT_FALSE(f.get_bool("test.bool_false"));
    EXPECT_EQ(f.get_string("test.string"), "h\xc3\xa9llo, GGUF \xe2\x9c\x93");
    EXPECT_EQ(f.get_u64("test.u64"), 18000000000000000000ull);
    EXPECT_EQ(f.get_i64("test.i64"), -9000000000000000000ll);
    EXPECT_EQ(f.get_f64("test.f64"), 2.718281828459045);

    auto eq = [](auto span, auto expected) {
        return std::vector(span.begin(), span.end()) == expected;
    };
    EXPECT_TRUE(eq(f.get_array_u8("test.arr_u8"), std::vector<std::uint8_t>{0, 1, 255}));
    EXPECT_TRUE(eq(f.get_array_i8("test.arr_i8"), std::vector<std::int8_t>{-128, 0, 127}));
    EXPECT_TRUE(eq(f.get_array_u16("test.arr_u16"), std::vector<std::uint16_t>{0, 65535}));
    EXPECT_TRUE(eq(f.get_array_i16("test.arr_i16"), std::vector<std::int16_t>{-32768, 32767}));
    EXPECT_TRUE(eq(f.get_array_u32("test.arr_u32"), std::vector<std::uint32_t>{1, 2, 3, 4294967295u}));
    EXPECT_TRUE(eq(f.get_array_i32("test.arr_i32"), std::vector<std::int32_t>{-1, 0, 1}));
    EXPECT_TRUE(eq(f.get_array_f32("test.arr_f32"), std::vector<float>{1.5f, -2.25f, 1e-3f}));
    EXPECT_EQ(f.get_array_bool("test.arr_bool"), (std::vector<bool>{true, false, true}));
    EXPECT_TRUE(eq(f.get_array_string("test.arr_string"),
                   std::vector<std::string>{"alpha", "", "\xce\xb3\xce\xac\xce\xbc\xce\xbc\xce\xb1"}));
    EXPECT_TRUE(eq(f.get_array_u64("test.arr_u64"), std::vector<std::uint64_t>{0, 18446744073709551615ull}));
    EXPECT_TRUE(eq(f.get_array_i64("test.arr_i64"),
                   std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min(),
                                             std::numeric_limits<std::int64_t>::max()}));
    EXPECT_TRUE(eq(f.get_array_f64("test.arr_f64"), std::vector<double>{0.5, -1e300}));

    // Type tags and width-agnostic access.
    EXPECT_EQ(f.get("test.u16").type(), GgufType::u16);
    EXPECT_EQ(f.get("test.arr_string").type(), GgufType::array);
    EXPECT_EQ(f.get("test.arr_string").array_type(), GgufType::string);
    EXPECT_EQ(f.get("test.arr_string").array_size(), 3u);
    EXPECT_EQ(f.get_int("test.u8"), 200);
    EXPECT_EQ(f.get_int("test.i64"), -9000000000000000000ll);
    EXPECT_THROW((void)f.get_int("test.u64"), Error);  // 1.8e19 does not fit in i64
    EXPECT_EQ(f.get_float("test.f32"), static_cast<double>(0.1f));
    EXPECT_EQ(f.get("test.arr_u32").summary(2), "[u32 × 4: 1, 2, …]");
    EXPECT_EQ(f.get("test.bool_true").summary(), "true");
    EXPECT_EQ(f.keys().size(), 2u + 13u + 12u);
}

TEST(GgufMetadata, OpenAndParseAgree) {
    const auto bytes = read_bytes(kFixtures + "types.gguf");
    const GgufFile a = GgufFile::parse(bytes, "types.gguf");
    GgufFile b = GgufFile::open(kFixtures + "types.gguf");
    GgufFile moved = std::move(b);  // the mapping moves with it; data pointers stay valid
    ASSERT_EQ(a.tensors().size(), moved.tensors().size());
    for (std::size_t i = 0; i < a.tensors().size(); ++i) {
        const auto& ta = a.tensors()[i];
        const auto& tb = moved.tensors()[i];
        EXPECT_EQ(ta.name, tb.name);
        EXPECT_EQ(ta.file_offset, tb.file_offset);
        ASSERT_EQ(ta.nbytes, tb.nbytes);
        EXPECT_EQ(std::memcmp(ta.data, tb.data, ta.nbytes), 0) << ta.name;
    }
}

TEST(GgufMetadata, OpenMissingFileNamesIt) {
    try {
        (void)GgufFile::open("/nonexistent/x.gguf");
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input);
        EXPECT_NE(std::string(e.what()).find("/nonexistent/x.gguf"), std::string::npos);
    }
}

// ---------------------------------------------------------------------------
// Dequantisation against the gguf package, bit for bit
// ---------------------------------------------------------------------------

TEST(GgufDequant, EveryFixtureTensorMatchesGgufPyBitExactly) {
    std::ifstream in(kFixtures + "ref/index.json");
    ASSERT_TRUE(in.good()) << "run scripts/make_gguf_fixtures.py";
    const auto index = nlohmann::json::parse(in);
    std::size_t checked_tensors = 0;
    std::size_t checked_values = 0;
    std::map<std::string, int> types_seen;
    for (const auto& [file_name, tensors] : index.items()) {
        const GgufFile f = GgufFile::open(kFixtures + file_name);
        EXPECT_EQ(f.tensors().size(), tensors.size()) << file_name;
        for (const auto& [name, entry] : tensors.items()) {
            SCOPED_TRACE(file_name + ":" + name);
            const GgufTensor& t = f.tensor(name);
            EXPECT_EQ(std::string(ggml_type_name(t.type)), entry["type"].get<std::string>());
            EXPECT_EQ(t.ne, entry["ne"].get<std::vector<std::int64_t>>());
            EXPECT_EQ(t.shape, entry["shape"].get<Shape>());
            const Tensor got = dequantize(t);
            EXPECT_EQ(got.dtype(), DType::f32);
            EXPECT_EQ(got.shape(), t.shape);
            const auto ref = read_bytes(kFixtures + "ref/" + entry["bin"].get<std::string>());
            ASSERT_EQ(ref.size(), got.nbytes());
            std::int64_t max_ulp = 0;
            std::size_t differing = 0;
            for (std::int64_t i = 0; i < got.numel(); ++i) {
                float r = 0;
                std::memcpy(&r, ref.data() + 4 * i, 4);
                const float g = got.as<float>()[i];
                if (std::bit_cast<std::uint32_t>(r) != std::bit_cast<std::uint32_t>(g)) {
                    ++differing;
                    max_ulp = std::max(max_ulp, ulp_distance(r, g));
                }
            }
            EXPECT_EQ(differing, 0u) << "max ulp " << max_ulp;
            checked_values += static_cast<std::size_t>(got.numel());
            ++checked_tensors;
            ++types_seen[entry["type"].get<std::string>()];
        }
    }
    EXPECT_EQ(checked_tensors, 8u + 27u);
    for (const char* type : {"F32", "F16", "BF16", "Q8_0", "Q4_K", "Q6_K"})
        EXPECT_GT(types_seen[type], 0) << type << " not covered by the fixtures";
    std::printf("[ checked %zu tensors, %zu values: bit-identical to gguf.quants.dequantize ]\n", checked_tensors,
                checked_values);
}

TEST(GgufDequant, UnsupportedTypeIsListedButRefused) {
    Layout L = valid_file();
    put_u32(L.bytes, L.t_type[1], 2);     // t1 as Q4_0: 32 elements in 18 bytes
    put_u64(L.bytes, L.t_ne[1], 32);
    const GgufFile f = parse(L.bytes);
    const GgufTensor& t = f.tensor("t1");
    EXPECT_EQ(ggml_type_name(t.type), "Q4_0");
    EXPECT_EQ(t.nbytes, 18u);
    try {
        (void)dequantize(t);
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::unsupported);
        const std::string msg = e.what();
        EXPECT_NE(msg.find("mem.gguf: tensor 't1' has type Q4_0"), std::string::npos) << msg;
        EXPECT_NE(msg.find("Q4_K"), std::string::npos) << msg;  // lists what is supported
    }
}

TEST(GgufDequant, HandBuiltTensorWithLyingSizeIsRefused) {
    const Layout L = valid_file();
    const GgufFile f = parse(L.bytes);
    GgufTensor t = f.tensor("t1");
    t.ne = {64};
    t.shape = {64};
    t.numel = 64;  // nbytes still 34: would read past the block
    EXPECT_THROW((void)dequantize(t), Error);
}

// ---------------------------------------------------------------------------
// llama.cpp names and hyperparameters
// ---------------------------------------------------------------------------

TEST(GgufNames, GlobalTensors) {
    auto r = gguf_tensor_role("token_embd.weight");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->role, GgufRole::token_embd);
    EXPECT_EQ(r->layer, -1);
    EXPECT_FALSE(r->expert_stacked);
    EXPECT_EQ(gguf_tensor_role("output_norm.weight")->role, GgufRole::output_norm);
    EXPECT_EQ(gguf_tensor_role("output.weight")->role, GgufRole::output);
}

TEST(GgufNames, LayerTensors) {
    struct Case {
        const char* name;
        int layer;
        GgufRole role;
        bool stacked;
        bool bias;
    };
    const Case cases[] = {
        {"blk.0.attn_norm.weight", 0, GgufRole::attn_norm, false, false},
        {"blk.1.attn_q.weight", 1, GgufRole::attn_q, false, false},
        {"blk.1.attn_q.bias", 1, GgufRole::attn_q, false, true},
        {"blk.2.attn_k.weight", 2, GgufRole::attn_k, false, false},
        {"blk.2.attn_v.bias", 2, GgufRole::attn_v, false, true},
        {"blk.3.attn_output.weight", 3, GgufRole::attn_output, false, false},
        {"blk.3.attn_q_norm.weight", 3, GgufRole::attn_q_norm, false, false},
        {"blk.3.attn_k_norm.weight", 3, GgufRole::attn_k_norm, false, false},
        {"blk.4.ffn_norm.weight", 4, GgufRole::ffn_norm, false, false},
        {"blk.47.ffn_gate_inp.weight", 47, GgufRole::ffn_gate_inp, false, false},
        {"blk.47.ffn_gate_exps.weight", 47, GgufRole::ffn_gate_exps, true, false},
        {"blk.47.ffn_up_exps.weight", 47, GgufRole::ffn_up_exps, true, false},
        {"blk.47.ffn_down_exps.weight", 47, GgufRole::ffn_down_exps, true, false},
        {"blk.5.ffn_gate_inp_shexp.weight", 5, GgufRole::ffn_gate_inp_shexp, false, false},
        {"blk.5.ffn_gate_shexp.weight", 5, GgufRole::ffn_gate_shexp, false, false},
        {"blk.5.ffn_up_shexp.weight", 5, GgufRole::ffn_up_shexp, false, false},
        {"blk.5.ffn_down_shexp.weight", 5, GgufRole::ffn_down_shexp, false, false},
        {"blk.0.ffn_gate.weight", 0, GgufRole::ffn_gate, false, false},
        {"blk.0.ffn_up.weight", 0, GgufRole::ffn_up, false, false},
        {"blk.0.ffn_down.weight", 0, GgufRole::ffn_down, false, false},
        {"blk.9.exp_probs_b.bias", 9, GgufRole::exp_probs_b, false, true},
        // gpt-oss (llama.cpp's converter: sinks, its own post-attention norm name, expert biases)
        {"blk.3.attn_sinks.weight", 3, GgufRole::attn_sinks, false, false},
        {"blk.3.post_attention_norm.weight", 3, GgufRole::post_attention_norm, false, false},
        {"blk.3.ffn_gate_exps.bias", 3, GgufRole::ffn_gate_exps, true, true},
        {"blk.3.ffn_gate_inp.bias", 3, GgufRole::ffn_gate_inp, false, true},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.name);
        const auto r = gguf_tensor_role(c.name);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->layer, c.layer);
        EXPECT_EQ(r->role, c.role);
        EXPECT_EQ(r->expert_stacked, c.stacked);
        EXPECT_EQ(r->bias, c.bias);
        EXPECT_EQ(r->expert, -1);
        // The role's name is the base of the GGUF name.
        EXPECT_NE(std::string(c.name).find(std::string(".") + std::string(gguf_role_name(c.role)) + "."),
                  std::string::npos);
    }
}

TEST(GgufNames, LegacyPerExpertTensors) {
    const auto r = gguf_tensor_role("blk.2.ffn_down.7.weight");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->layer, 2);
    EXPECT_EQ(r->role, GgufRole::ffn_down);
    EXPECT_EQ(r->expert, 7);
    EXPECT_FALSE(r->expert_stacked);
}

TEST(GgufNames, UnknownAndMalformedNames) {
    for (const char* name : {"rope_freqs.weight", "blk.0.attn_q", "blk..attn_q.weight", "blk.-1.attn_q.weight",
                             "blk.01.attn_q.weight", "blk.99999999999.attn_q.weight", "blk.0.token_embd.weight",
                             "attn_q.weight", "blk.0.attn_q.7.weight", "blk.0.ffn_up.x.weight", "", "blk.0.weight",
                             "v.blk.0.attn_q.weight"})
        EXPECT_FALSE(gguf_tensor_role(name)) << name;
}

TEST(GgufModel, TinyQwen3MoeParams) {
    const GgufFile f = GgufFile::open(kFixtures + "moe.gguf");
    const GgufModelParams p = read_gguf_model_params(f);
    EXPECT_EQ(p.architecture, "qwen3moe");
    EXPECT_EQ(p.block_count, 2);
    EXPECT_EQ(p.embedding_length, 64);
    EXPECT_EQ(p.head_count, 4);
    EXPECT_EQ(p.head_count_kv, 2);
    EXPECT_EQ(p.key_length, 16);
    EXPECT_EQ(p.value_length, 16);
    EXPECT_EQ(p.rope_freq_base, 1000000.0);
    EXPECT_EQ(p.rms_norm_eps, static_cast<double>(1e-6f));
    EXPECT_EQ(p.expert_count, 4);
    EXPECT_EQ(p.expert_used_count, 2);
    EXPECT_EQ(p.expert_feed_forward_length, 32);
    EXPECT_EQ(p.expert_shared_feed_forward_length, 0);
    EXPECT_TRUE(p.norm_topk_prob);
    EXPECT_EQ(p.vocab_size, 48);
    EXPECT_TRUE(p.qk_norm);
    EXPECT_FALSE(p.shared_expert);
    EXPECT_FALSE(p.shared_expert_gate);
    EXPECT_FALSE(p.tied_embeddings);
    EXPECT_EQ(p.moe_layers, (std::vector<bool>{true, true}));

    // The expert stacks: ggml order [in, out, expert], row-major [expert, out, in].
    const GgufTensor& up = f.tensor("blk.1.ffn_up_exps.weight");
    EXPECT_EQ(up.ne, (std::vector<std::int64_t>{64, 32, 4}));
    EXPECT_EQ(up.shape, (Shape{4, 32, 64}));
    EXPECT_TRUE(gguf_tensor_role(up.name)->expert_stacked);
    const GgufTensor& down = f.tensor("blk.0.ffn_down_exps.weight");
    EXPECT_EQ(down.shape, (Shape{4, 64, 32}));
    std::size_t mapped = 0;
    for (const auto& t : f.tensors()) mapped += gguf_tensor_role(t.name).has_value();
    EXPECT_EQ(mapped, f.tensors().size());
}

namespace {
// A metadata-only GGUF (no tensors) from (key, writer) pairs.
struct Kv {
    std::string key;
    std::function<void(Builder&)> value;  // writes type tag + value
};
std::vector<std::byte> metadata_file(const std::vector<Kv>& kvs) {
    Builder w;
    w.u8('G'); w.u8('G'); w.u8('U'); w.u8('F');
    w.u32(3); w.u64(0); w.u64(kvs.size());
    for (const auto& kv : kvs) {
        w.str(kv.key);
        kv.value(w);
    }
    return w.b;
}
Kv kv_u32(std::string k, std::uint32_t v) { return {std::move(k), [v](Builder& w) { w.u32(4); w.u32(v); }}; }
Kv kv_f32(std::string k, float v) { return {std::move(k), [v](Builder& w) { w.u32(6); w.f32(v); }}; }
Kv kv_str(std::string k, std::string v) { return {std::move(k), [v](Builder& w) { w.u32(8); w.str(v); }}; }
Kv kv_bools(std::string k, std::vector<bool> v) {
    return {std::move(k), [v](Builder& w) {
                w.u32(9);
                w.u32(7);
                w.u64(v.size());
                for (bool b : v) w.u8(b ? 1 : 0);
            }};
}

// gpt-oss metadata as llama.cpp's converter writes it (no tensors), plus `extra`.
std::vector<std::byte> gpt_oss_metadata(std::vector<Kv> extra) {
    std::vector<Kv> kvs{
        kv_str("general.architecture", "gpt-oss"), kv_u32("gpt-oss.block_count", 6),
        kv_u32("gpt-oss.embedding_length", 64), kv_u32("gpt-oss.attention.head_count", 4),
        kv_u32("gpt-oss.attention.head_count_kv", 2), kv_u32("gpt-oss.attention.key_length", 16),
        kv_f32("gpt-oss.rope.freq_base", 150000.0f), kv_f32("gpt-oss.attention.layer_norm_rms_epsilon", 1e-5f),
        kv_u32("gpt-oss.expert_count", 8), kv_u32("gpt-oss.expert_used_count", 2),
        kv_u32("gpt-oss.expert_feed_forward_length", 64), kv_u32("gpt-oss.vocab_size", 320),
        kv_str("gpt-oss.rope.scaling.type", "yarn"), kv_f32("gpt-oss.rope.scaling.factor", 32.0f),
        kv_u32("gpt-oss.rope.scaling.original_context_length", 4096), kv_u32("gpt-oss.context_length", 131072),
    };
    for (auto& e : extra) kvs.push_back(std::move(e));
    return metadata_file(kvs);
}

// The error `f` throws: its code and one-line message.
template <typename F>
std::pair<ErrorCode, std::string> error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return {e.code(), e.what()};
    }
    return {ErrorCode::internal, "<no error>"};
}
}  // namespace

TEST(GgufModel, MixtralUsesLlamaArchWithExperts) {
    const auto bytes = metadata_file({
        kv_str("general.architecture", "llama"), kv_u32("llama.block_count", 32),
        kv_u32("llama.embedding_length", 4096), kv_u32("llama.feed_forward_length", 14336),
        kv_u32("llama.attention.head_count", 32), kv_u32("llama.attention.head_count_kv", 8),
        kv_f32("llama.rope.freq_base", 1e6f), kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f),
        kv_u32("llama.expert_count", 8), kv_u32("llama.expert_used_count", 2), kv_u32("llama.vocab_size", 32000),
    });
    const GgufModelParams p = read_gguf_model_params(GgufFile::parse(bytes, "mixtral.gguf"));
    EXPECT_EQ(p.architecture, "llama");
    EXPECT_EQ(p.expert_count, 8);
    EXPECT_EQ(p.expert_used_count, 2);
    EXPECT_EQ(p.expert_feed_forward_length, 14336);  // Mixtral sizes experts with the dense key
    EXPECT_EQ(p.key_length, 128);                    // 4096 / 32
    EXPECT_EQ(p.head_count_kv, 8);
    EXPECT_TRUE(p.norm_topk_prob);
    EXPECT_EQ(p.vocab_size, 32000);
    EXPECT_TRUE(p.tied_embeddings);  // no tensors at all, so no `output`
    EXPECT_EQ(p.moe_layers.size(), 32u);
}

TEST(GgufModel, Qwen2MoeDoesNotRenormaliseAndHasSharedExpert) {
    const auto bytes = metadata_file({
        kv_str("general.architecture", "qwen2moe"), kv_u32("qwen2moe.block_count", 24),
        kv_u32("qwen2moe.embedding_length", 2048), kv_u32("qwen2moe.attention.head_count", 16),
        kv_f32("qwen2moe.attention.layer_norm_rms_epsilon", 1e-6f), kv_u32("qwen2moe.expert_count", 60),
        kv_u32("qwen2moe.expert_used_count", 4), kv_u32("qwen2moe.expert_feed_forward_length", 1408),
        kv_u32("qwen2moe.expert_shared_feed_forward_length", 5632), kv_u32("qwen2moe.vocab_size", 151936),
    });
    const GgufModelParams p = read_gguf_model_params(GgufFile::parse(bytes, "qwen2moe.gguf"));
    EXPECT_FALSE(p.norm_topk_prob);
    EXPECT_EQ(p.head_count_kv, 16);        // defaults to head_count
    EXPECT_EQ(p.rope_freq_base, 10000.0);  // llama.cpp's default
    EXPECT_EQ(p.expert_feed_forward_length, 1408);
    EXPECT_EQ(p.expert_shared_feed_forward_length, 5632);
}

TEST(GgufModel, MissingOrInconsistentHyperparametersAreClearErrors) {
    const auto no_eps = metadata_file({
        kv_str("general.architecture", "qwen3moe"), kv_u32("qwen3moe.block_count", 2),
        kv_u32("qwen3moe.embedding_length", 64), kv_u32("qwen3moe.attention.head_count", 4),
        kv_u32("qwen3moe.expert_count", 4), kv_u32("qwen3moe.expert_used_count", 2),
    });
    try {
        (void)read_gguf_model_params(GgufFile::parse(no_eps, "x.gguf"));
        FAIL();
    } catch (const Error& e) {
        EXPECT_STREQ(e.what(), "x.gguf: metadata key 'qwen3moe.attention.layer_norm_rms_epsilon' is missing");
    }
    const auto topk_too_big = metadata_file({
        kv_str("general.architecture", "qwen3moe"), kv_u32("qwen3moe.block_count", 2),
        kv_u32("qwen3moe.embedding_length", 64), kv_u32("qwen3moe.attention.head_count", 4),
        kv_f32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6f), kv_u32("qwen3moe.expert_count", 4),
        kv_u32("qwen3moe.expert_used_count", 5),
    });
    try {
        (void)read_gguf_model_params(GgufFile::parse(topk_too_big, "x.gguf"));
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input);
        EXPECT_STREQ(e.what(), "x.gguf: qwen3moe.expert_used_count is 5, not in 1..4");
    }
}

// Which GGUF architectures may come without experts is the family records' (Family::gguf_experts):
// only llama's (the dense llama family; with experts it is Mixtral).
TEST(GgufModel, AMoeArchitectureWithoutExpertsIsRefused) {
    const auto dense_qwen3moe = metadata_file({
        kv_str("general.architecture", "qwen3moe"), kv_u32("qwen3moe.block_count", 2),
        kv_u32("qwen3moe.embedding_length", 64), kv_u32("qwen3moe.attention.head_count", 4),
        kv_f32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6f),
    });
    try {
        (void)read_gguf_model_params(GgufFile::parse(dense_qwen3moe, "x.gguf"));
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input);
        EXPECT_STREQ(e.what(), "x.gguf: qwen3moe has no qwen3moe.expert_count");
    }
}

TEST(GgufModel, UnsupportedArchitectureListsSupported) {
    const GgufFile f = GgufFile::open(kFixtures + "types.gguf");  // general.architecture = "test"
    try {
        (void)read_gguf_model_params(f);
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::unsupported);
        EXPECT_NE(std::string(e.what()).find(
                      "architecture 'test' is not supported (supported: qwen2moe, qwen3moe, llama, qwen35moe, qwen3next, gpt-oss, deepseek2)"),
                  std::string::npos)
            << e.what();
    }
}

// gpt_oss_tiny_mxfp4.gguf is written by llama.cpp's own convert_hf_to_gguf.py (scripts/make_fixtures.py
// --llama-cpp): what the tool reads of it is what llama.cpp's openai-moe graph computes.
TEST(GgufModel, DeepSeek2ConvertedByLlamaCppIsTheHuggingFaceModel) {
    // deepseek_v3_tiny converted by llama.cpp's own convert_hf_to_gguf.py: MLA in llama.cpp's MQA form
    // (head_count_kv 1, key_length = kv_lora + rope, value_length = kv_lora), the per-head widths in the
    // *_mla keys, kv_b_proj split into attn_k_b (transposed) and attn_v_b, yarn's mscale_all_dim as
    // yarn_log_multiplier / 0.1, the sigmoid router's groups and scale.
    const std::string path = std::string(KVASIR_SOURCE_DIR) + "/fixtures/models/deepseek_v3_tiny.gguf";
    const GgufFile f = GgufFile::open(path);
    const GgufModelParams p = read_gguf_model_params(f);
    EXPECT_EQ(p.architecture, "deepseek2");
    EXPECT_EQ(p.head_count_kv, 1);
    EXPECT_EQ(p.key_length, 40);
    EXPECT_EQ(p.value_length, 32);
    EXPECT_EQ(p.key_length_mla, 24);
    EXPECT_EQ(p.value_length_mla, 16);
    EXPECT_EQ(p.expert_gating_func, 2);
    EXPECT_EQ(p.leading_dense_block_count, 1);
    const ModelConfig c = model_config_from_gguf(f, path);
    EXPECT_EQ(c.architecture, Architecture::deepseek_v3);
    EXPECT_EQ(c.num_kv_heads, 4);  // one expanded key and value per head, as DeepseekV3Attention
    EXPECT_EQ(c.head_dim, 24);
    EXPECT_EQ(c.mla.q_lora_rank, 32);
    EXPECT_EQ(c.mla.kv_lora_rank, 32);
    EXPECT_EQ(c.mla.qk_nope_head_dim, 16);
    EXPECT_EQ(c.mla.qk_rope_head_dim, 8);
    EXPECT_EQ(c.mla.v_head_dim, 16);
    EXPECT_TRUE(c.mla.rope_interleave);
    EXPECT_EQ(c.router.scoring, RouterScoring::sigmoid);
    EXPECT_TRUE(c.router.score_correction_bias);
    EXPECT_EQ(c.router.n_group, 4);
    EXPECT_EQ(c.router.topk_group, 2);
    EXPECT_EQ(c.router.routed_scaling_factor, 2.5);
    EXPECT_TRUE(c.router.norm_topk_prob);
    EXPECT_EQ(c.first_k_dense_replace, 1);
    EXPECT_EQ(c.shared_expert_intermediate_size, 16);
    EXPECT_EQ(c.rope_type, "yarn");
    EXPECT_EQ(c.rope_scaling.factor, 40.0);
    EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 512.0);
    EXPECT_EQ(c.rope_scaling.mscale, 1.0);
    EXPECT_EQ(c.rope_scaling.mscale_all_dim, 1.0);
    // Every weight is the checkpoint's, bit for bit — kv_b_proj reassembled from attn_k_b / attn_v_b.
    const Model g = Model::open(path);
    const Model hf = Model::open(std::string(KVASIR_SOURCE_DIR) + "/fixtures/models/deepseek_v3_tiny");
    for (std::int64_t l = 0; l < c.num_layers; ++l) {
        const LayerWeights& a = g.layer(l);
        const LayerWeights& b = hf.layer(l);
        const auto va = a.named_views(), vb = b.named_views();
        ASSERT_EQ(va.size(), vb.size());
        for (std::size_t i = 0; i < va.size(); ++i) {
            const TensorView& x = *va[i].first;
            const TensorView& y = *vb[i].first;
            ASSERT_EQ(x.data == nullptr, y.data == nullptr) << "layer " << l << " " << va[i].second;
            if (x.data == nullptr) continue;
            ASSERT_EQ(x.shape, y.shape) << "layer " << l << " " << va[i].second;
            ASSERT_EQ(x.dtype, y.dtype) << "layer " << l << " " << va[i].second;
            EXPECT_EQ(std::memcmp(x.data, y.data, static_cast<std::size_t>(x.numel()) * dtype_size(x.dtype)), 0)
                << "layer " << l << " " << va[i].second;
        }
        ASSERT_EQ(a.experts.size(), b.experts.size());
        for (std::size_t e = 0; e < a.experts.size(); ++e)
            EXPECT_EQ(std::memcmp(a.experts[e].down.data, b.experts[e].down.data,
                                  static_cast<std::size_t>(a.experts[e].down.numel()) * 4), 0)
                << "layer " << l << " expert " << e;
    }
}

TEST(GgufModel, HybridsConvertedByLlamaCppAreTheHuggingFaceModels) {
    // qwen3_5_moe_tiny.gguf (qwen35moe): the converter tiles the v heads (file head j·nk + g is HF head g·r + j)
    // and stores norms as f32(1 + w), ssm_a = −exp(A_log); read back, every DeltaNet tensor is the checkpoint's
    // bit for bit, the norms are f32(1 + w) and exp(A_log) is −ssm_a.
    const std::string dir = std::string(KVASIR_SOURCE_DIR) + "/fixtures/models/";
    for (const char* name : {"qwen3_5_moe_tiny", "qwen3_next_tiny"}) {
        const std::string path = dir + name + ".gguf";
        const GgufFile f = GgufFile::open(path);
        const GgufModelParams p = read_gguf_model_params(f);
        EXPECT_EQ(p.ssm_conv_kernel, 4) << name;
        EXPECT_EQ(p.ssm_state_size, 16) << name;
        EXPECT_EQ(p.ssm_group_count, 2) << name;
        EXPECT_EQ(p.ssm_time_step_rank, 4) << name;
        const Model g = Model::open(path);
        const Model hf = Model::open(dir + name);
        const ModelConfig& c = g.config();
        EXPECT_EQ(c.linear_attention_layers, hf.config().linear_attention_layers) << name;
        EXPECT_EQ(c.partial_rotary_factor, 0.25) << name;
        EXPECT_FALSE(c.norm_weight_offset) << name;  // the file holds the scales 1 + w
        EXPECT_TRUE(c.attention_output_gate) << name;
        for (std::int64_t l = 0; l < c.num_layers; ++l) {
            const LayerWeights& a = g.layer(l);
            const LayerWeights& b = hf.layer(l);
            const auto same = [&](const TensorView& x, const TensorView& y, const char* what) {
                ASSERT_EQ(x.numel(), y.numel()) << name << " layer " << l << " " << what;
                EXPECT_EQ(std::memcmp(x.data, y.data, static_cast<std::size_t>(x.numel()) * dtype_size(x.dtype)), 0)
                    << name << " layer " << l << " " << what;
            };
            for (std::int64_t i = 0; i < b.input_norm.numel(); ++i)
                EXPECT_EQ(a.input_norm.at(i), static_cast<double>(static_cast<float>(1.0f + static_cast<float>(b.input_norm.at(i)))))
                    << name << " layer " << l;
            if (!a.linear_attention) continue;
            for (std::int64_t h = 0; h < b.a_log.numel(); ++h)
                EXPECT_NEAR(std::exp(a.a_log.at(h)), std::exp(b.a_log.at(h)), 1e-7 * std::exp(b.a_log.at(h))) << name;
            same(a.dt_bias, b.dt_bias, "dt_bias");
            same(a.linear_norm, b.linear_norm, "norm");
            same(a.out_proj, b.out_proj, "out_proj");
            same(a.conv1d, b.conv1d, "conv1d");
            if (std::string(name) == "qwen3_5_moe_tiny") {  // the checkpoint's own layout: in_proj_qkv / z / b / a
                same(a.in_proj_qkv, b.in_proj_qkv, "in_proj_qkv");
                same(a.in_proj_z, b.in_proj_z, "in_proj_z");
                same(a.in_proj_b, b.in_proj_b, "in_proj_b");
                same(a.in_proj_a, b.in_proj_a, "in_proj_a");
            }
        }
    }
}

TEST(GgufModel, GptOssConvertedByLlamaCpp) {
    const std::string path = std::string(KVASIR_SOURCE_DIR) + "/fixtures/models/gpt_oss_tiny_mxfp4.gguf";
    const GgufFile f = GgufFile::open(path);
    const GgufModelParams p = read_gguf_model_params(f);
    EXPECT_EQ(p.architecture, "gpt-oss");
    EXPECT_EQ(p.sliding_window, 8);
    EXPECT_EQ(p.sliding_layers, (std::vector<bool>{true, false, true, false}));  // llama.cpp's period 2
    for (const char* n : {"blk.0.ffn_gate_exps.weight", "blk.3.ffn_up_exps.weight", "blk.2.ffn_down_exps.weight"})
        EXPECT_EQ(f.tensor(n).type, GgmlType::MXFP4) << n;
    const ModelConfig c = model_config_from_gguf(f, path);
    EXPECT_EQ(c.architecture, Architecture::gpt_oss);
    EXPECT_TRUE(c.attention_sinks);
    EXPECT_TRUE(c.attention_bias);
    EXPECT_TRUE(c.attention_out_bias);
    EXPECT_TRUE(c.clamped_swiglu);
    EXPECT_EQ(c.swiglu_alpha, 1.702);  // ggml_swiglu_oai's constants: the GGUF has no key for them
    EXPECT_EQ(c.swiglu_limit, 7.0);
    EXPECT_EQ(c.sliding_window, 8);
    EXPECT_EQ(c.sliding_layers, (std::vector<bool>{true, false, true, false}));
    EXPECT_EQ(c.rope_type, "yarn");
    EXPECT_EQ(c.rope_theta, 150000.0);
    EXPECT_EQ(c.rope_scaling.factor, 32.0);
    EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096.0);
    EXPECT_EQ(c.rope_scaling.beta_fast, 32.0);
    EXPECT_EQ(c.rope_scaling.beta_slow, 1.0);
    EXPECT_TRUE(c.rope_scaling.truncate);  // ggml_rope_yarn_corr_dims floors / ceils
    EXPECT_DOUBLE_EQ(c.rope_scaling.attention_factor, 0.1 * std::log(32.0) + 1.0);
    EXPECT_EQ(c.router.scoring, RouterScoring::softmax);
    EXPECT_EQ(c.router.num_experts, 8);
    EXPECT_EQ(c.router.top_k, 2);
    EXPECT_TRUE(c.router.norm_topk_prob);
    EXPECT_EQ(c.moe_intermediate_size, 64);
    EXPECT_EQ(c.moe_layers, (std::vector<bool>{true, true, true, true}));
    EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(GgufModel, SlidingWindowPatternKeys) {
    // A period n: layer l slides iff l % n < n - 1 (llama_hparams::set_swa_pattern); 0: every layer.
    auto layers = [](std::vector<Kv> extra) {
        return read_gguf_model_params(GgufFile::parse(gpt_oss_metadata(std::move(extra)), "g.gguf")).sliding_layers;
    };
    EXPECT_EQ(layers({kv_u32("gpt-oss.attention.sliding_window", 128)}),
              (std::vector<bool>{true, false, true, false, true, false}));
    EXPECT_EQ(layers({kv_u32("gpt-oss.attention.sliding_window", 128),
                      kv_u32("gpt-oss.attention.sliding_window_pattern", 3)}),
              (std::vector<bool>{true, true, false, true, true, false}));
    EXPECT_EQ(layers({kv_u32("gpt-oss.attention.sliding_window", 128),
                      kv_u32("gpt-oss.attention.sliding_window_pattern", 0)}),
              (std::vector<bool>(6, true)));
    const std::vector<bool> explicit_layers{false, true, true, false, false, true};
    EXPECT_EQ(layers({kv_u32("gpt-oss.attention.sliding_window", 128),
                      kv_bools("gpt-oss.attention.sliding_window_pattern", explicit_layers)}),
              explicit_layers);
    EXPECT_TRUE(layers({}).empty());  // no window: no sliding layer

    const auto [code, msg] = error_of([&] {
        (void)layers({kv_u32("gpt-oss.attention.sliding_window", 128),
                      kv_bools("gpt-oss.attention.sliding_window_pattern", {true, false})});
    });
    EXPECT_EQ(code, ErrorCode::bad_input);
    EXPECT_EQ(msg, "g.gguf: gpt-oss.attention.sliding_window_pattern is an array of 2 bool, not 6 booleans (one per layer)");
    const auto [code2, msg2] = error_of([&] {
        (void)layers({kv_u32("gpt-oss.attention.sliding_window", 128),
                      kv_u32("gpt-oss.attention.sliding_window_pattern", 7)});
    });
    EXPECT_EQ(code2, ErrorCode::bad_input);
    EXPECT_EQ(msg2, "g.gguf: gpt-oss.attention.sliding_window_pattern is 7, not a period in 0..6");
    // A window on an architecture whose pattern llama.cpp takes from elsewhere is refused, not guessed.
    const auto qwen = metadata_file({
        kv_str("general.architecture", "qwen3moe"), kv_u32("qwen3moe.block_count", 2),
        kv_u32("qwen3moe.embedding_length", 64), kv_u32("qwen3moe.attention.head_count", 4),
        kv_f32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6f), kv_u32("qwen3moe.expert_count", 4),
        kv_u32("qwen3moe.expert_used_count", 2), kv_u32("qwen3moe.expert_feed_forward_length", 32),
        kv_u32("qwen3moe.vocab_size", 48), kv_u32("qwen3moe.attention.sliding_window", 16),
    });
    EXPECT_EQ(error_of([&] { (void)read_gguf_model_params(GgufFile::parse(qwen, "q.gguf")); }),
              std::make_pair(ErrorCode::unsupported,
                             std::string("q.gguf: qwen3moe.attention.sliding_window is set but qwen3moe has no "
                                         "sliding-window layer pattern here (not modelled for this architecture)")));
}

TEST(GgufModel, YarnKeysLlamaCppDoesNotReadAreRefusedWhenTheyDisagree) {
    // llama.cpp computes gpt-oss's yarn with beta 32 / 1, extrapolation 1 and cos/sin scale 0.1 ln(factor) + 1
    // whatever these keys say: a file that says otherwise is refused (which one is meant is not knowable).
    auto config_error = [](Kv extra) {
        const auto bytes = gpt_oss_metadata({std::move(extra)});
        return error_of([&] { (void)model_config_from_gguf(GgufFile::parse(bytes, "g.gguf"), "g.gguf"); });
    };
    EXPECT_EQ(config_error(kv_f32("gpt-oss.rope.scaling.yarn_beta_fast", 16.0f)),
              std::make_pair(ErrorCode::unsupported,
                             std::string("g.gguf: gpt-oss.rope.scaling.yarn_beta_fast is 16, but llama.cpp computes this "
                                         "architecture's yarn with 32 (not modelled)")));
    EXPECT_EQ(config_error(kv_f32("gpt-oss.rope.scaling.yarn_ext_factor", 0.5f)).first, ErrorCode::unsupported);
    EXPECT_EQ(config_error(kv_f32("gpt-oss.rope.scaling.yarn_log_multiplier", 0.1f)).first, ErrorCode::unsupported);
    EXPECT_EQ(config_error(kv_f32("gpt-oss.rope.scaling.yarn_attn_factor", 1.0f)).first, ErrorCode::unsupported);
    EXPECT_EQ(config_error(kv_f32("gpt-oss.rope.freq_base_swa", 10000.0f)).first, ErrorCode::unsupported);
    EXPECT_EQ(config_error(kv_f32("gpt-oss.rope.scaling.factor", 0.5f)).first, ErrorCode::bad_input);
    // The keys with llama.cpp's own values pass the yarn checks (and the metadata-only file then fails on its
    // missing routers: every gpt-oss layer is MoE).
    const auto [code, msg] = config_error(kv_f32("gpt-oss.rope.scaling.yarn_beta_slow", 1.0f));
    EXPECT_EQ(code, ErrorCode::bad_input);
    EXPECT_EQ(msg, "g.gguf: layer 0 has no blk.0.ffn_gate_inp.weight (every gpt-oss layer is MoE)");
}
