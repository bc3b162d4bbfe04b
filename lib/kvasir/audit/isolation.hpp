// The audit with one process per node (the default of `audit`).
//
// Auditing new hardware means running immature drivers: a kernel that
// segfaults, hangs or allocates without bound is the normal case. So each
// node runs in a child process — this tool's own `capture` command, executed
// afresh (fork + exec: no driver, OpenMP or OpenCL state is inherited) —
// which collects every step on that node with the reference beside it as
// the authority, and writes a capture. The parent computes nothing: it
// watches the children and then compares the captures exactly as `compare`
// does, so the figures are bit for bit those of the in-process audit. Up to
// `jobs` children run at once. With jobs = 1 the reference runs first (a
// reference that cannot run ends the audit before any other node starts)
// and each node has the machine to itself, so its timings are its own. With
// more, the reference starts first beside the others (its failure kills
// them and ends the audit as before), then the longest first (nodes off
// the CPU, then CPU nodes emulating a format), and the per-node seconds
// include the contention; the figures never change (every node's arithmetic
// is independent of the load and of its thread count).
//
// A child that is killed by a signal, exceeds the wall-clock limit, exceeds
// the resident-memory limit, or exits with an error makes that node `error`
// with the reason ("crashed: SIGSEGV (Segmentation fault)", "timed out after
// 30 s", "exceeded 4 GiB of memory of its own", "exited with code 3: …"); its
// partial output is discarded (the capture is written atomically, so there
// is none); every other node is judged and the reports are written. The
// reference failing that way ends the audit: Error(backend_failure), exit 3,
// naming the reference and the reason; the reference refusing its input
// (exit 2: e.g. a model whose weights are not finite) is Error(bad_input). A
// bug of this tool in any child (it reports "internal" through
// KVASIR_FAILURE_FILE) ends the audit with Error(internal), exit 3: a bug is
// never blamed on a node.
//
// The memory limit is on host resident memory (VmRSS, polled every 10 ms):
// device memory of a GPU node is not counted (a driver's virtual mappings
// make an address-space limit useless there).
#pragma once

#include "kvasir/audit/audit.hpp"

#include <atomic>
#include <string>
#include <vector>

namespace kvasir {

struct IsolationOptions {
    std::string executable;      // this tool (/proc/self/exe)
    std::string protocol_path;   // each child reloads it (compare checks its hash)
    std::vector<std::string> protocol_arguments;  // options each child applies to it (--score, --kl-divergence)
    std::string model_path;
    double node_timeout_s = 1800;  // wall-clock limit per node, > 0
    double node_memory_gib = 0;    // limit per node on its own memory (process_memory.hpp), > 0
    int jobs = 1;                  // non-reference nodes run at once, ≥ 1
    // Keep every node's capture and the reference's decisions in this folder
    // (created if absent) instead of a temporary one; a later run given the
    // same folder reuses each capture that is complete (its content hash
    // verifies) and of this run's protocol, seed, model, node and steps, and
    // runs only the other nodes — after a kill or a crash, or to audit more
    // nodes against a reference already captured. A reference that has to
    // run again makes every node run again. Empty: a temporary folder.
    std::string resume_dir;
};

// The default of `jobs`: as many nodes at once as the machine has cores, at
// most `nodes` − 1, and no more than fit in half its available memory when
// each child holds `model_bytes` of weights (1 when unknown).
int default_isolation_jobs(std::size_t nodes, std::uint64_t model_bytes);

// How one child ended.
struct ChildOutcome {
    bool ok = false;          // exited 0
    int exit_code = -1;       // when it exited
    std::string reason;       // one line when !ok
    double seconds = 0;
    // What the child's main() said ended it (app/main.cpp writes the file
    // named by KVASIR_FAILURE_FILE): "internal", "bad input", ...; empty when
    // it said nothing (killed, crashed).
    std::string failure_kind, failure_message;
};

// Runs `argv` (argv[0] = the program) with stdout discarded and stderr into
// `stderr_path`, in its own process group, polling every 10 ms; kills the
// group (SIGKILL) past `timeout_s` or `memory_gib` of memory of its own
// (process_memory.hpp: anonymous + shared; the pages of mapped weight files
// are not counted — the kernel reclaims them).
// `failure_path` (optional) is passed as KVASIR_FAILURE_FILE.
// `cancel` (optional): when it becomes true the child is killed the same way
// ("cancelled: …", the audit has already failed elsewhere).
ChildOutcome run_child(const std::vector<std::string>& argv, const std::string& stderr_path, double timeout_s,
                       double memory_gib, const std::string& failure_path = "", const std::atomic<bool>* cancel = nullptr);

// The command line of node i's process (this tool's `capture`): the node
// with the reference as its authority, the run's protocol, model and seed,
// `steps` (empty: the protocol's), its capture written to `output`; the
// reference writes its decisions into `decisions_dir`, every other node
// reads them from there (waiting for each). What an isolated audit runs, and
// what a Slurm job array runs (audit --slurm).
std::vector<std::string> node_capture_argv(const IsolationOptions& options, const std::vector<std::string>& specs,
                                           std::size_t i, std::size_t reference, std::uint64_t seed,
                                           const std::vector<std::string>& steps, const std::string& output,
                                           const std::string& decisions_dir);

// `specs` are node specs, specs[reference] the reference; config.failed_nodes
// (nodes that could not even be created) are appended as errors.
AuditRun run_audit_isolated(const AuditConfig& config, const std::vector<std::string>& specs, std::size_t reference,
                            const IsolationOptions& options);

}  // namespace kvasir
