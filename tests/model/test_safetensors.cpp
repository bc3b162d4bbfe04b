// Tests of the safetensors reader, sharded checkpoints and the writer.
//
//  * Fixtures written by the reference library (scripts/make_safetensors_fixtures.py)
//    load bit-exactly.
//  * Malformed files (built here, byte by byte) are rejected with
//    Error(bad_input) and a one-line message naming the file and the problem.
//  * Loading one layer touches only that layer's bytes (mincore residency).
//  * The writer is canonical and atomic.
#include "kvasir/core/error.hpp"
#include "kvasir/model/safetensors.hpp"
#include "kvasir/model/safetensors_checkpoint.hpp"
#include "kvasir/model/safetensors_writer.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace kvasir;

namespace {

const fs::path kFixtures = fs::path(KVASIR_SOURCE_DIR) / "fixtures" / "safetensors";

// A fresh directory per test, removed afterwards. `base` lets the residency
// test insist on a disk-backed file system.
class TempDir {
public:
    explicit TempDir(const fs::path& base = fs::temp_directory_path()) {
        std::string tmpl = (base / "kvasir-st-XXXXXX").string();
        if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
        path_ = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    const fs::path& path() const { return path_; }
    std::string file(const std::string& name) const { return (path_ / name).string(); }

private:
    fs::path path_;
};

void write_file(const std::string& path, std::string_view bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(f.good()) << path;
}

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string le64(std::uint64_t v) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
    return s;
}

// A safetensors image: length prefix, header (space-padded to 8 like real
// writers, unless pad=false) and `data_bytes` bytes of data.
std::string image(std::string_view header, std::size_t data_bytes, bool pad = true) {
    std::string h(header);
    if (pad) h.append((8 - h.size() % 8) % 8, ' ');
    std::string out = le64(h.size()) + h;
    for (std::size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<char>(i * 7 + 1));
    return out;
}

// Run `f`, expect Error(code) whose message is one line, names `file` and contains `phrase`.
template <typename F>
void expect_error(F&& f, const std::string& file, const std::string& phrase, ErrorCode code = ErrorCode::bad_input) {
    try {
        f();
        ADD_FAILURE() << "no error; expected: " << phrase;
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(e.code(), code) << msg;
        EXPECT_NE(msg.find(file), std::string::npos) << "message does not name " << file << ": " << msg;
        EXPECT_NE(msg.find(phrase), std::string::npos) << "message lacks '" << phrase << "': " << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
        EXPECT_EQ(msg.rfind(file + ": ", 0), 0u) << "message does not start with 'FILE: ': " << msg;
    } catch (const std::exception& e) {
        ADD_FAILURE() << "wrong exception type: " << e.what();
    }
}

std::uint64_t hex_bits(const std::string& s) { return std::stoull(s, nullptr, 16); }

// Element i of a raw little-endian buffer as an unsigned bit pattern.
std::uint64_t raw_bits(const std::byte* p, std::size_t width, std::size_t i) {
    std::uint64_t v = 0;
    for (std::size_t b = 0; b < width; ++b) v |= static_cast<std::uint64_t>(p[i * width + b]) << (8 * b);
    return v;
}

// Compare a loaded tensor with the bits the Python library wrote.
void expect_matches(const SafetensorsTensorInfo& info, std::span<const std::byte> raw, const nlohmann::json& want,
                    const std::string& name) {
    EXPECT_EQ(safetensors_dtype_name(info.dtype), want["dtype"].get<std::string>()) << name;
    EXPECT_EQ(info.shape, want["shape"].get<Shape>()) << name;
    const auto& bits = want["bits"];
    const std::size_t width = safetensors_dtype_bits(info.dtype) / 8;
    ASSERT_EQ(raw.size(), bits.size() * width) << name;
    for (std::size_t i = 0; i < bits.size(); ++i)
        ASSERT_EQ(raw_bits(raw.data(), width, i), hex_bits(bits[i].get<std::string>())) << name << "[" << i << "]";
}

nlohmann::json expected_json() {
    std::ifstream f(kFixtures / "expected.json");
    return nlohmann::json::parse(f);
}

}  // namespace

// ===========================================================================
// Fixtures written by the reference implementation
// ===========================================================================

TEST(SafetensorsFixture, LoadsEveryTensorBitExactly) {
    const auto expected = expected_json()["files"]["reference.safetensors"];
    const auto file = SafetensorsFile::open((kFixtures / "reference.safetensors").string());

    std::vector<std::string> want_names;
    for (const auto& [name, _] : expected["tensors"].items()) want_names.push_back(name);
    EXPECT_EQ(file.names(), want_names);  // sorted
    using StringMap = std::map<std::string, std::string>;
    EXPECT_EQ(file.metadata(), expected["metadata"].get<StringMap>());

    for (const auto& name : file.names()) {
        const auto& info = file.info(name);
        const auto& want = expected["tensors"][name];
        expect_matches(info, file.raw(name), want, name);
        if (!info.kvasir_dtype()) continue;
        // The typed view must show the same bits and point into the mapping.
        const TensorView v = file.view(name);
        EXPECT_EQ(v.shape, info.shape);
        const std::size_t width = dtype_size(v.dtype);
        const auto* base = file.mapping()->data();
        if (v.numel() > 0) {
            EXPECT_EQ(static_cast<const std::byte*>(v.data), base + info.offset) << name << ": not zero-copy";
            EXPECT_EQ(reinterpret_cast<std::uintptr_t>(v.data) % width, 0u) << name;
        }
        for (std::int64_t i = 0; i < v.numel(); ++i)
            ASSERT_EQ(raw_bits(static_cast<const std::byte*>(v.data), width, static_cast<std::size_t>(i)),
                      hex_bits(want["bits"][static_cast<std::size_t>(i)].get<std::string>()));
    }
    // Values through the kvasir conversions, a few spot checks.
    EXPECT_EQ(file.view("f32.scalar").at(0), 2.5);
    EXPECT_EQ(file.view("bf16.values").at(2), 1.0);
    EXPECT_EQ(file.view("f16.values").at(3), -1.0);
    EXPECT_EQ(file.view("i32.values").at(4), -2147483648.0);
    EXPECT_EQ(file.view("f32.empty").numel(), 0);
}

TEST(SafetensorsFixture, RefusesDtypesKvasirDoesNotComputeWith) {
    const std::string path = (kFixtures / "reference.safetensors").string();
    const auto file = SafetensorsFile::open(path);
    EXPECT_EQ(file.info("u8.refused").dtype, SafetensorsDType::U8);  // listed ...
    EXPECT_EQ(file.raw("u8.refused").size(), 7u);
    expect_error([&] { (void)file.view("u8.refused"); }, path, "tensor 'u8.refused' has dtype U8", ErrorCode::unsupported);
    expect_error([&] { (void)file.view("nope"); }, path, "no tensor named 'nope'");
}

TEST(SafetensorsFixture, ShardedCheckpointOpensShardsLazily) {
    const auto expected = expected_json()["files"]["sharded"];
    const fs::path dir = kFixtures / "sharded";
    const auto ckpt = SafetensorsCheckpoint::open(dir.string());
    EXPECT_TRUE(ckpt.sharded());
    std::vector<std::string> want_names;
    for (const auto& [name, _] : expected["weight_map"].items()) want_names.push_back(name);
    EXPECT_EQ(ckpt.names(), want_names);
    ASSERT_EQ(ckpt.shard_files().size(), 2u);
    EXPECT_TRUE(ckpt.open_shards().empty()) << "open() must not map any shard";

    const std::string layer1 = "model.layers.1.mlp.up_proj.weight";
    const std::string shard2 = (dir / "model-00002-of-00002.safetensors").string();
    EXPECT_EQ(ckpt.shard_of(layer1), shard2);
    EXPECT_TRUE(ckpt.open_shards().empty());
    (void)ckpt.view(layer1);
    EXPECT_EQ(ckpt.open_shards(), std::vector<std::string>{shard2}) << "layer 1 must map only its own shard";

    for (const auto& name : ckpt.names()) expect_matches(ckpt.info(name), ckpt.raw(name), expected["tensors"][name], name);
    EXPECT_EQ(ckpt.open_shards().size(), 2u);

    std::uint64_t want = 0;
    std::vector<std::string> layer0;
    for (const auto& n : ckpt.names())
        if (n.starts_with("model.layers.0.")) layer0.push_back(n), want += ckpt.info(n).nbytes;
    EXPECT_EQ(want, 4u * 3 * 4 + 3u * 4 * 2 + 3u * 2);
    EXPECT_EQ(ckpt.bytes_of(layer0), want);
    layer0.push_back(layer0.front());  // a name twice counts once
    EXPECT_EQ(ckpt.bytes_of(layer0), want);
}

TEST(SafetensorsCheckpoint, SingleFileAsDirectoryOrPath) {
    TempDir tmp;
    fs::copy_file(kFixtures / "reference.safetensors", tmp.path() / "model.safetensors");
    for (const std::string& p : {tmp.path().string(), tmp.file("model.safetensors")}) {
        const auto ckpt = SafetensorsCheckpoint::open(p);
        EXPECT_FALSE(ckpt.sharded());
        EXPECT_EQ(ckpt.names().size(), 9u);
        EXPECT_EQ(ckpt.view("f32.scalar").at(0), 2.5);
        ckpt.verify();
    }
    // model.safetensors wins over an index in the same directory (transformers' order).
    fs::copy_file(kFixtures / "sharded" / "model.safetensors.index.json", tmp.path() / "model.safetensors.index.json");
    EXPECT_FALSE(SafetensorsCheckpoint::open(tmp.path().string()).sharded());
}

// ===========================================================================
// Reader details
// ===========================================================================

TEST(SafetensorsReader, ParseFromMemoryMatchesOpen) {
    const std::string path = (kFixtures / "reference.safetensors").string();
    const std::string bytes = read_file(path);
    const auto mem = SafetensorsFile::parse(std::as_bytes(std::span(bytes.data(), bytes.size())), "in-memory");
    const auto file = SafetensorsFile::open(path);
    EXPECT_EQ(mem.names(), file.names());
    EXPECT_EQ(mem.mapping(), nullptr);
    EXPECT_EQ(mem.header_size(), file.header_size());
    for (const auto& n : file.names()) {
        EXPECT_EQ(mem.info(n).offset, file.info(n).offset);
        EXPECT_TRUE(std::equal(mem.raw(n).begin(), mem.raw(n).end(), file.raw(n).begin(), file.raw(n).end()));
    }
    expect_error([&] { SafetensorsFile::parse({}, "in-memory"); }, "in-memory", "too short");
}

TEST(SafetensorsReader, AcceptsWhatTheReferenceAccepts) {
    TempDir tmp;
    struct Case {
        const char* what;
        std::string bytes;
        std::size_t tensors;
    };
    const std::vector<Case> cases = {
        {"empty header, no data", image("{}", 0), 0},
        {"unpadded header", image(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", 8, false), 1},
        {"whitespace around the object", image(" \n\t{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}\r\n", 8), 1},
        {"__metadata__ null", image(R"({"__metadata__":null,"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", 8), 1},
        {"zero-size tensors sharing offsets",
         image(R"({"e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"f":{"dtype":"F64","shape":[2,0],"data_offsets":[0,0]},)"
               R"("c":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"z":{"dtype":"I8","shape":[0],"data_offsets":[8,8]}})",
               8),
         4},
        {"scalar", image(R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})", 8), 1},
        {"entries in any order, fields in any order",
         image(R"({"b":{"data_offsets":[4,8],"shape":[2],"dtype":"BF16"},"a":{"shape":[4],"dtype":"I8","data_offsets":[0,4]}})", 8), 2},
        {"sub-byte dtype on a byte boundary", image(R"({"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}})", 2), 1},
        {"non-ASCII and escaped names", image(R"({"\u00e9\n":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"ü":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2), 2},
    };
    for (const auto& c : cases) {
        const std::string p = tmp.file("ok.safetensors");
        write_file(p, c.bytes);
        try {
            const auto f = SafetensorsFile::open(p);
            EXPECT_EQ(f.names().size(), c.tensors) << c.what;
        } catch (const std::exception& e) {
            ADD_FAILURE() << c.what << ": " << e.what();
        }
    }
}

TEST(SafetensorsReader, MisalignedTensorIsCopiedNotMisused) {
    // F16 [1] at 0..2, then F32 [2] at 2..10: valid, but the F32 data is not
    // 4-aligned. view() must hand out an aligned copy with the same bits.
    TempDir tmp;
    const std::string p = tmp.file("mis.safetensors");
    std::string bytes = image(R"({"h":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},"w":{"dtype":"F32","shape":[2],"data_offsets":[2,10]}})", 0);
    const float vals[2] = {1.5f, -3.25f};
    bytes += std::string("\x00\x3c", 2);
    bytes.append(reinterpret_cast<const char*>(vals), sizeof vals);
    write_file(p, bytes);
    const auto f = SafetensorsFile::open(p);
    const TensorView v = f.view("w");
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(v.data) % 4, 0u);
    EXPECT_EQ(v.at(0), 1.5);
    EXPECT_EQ(v.at(1), -3.25);
    EXPECT_EQ(f.view("w").data, v.data) << "the copy is made once";
    EXPECT_EQ(f.raw("w").data(), f.mapping()->data() + f.info("w").offset);
    EXPECT_EQ(f.view("h").at(0), 1.0);
}

// ===========================================================================
// Malformed single files: every one rejected with a specific one-liner.
// ===========================================================================
namespace {

struct Malformed {
    const char* name;
    std::string bytes;
    std::string phrase;
};

std::string hdr(std::string_view json, std::size_t data) { return image(json, data); }

std::vector<Malformed> malformed_cases() {
    const std::string ok_a = R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]})";
    return {
        {"empty_file", "", "too short"},
        {"shorter_than_8_bytes", "\x10\x00\x00", "too short"},
        {"header_length_past_eof", le64(100) + "{}", "header length 100 runs past the end of the file (10 bytes)"},
        {"header_length_over_100MB", le64(100'000'001) + "{}      ", "header length 100000001 exceeds the 100000000-byte limit"},
        {"header_length_u64_max", le64(~0ull) + "{}      ", "exceeds the 100000000-byte limit"},
        {"header_length_zero", le64(0), "header is not valid JSON"},
        {"invalid_utf8", hdr("{\"a\xff\":{}}", 0), "header is not valid UTF-8 (byte 3 of the header)"},
        {"utf8_overlong", hdr("{\"\xc0\xaf\":{}}", 0), "not valid UTF-8"},
        {"utf8_surrogate", hdr("{\"\xed\xa0\x80\":{}}", 0), "not valid UTF-8"},
        {"utf8_truncated_sequence", le64(3) + "{\"\xe2", "not valid UTF-8"},
        {"invalid_json", hdr(R"({"a":)", 0), "header is not valid JSON"},
        {"json_trailing_garbage", hdr("{}x", 0), "header is not valid JSON"},
        {"json_trailing_nul", le64(3) + std::string("{}\0", 3), "header is not valid JSON: NUL byte at byte 2"},
        {"json_nul_then_garbage", le64(8) + std::string("{}\0junk!", 8), "NUL byte at byte 2"},
        {"json_lone_surrogate_escape", hdr(R"({"\ud800":{}})", 0), "header is not valid JSON"},
        {"json_bom", hdr("\xef\xbb\xbf{}", 0), "header is not valid JSON: it starts with a UTF-8 byte-order mark"},
        {"json_not_object_array", hdr("[1,2]", 0), "header is not a JSON object (it is an array)"},
        {"json_not_object_string", hdr(R"("x")", 0), "header is not a JSON object (it is a string)"},
        {"json_not_object_number", hdr("12", 0), "header is not a JSON object"},
        {"metadata_array", hdr(R"({"__metadata__":["k"]})", 0), "__metadata__ is not an object of strings (it is an array)"},
        {"metadata_value_int", hdr(R"({"__metadata__":{"k":1}})", 0), "__metadata__ is not an object of strings: value of 'k' is an integer"},
        {"metadata_value_object", hdr(R"({"__metadata__":{"k":{}}})", 0), "value of 'k' is an object"},
        {"metadata_duplicate_key", hdr(R"({"__metadata__":{"k":"1","k":"2"}})", 0), "duplicate key 'k' in __metadata__"},
        {"metadata_twice", hdr(R"({"__metadata__":{},"__metadata__":{}})", 0), "duplicate key \"__metadata__\""},
        {"entry_not_object", hdr(R"({"a":[1,2]})", 0), "tensor 'a': entry is not an object (it is an array)"},
        {"entry_null", hdr(R"({"a":null})", 0), "tensor 'a': entry is not an object (it is null)"},
        {"entry_missing_dtype", hdr(R"({"a":{"shape":[4],"data_offsets":[0,4]}})", 4), "tensor 'a': missing field \"dtype\""},
        {"entry_missing_shape", hdr(R"({"a":{"dtype":"U8","data_offsets":[0,4]}})", 4), "tensor 'a': missing field \"shape\""},
        {"entry_missing_data_offsets", hdr(R"({"a":{"dtype":"U8","shape":[4]}})", 4), "tensor 'a': missing field \"data_offsets\""},
        {"entry_unknown_field", hdr(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"x":1}})", 4), "tensor 'a': unexpected field 'x'"},
        {"entry_duplicate_field", hdr(R"({"a":{"dtype":"U8","dtype":"I8","shape":[4],"data_offsets":[0,4]}})", 4), "tensor 'a': duplicate field 'dtype'"},
        {"dtype_unknown", hdr(R"({"a":{"dtype":"F128","shape":[4],"data_offsets":[0,4]}})", 4), "tensor 'a': unknown dtype 'F128'"},
        {"dtype_lowercase", hdr(R"({"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4), "unknown dtype 'f32'"},
        {"dtype_not_string", hdr(R"({"a":{"dtype":5,"shape":[4],"data_offsets":[0,4]}})", 4), "tensor 'a': dtype is not a string (it is an integer)"},
        {"offsets_reversed", hdr(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", 8), "tensor 'a': data_offsets [8, 0] are reversed"},
        {"offsets_overlapping", hdr("{" + ok_a + R"(,"b":{"dtype":"U8","shape":[6],"data_offsets":[2,8]}})", 8),
         "tensor 'b': data_offsets [2, 8] overlap tensor 'a', which ends at 4"},
        {"offsets_identical", hdr("{" + ok_a + R"(,"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4), "overlap tensor 'a'"},
        {"offsets_gap", hdr("{" + ok_a + R"(,"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})", 8),
         "tensor 'b': gap of 2 bytes before data_offsets [6, 8]"},
        {"offsets_not_starting_at_zero", hdr(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 8), "tensor 'a': gap of 4 bytes"},
        {"data_trailing_bytes", hdr("{" + ok_a + "}", 8), "data buffer has 4 trailing bytes not covered by any tensor"},
        {"data_without_tensors", hdr("{}", 8), "data buffer has 8 trailing bytes"},
        {"offsets_past_eof", hdr(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})", 8),
         "tensor 'a': data_offsets [0, 16] run past the end of the data buffer (8 bytes)"},
        {"offsets_u64_max", hdr(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,18446744073709551615]}})", 8), "run past the end"},
        {"offsets_float", hdr(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4.0]}})", 4),
         "tensor 'a': data_offsets must be an array of 2 non-negative integers, but it holds 4.0, which is not an integer"},
        {"offsets_exponent", hdr(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4e0]}})", 4), "which is not an integer"},
        {"offsets_beyond_u64", hdr(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,18446744073709551616]}})", 4), "not an integer"},
        {"offsets_negative", hdr(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[-4,4]}})", 4), "holds the negative number -4"},
        {"offsets_strings", hdr(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":["0","4"]}})", 4), "but it holds a string"},
        {"offsets_one_element", hdr(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4]}})", 4), "but it has 1 element"},
        {"offsets_three_elements", hdr(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4,4]}})", 4), "has more than 2 elements"},
        {"offsets_object", hdr(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":{"0":4}}})", 4), "but it is an object"},
        {"size_not_matching_shape", hdr(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}})", 8),
         "tensor 'a': data_offsets [0, 8] hold 8 bytes but shape [4] of F32 needs 16"},
        {"shape_overflow", hdr(R"({"a":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,8]}})", 8),
         "tensor 'a': shape [1099511627776, 1099511627776] of F32 overflows 64-bit size arithmetic"},
        {"shape_overflow_in_bytes", hdr(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8), "overflows"},
        {"shape_negative_dim", hdr(R"({"a":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}})", 4), "tensor 'a': negative dimension -4 in shape"},
        {"shape_float_dim", hdr(R"({"a":{"dtype":"U8","shape":[4.0],"data_offsets":[0,4]}})", 4), "tensor 'a': shape dimension 4.0 is not an integer"},
        {"shape_not_array", hdr(R"({"a":{"dtype":"U8","shape":4,"data_offsets":[0,4]}})", 4), "tensor 'a': shape must be an array of non-negative integers, but it is an integer"},
        {"shape_nested", hdr(R"({"a":{"dtype":"U8","shape":[[4]],"data_offsets":[0,4]}})", 4), "but holds an array"},
        {"shape_minus_zero", hdr(R"({"a":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}})", 0), "tensor 'a': shape dimension -0 is not an integer"},
        {"shape_boolean", hdr(R"({"a":{"dtype":"U8","shape":[true],"data_offsets":[0,4]}})", 4), "but holds a boolean"},
        {"shape_dim_beyond_int64", hdr(R"({"a":{"dtype":"U8","shape":[0,9223372036854775808],"data_offsets":[0,0]}})", 0),
         "dimension 9223372036854775808 is too large"},
        {"subbyte_not_whole_bytes", hdr(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2), "of F4 is not a whole number of bytes"},
        {"duplicate_tensor_name", hdr("{" + ok_a + R"(,"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 8), "duplicate tensor name 'a'"},
        {"name_with_newline_is_escaped", hdr(R"({"x\ny":{"dtype":"U8","shape":[4],"data_offsets":[0,5]}})", 5), "tensor 'x\\x0ay':"},
    };
}

class SafetensorsMalformed : public ::testing::TestWithParam<Malformed> {};

TEST_P(SafetensorsMalformed, RejectedWithOneLineNamingFileAndProblem) {
    TempDir tmp;
    const std::string path = tmp.file(std::string(GetParam().name) + ".safetensors");
    write_file(path, GetParam().bytes);
    expect_error([&] { SafetensorsFile::open(path); }, path, GetParam().phrase);
    // The same through the checkpoint entry point, and from memory.
    expect_error([&] { SafetensorsCheckpoint::open(path); }, path, GetParam().phrase);
    const std::string& b = GetParam().bytes;
    expect_error([&] { SafetensorsFile::parse(std::as_bytes(std::span(b.data(), b.size())), "mem.safetensors"); },
                 "mem.safetensors", GetParam().phrase);
}

INSTANTIATE_TEST_SUITE_P(All, SafetensorsMalformed, ::testing::ValuesIn(malformed_cases()),
                         [](const ::testing::TestParamInfo<Malformed>& i) { return std::string(i.param.name); });

}  // namespace

// ===========================================================================
// Malformed sharded checkpoints
// ===========================================================================
namespace {

struct BadIndex {
    const char* name;
    std::string index;  // model.safetensors.index.json contents
    std::string phrase;
    bool lazy = false;  // the problem shows only when the shard is used
};

std::vector<BadIndex> bad_index_cases() {
    auto wm = [](const std::string& shard) {
        return R"({"metadata":{"total_size":16},"weight_map":{"a":")" + shard + R"("}})";
    };
    return {
        {"missing_shard", wm("model-00009-of-00009.safetensors"), "shard 'model-00009-of-00009.safetensors' (holding tensor 'a') is missing"},
        {"escape_dotdot", wm("../shard.safetensors"), "tensor 'a' maps to shard '../shard.safetensors', which is not a plain file name"},
        {"escape_absolute", wm("/etc/passwd"), "maps to shard '/etc/passwd', which is not a plain file name"},
        {"escape_subdir", wm("a/b"), "maps to shard 'a/b'"},
        {"escape_backslash", wm(R"(..\\x)"), "which is not a plain file name"},
        {"shard_dotdot_alone", wm(".."), "maps to shard '..'"},
        {"shard_dot", wm("."), "maps to shard '.'"},
        {"shard_empty", wm(""), "maps to shard ''"},
        {"shard_nul", wm(R"(shard.safetensors\u0000.txt)"), "which is not a plain file name"},
        {"shard_is_directory", wm("subdir"), "is missing or not a regular file"},
        {"tensor_absent_from_shard", R"({"weight_map":{"a":"shard.safetensors","zz":"shard.safetensors"}})",
         "tensor 'zz' is mapped to shard 'shard.safetensors', which does not contain it", true},
        {"not_json", "{\"weight_map\": {\"a\": \"shard.safetensors\"", "index is not valid JSON"},
        {"nul_then_garbage", std::string(R"({"weight_map":{"a":"shard.safetensors"}})") + std::string("\0junk", 5), "index is not valid JSON: NUL byte"},
        {"not_utf8", "{\"weight_map\":{\"a\xff\":\"shard.safetensors\"}}", "index is not valid UTF-8"},
        {"not_object", R"(["weight_map"])", "index is not a JSON object (it is an array)"},
        {"no_weight_map", R"({"metadata":{}})", "index has no \"weight_map\" object"},
        {"weight_map_not_object", R"({"weight_map":["a"]})", "weight_map is not an object (it is an array)"},
        {"weight_map_value_not_string", R"({"weight_map":{"a":1}})", "weight_map value of tensor 'a' is not a string (it is an integer)"},
        {"weight_map_empty", R"({"weight_map":{}})", "weight_map is empty"},
        {"weight_map_duplicate_tensor", R"({"weight_map":{"a":"shard.safetensors","a":"shard.safetensors"}})", "tensor 'a' appears twice in weight_map"},
        {"weight_map_twice", R"({"weight_map":{"a":"shard.safetensors"},"weight_map":{"a":"shard.safetensors"}})", "duplicate key 'weight_map'"},
        {"deep_nesting_elsewhere", R"({"weight_map":{"a":"shard.safetensors"},"x":)" + std::string(200, '[') + std::string(200, ']') + "}",
         "index nests deeper than 128 levels"},
    };
}

class SafetensorsBadIndex : public ::testing::TestWithParam<BadIndex> {};

TEST_P(SafetensorsBadIndex, RejectedWithOneLineNamingTheIndex) {
    TempDir tmp;
    fs::create_directory(tmp.path() / "subdir");
    write_file(tmp.file("shard.safetensors"), image(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})", 16));
    const std::string index = tmp.file("model.safetensors.index.json");
    write_file(index, GetParam().index);
    if (!GetParam().lazy) {
        expect_error([&] { SafetensorsCheckpoint::open(tmp.path().string()); }, index, GetParam().phrase);
        return;
    }
    const auto ckpt = SafetensorsCheckpoint::open(tmp.path().string());
    expect_error([&] { (void)ckpt.view("a"); }, index, GetParam().phrase);
    expect_error([&] { ckpt.verify(); }, index, GetParam().phrase);
}

INSTANTIATE_TEST_SUITE_P(All, SafetensorsBadIndex, ::testing::ValuesIn(bad_index_cases()),
                         [](const ::testing::TestParamInfo<BadIndex>& i) { return std::string(i.param.name); });

}  // namespace

TEST(SafetensorsCheckpoint, MalformedShardIsNamedWhenUsed) {
    TempDir tmp;
    write_file(tmp.file("model.safetensors.index.json"), R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
    write_file(tmp.file("s1.safetensors"), image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4));
    write_file(tmp.file("s2.safetensors"), "garbage");
    const auto ckpt = SafetensorsCheckpoint::open(tmp.path().string());
    EXPECT_EQ(ckpt.raw("a").size(), 4u);  // the good shard works without touching the bad one
    expect_error([&] { (void)ckpt.info("b"); }, tmp.file("s2.safetensors"), "too short");
    expect_error([&] { (void)ckpt.info("c"); }, tmp.path().string(), "no tensor named 'c'");
}

TEST(SafetensorsCheckpoint, MissingPathsAreBadInput) {
    TempDir tmp;
    expect_error([&] { SafetensorsCheckpoint::open(tmp.path().string()); }, tmp.path().string(),
                 "directory holds neither model.safetensors nor model.safetensors.index.json");
    expect_error([&] { SafetensorsCheckpoint::open(tmp.file("nope")); }, tmp.file("nope"), "no such file or directory");
    expect_error([&] { SafetensorsFile::open(tmp.file("nope.safetensors")); }, tmp.file("nope.safetensors"), "no such file or directory");
}

// ===========================================================================
// Writer
// ===========================================================================

TEST(SafetensorsWriter, RoundTripsEveryKvasirDtypeCanonically) {
    TempDir tmp;
    const std::string p = tmp.file("out.safetensors");
    Tensor f64 = Tensor::from_f64(std::vector<double>{1.0, -2.5, 1e300}, {3}, DType::f64);
    Tensor f32 = Tensor::from_f64(std::vector<double>{0.5, 0.25, -0.125, 8, 9, 10}, {2, 3}, DType::f32);
    Tensor f16 = Tensor::from_f64(std::vector<double>{1, 2, 3}, {3}, DType::f16);  // 6 bytes: would misalign what follows
    Tensor bf16 = Tensor::from_f64(std::vector<double>{-1, 0.5, 7}, {1, 3}, DType::bf16);
    Tensor i32 = Tensor::from_f64(std::vector<double>{7, -7, 2147483647}, {3}, DType::i32);
    Tensor scalar = Tensor::from_f64(std::vector<double>{42}, {}, DType::f32);
    Tensor empty(DType::f32, {0, 4});
    const std::map<std::string, TensorView> tensors = {
        {"a.f16", f16}, {"b.f64", f64}, {"c.f32", f32}, {"d.bf16", bf16}, {"e.i32", i32}, {"scalar", scalar}, {"empty", empty}};
    const std::map<std::string, std::string> meta = {{"protocol", "p1"}, {"seed", "42"}, {"ünï", "cødé\n\"q\""}};
    write_safetensors(p, tensors, meta);

    const auto f = SafetensorsFile::open(p);
    EXPECT_EQ(f.metadata(), meta);
    EXPECT_EQ(f.header_size() % 8, 0u);
    ASSERT_EQ(f.names().size(), tensors.size());
    for (const auto& [name, v] : tensors) {
        const TensorView r = f.view(name);
        EXPECT_EQ(r.dtype, v.dtype) << name;
        EXPECT_EQ(r.shape, v.shape) << name;
        const auto raw = f.raw(name);
        EXPECT_EQ(raw.data(), static_cast<const std::byte*>(r.data)) << name << ": aligned in the file, so zero-copy";
        EXPECT_EQ(f.info(name).offset % dtype_size(v.dtype), 0u) << name;
        ASSERT_EQ(raw.size(), static_cast<std::size_t>(v.numel()) * dtype_size(v.dtype));
        EXPECT_EQ(std::memcmp(raw.data(), v.data, raw.size()), 0) << name;
    }
    // Canonical header: sorted keys, no whitespace but the padding.
    const std::string bytes = read_file(p);
    const std::string header = bytes.substr(8, f.header_size());
    const auto j = nlohmann::json::parse(header);
    std::vector<std::string> keys;
    for (const auto& [k, _] : j.items()) keys.push_back(k);
    EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
    EXPECT_EQ(header.find_last_not_of(' ') + 1, j.dump().size());
    // Deterministic: writing again gives the same bytes.
    write_safetensors(tmp.file("again.safetensors"), tensors, meta);
    EXPECT_EQ(read_file(tmp.file("again.safetensors")), bytes);
}

TEST(SafetensorsWriter, RejectsBadInputWithoutTouchingTheTarget) {
    TempDir tmp;
    const std::string p = tmp.file("keep.safetensors");
    write_file(p, "previous contents");
    Tensor t = Tensor::from_f64(std::vector<double>{1}, {1}, DType::f32);
    expect_error([&] { write_safetensors(p, {{"__metadata__", t}}); }, p, "\"__metadata__\" cannot be a tensor name");
    expect_error([&] { write_safetensors(p, {{"bad\xff", t}}); }, p, "is not valid UTF-8");
    expect_error([&] { write_safetensors(p, {{"a", t}}, {{"k", "\xc0"}}); }, p, "__metadata__ entry 'k' is not valid UTF-8");
    expect_error([&] { write_safetensors(p, {{"a", TensorView{DType::f32, nullptr, {2}}}}); }, p, "tensor 'a': view has no data");
    expect_error([&] { write_safetensors(p, {{"a", TensorView{DType::f32, t.raw(), {-1}}}}); }, p, "negative dimension");
    // The target is a directory: refused before any temporary is made.
    fs::create_directory(tmp.path() / "dir.safetensors");
    fs::create_directory(tmp.path() / "dir.safetensors" / "inside");
    expect_error([&] { write_safetensors(tmp.file("dir.safetensors"), {{"a", t}}); }, tmp.file("dir.safetensors"),
                 "is a directory; an output is never written over one");
    expect_error([&] { write_safetensors(tmp.file("no/such/dir/x.safetensors"), {{"a", t}}); }, tmp.file("no/such/dir/x.safetensors"),
                 "cannot create a temporary file");
    EXPECT_EQ(read_file(p), "previous contents");
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(tmp.path())) left.push_back(e.path().filename().string());
    std::sort(left.begin(), left.end());
    EXPECT_EQ(left, (std::vector<std::string>{"dir.safetensors", "keep.safetensors"})) << "a temporary file was left behind";
}

TEST(SafetensorsWriter, FailureMidWriteLeavesNoTemporaryAndKeepsTheTarget) {
    // A file-size limit makes write() fail with EFBIG part way through the
    // data. Run in a child process so the limit does not leak into other tests.
    TempDir tmp;
    const std::string p = tmp.file("big.safetensors");
    write_file(p, "previous contents");
    auto child = [&] {
        ::signal(SIGXFSZ, SIG_IGN);
        rlimit lim{1 << 16, 1 << 16};
        ::setrlimit(RLIMIT_FSIZE, &lim);
        Tensor big(DType::f32, {1 << 18});  // 1 MiB > 64 KiB limit
        int rc = 1;
        try {
            write_safetensors(p, {{"big", big}});
        } catch (const Error& e) {
            if (e.code() == ErrorCode::bad_input && std::string(e.what()).find("cannot write") != std::string::npos) rc = 0;
        }
        std::_Exit(rc);  // no atexit handlers of the parent's gtest state
    };
    EXPECT_EXIT(child(), ::testing::ExitedWithCode(0), "");
    EXPECT_EQ(read_file(p), "previous contents");
    std::size_t entries = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.path())) ++entries;
    EXPECT_EQ(entries, 1u) << "a temporary file was left behind";
}

// ===========================================================================
// Bytes touched: loading layer L reads only layer L
// ===========================================================================
namespace {

// mincore() reports page-cache residency; on tmpfs every page is always
// resident, so the proof needs a disk-backed file system.
fs::path disk_backed_dir() {
    for (const fs::path& cand : {fs::temp_directory_path(), fs::path("/var/tmp"), fs::path(KVASIR_SOURCE_DIR)}) {
        struct statfs s {};
        if (::statfs(cand.c_str(), &s) == 0 && s.f_type != 0x01021994 /* TMPFS_MAGIC */ && ::access(cand.c_str(), W_OK) == 0)
            return cand;
    }
    return {};
}

// read_bytes of /proc/self/io: bytes this process caused to be fetched from
// storage. Corroborates mincore where the kernel accounts it (0 elsewhere).
std::uint64_t proc_read_bytes() {
    std::ifstream f("/proc/self/io");
    std::string key;
    std::uint64_t v = 0;
    while (f >> key >> v)
        if (key == "read_bytes:") return v;
    return 0;
}

constexpr int kLayers = 4;
constexpr std::int64_t kElems = 2 << 20;  // 2 Mi f32 = 8 MiB per tensor, 2 tensors = 16 MiB per layer

std::string layer_tensor(int layer, const char* which) { return "model.layers." + std::to_string(layer) + ".mlp." + which + ".weight"; }

void write_layers(const std::string& path, int first, int count) {
    std::vector<Tensor> store;
    std::map<std::string, TensorView> views;
    store.reserve(static_cast<std::size_t>(2 * count));  // views below point into these tensors
    for (int l = first; l < first + count; ++l)
        for (const char* w : {"up_proj", "down_proj"}) {
            Tensor& t = store.emplace_back(DType::f32, Shape{kElems / 1024, 1024});
            auto* d = t.as<float>();
            for (std::int64_t i = 0; i < kElems; ++i) d[i] = static_cast<float>(l * 1000 + (i % 97));
            views.emplace(layer_tensor(l, w), t.view());
        }
    write_safetensors(path, views);  // fsyncs: the pages are clean, so they can be dropped
}

// Read every element, as a backend loading the layer would.
double load(const TensorView& v) {
    double s = 0;
    for (std::int64_t i = 0; i < v.numel(); ++i) s += v.at(i);
    return s;
}

double expected_sum(int layer) {
    double s = 0;
    for (std::int64_t i = 0; i < kElems; ++i) s += static_cast<float>(layer * 1000 + (i % 97));
    return 2 * s;
}

}  // namespace

TEST(SafetensorsBytesTouched, LoadingOneLayerTouchesOnlyThatLayer) {
    const fs::path base = disk_backed_dir();
    if (base.empty()) GTEST_SKIP() << "no disk-backed writable directory: mincore cannot tell what was read";
    TempDir tmp(base);
    const std::string p = tmp.file("layers.safetensors");
    write_layers(p, 0, kLayers);

    const auto f = SafetensorsFile::open(p);
    const MappedFile& m = *f.mapping();
    // Byte range of each layer (its tensors are contiguous: same dtype, name order).
    std::vector<std::pair<std::uint64_t, std::uint64_t>> range(kLayers, {~0ull, 0});
    for (int l = 0; l < kLayers; ++l)
        for (const char* w : {"up_proj", "down_proj"}) {
            const auto& ti = f.info(layer_tensor(l, w));
            range[l].first = std::min(range[l].first, ti.offset);
            range[l].second = std::max(range[l].second, ti.offset + ti.nbytes);
        }
    const std::uint64_t layer_bytes = range[1].second - range[1].first;
    ASSERT_EQ(layer_bytes, 2u * kElems * 4);

    m.drop_pages();
    for (int l = 0; l < kLayers; ++l)
        ASSERT_LE(m.resident_bytes(range[l].first, range[l].second - range[l].first), 64u << 10)
            << "layer " << l << " still resident after drop_pages(): page cache cannot be measured here";

    const std::uint64_t io_before = proc_read_bytes();
    double sum = 0;
    for (const char* w : {"up_proj", "down_proj"}) sum += load(f.view(layer_tensor(1, w)));
    const std::uint64_t io_read = proc_read_bytes() - io_before;
    EXPECT_EQ(sum, expected_sum(1));

    const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    const std::uint64_t layer1_resident = m.resident_bytes(range[1].first, layer_bytes);
    // Layer 1 is fully resident (its range rounded out to whole pages).
    const std::uint64_t rounded = (range[1].second + page - 1) / page * page - range[1].first / page * page;
    EXPECT_EQ(layer1_resident, rounded);
    // The other layers: at most the page each boundary shares with layer 1,
    // plus the kernel's fault-around. The reader maps with MADV_RANDOM (no
    // read-around) and view() asks MADV_WILLNEED for exactly the tensor's
    // pages, so nothing should be read speculatively; fault-around
    // (fault_around_bytes, 64 KiB by default) only maps pages already in the
    // page cache and reads nothing. 256 KiB leaves room for a kernel whose
    // readahead ignores the advice, and is still 64x smaller than one layer,
    // so reading a neighbouring layer would fail the test loudly.
    constexpr std::uint64_t kBound = 256 << 10;
    std::uint64_t others = 0;
    for (int l = 0; l < kLayers; ++l) {
        if (l == 1) continue;
        const std::uint64_t r = m.resident_bytes(range[l].first, range[l].second - range[l].first);
        EXPECT_LE(r, kBound) << "layer " << l << " has " << r << " bytes resident after loading layer 1";
        others += r;
    }
    // Where the kernel accounts storage reads, they agree: one layer plus slack.
    EXPECT_LE(io_read, layer_bytes + (1u << 20));
    std::printf("[ measured ] layer 1: %llu of %llu bytes resident; layers 0,2,3: %llu bytes resident in total; "
                "/proc/self/io read_bytes during the load: %llu\n",
                static_cast<unsigned long long>(layer1_resident), static_cast<unsigned long long>(layer_bytes),
                static_cast<unsigned long long>(others), static_cast<unsigned long long>(io_read));
    RecordProperty("layer1_resident", std::to_string(layer1_resident));
    RecordProperty("other_layers_resident", std::to_string(others));
    RecordProperty("read_bytes", std::to_string(io_read));
}

TEST(SafetensorsBytesTouched, ShardedCheckpointMapsOnlyTheLayersShard) {
    const fs::path base = disk_backed_dir();
    if (base.empty()) GTEST_SKIP() << "no disk-backed writable directory";
    TempDir tmp(base);
    std::string index = R"({"metadata":{},"weight_map":{)";
    for (int l = 0; l < kLayers; ++l) {
        const std::string shard = "model-0000" + std::to_string(l + 1) + "-of-0000" + std::to_string(kLayers) + ".safetensors";
        write_layers(tmp.file(shard), l, 1);
        for (const char* w : {"up_proj", "down_proj"})
            index += (index.back() == '{' ? "" : ",") + ("\"" + layer_tensor(l, w) + "\":\"" + shard + "\"");
    }
    write_file(tmp.file("model.safetensors.index.json"), index + "}}");
    for (const auto& e : fs::directory_iterator(tmp.path())) MappedFile(e.path().string()).drop_pages();

    const auto ckpt = SafetensorsCheckpoint::open(tmp.path().string());
    double sum = 0;
    for (const char* w : {"up_proj", "down_proj"}) sum += load(ckpt.view(layer_tensor(1, w)));
    EXPECT_EQ(sum, expected_sum(1));
    EXPECT_EQ(ckpt.open_shards(), std::vector<std::string>{tmp.file("model-00002-of-00004.safetensors")});
    // The other shards were never mapped, and their pages are not in the page cache.
    for (int l : {0, 2, 3}) {
        const MappedFile other(tmp.file("model-0000" + std::to_string(l + 1) + "-of-00004.safetensors"));
        EXPECT_LE(other.resident_bytes(0, other.size()), 64u << 10) << "shard of layer " << l;
    }
    const MappedFile mine(tmp.file("model-00002-of-00004.safetensors"));
    EXPECT_GE(mine.resident_bytes(0, mine.size()), 2u * kElems * 4);
}
