#include "kvasir/audit/isolation.hpp"
#include "kvasir/core/process_memory.hpp"

#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/capture.hpp"
#include "kvasir/audit/step.hpp"
#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/sha256.hpp"
#include "kvasir/core/io.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

namespace fs = std::filesystem;

namespace kvasir {

namespace {

// Resident memory of `pid` in bytes (0 when unknown or gone).
// The last non-empty line of a child's stderr, without our own prefix.
std::string last_line(const std::string& path) {
    std::ifstream in(path);
    std::string line, last;
    while (std::getline(in, line))
        if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
    for (const char* prefix : {"kvasir-equiv: error: ", "kvasir-equiv: internal error: "})
        if (last.rfind(prefix, 0) == 0) return last.substr(std::strlen(prefix));
    if (last.size() > 300) last = last.substr(0, 300) + "…";
    return last;
}

std::string signal_text(int sig) {
    const char* abbrev = sigabbrev_np(sig);
    const char* desc = strsignal(sig);
    return fmt::format("SIG{} ({})", abbrev ? abbrev : std::to_string(sig).c_str(), desc ? desc : "unknown signal");
}

// A temporary folder, removed with everything in it — also when the audit is
// interrupted (SIGINT/SIGTERM/SIGHUP: core/io TemporaryFolderGuard).
struct TempFolder {
    fs::path path;
    std::unique_ptr<TemporaryFolderGuard> guard;
    // A kept folder (--resume DIR): created if absent, never removed.
    explicit TempFolder(const std::string& keep) : path(keep) {
        std::error_code ec;
        fs::create_directories(path, ec);
        KVASIR_CHECK(!ec && fs::is_directory(path), ErrorCode::bad_input, "--resume {}: cannot create the folder: {}", keep,
                     ec ? ec.message() : "not a folder");
    }
    TempFolder() {
        const char* tmp = std::getenv("TMPDIR");
        std::string templ = (fs::path(tmp && *tmp ? tmp : "/tmp") / "kvasir-audit-XXXXXX").string();
        KVASIR_CHECK(::mkdtemp(templ.data()) != nullptr, ErrorCode::backend_failure, "cannot create a temporary folder {}: {}",
                     templ, std::strerror(errno));
        path = templ;
        guard = std::make_unique<TemporaryFolderGuard>(templ);
    }
    ~TempFolder() {
        if (!guard) return;  // kept
        guard.reset();
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

// Why a capture left in a --resume folder is not this run's (empty: it is,
// and is reused): content hash verified on opening, then the protocol, seed,
// model, node and steps it holds.
std::string not_reusable(const std::string& file, const AuditConfig& ac, const detail::AuditPlan& plan, const std::string& spec,
                         std::optional<Capture>& cap) {
    if (!fs::exists(file)) return "no capture";
    try {
        cap.emplace(Capture::open(file));
    } catch (const Error& e) {
        return fmt::format("unreadable ({})", e.what());
    }
    std::string why;
    if (cap->protocol_hash() != ac.protocol->content_hash) why = "another protocol";
    else if (cap->seed() != plan.seed) why = "another seed";
    else if (cap->model_fingerprint() != ac.model->fingerprint()) why = "another model";
    else if (cap->node() != BackendSpec::parse(spec).canonical()) why = fmt::format("another node ({})", cap->node());
    else if (cap->steps() != plan.steps) why = "other steps";
    if (!why.empty()) cap.reset();
    return why;
}

}  // namespace

ChildOutcome run_child(const std::vector<std::string>& argv, const std::string& stderr_path, double timeout_s,
                       double memory_gib, const std::string& failure_path, const std::atomic<bool>* cancel) {
    KVASIR_ASSERT(!argv.empty() && timeout_s > 0 && memory_gib > 0);
    // Everything the child needs is prepared before fork: between fork and
    // exec only async-signal-safe calls.
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int err = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    KVASIR_CHECK(err >= 0, ErrorCode::backend_failure, "cannot create {}: {}", stderr_path, std::strerror(errno));
    const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    const std::string failure_env = "KVASIR_FAILURE_FILE=" + failure_path;
    std::vector<char*> env;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e)
        if (std::strncmp(*e, "KVASIR_FAILURE_FILE=", 20) != 0) env.push_back(*e);
    if (!failure_path.empty()) env.push_back(const_cast<char*>(failure_env.c_str()));
    env.push_back(nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
        ::close(err);
        if (null >= 0) ::close(null);
        fail(ErrorCode::backend_failure, "fork: {}", std::strerror(errno));
    }
    if (pid == 0) {
        // The child dies with the audit: a killed audit leaves no node running.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) _exit(127);  // the audit died before prctl
        ::setpgid(0, 0);
        if (null >= 0) {
            ::dup2(null, STDIN_FILENO);
            ::dup2(null, STDOUT_FILENO);
        }
        ::dup2(err, STDERR_FILENO);
        ::execve(args[0], args.data(), env.data());
        _exit(127);
    }
    ::setpgid(pid, pid);  // also here: no race with the child's own call
    ::close(err);
    if (null >= 0) ::close(null);

    ChildOutcome out;
    const double limit_bytes = memory_gib * 1024.0 * 1024.0 * 1024.0;
    std::string killed_for;
    int status = 0;
    for (;;) {
        const pid_t r = ::waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) fail(ErrorCode::backend_failure, "waitpid: {}", std::strerror(errno));
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        // The limit is on the memory the child owns: the pages of its mapped
        // weights are page cache the kernel reclaims (a model larger than RAM
        // keeps its resident size near the machine's memory by design).
        const auto mem = process_memory(pid);
        const double own = mem ? static_cast<double>(mem->own) : 0.0;
        if (killed_for.empty() && cancel != nullptr && cancel->load()) killed_for = "cancelled: the audit failed on another node";
        if (killed_for.empty() && elapsed > timeout_s) killed_for = fmt::format("timed out after {:g} s", timeout_s);
        if (killed_for.empty() && own > limit_bytes)
            killed_for = fmt::format("exceeded {:g} GiB of memory of its own ({:.2f} GiB when stopped; mapped weights "
                                     "not counted)", memory_gib, own / (1024.0 * 1024.0 * 1024.0));
        if (!killed_for.empty()) {
            ::kill(-pid, SIGKILL);
            ::kill(pid, SIGKILL);
            while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
            }
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!killed_for.empty()) {
        out.reason = killed_for;
    } else if (WIFSIGNALED(status)) {
        out.reason = "crashed: " + signal_text(WTERMSIG(status));
        if (WTERMSIG(status) == SIGKILL) out.reason += " — killed from outside (the kernel's OOM killer?)";
    } else if (WIFEXITED(status)) {
        out.exit_code = WEXITSTATUS(status);
        out.ok = out.exit_code == 0;
        if (!out.ok) {
            const std::string line = last_line(stderr_path);
            out.reason = out.exit_code == 127 && line.empty()
                             ? fmt::format("could not start {}", argv[0])
                             : fmt::format("exited with code {}{}", out.exit_code, line.empty() ? "" : ": " + line);
        }
    } else {
        out.reason = "ended oddly (wait status " + std::to_string(status) + ")";
    }
    if (!out.ok && !failure_path.empty()) {
        std::ifstream in(failure_path);
        std::getline(in, out.failure_kind);
        std::getline(in, out.failure_message);
    }
    return out;
}

int default_isolation_jobs(std::size_t nodes, std::uint64_t model_bytes) {
    if (nodes <= 2) return 1;
    std::uint64_t jobs = std::max(1u, std::thread::hardware_concurrency());
    jobs = std::min<std::uint64_t>(jobs, nodes - 1);
    const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (model_bytes > 0 && pages > 0 && page > 0) {
        const std::uint64_t half = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) / 2;
        jobs = std::min<std::uint64_t>(jobs, std::max<std::uint64_t>(1, half / model_bytes));
    }
    return static_cast<int>(jobs);
}

std::vector<std::string> node_capture_argv(const IsolationOptions& opt, const std::vector<std::string>& specs,
                                           std::size_t i, std::size_t reference, std::uint64_t seed,
                                           const std::vector<std::string>& steps, const std::string& output,
                                           const std::string& decisions_dir) {
    std::vector<std::string> argv{opt.executable, "capture",
                                  "--backend",    specs[i],
                                  "--authority",  specs[reference],
                                  "--protocol",   opt.protocol_path,
                                  "--model",      opt.model_path,
                                  "--seed",       std::to_string(seed),
                                  "--output",     output};
    if (!steps.empty()) argv.insert(argv.end(), {"--steps", fmt::format("{}", fmt::join(steps, ","))});
    // The reference's process decides once for all: the others read its
    // decisions (routing, anchors, tokens) instead of running it again.
    argv.insert(argv.end(), {i == reference ? "--decisions-out" : "--decisions-in", decisions_dir});
    argv.insert(argv.end(), opt.protocol_arguments.begin(), opt.protocol_arguments.end());
    return argv;
}

AuditRun run_audit_isolated(const AuditConfig& ac, const std::vector<std::string>& specs, std::size_t reference,
                            const IsolationOptions& opt) {
    KVASIR_ASSERT(ac.protocol != nullptr && ac.model != nullptr && reference < specs.size());
    // A node process reads its protocol's streams: a step command's own tokens do not reach it.
    KVASIR_ASSERT(!ac.tokens);
    KVASIR_CHECK(opt.node_timeout_s > 0 && std::isfinite(opt.node_timeout_s), ErrorCode::bad_input,
                 "--node-timeout must be a positive number of seconds");
    KVASIR_CHECK(opt.node_memory_gib > 0 && std::isfinite(opt.node_memory_gib), ErrorCode::bad_input,
                 "--node-memory must be a positive number of GiB");
    const detail::AuditPlan plan = detail::make_audit_plan(ac);  // bad input refused before any child starts
    const TempFolder dir = opt.resume_dir.empty() ? TempFolder() : TempFolder(opt.resume_dir);
    // The reference's decisions lie beside the captures, in the folder
    // itself: the signal handler that removes it empties one level only.
    const std::string decisions = dir.path.string();
    const int n = static_cast<int>(specs.size());

    // The reference first: if it cannot run, nothing can be compared. Then,
    // when nodes run at once, the longest first so that the last to start
    // are short: nodes off the CPU (launch latency dominates on small
    // models), then CPU nodes that emulate a format (acc=, storage=: a
    // rounding per operation), then the rest; the given order within each.
    std::vector<std::size_t> order{reference};
    const auto rank = [&](std::size_t i) {
        if (opt.jobs == 1) return 0;
        if (specs[i].rfind("cpu", 0) != 0) return 0;
        return specs[i].find("acc=") != std::string::npos || specs[i].find("storage=") != std::string::npos ? 1 : 2;
    };
    for (int r = 0; r <= 2; ++r)
        for (std::size_t i = 0; i < specs.size(); ++i)
            if (i != reference && rank(i) == r) order.push_back(i);
    KVASIR_CHECK(opt.jobs >= 1, ErrorCode::bad_input, "--jobs must be at least 1");
    std::vector<std::optional<Capture>> caps(specs.size());
    std::vector<ChildOutcome> outcomes(specs.size());
    std::mutex lock;  // progress and the first error, from the worker threads
    std::atomic<bool> cancel{false};  // set by the first error: the running children are killed
    int done = 0;
    // A node's files: by its index in a throw-away folder; by its canonical
    // name's hash in a kept one, so that a resumed run finds them whatever
    // the order of --backends.
    const auto stem = [&](std::size_t i) {
        return opt.resume_dir.empty() ? fmt::format("node{}", i)
                                      : "node-" + sha256_hex(BackendSpec::parse(specs[i]).canonical()).substr(0, 16);
    };
    // --resume: every complete capture of this run's protocol, seed, model,
    // node and steps is reused; the reference's only while its shared
    // decisions lie beside it (the other nodes read them).
    std::vector<bool> reused(specs.size(), false);
    if (!opt.resume_dir.empty()) {
        for (std::size_t i = 0; i < specs.size(); ++i) {
            const std::string why = not_reusable((dir.path / (stem(i) + ".safetensors")).string(), ac, plan, specs[i], caps[i]);
            reused[i] = why.empty();
            if (!reused[i] && why != "no capture") std::fprintf(stderr, "resume: %s runs again: its capture is of %s\n", specs[i].c_str(), why.c_str());
        }
        if (reused[reference])
            for (const std::string& st : plan.steps)
                if (step_named(st).shares_decisions() && !fs::exists(dir.path / (st + ".decisions"))) {
                    reused[reference] = false;
                    caps[reference].reset();
                }
        // A reference that runs again decides again: its decisions and every
        // capture made from them go first, so that no node reads a stale one.
        if (!reused[reference]) {
            for (std::size_t i = 0; i < specs.size(); ++i) {
                reused[i] = false;
                caps[i].reset();
                std::error_code ec;
                fs::remove(dir.path / (stem(i) + ".safetensors"), ec);
            }
            for (const std::string& st : protocol_step_names()) {
                std::error_code ec;
                fs::remove(dir.path / (st + ".decisions"), ec);
            }
        }
        const auto n_reused = std::count(reused.begin(), reused.end(), true);
        std::fprintf(stderr, "resume: %lld of %d node captures reused from %s\n", static_cast<long long>(n_reused), n,
                     dir.path.string().c_str());
    }
    const auto run_node = [&](std::size_t i) {
        {
            const std::lock_guard<std::mutex> g(lock);
            ++done;
            if (ac.progress) ac.progress({"node processes", done, n, specs[i], 0, n});
        }
        if (reused[i]) return;
        const std::string file = (dir.path / (stem(i) + ".safetensors")).string();
        const std::vector<std::string> argv = node_capture_argv(
            opt, specs, i, reference, plan.seed, ac.only_steps.empty() ? std::vector<std::string>{} : plan.steps, file, decisions);
        const std::string failure = (dir.path / (stem(i) + ".failure")).string();
        outcomes[i] = run_child(argv, (dir.path / (stem(i) + ".err")).string(), opt.node_timeout_s, opt.node_memory_gib, failure,
                                &cancel);
        // A bug of this tool in the child is a bug of the audit: exit 3,
        // whichever node it happened on.
        if (!outcomes[i].ok && outcomes[i].failure_kind == "internal")
            fail(ErrorCode::internal, "internal error while running node {} (in its process): {}", specs[i],
                 outcomes[i].failure_message);
        if (i == reference && !outcomes[i].ok) {
            if (outcomes[i].exit_code == 2)
                fail(ErrorCode::bad_input, "the reference {}: {}", specs[i], last_line((dir.path / (stem(i) + ".err")).string()));
            fail(ErrorCode::backend_failure, "the reference node {} {}: nothing can be compared", specs[i], outcomes[i].reason);
        }
        if (outcomes[i].ok) caps[i] = Capture::open(file);
    };
    const auto t_start = std::chrono::steady_clock::now();
    // `jobs` workers take the next node in order (with one, the reference
    // alone first). A worker's exception (the reference failing, an internal
    // error in a child) kills the running children and ends the audit.
    std::size_t next = 0;
    if (opt.jobs == 1) {
        run_node(reference);
        next = 1;
    }
    std::exception_ptr first_error;
    const auto worker = [&] {
        for (;;) {
            std::size_t i = 0;
            {
                const std::lock_guard<std::mutex> g(lock);
                if (next >= order.size() || first_error) return;
                i = order[next++];
            }
            try {
                run_node(i);
            } catch (...) {
                const std::lock_guard<std::mutex> g(lock);
                if (!first_error) first_error = std::current_exception();
                cancel = true;
            }
        }
    };
    const std::size_t workers = std::min<std::size_t>(static_cast<std::size_t>(opt.jobs), order.size() - next);
    if (workers <= 1) {
        worker();
    } else {
        std::vector<std::thread> pool;
        for (std::size_t w = 0; w < workers; ++w) pool.emplace_back(worker);
        for (auto& t : pool) t.join();
    }
    if (first_error) std::rethrow_exception(first_error);

    std::vector<const Capture*> ptrs;
    std::size_t ref_index = 0;
    CompareConfig cc;
    cc.protocol = ac.protocol;
    cc.gate = ac.gate;
    cc.contrast_nodes = ac.contrast_nodes;
    cc.only_steps = ac.only_steps;
    for (std::size_t i = 0; i < specs.size(); ++i) {
        if (caps[i]) {
            if (i == reference) ref_index = ptrs.size();
            ptrs.push_back(&*caps[i]);
            continue;
        }
        NodeInput f;
        f.node = specs[i];
        f.capabilities["node"] = specs[i];
        f.errors["process"] = outcomes[i].reason;
        cc.failed_nodes.push_back(std::move(f));
    }
    for (const NodeInput& f : ac.failed_nodes) cc.failed_nodes.push_back(f);
    const auto t_compare = std::chrono::steady_clock::now();
    AuditRun run = compare_captures(cc, ptrs, ref_index);
    const double compare_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_compare).count();

    // The report of an audit, not of captures: the model it ran, how nodes ran.
    run.report.model = audit_model_json(*ac.model);
    run.report.steps.erase("captures");
    run.report.steps["isolation"] = nlohmann::ordered_json{
        {"mode", "one child process per node"},
        {"node_timeout_s", opt.node_timeout_s},
        {"node_memory_gib", opt.node_memory_gib}};
    run.step_order = plan.steps;

    // Timings: each child's seconds per step (its own clock, the authority's
    // share included) and its weight cache, the compare in "other".
    run.timings = timings_of_captures(ptrs, plan.steps);
    if (!run.timings.steps.empty()) run.timings.steps.back().wall += compare_s;
    run.timings.nodes_at_once = static_cast<int>(std::max<std::size_t>(workers, 1));
    run.timings.elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    return run;
}

}  // namespace kvasir
