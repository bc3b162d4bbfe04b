// SHA-256 (libcrypto through kvasir::sha256_hex) against the FIPS 180 / NIST
// example vectors, the padding boundaries, and a long input of every byte
// value spread over many blocks.
#include "kvasir/core/sha256.hpp"

#include <gtest/gtest.h>

#include <string>

using kvasir::sha256;
using kvasir::sha256_hex;

TEST(Sha256, Fips180Vectors) {
    // FIPS 180-2 appendix B / NIST's SHA-256 examples: the empty message,
    // "abc" (one block), the 448-bit message (two blocks: the length spills),
    // one million 'a' (15 625 blocks).
    EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, PaddingBoundaries) {
    // 55 bytes: the length fits the first block; 56: it spills into a second;
    // 64: a full block then a padding-only block. Values from Python hashlib.
    EXPECT_EQ(sha256_hex(std::string(55, 'a')), "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
    EXPECT_EQ(sha256_hex(std::string(56, 'a')), "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
    EXPECT_EQ(sha256_hex(std::string(63, 'a')), "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34");
    EXPECT_EQ(sha256_hex(std::string(64, 'a')), "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
    EXPECT_EQ(sha256_hex(std::string(65, 'a')), "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0");
    EXPECT_EQ(sha256_hex(std::string(119, 'a')), "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb");
    EXPECT_EQ(sha256_hex(std::string(120, 'a')), "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c");
}

TEST(Sha256, ManyBlocksOfEveryByteValue) {
    // Embedded NULs and bytes >= 0x80 must be hashed as bytes (string_view,
    // not a C string); lengths that are not a multiple of 64 leave a partial
    // last block. Values from Python hashlib; the hand-written FIPS 180-4
    // implementation this replaced gave the same.
    std::string all;
    for (int r = 0; r < 4; ++r)
        for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
    EXPECT_EQ(sha256_hex(all), "785b0751fc2c53dc14a4ce3d800e69ef9ce1009eb327ccf458afe09c242c26c9");
    std::string spread;
    for (int i = 0; i < 1000003; ++i) spread += static_cast<char>((i * 31 + 7) % 251);
    EXPECT_EQ(sha256_hex(spread), "a79aaccf39831e39ad9382f03c515510dcde695830c65a91620160cbe434b410");
}

TEST(Sha256, BytesAndHexAgree) {
    const auto bytes = sha256("abc");
    ASSERT_EQ(bytes.size(), 32u);
    EXPECT_EQ(bytes[0], 0xba);
    EXPECT_EQ(bytes[31], 0xad);
    const std::string hex = sha256_hex("abc");
    EXPECT_EQ(hex.size(), 64u);
    EXPECT_EQ(hex.find_first_not_of("0123456789abcdef"), std::string::npos);
}
