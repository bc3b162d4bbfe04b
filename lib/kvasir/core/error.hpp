// kvasir::Error — the one exception type of the library.
//
// Every failure the library reports carries an ErrorCode that the CLI maps to
// a process exit code in exactly one place (app/main.cpp). Messages are one
// line, name the offending file/option/tensor, and say what is wrong.
#pragma once

#include <fmt/format.h>

#include <exception>
#include <optional>
#include <stdexcept>
#include <string>

namespace kvasir {

enum class ErrorCode {
    bad_input,        // malformed file, bad option value, unknown name → exit 2
    unsupported,      // a valid request this build/device cannot serve   → exit 2
    backend_failure,  // a device/runtime call failed at run time         → exit 3 (audit: node "error")
    internal,         // a broken invariant inside kvasir                 → exit 3
};

const char* to_string(ErrorCode code) noexcept;

// Process exit code for an error that reaches main().
int exit_code_for(ErrorCode code) noexcept;

class Error : public std::runtime_error {
public:
    Error(ErrorCode code, std::string message) : std::runtime_error(std::move(message)), code_(code) {}
    ErrorCode code() const noexcept { return code_; }

private:
    ErrorCode code_;
};

template <typename... Args>
[[noreturn]] void fail(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
    throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

// Whose failure an exception is. The NODE's (a backend, device or input
// failing; the audit records it as that node's error and goes on):
// kvasir::Error other than internal, and std::bad_alloc — its one-line
// message. A bug of this tool (Error(internal), std::logic_error, anything
// else): nullopt, and the caller rethrows (exit 3). Every place that runs a
// node's work uses this one policy.
std::optional<std::string> node_failure(std::exception_ptr e);

// Runs `body`; a node failure is returned as its message, a bug propagates.
template <class F>
std::optional<std::string> as_node_failure(F&& body) {
    try {
        body();
        return std::nullopt;
    } catch (...) {
        std::exception_ptr e = std::current_exception();
        if (std::optional<std::string> why = node_failure(e)) return why;
        std::rethrow_exception(e);
    }
}

}  // namespace kvasir

// KVASIR_CHECK(cond, code, "fmt", args...): throw kvasir::Error when cond is false.
#define KVASIR_CHECK(cond, code, ...)                  \
    do {                                               \
        if (!(cond)) ::kvasir::fail((code), __VA_ARGS__); \
    } while (0)

// KVASIR_ASSERT(cond): an internal invariant; reports statement, file and line.
#define KVASIR_ASSERT(cond)                                                                  \
    do {                                                                                     \
        if (!(cond))                                                                         \
            ::kvasir::fail(::kvasir::ErrorCode::internal, "internal check failed: {} ({}:{})", \
                           #cond, __FILE__, __LINE__);                                       \
    } while (0)
