// Device-resident weights: the host side of "upload a weight once, reuse it",
// written once for every device backend (OpenCL, and the CUDA/HIP source
// gpu_backend_impl.inc) and device agnostic: a backend supplies its buffer
// type and how to upload a view; the cache decides when to call it.
//
// What may be cached — the one rule that keeps a hit from ever being stale:
// only bytes in *immutable memory* (core/immutable_memory.hpp: the read-only
// checkpoint mappings and the model's dequantised copies). A key is
//   (registration id, byte offset, host bytes, dtype, shape, device format)
// and a registration id is never reused, so a key names the same bytes for
// the whole life of its entry. Everything else — activations, the seeded
// inputs of step 1, a (1 + w) norm scale a graph computed — is heap memory
// whose address a later tensor may reuse with other contents; it is
// uploaded for the call and counted as a bypass, never looked up. Keying on
// the address alone would serve a freed-and-reallocated activation stale; a
// content hash would cost a full read of every weight at every call, which
// is most of what an upload costs on a host-memory device.
//
// The device format (storage rounding done on upload: f32, half, bf16
// values in f32) is part of the key, so two formats of one weight are two
// entries. Bounded: `budget` bytes of device copies at most, least recently
// used evicted first — once cold: while every resident weight was asked for
// within the current pass (as many gets as weights seen), a newcomer is
// uploaded for its call and not kept (`declined`), so a model larger than the
// budget keeps its resident share hitting instead of LRU's miss on every get; a weight larger than the whole budget bypasses the
// cache (uploaded per call, as without it) rather than flush it. Budget 0 =
// off. An entry evicted while an op still holds it lives until that op ends
// (shared ownership), so the bound is the budget plus one op's operands.
//
// The bookkeeping is compiled once, by the host compiler (weight_cache.cpp):
// the GPU sources see only WeightCache<Buffer>'s thin typed wrapper (hipcc's
// device pass of clang 15 crashes instantiating std::map of a class template's
// nested key).
#pragma once

#include "kvasir/backend/backend.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace kvasir {

// The default budget: this share of the device's memory (CL_DEVICE_GLOBAL_MEM_SIZE,
// cudaDeviceProp::totalGlobalMem), per node. Half leaves the other half to
// activations, the lm_head's [T, vocab] outputs and other processes; an
// in-process audit of several nodes on one device should set weight_cache=.
inline constexpr double kWeightCacheDeviceShare = 0.5;

std::uint64_t default_weight_cache_budget(std::uint64_t device_memory_bytes);

// The backend option weight_cache=<MiB> (a whole number; 0 = off), in bytes;
// Error(bad_input) naming the spec otherwise.
std::uint64_t parse_weight_cache_option(const BackendSpec& spec, const std::string& value);

// What a node's capabilities say about its cache: the policy and the budget,
// from the option or as the share of `memory_query`. The counters change
// while the node runs, so they are not here but in WeightCacheStats (shown
// by --timings).
std::string describe_weight_cache(std::uint64_t budget, bool from_option, const char* memory_query);

// Type-erased cache: buffers are shared_ptr<const void> to the backend's
// buffer type. Thread-safe; `upload` runs under the cache's lock.
class WeightCacheCore {
public:
    using Upload = std::function<std::shared_ptr<const void>()>;
    explicit WeightCacheCore(std::uint64_t budget_bytes);
    ~WeightCacheCore();
    WeightCacheCore(const WeightCacheCore&) = delete;
    WeightCacheCore& operator=(const WeightCacheCore&) = delete;

    // The device copy of weight `w` in device format `format` (device_bytes
    // long): the resident one on a hit; else made by `upload` and kept when
    // the weight is cacheable and fits the budget (evicting the least
    // recently used entries first, to make room before the upload).
    // `layout` tells apart copies of one weight the backend arranges
    // differently (the OpenCL node's matmul panels: 1; plain copies: 0).
    std::shared_ptr<const void> get(const TensorView& w, DType format, std::uint64_t device_bytes, const Upload& upload,
                                    std::uint32_t layout = 0);
    WeightCacheStats stats() const;
    void clear();  // drops every entry; the counters stay

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

template <typename Buffer>
class WeightCache {
public:
    explicit WeightCache(std::uint64_t budget_bytes) : core_(budget_bytes) {}

    // `upload()` → Buffer, called on a miss or a bypass.
    template <typename MakeBuffer>
    std::shared_ptr<const Buffer> get(const TensorView& w, DType format, std::uint64_t device_bytes, MakeBuffer&& upload,
                                      std::uint32_t layout = 0) {
        return std::static_pointer_cast<const Buffer>(core_.get(
            w, format, device_bytes, [&]() -> std::shared_ptr<const void> { return std::make_shared<const Buffer>(upload()); },
            layout));
    }
    WeightCacheStats stats() const { return core_.stats(); }
    void clear() { core_.clear(); }

private:
    WeightCacheCore core_;
};

}  // namespace kvasir
