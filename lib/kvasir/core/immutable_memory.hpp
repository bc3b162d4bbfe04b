// Host memory that keeps the same bytes for as long as it is registered —
// in practice the read-only mappings of model checkpoints (MappedFile). A
// device backend may keep a copy of such bytes resident (weight_cache.hpp):
// the registry tells it whether a pointer lies in memory like that, and in
// which *registration*.
//
// Why a registry rather than the pointer alone: activations are fresh heap
// Tensors, and a freed buffer's address is soon reused with other contents,
// so an address never identifies bytes by itself. A registration's id is
// never reused (a process-wide counter), and memory is registered only
// while it cannot change: a view that lies inside registration R at offset
// o names the same bytes for as long as R exists, and a file mapped again at
// the same address gets a new id. Heap memory is never registered.
//
// The one assumption: nobody writes to a checkpoint file while it is mapped
// (a MAP_PRIVATE mapping shows such writes) — the model loader assumes it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace kvasir {

// What registered bytes were expanded from, when the model expanded them
// (dequantised GGUF blocks, MXFP4 experts): the family of the stored format
// as llama.cpp's CPU backend pairs it with activations for its dot products
// (cpu:qdot=llamacpp). `none`: the bytes are the checkpoint's own.
enum class WeightOrigin : std::uint8_t {
    none,
    f16,            // F16 stored (activations rounded to f16)
    bf16,           // BF16 stored (activations rounded to bf16)
    blocks_q8_0,    // 32-value blocks whose dot takes Q8_0/Q8_1 activations (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4)
    superblocks_q8_k,  // 256-value k-quants whose dot takes Q8_K activations (Q2_K … Q6_K)
};

// Where a byte range lies in registered memory.
struct ImmutableSpan {
    std::uint64_t region = 0;  // the registration's id, never reused in this process
    std::size_t offset = 0;    // of the range's first byte from the registration's start
    WeightOrigin origin = WeightOrigin::none;
};

// Registers [data, data + size) for the life of this object; move-only.
// Registering a range that overlaps a live registration is an internal
// error (two owners would claim the same bytes).
class ImmutableRegistration {
public:
    ImmutableRegistration() = default;
    ImmutableRegistration(const void* data, std::size_t size, WeightOrigin origin = WeightOrigin::none);
    ImmutableRegistration(ImmutableRegistration&& other) noexcept;
    ImmutableRegistration& operator=(ImmutableRegistration&& other) noexcept;
    ImmutableRegistration(const ImmutableRegistration&) = delete;
    ImmutableRegistration& operator=(const ImmutableRegistration&) = delete;
    ~ImmutableRegistration();

    std::uint64_t id() const { return id_; }  // 0: registers nothing
    // Unregisters now (before the memory is unmapped, so that no lookup can
    // find the range once it may change).
    void reset() noexcept;

private:
    std::uint64_t id_ = 0;
};

// The registration holding all of [data, data + bytes), if one does.
// Thread-safe.
std::optional<ImmutableSpan> find_immutable(const void* data, std::size_t bytes);

}  // namespace kvasir
