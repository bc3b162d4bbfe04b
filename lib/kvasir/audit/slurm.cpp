#include "kvasir/audit/slurm.hpp"

#include "kvasir/backend/backend.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"

#include <fmt/format.h>

#include <filesystem>

namespace kvasir {

namespace fs = std::filesystem;

namespace {

std::string command_line(const std::vector<std::string>& argv) {
    std::string out;
    for (const std::string& a : argv) out += (out.empty() ? "" : " ") + shell_quote(a);
    return out;
}

bool device_node(const std::string& spec) {
    const std::string name = BackendSpec::parse(spec).name;
    return name == "cuda" || name == "hip";
}

}  // namespace

std::string shell_quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

SlurmJobs write_slurm_jobs(const IsolationOptions& iso, const std::vector<std::string>& specs, std::size_t reference,
                           std::uint64_t seed, const std::vector<std::string>& steps,
                           const std::vector<std::string>& compare_args, const SlurmOptions& opt) {
    KVASIR_CHECK(reference == 0, ErrorCode::internal, "write_slurm_jobs: the reference must be node 0");
    const fs::path dir = fs::absolute(opt.dir).lexically_normal();
    std::error_code ec;
    fs::create_directories(dir, ec);
    KVASIR_CHECK(!ec && fs::is_directory(dir), ErrorCode::bad_input, "--slurm {}: cannot create the folder: {}", dir.string(),
                 ec.message());
    KVASIR_CHECK(!fs::exists(dir / "submit.sh") && !fs::exists(dir / "node-0.safetensors"), ErrorCode::bad_input,
                 "--slurm {}: the folder holds another audit's jobs (submit.sh or captures); give an empty one",
                 dir.string());
    const std::string decisions = (dir / "decisions").string();
    SlurmJobs jobs;
    jobs.dir = dir.string();
    // One array per kind of machine: the device nodes get their own sbatch options.
    struct Group {
        const char* name;
        std::vector<std::size_t> nodes;
    };
    Group groups[2] = {{"cpu", {}}, {"device", {}}};
    for (std::size_t i = 0; i < specs.size(); ++i) groups[device_node(specs[i]) ? 1 : 0].nodes.push_back(i);
    std::vector<std::pair<std::string, const Group*>> arrays;
    for (const Group& g : groups) {
        if (g.nodes.empty()) continue;
        std::string body = fmt::format(
            "#!/bin/bash\n"
            "# Written by kvasir-equiv audit --slurm: one capture per node, task k runs the k-th node below.\n"
            "#SBATCH --job-name=kvasir-captures-{}\n"
            "#SBATCH --array=0-{}\n"
            "#SBATCH --output={}\n"
            "set -u\n"
            "case \"$SLURM_ARRAY_TASK_ID\" in\n",
            g.name, g.nodes.size() - 1, (dir / fmt::format("captures-{}-%a.log", g.name)).string());
        for (std::size_t k = 0; k < g.nodes.size(); ++k) {
            const std::size_t i = g.nodes[k];
            const std::string out = (dir / fmt::format("node-{}.safetensors", i)).string();
            body += fmt::format("  {})  # node {}: {}\n    exec {} ;;\n", k, i, specs[i],
                                command_line(node_capture_argv(iso, specs, i, reference, seed, steps, out, decisions)));
        }
        body += "esac\necho \"no node for task $SLURM_ARRAY_TASK_ID\" >&2\nexit 2\n";
        const std::string file = (dir / fmt::format("captures-{}.sbatch", g.name)).string();
        write_file_atomic(file, body);
        jobs.files.push_back(file);
        arrays.emplace_back(file, &g);
    }
    // The compare job: every capture that exists, in node order (the reference first).
    std::string list;
    for (std::size_t i = 0; i < specs.size(); ++i)
        list += " " + shell_quote((dir / fmt::format("node-{}.safetensors", i)).string());
    std::vector<std::string> compare{iso.executable, "compare"};
    const std::string compare_body = fmt::format(
        "#!/bin/bash\n"
        "# Written by kvasir-equiv audit --slurm: the report, once every capture job has ended; its exit status is "
        "the audit's.\n"
        "#SBATCH --job-name=kvasir-compare\n"
        "#SBATCH --output={}\n"
        "set -u\n"
        "caps=()\n"
        "for f in{}; do\n"
        "  if [ -e \"$f\" ]; then caps+=(\"$f\"); else echo \"no capture $f: its node's job failed (see its log)\" >&2; fi\n"
        "done\n"
        "{} \"${{caps[@]}}\" {}\n"
        "rc=$?\n"
        "echo $rc > {}\n"
        "exit $rc\n",
        (dir / "compare.log").string(), list, command_line(compare), command_line(compare_args),
        shell_quote((dir / "exit_status").string()));
    const std::string compare_file = (dir / "compare.sbatch").string();
    write_file_atomic(compare_file, compare_body);
    jobs.files.push_back(compare_file);
    std::string submit = fmt::format(
        "#!/bin/bash\n"
        "# Written by kvasir-equiv audit --slurm: submits the capture arrays and the compare job after them.\n"
        "set -euo pipefail\n"
        "mkdir -p {}\n",
        shell_quote(decisions));
    std::string deps;
    for (std::size_t a = 0; a < arrays.size(); ++a) {
        const bool device = std::string(arrays[a].second->name) == "device";
        submit += fmt::format("a{}=$(sbatch --parsable {} {})\na{}=${{a{}%%;*}}\n", a,
                              device ? opt.sbatch + " " + opt.device_sbatch : opt.sbatch, shell_quote(arrays[a].first), a, a);
        deps += fmt::format(":$a{}", a);
    }
    submit += fmt::format("c=$(sbatch --parsable {} --dependency=afterany{} {})\nc=${{c%%;*}}\n", opt.sbatch, deps,
                          shell_quote(compare_file));
    submit += fmt::format("echo \"capture arrays{}, compare job $c: report and exit status in {}\"\n",
                          [&] {
                              std::string s;
                              for (std::size_t a = 0; a < arrays.size(); ++a) s += fmt::format(" $a{}", a);
                              return s;
                          }(),
                          dir.string());
    jobs.submit = (dir / "submit.sh").string();
    write_file_atomic(jobs.submit, submit);
    fs::permissions(jobs.submit, fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec, fs::perm_options::add);
    jobs.files.push_back(jobs.submit);
    return jobs;
}

}  // namespace kvasir
