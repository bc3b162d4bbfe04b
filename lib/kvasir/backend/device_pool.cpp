#include "kvasir/backend/device_pool.hpp"

#include <algorithm>

namespace kvasir {

DevicePool::~DevicePool() { release_idle(); }

void DevicePool::release_idle() {
    for (auto& [bytes, handles] : idle_)
        for (void* h : handles) release_(h);
    idle_.clear();
    idle_bytes_ = 0;
}

std::uint64_t DevicePool::size_class(std::uint64_t bytes) { return std::max<std::uint64_t>(256, (bytes + 255) / 256 * 256); }

void* DevicePool::take(std::uint64_t bytes) {
    const auto it = idle_.find(bytes);
    if (it == idle_.end() || it->second.empty()) return nullptr;
    void* h = it->second.back();
    it->second.pop_back();
    idle_bytes_ -= bytes;
    ++reused_;
    return h;
}

void DevicePool::give(void* handle, std::uint64_t bytes) {
    if (handle == nullptr) return;
    if (idle_bytes_ + bytes > cap_) {
        release_(handle);
        return;
    }
    try {
        idle_[bytes].push_back(handle);
    } catch (...) {  // no memory for the bookkeeping: free it instead (this runs in destructors)
        release_(handle);
        return;
    }
    idle_bytes_ += bytes;
}

std::uint64_t default_device_pool_cap(std::uint64_t device_memory_bytes) {
    return std::min<std::uint64_t>(device_memory_bytes / 16, std::uint64_t{1} << 30);
}

}  // namespace kvasir
