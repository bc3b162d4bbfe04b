#include "commands.hpp"

#include "kvasir/audit/audit.hpp"
#include "kvasir/report/writers.hpp"

#include <fmt/format.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace kvasir::app {

std::string default_model_path() { return std::string(KVASIR_SOURCE_DIR) + "/fixtures/models/qwen3_moe_tiny"; }

HtmlStamp html_stamp() {
    HtmlStamp s;
    std::time_t t = std::time(nullptr);
    if (const char* e = std::getenv("SOURCE_DATE_EPOCH"); e != nullptr && *e != '\0') {
        char* end = nullptr;
        const long long v = std::strtoll(e, &end, 10);
        if (*end == '\0' && v >= 0) t = static_cast<std::time_t>(v);
    }
    std::tm utc{};
    if (::gmtime_r(&t, &utc) != nullptr) {
        char buf[64];
        if (std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &utc) > 0) s.date = buf;
    }
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0) s.machine = host;
    struct utsname u {};
    if (::uname(&u) == 0) s.machine += fmt::format("{}({} {} {})", s.machine.empty() ? "" : " ", u.sysname, u.release, u.machine);
    return s;
}

int& command_exit_code() {
    static int code = 0;
    return code;
}

void add_output_options(CLI::App& cmd, OutputOptions& out) {
    cmd.add_flag("--json", out.json, "Print the report as JSON on stdout instead of tables");
    cmd.add_option("-o,--output", out.output_file, "Also write the JSON report to FILE (atomically)");
}

void add_node_options(CLI::App& cmd, NodeOptions& nodes) {
    cmd.add_option("-b,--backends", nodes.backends,
                   "Nodes to run, comma separated: NAME[:DEVICE][:key=value,...], e.g. cpu-ref,cpu,cpu:acc=f16. "
                   "Default: every available backend plus cpu:acc=f16");
    cmd.add_option("-r,--reference", nodes.reference, "Node every other node is compared with")
        ->capture_default_str();
}

void add_timings_flag(CLI::App& cmd, bool& timings, const std::string& what) {
    cmd.add_flag("--timings", timings,
                 "Print where the time went on stderr: " + what +
                     "; and each device node's weight cache (hits, misses, evictions, bytes uploaded). Never in a "
                     "report, which stays reproducible");
}

std::function<void(const AuditProgress&)> progress_printer() {
    if (!isatty(STDERR_FILENO)) return {};
    return [](const AuditProgress& p) {
        // Done: the steps before this one, plus the nodes before this one
        // inside it (a node's share of a step is taken as equal).
        double done = p.step_index > 0 ? p.step_index - 1 : 0;
        if (p.node_index > 0 && p.nodes > 0) done += static_cast<double>(p.node_index - 1) / p.nodes;
        const int pct = p.steps > 0 ? static_cast<int>(100.0 * done / p.steps) : 0;
        std::string line = fmt::format("\r\033[K[{}/{} {:3d}%] {}", p.step_index, p.steps, pct, p.step);
        if (!p.node.empty()) line += fmt::format(" — {} ({}/{})", p.node, p.node_index, p.nodes);
        std::fputs(line.c_str(), stderr);
        std::fflush(stderr);
    };
}

void end_progress() {
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
}

}  // namespace kvasir::app
