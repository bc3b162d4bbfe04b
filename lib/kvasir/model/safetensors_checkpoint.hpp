// safetensors checkpoints: a Hugging Face model directory (one file, or an
// index and its shards) opened as one set of tensors. The format and the
// reader of a single file are in safetensors.hpp.
#pragma once

#include "kvasir/core/tensor.hpp"
#include "kvasir/model/safetensors.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

// A Hugging Face checkpoint: a directory holding model.safetensors, or
// model.safetensors.index.json plus shards; or a single .safetensors file.
// A directory holding both uses model.safetensors (transformers' order).
//
// Index: a JSON object (≤ 100 MB, duplicate keys rejected) whose "weight_map"
// is a non-empty object of tensor name → shard file name; other keys
// ("metadata": {"total_size": ...}) are ignored. A shard name must be a plain
// file name inside the directory: not empty, not "." or "..", no '/', '\\' or
// NUL (so no absolute path and no escape). Symlinks are followed (the Hugging
// Face cache stores snapshots as links to blobs). Every shard must exist as a
// regular file when the checkpoint is opened (a stat, nothing is mapped);
// a shard is mapped and its header parsed only when one of its tensors is
// asked for (info/view/raw/bytes_of), and at that moment every tensor the
// index assigns to it must be present in it. Tensors a shard holds beyond
// those the index names are ignored, as transformers does.
class SafetensorsCheckpoint {
public:
    static SafetensorsCheckpoint open(const std::string& path);

    SafetensorsCheckpoint(SafetensorsCheckpoint&&) noexcept;
    SafetensorsCheckpoint& operator=(SafetensorsCheckpoint&&) noexcept;
    ~SafetensorsCheckpoint();

    const std::string& path() const;
    bool sharded() const;                                  // opened through an index
    const std::vector<std::string>& names() const;         // sorted; opens nothing
    bool contains(std::string_view name) const;
    const std::vector<std::string>& shard_files() const;   // sorted full paths
    const std::string& shard_of(std::string_view name) const;  // full path; opens nothing

    // These open the tensor's shard on first use. Views (and references
    // returned here) stay valid as long as the checkpoint lives.
    const SafetensorsTensorInfo& info(std::string_view name) const;
    TensorView view(std::string_view name) const;
    std::span<const std::byte> raw(std::string_view name) const;
    // Sum of the byte sizes of the named tensors (each distinct name once).
    std::uint64_t bytes_of(std::span<const std::string> names) const;

    // Shards mapped so far (full paths, sorted): lets tests and `inspect`
    // show that auditing one layer mapped only that layer's shards.
    std::vector<std::string> open_shards() const;
    // The shard file at `shard_path` (one of shard_files()), opened if needed.
    const SafetensorsFile& shard(const std::string& shard_path) const;
    // Open every shard and check the whole index (what `inspect` wants).
    void verify() const;

private:
    struct Impl;
    explicit SafetensorsCheckpoint(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// The weight map of a model.safetensors.index.json image (tensor → shard
// file name), validated as described above; `name` is used in messages.
// Exposed for the fuzz target.
std::map<std::string, std::string> parse_safetensors_index(std::span<const std::byte> bytes,
                                                            const std::string& name);

}  // namespace kvasir
