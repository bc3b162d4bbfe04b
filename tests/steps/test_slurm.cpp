// audit/slurm.hpp: the job files, read back. (A real cluster runs them in
// tests/cli/test_slurm.sh.)
#include "kvasir/audit/slurm.hpp"
#include "kvasir/core/error.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fs = std::filesystem;
using namespace kvasir;

namespace {

std::string slurp(const fs::path& p) {
    std::ifstream f(p);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

TEST(Slurm, ShellQuotingKeepsEveryWordWhole) {
    EXPECT_EQ(shell_quote("cpu:acc=f16"), "'cpu:acc=f16'");
    EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
    EXPECT_EQ(shell_quote(""), "''");
    EXPECT_EQ(shell_quote("$HOME `x` \"y\""), "'$HOME `x` \"y\"'");
}

TEST(Slurm, OneArrayPerKindOfMachineAndACompareAfterThem) {
    const fs::path dir = fs::temp_directory_path() / ("kvasir-slurm-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    IsolationOptions iso;
    iso.executable = "/opt/kvasir/kvasir-equiv";
    iso.protocol_path = "/shared/p.json";
    iso.model_path = "/shared/model";
    SlurmOptions opt;
    opt.dir = dir.string();
    opt.sbatch = "--partition=cpu";
    const std::vector<std::string> specs{"cpu-ref", "cpu", "cuda:0", "hip:1:storage=bf16"};
    const SlurmJobs jobs = write_slurm_jobs(iso, specs, 0, 7, {"ops", "logits"}, {"--gate", "sensitive"}, opt);
    ASSERT_EQ(jobs.files.size(), 4u);
    const std::string cpu = slurp(dir / "captures-cpu.sbatch"), dev = slurp(dir / "captures-device.sbatch");
    EXPECT_NE(cpu.find("#SBATCH --array=0-1"), std::string::npos);
    EXPECT_NE(dev.find("#SBATCH --array=0-1"), std::string::npos);
    // The reference decides; the others read its decisions; every capture writes node-<i>.
    EXPECT_NE(cpu.find("'--backend' 'cpu-ref' '--authority' 'cpu-ref'"), std::string::npos);
    EXPECT_NE(cpu.find("'--decisions-out' '" + (dir / "decisions").string() + "'"), std::string::npos);
    EXPECT_NE(dev.find("'--backend' 'hip:1:storage=bf16'"), std::string::npos);
    EXPECT_NE(dev.find("'--decisions-in'"), std::string::npos);
    EXPECT_NE(dev.find("'--output' '" + (dir / "node-3.safetensors").string() + "'"), std::string::npos);
    EXPECT_NE(cpu.find("'--seed' '7'"), std::string::npos);
    EXPECT_NE(cpu.find("'--steps' 'ops,logits'"), std::string::npos);
    const std::string submit = slurp(dir / "submit.sh");
    EXPECT_NE(submit.find("sbatch --parsable --partition=cpu --gres=gpu:1 '" + (dir / "captures-device.sbatch").string()),
              std::string::npos);
    EXPECT_NE(submit.find("--dependency=afterany:$a0:$a1"), std::string::npos);
    EXPECT_NE(slurp(dir / "compare.sbatch").find("'compare' \"${caps[@]}\" '--gate' 'sensitive'"), std::string::npos);
    // A folder that holds these jobs is not written over.
    EXPECT_THROW(write_slurm_jobs(iso, specs, 0, 7, {}, {}, opt), Error);
    fs::remove_all(dir);
}

}  // namespace
