// Canonical JSON and the content hash over it: key order and whitespace do
// not matter, values (and array order, and integer vs float) do.
#include "kvasir/core/canonical_json.hpp"
#include "kvasir/core/sha256.hpp"

#include <gtest/gtest.h>

using kvasir::canonical_json;
using kvasir::content_hash;
using nlohmann::json;

TEST(ContentHash, KeyOrderAndWhitespaceDoNotMatterValuesDo) {
    const json a = json::parse(R"({"b": 1, "a": {"y": [1, 2], "x": 0.001}})");
    const json b = json::parse("{\n  \"a\" : {\"x\":1e-3,\n\"y\":[1,2]},\t\"b\":1}");
    EXPECT_EQ(canonical_json(a), R"({"a":{"x":0.001,"y":[1,2]},"b":1})");
    EXPECT_EQ(content_hash(a), content_hash(b));
    EXPECT_EQ(content_hash(a), "sha256:" + kvasir::sha256_hex(R"({"a":{"x":0.001,"y":[1,2]},"b":1})"));
    json c = a;
    c["a"]["x"] = 0.002;
    EXPECT_NE(content_hash(a), content_hash(c));
    json d = a;
    d["a"]["y"] = json::array({2, 1});  // array order is content
    EXPECT_NE(content_hash(a), content_hash(d));
}

TEST(CanonicalJson, IntegerAndFloatStayDistinctStringsEscapedKeysByteOrdered) {
    EXPECT_EQ(canonical_json(json::parse("[1, 1.0, -0.0, 1e300]")), "[1,1.0,-0.0,1e+300]");
    // Keys sort by their UTF-8 bytes: "B" (0x42) < "a" (0x61) < "é" (0xc3 0xa9).
    EXPECT_EQ(canonical_json(json::parse(R"({"é": 1, "a": 2, "B": 3})")), "{\"B\":3,\"a\":2,\"é\":1}");
    EXPECT_EQ(canonical_json(json::parse(R"({"q": "a\"b\\c\n\u0001"})")), R"({"q":"a\"b\\c\n\u0001"})");
    EXPECT_EQ(canonical_json(json(nullptr)), "null");
}

TEST(CanonicalJson, InvalidUtf8IsRefusedNotReplaced) {
    // A hash over silently replaced bytes would pin content nobody wrote.
    EXPECT_THROW(canonical_json(json(std::string("\xff\xfe"))), json::type_error);
}
