#include "kvasir/core/sha256.hpp"

#include "kvasir/core/error.hpp"

#include <openssl/evp.h>

namespace kvasir {

std::array<std::uint8_t, 32> sha256(std::string_view data) {
    // One-shot EVP_Digest: every input (a canonical protocol, a token-stream
    // file read under a 64 MiB bound) is already whole in memory.
    std::array<std::uint8_t, 32> out{};
    unsigned int len = 0;
    const int ok = EVP_Digest(data.data(), data.size(), out.data(), &len, EVP_sha256(), nullptr);
    KVASIR_CHECK(ok == 1 && len == out.size(), ErrorCode::internal, "libcrypto SHA-256 failed");
    return out;
}

std::string sha256_hex(std::string_view data) {
    static const char* digits = "0123456789abcdef";
    std::string out;
    out.reserve(64);
    for (const std::uint8_t b : sha256(data)) {
        out += digits[b >> 4];
        out += digits[b & 15];
    }
    return out;
}

}  // namespace kvasir
