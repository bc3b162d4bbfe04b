// SHA-256 (FIPS 180-4): the protocol's content hash and the pin of a token
// stream's bytes. Computed by OpenSSL's libcrypto (EVP interface), a
// well-kept, widely audited implementation, rather than by a hand-written one.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvasir {

// SHA-256 of `data` (any bytes, any length). Error(internal) if libcrypto
// fails, which it does not for SHA-256 short of running out of memory.
std::array<std::uint8_t, 32> sha256(std::string_view data);
// The same as 64 lowercase hex digits.
std::string sha256_hex(std::string_view data);

}  // namespace kvasir
