// What a process holds in memory, split the way a model larger than the
// machine needs it split (issue #42):
//  * resident — VmRSS: every page of the process in RAM, including the pages
//    of mapped weight files. For a memory-mapped checkpoint these are page
//    cache: the kernel reads them in as the forward pass walks the layers and
//    drops them again under pressure, so they say how much of the model
//    happened to be cached, not what the process needs.
//  * own — RssAnon + RssShmem: memory only this process can give back
//    (activations, caches, packed or dequantised copies, device staging).
//    This is the figure that must stay bounded when the model is larger than
//    RAM, and the one a node's memory limit applies to.
// Read from /proc/<pid>/status (Linux); nullopt where it cannot be read.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <thread>

namespace kvasir {

struct ProcessMemory {
    std::uint64_t resident = 0;  // bytes, VmRSS
    std::uint64_t own = 0;       // bytes, RssAnon + RssShmem
};

// `pid` 0: this process.
std::optional<ProcessMemory> process_memory(pid_t pid = 0);

// This process's peak `own` memory while the object lives: a thread samples
// process_memory() every `period_ms` (the kernel keeps a peak of VmRSS, not of
// anonymous memory). peak() includes a sample taken at the call.
class PeakMemoryWatch {
public:
    explicit PeakMemoryWatch(int period_ms = 20);
    ~PeakMemoryWatch();
    PeakMemoryWatch(const PeakMemoryWatch&) = delete;
    PeakMemoryWatch& operator=(const PeakMemoryWatch&) = delete;

    std::uint64_t peak_own() const;
    std::uint64_t samples() const { return samples_.load(); }  // taken so far

private:
    void sample() const;
    mutable std::atomic<std::uint64_t> peak_own_{0}, samples_{0};
    std::atomic<bool> stop_{false};
    int period_ms_;
    std::thread thread_;
};

}  // namespace kvasir
