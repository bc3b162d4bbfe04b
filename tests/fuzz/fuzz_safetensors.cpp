// libFuzzer target for the safetensors parsers (header + tensor table, and the
// sharded-checkpoint index). Built only with -DKVASIR_FUZZ=ON under clang,
// normally with ASan+UBSan:
//
//   CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DKVASIR_FUZZ=ON \
//       -DKVASIR_SANITIZE=address,undefined -DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link
//   ninja -C build-fuzz fuzz_safetensors
//   ./build-fuzz/fuzz_safetensors -max_total_time=60 tests/fuzz/corpus/safetensors
//
// The input is parsed straight from libFuzzer's buffer (SafetensorsFile::parse),
// which is allocated to exactly its size, so ASan flags any read past the end.
// Beyond "no crash", the target checks the parser's contract and aborts when
// it is broken:
//  * a rejection is Error(bad_input), one line, starting "NAME: ";
//  * an accepted file's tensors lie inside the buffer and tile the data
//    region exactly; every byte and every element of every view is read;
//  * view() refuses only dtypes without a kvasir counterpart (Error(unsupported));
//  * MXFP4 pairs (X_blocks / X_scales) pass check_mxfp4_pair or are refused as above.
#include "kvasir/core/error.hpp"
#include "kvasir/model/quant.hpp"
#include "kvasir/model/safetensors.hpp"
#include "kvasir/model/safetensors_checkpoint.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

void check(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "fuzz_safetensors: contract broken: %s\n", what);
        __builtin_trap();
    }
}

void check_rejection(const kvasir::Error& e, std::string_view name) {
    const std::string_view msg = e.what();
    check(e.code() == kvasir::ErrorCode::bad_input, "rejection is not bad_input");
    check(msg.find('\n') == std::string_view::npos, "message is not one line");
    check(msg.size() > name.size() + 2 && msg.substr(0, name.size()) == name && msg.substr(name.size(), 2) == ": ",
          "message does not start with the file name");
}

volatile std::uint64_t g_sink;  // keeps the reads below from being optimised away

// Every "X_blocks" / "X_scales" pair (gpt-oss MXFP4) through the loader's own
// check (check_mxfp4_pair, against the blocks' own shape: the scales, the
// dtypes and the sizes must fit it) and, when accepted, every row expanded.
// A refusal is bad_input, one line, naming the file.
void exercise_mxfp4(const kvasir::SafetensorsFile& f, std::string_view file, std::uint64_t& sink) {
    for (const auto& name : f.names()) {
        constexpr std::string_view kSuffix = "_blocks";
        if (name.size() <= kSuffix.size() || name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) continue;
        const std::string scales = name.substr(0, name.size() - kSuffix.size()) + "_scales";
        if (!f.contains(scales)) continue;
        const auto& bi = f.info(name);
        if (bi.shape.size() < 3 || bi.shape.back() != 16) continue;  // not an MXFP4 blocks shape: the loader never asks
        try {
            const kvasir::Mxfp4Pair p =
                kvasir::check_mxfp4_pair(std::string(file), bi, f.raw(name), f.info(scales), f.raw(scales), bi.shape);
            std::vector<float> row(static_cast<std::size_t>(p.groups) * 32);
            for (std::int64_t r = 0; r < p.rows; ++r) {
                p.row(r, row.data());
                for (float v : row) sink += v == 0.0f;
            }
        } catch (const kvasir::Error& e) {
            check_rejection(e, file);
        }
    }
}

void exercise_file(std::span<const std::byte> bytes) {
    constexpr std::string_view kName = "fuzz.safetensors";
    try {
        const auto f = kvasir::SafetensorsFile::parse(bytes, std::string(kName));
        const std::byte* begin = bytes.data();
        const std::byte* end = begin + bytes.size();
        std::uint64_t covered = 0, sink = 0;
        const std::string* prev = nullptr;
        for (const auto& name : f.names()) {
            check(prev == nullptr || *prev < name, "names not sorted and unique");
            prev = &name;
            const auto& info = f.info(name);
            const auto raw = f.raw(name);
            check(raw.size() == info.nbytes, "raw size differs from info");
            check(raw.empty() || (raw.data() >= begin && raw.data() + raw.size() <= end), "tensor outside the buffer");
            check(info.offset >= f.data_offset(), "tensor inside the header");
            covered += info.nbytes;
            for (std::byte b : raw) sink += static_cast<std::uint8_t>(b);
            try {
                const kvasir::TensorView v = f.view(name);
                check(info.kvasir_dtype().has_value(), "view of a dtype without kvasir counterpart");
                check(static_cast<std::uint64_t>(v.numel()) * kvasir::dtype_size(v.dtype) == info.nbytes, "view size mismatch");
                for (std::int64_t i = 0; i < v.numel(); ++i) sink += v.at(i) == 0.0;  // UBSan: alignment; ASan: bounds
            } catch (const kvasir::Error& e) {
                check(e.code() == kvasir::ErrorCode::unsupported && !info.kvasir_dtype(), "view refused a supported dtype");
            }
        }
        check(covered == f.file_size() - f.data_offset(), "tensors do not tile the data buffer");
        exercise_mxfp4(f, kName, sink);
        for (const auto& [k, v] : f.metadata()) sink += k.size() + v.size();
        g_sink = sink;
    } catch (const kvasir::Error& e) {
        check_rejection(e, kName);
    }
}

void exercise_index(std::span<const std::byte> bytes) {
    constexpr std::string_view kName = "fuzz.index.json";
    try {
        const auto map = kvasir::parse_safetensors_index(bytes, std::string(kName));
        check(!map.empty(), "empty weight_map accepted");
        for (const auto& [tensor, shard] : map) {
            check(!shard.empty() && shard != "." && shard != "..", "shard name not a file name");
            check(shard.find_first_of(std::string_view("/\\\0", 3)) == std::string::npos, "shard name escapes the directory");
        }
    } catch (const kvasir::Error& e) {
        check_rejection(e, kName);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto bytes = std::as_bytes(std::span(data, size));
    exercise_file(bytes);
    // The same bytes as an index: cheap, and JSON-shaped inputs the corpus
    // grows for the header exercise the index parser as well.
    exercise_index(bytes);
    return 0;
}
