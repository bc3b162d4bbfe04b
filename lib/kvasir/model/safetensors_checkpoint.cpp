// Sharded Hugging Face checkpoints (safetensors_checkpoint.hpp): the SAX
// parser of model.safetensors.index.json and SafetensorsCheckpoint, which
// maps each shard on first use and checks it against the index.
#include "kvasir/model/safetensors_checkpoint.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/model/safetensors_text.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <mutex>
#include <set>
#include <utility>

namespace kvasir {

using namespace safetensors_detail;

// ===========================================================================
// Index (model.safetensors.index.json)
// ===========================================================================
namespace {

using json = nlohmann::json;


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
    const bool is_dir = check_input_path(path, InputKind::file_or_directory);  // a FIFO, device, loop: refused by name

    fs::path index;
    fs::path single;
    if (is_dir) {
        const fs::path dir(path);
        // An entry of either name that is there in any form (a FIFO, a folder,
        // a link to a device or to nothing) is the one meant: opening it
        // refuses it by what it is (check_input_path), never as "absent".
        const auto present = [&](const fs::path& p) { return fs::symlink_status(p, ec).type() != fs::file_type::not_found; };
        if (present(dir / "model.safetensors")) single = dir / "model.safetensors";
        else if (present(dir / "model.safetensors.index.json")) index = dir / "model.safetensors.index.json";
        else fail(ErrorCode::bad_input, "{}: directory holds neither model.safetensors nor model.safetensors.index.json", shown);
        (void)check_input_path((single.empty() ? index : single).string());  // a regular file (symlinks followed), or refused by name
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

}  // namespace kvasir
