#include "kvasir/core/error.hpp"

#include <new>

namespace kvasir {

const char* to_string(ErrorCode code) noexcept {
    switch (code) {
        case ErrorCode::bad_input: return "bad input";
        case ErrorCode::unsupported: return "unsupported";
        case ErrorCode::backend_failure: return "backend failure";
        case ErrorCode::internal: return "internal error";
    }
    return "internal error";
}

int exit_code_for(ErrorCode code) noexcept {
    switch (code) {
        case ErrorCode::bad_input:
        case ErrorCode::unsupported: return 2;
        case ErrorCode::backend_failure:
        case ErrorCode::internal: return 3;
    }
    return 3;
}

std::optional<std::string> node_failure(std::exception_ptr e) {
    try {
        std::rethrow_exception(e);
    } catch (const Error& err) {
        if (err.code() == ErrorCode::internal) return std::nullopt;
        return std::string(err.what());
    } catch (const std::bad_alloc&) {
        return std::string("out of memory (std::bad_alloc)");
    } catch (...) {
        return std::nullopt;  // std::logic_error and the rest: a bug of this tool
    }
}

}  // namespace kvasir
