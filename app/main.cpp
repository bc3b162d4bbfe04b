// kvasir-equiv: measures whether compute backends are numerically equivalent
// enough to serve one model in one inference swarm. main() wires the
// subcommands and is the one place where errors become exit codes:
//   0 success / every node meets the gate   1 a node fails the gate
//   2 bad usage or bad input                3 internal or backend failure
#include "commands.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/tool_info.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

namespace {

// A child process of the isolated audit (audit/isolation.hpp) is told where
// to say what kind of failure ended it: the exit code cannot tell a bug of
// this tool (which must end the whole audit with 3) from a device failure
// (which is only that node's error; also 3).
int failed(const char* kind, int code, const char* message) {
    if (const char* path = std::getenv("KVASIR_FAILURE_FILE"); path != nullptr && *path != '\0')
        if (std::FILE* f = std::fopen(path, "w")) {
            std::fprintf(f, "%s\n%s\n", kind, message);
            std::fclose(f);
        }
    return code;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"kvasir-equiv — audit numeric equivalence of compute backends (CPU, OpenCL, CUDA, HIP) on real "
                 "model layers"};
    app.name("kvasir-equiv");
    app.set_version_flag("--version", kvasir::version_line());
    app.require_subcommand(1);
    app.footer("Exit codes: 0 ok, 1 a node fails the gate, 2 bad usage or input, 3 internal error.\n"
               "Run 'kvasir-equiv COMMAND --help' for a command's options.");
    kvasir::app::set_audit_command(app);
    kvasir::app::set_capture_command(app);
    kvasir::app::set_compare_command(app);
    kvasir::app::set_backends_command(app);
    kvasir::app::set_ops_command(app);
    kvasir::app::set_matrix_command(app);
    kvasir::app::set_drift_command(app);
    kvasir::app::set_logits_command(app);
    kvasir::app::set_decide_command(app);
    kvasir::app::set_generate_command(app);
    kvasir::app::set_perplexity_command(app);
    kvasir::app::set_task_command(app);
    kvasir::app::set_inspect_command(app);
    kvasir::app::set_tokenize_command(app);
    kvasir::app::strict_options(app);
    // An unknown command is named, with the valid ones (CLI11 would only say
    // that a subcommand is required).
    if (argc > 1 && argv[1][0] != '-' && app.get_subcommands([&](const CLI::App* s) { return s->get_name() == argv[1]; }).empty()) {
        std::string names;
        for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; }))
            names += (names.empty() ? "" : ", ") + s->get_name();
        std::fprintf(stderr, "kvasir-equiv: error: unknown command '%s' (commands: %s; see --help)\n", argv[1], names.c_str());
        return 2;
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "kvasir-equiv: error: %s (see --help)\n", e.what());
        return 2;
    } catch (const kvasir::Error& e) {
        std::fprintf(stderr, "kvasir-equiv: error: %s\n", e.what());
        return failed(e.code() == kvasir::ErrorCode::internal ? "internal" : kvasir::to_string(e.code()),
                      kvasir::exit_code_for(e.code()), e.what());
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "kvasir-equiv: internal error: out of memory\n");
        return failed("out of memory", 3, "out of memory");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "kvasir-equiv: internal error: %s\n", e.what());
        return failed("internal", 3, e.what());
    }
    return kvasir::app::command_exit_code();
}
