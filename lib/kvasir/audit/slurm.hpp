// An audit as Slurm jobs (audit --slurm): the nodes of a fleet run where
// their devices are, each as one task of a job array — exactly the capture
// an isolated audit's child runs (isolation.hpp node_capture_argv), its
// capture written into a folder every machine of the cluster sees — and a
// compare job, run when every capture job has ended, writes the report and
// ends with the audit's exit status (0 every node meets the gate, 1 some
// does not).
//
// Files written into `dir` (absolute paths throughout; nothing runs here):
//   captures-cpu.sbatch      a job array of the nodes that run on CPUs
//   captures-device.sbatch   a job array of the device nodes (cuda, hip), when
//                            there are any, submitted with their own sbatch
//                            options (a GPU partition, --gres=gpu:1)
//   compare.sbatch           compare of every capture that exists (a node
//                            whose job failed is named in the job's log)
//   submit.sh                the sbatch calls, the compare job depending on
//                            the arrays (afterany)
// Task k of an array runs its k-th node; node i writes node-<i>.safetensors,
// its log node-<i>.log; the reference (node 0) writes its decisions into
// decisions/ and the others wait for them there (capture --decisions-in).
#pragma once

#include "kvasir/audit/isolation.hpp"

#include <string>
#include <vector>

namespace kvasir {

struct SlurmOptions {
    std::string dir;            // the shared folder (created; must be empty of jobs)
    std::string sbatch;         // sbatch options for every job ("--partition=cpu --time=4:00:00"), shell words
    std::string device_sbatch = "--gres=gpu:1";  // sbatch options of the device array
};

struct SlurmJobs {
    std::string dir;
    std::vector<std::string> files;  // written, in the order above
    std::string submit;              // dir/submit.sh
};

// `specs[reference]` is the reference; `compare_args` the compare command's
// options after the captures (protocol, reference, gate, report files).
// Error(bad_input) for a folder that holds another audit's jobs.
SlurmJobs write_slurm_jobs(const IsolationOptions& iso, const std::vector<std::string>& specs, std::size_t reference,
                           std::uint64_t seed, const std::vector<std::string>& steps,
                           const std::vector<std::string>& compare_args, const SlurmOptions& options);

// `s` quoted for a POSIX shell: one word, whatever it holds.
std::string shell_quote(const std::string& s);

}  // namespace kvasir
