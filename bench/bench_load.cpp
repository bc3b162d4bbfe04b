// Loading one real-size layer against simply reading its bytes.
//
// The layer is layer 0 of the synthetic Qwen3-30B-A3B-shaped checkpoint
// (scripts/make_synthetic_checkpoint.py: 128 experts of 768×2048 in BF16,
// attention, router, norms — ~1.6 GB per layer), found at $KVASIR_BENCH_MODEL
// or out/qwen3-30b-a3b-synthetic; every benchmark is skipped when it is absent.
// Bytes/s are the layer's bytes in the file per second.
//
//   read           pread() of each of the layer's tensors into one buffer:
//                  what any loader pays to have the bytes (the yardstick)
//   load           what kvasir does: Model::open (parse, map), resolve the
//                  layer, Model::load_layer (read-ahead advice, every page
//                  touched) — the weights are then usable in place, in BF16
//   load+f32       load, then every tensor widened to f32 with the AVX2
//                  converter (what a node that wants f32 copies pays)
//   widen_bf16     the BF16→f32 conversion alone on resident pages
// "warm": the file is in the page cache (the second audit of a model);
// "cold": its pages are dropped (POSIX_FADV_DONTNEED) before every iteration
// — on a VM the host may still cache the disk, so cold is what this guest sees.
//
//   ./bench_load --benchmark_min_time=2 --benchmark_repetitions=3
#include "kernels/cpu/matmul.hpp"
#include "kvasir/model/config.hpp"
#include "kvasir/model/mapped_file.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/model/safetensors_checkpoint.hpp"

#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace {

using namespace kvasir;

std::string model_dir() {
    const char* env = std::getenv("KVASIR_BENCH_MODEL");
    return env != nullptr ? env : std::string(KVASIR_SOURCE_DIR) + "/out/qwen3-30b-a3b-synthetic";
}

// Where layer 0's tensors lie in the (single-file) checkpoint.
struct LayerExtent {
    std::string file;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;  // offset, bytes
    std::uint64_t bytes = 0;
};

bool extent_of_layer0(LayerExtent& e, std::string& why) {
    const std::string dir = model_dir();
    if (!std::filesystem::exists(dir)) {
        why = dir + " is absent: run scripts/make_synthetic_checkpoint.py " + dir;
        return false;
    }
    const Model m = Model::open(dir);
    const SafetensorsCheckpoint* ck = m.checkpoint();
    if (ck == nullptr || ck->shard_files().size() != 1) {
        why = "expects a single-file safetensors checkpoint";
        return false;
    }
    e.file = ck->shard_files().front();
    for (const TensorSpec& s : layer_tensor_specs(m.config(), 0)) {
        const auto& info = ck->info(s.name);
        e.ranges.emplace_back(info.offset, info.nbytes);
        e.bytes += info.nbytes;
    }
    return true;
}

void drop_cache(const std::string& file) { MappedFile(file).drop_pages(); }

void read_layer(benchmark::State& state, bool cold) {
    LayerExtent e;
    std::string why;
    if (!extent_of_layer0(e, why)) return state.SkipWithError(why.c_str());
    std::vector<char> buf(e.bytes);
    for (auto _ : state) {
        if (cold) {
            state.PauseTiming();
            drop_cache(e.file);
            state.ResumeTiming();
        }
        const int fd = ::open(e.file.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return state.SkipWithError("cannot open the checkpoint");
        if (cold) (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        std::uint64_t pos = 0;
        for (const auto& [offset, n] : e.ranges) {
            std::uint64_t done = 0;
            while (done < n) {
                const ssize_t r = ::pread(fd, buf.data() + pos + done, n - done, static_cast<off_t>(offset + done));
                if (r <= 0) {
                    ::close(fd);
                    return state.SkipWithError("short read");
                }
                done += static_cast<std::uint64_t>(r);
            }
            pos += n;
        }
        ::close(fd);
        benchmark::DoNotOptimize(buf.data());
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * e.bytes));
}

void widen(const TensorView& v, std::vector<float>& out) {
    const auto n = v.numel();
    if (static_cast<std::int64_t>(out.size()) < n) out.resize(static_cast<std::size_t>(n));
    kernels::convert_rounded(v.data, kernels::weight_format_of(v.dtype), kernels::WeightRounding::none, out.data(), n);
    benchmark::DoNotOptimize(out.data());
}

void widen_layer(const LayerWeights& w, std::vector<float>& out) {
    for (const TensorView* v : {&w.input_norm, &w.post_attention_norm, &w.q_proj, &w.k_proj, &w.v_proj, &w.o_proj,
                                &w.q_norm, &w.k_norm, &w.router})
        if (present(*v)) widen(*v, out);
    for (const ExpertWeights& x : w.experts) {
        widen(x.gate, out);
        widen(x.up, out);
        widen(x.down, out);
    }
}

void load_layer(benchmark::State& state, bool cold, bool to_f32) {
    LayerExtent e;
    std::string why;
    if (!extent_of_layer0(e, why)) return state.SkipWithError(why.c_str());
    if (to_f32 && !kernels::cpu_has_fma_kernels()) return state.SkipWithError("no fused kernels (AVX2/F16C, NEON) on this CPU");
    std::vector<float> f32;
    std::uint64_t loaded = 0;
    for (auto _ : state) {
        if (cold) {
            state.PauseTiming();
            drop_cache(e.file);
            state.ResumeTiming();
        }
        const Model m = Model::open(model_dir());
        loaded = m.load_layer(0);
        if (to_f32) widen_layer(m.layer(0), f32);
    }
    if (loaded != e.bytes) return state.SkipWithError("load_layer read another byte count than the layer holds");
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * e.bytes));
}

void widen_resident(benchmark::State& state) {
    LayerExtent e;
    std::string why;
    if (!extent_of_layer0(e, why)) return state.SkipWithError(why.c_str());
    if (!kernels::cpu_has_fma_kernels()) return state.SkipWithError("no fused kernels (AVX2/F16C, NEON) on this CPU");
    const Model m = Model::open(model_dir());
    (void)m.load_layer(0);
    std::vector<float> f32;
    for (auto _ : state) widen_layer(m.layer(0), f32);
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * e.bytes));
}

}  // namespace

BENCHMARK_CAPTURE(read_layer, warm, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(load_layer, warm, false, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(load_layer, warm_f32, false, true)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(widen_resident)->Name("widen_bf16/resident")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(read_layer, cold, true)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
BENCHMARK_CAPTURE(load_layer, cold, true, false)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
BENCHMARK_CAPTURE(load_layer, cold_f32, true, true)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);

BENCHMARK_MAIN();
