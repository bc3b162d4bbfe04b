#include "kvasir/core/error.hpp"

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

}  // namespace kvasir
