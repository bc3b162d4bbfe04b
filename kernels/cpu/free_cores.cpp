// free_cores (matmul.hpp): the cores other processes leave this one, from
// /proc/stat's busy time and this process's own CPU time over a window.
#include "kernels/cpu/matmul.hpp"

#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <thread>
#include <unistd.h>

namespace kvasir::kernels {
namespace {

constexpr double kWindowSeconds = 0.1;

// The machine's busy CPU time (every core, seconds) from /proc/stat's first
// line: user nice system idle iowait irq softirq steal; busy = all − idle −
// iowait. False where it cannot be read.
bool machine_busy_seconds(double& busy) {
    std::FILE* f = std::fopen("/proc/stat", "re");
    if (f == nullptr) return false;
    unsigned long long v[8] = {};
    const int got = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                                &v[6], &v[7]);
    std::fclose(f);
    if (got < 4) return false;
    const long hz = ::sysconf(_SC_CLK_TCK);
    if (hz <= 0) return false;
    const unsigned long long all = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    busy = static_cast<double>(all - v[3] - v[4]) / static_cast<double>(hz);
    return true;
}

double own_seconds() {
    rusage u{};
    if (::getrusage(RUSAGE_SELF, &u) != 0) return 0;
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct Sampler {
    std::mutex lock;
    bool have = false;
    std::chrono::steady_clock::time_point at;
    double busy = 0, own = 0;
    std::atomic<std::int64_t> next_ns{0};  // steady-clock time of the next sample
    std::atomic<int> free{0};              // 0: not measured yet
};

Sampler& sampler() {
    static Sampler s;
    return s;
}

int machine_cores() {
    static const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return cores;
}

}  // namespace

int free_cores_of(int cores, double others) noexcept {
    if (cores < 1) cores = 1;
    if (!(others > 0)) return cores;
    const int left = cores - static_cast<int>(std::lround(others));
    return left < 1 ? 1 : left;
}

int free_cores() noexcept {
    Sampler& s = sampler();
    const auto now = std::chrono::steady_clock::now();
    const std::int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
    if (now_ns >= s.next_ns.load(std::memory_order_relaxed)) {
        std::unique_lock<std::mutex> g(s.lock, std::try_to_lock);  // one thread samples; the others use the last value
        if (g.owns_lock() && now_ns >= s.next_ns.load(std::memory_order_relaxed)) {
            double busy = 0;
            if (!machine_busy_seconds(busy)) {
                s.next_ns.store(std::numeric_limits<std::int64_t>::max(), std::memory_order_relaxed);  // no /proc: never again
            } else {
                const double own = own_seconds();
                if (s.have) {
                    const double wall = std::chrono::duration<double>(now - s.at).count();
                    const double others = wall > 0 ? ((busy - s.busy) - (own - s.own)) / wall : 0;
                    s.free.store(free_cores_of(machine_cores(), others), std::memory_order_relaxed);
                }
                s.have = true;
                s.at = now;
                s.busy = busy;
                s.own = own;
                s.next_ns.store(now_ns + static_cast<std::int64_t>(kWindowSeconds * 1e9), std::memory_order_relaxed);
            }
        }
    }
    const int f = s.free.load(std::memory_order_relaxed);
    return f > 0 ? f : machine_cores();
}

}  // namespace kvasir::kernels
