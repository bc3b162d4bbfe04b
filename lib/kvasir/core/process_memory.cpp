#include "kvasir/core/process_memory.hpp"

#include <chrono>
#include <fstream>
#include <limits>
#include <string>

namespace kvasir {

std::optional<ProcessMemory> process_memory(pid_t pid) {
    std::ifstream in(pid == 0 ? std::string("/proc/self/status") : "/proc/" + std::to_string(pid) + "/status");
    if (!in) return std::nullopt;
    ProcessMemory m;
    bool rss = false, anon = false;
    std::string key;
    while (in >> key) {
        std::uint64_t kib = 0;
        if (key == "VmRSS:" || key == "RssAnon:" || key == "RssShmem:") {
            if (!(in >> kib)) return std::nullopt;
            if (key == "VmRSS:") m.resident = kib * 1024, rss = true;
            else m.own += kib * 1024, anon = anon || key == "RssAnon:";
        }
        in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
    if (!rss || !anon) return std::nullopt;  // a zombie, or not Linux
    return m;
}

PeakMemoryWatch::PeakMemoryWatch(int period_ms) : period_ms_(period_ms < 1 ? 1 : period_ms) {
    sample();
    thread_ = std::thread([this] {
        while (!stop_.load(std::memory_order_relaxed)) {
            std::this_thread::sleep_for(std::chrono::milliseconds(period_ms_));
            sample();
        }
    });
}

PeakMemoryWatch::~PeakMemoryWatch() {
    stop_ = true;
    thread_.join();
}

void PeakMemoryWatch::sample() const {
    const auto m = process_memory();
    samples_.fetch_add(1, std::memory_order_relaxed);
    if (!m) return;
    std::uint64_t seen = peak_own_.load(std::memory_order_relaxed);
    while (m->own > seen && !peak_own_.compare_exchange_weak(seen, m->own, std::memory_order_relaxed)) {
    }
}

std::uint64_t PeakMemoryWatch::peak_own() const {
    sample();
    return peak_own_.load(std::memory_order_relaxed);
}

}  // namespace kvasir
