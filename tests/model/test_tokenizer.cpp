// tokenizer.json → ids, checked id for id against Hugging Face `tokenizers`
// (fixtures/tokenizers/cases.json, written by scripts/make_tokenizer_fixtures.py:
// three byte-level BPE tokenizers in the Qwen 2, Llama 3 and GPT-2 shapes on a
// multilingual text and its edge cases), plus hand-computed BPE on tokenizers
// written out here, and every way a tokenizer.json is refused.
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/model/tokenizer.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace {

using kvasir::Error;
using kvasir::ErrorCode;
using kvasir::Tokenizer;
using json = nlohmann::json;

const std::string kDir = std::string(KVASIR_SOURCE_DIR) + "/fixtures/tokenizers/";

const json& cases() {
    static const json doc = json::parse(kvasir::read_text_file(kDir + "cases.json"));
    return doc;
}

const Tokenizer& fixture(const std::string& name) {
    static std::map<std::string, Tokenizer> cache;
    auto it = cache.find(name);
    if (it == cache.end()) it = cache.emplace(name, Tokenizer::load(kDir + name)).first;
    return it->second;
}

TEST(TokenizerFixtures, IdsOffsetsAndDecodingEqualHuggingFaceTokenizers) {
    const json& doc = cases();
    ASSERT_EQ(doc.at("cases").size(), 276u);
    std::map<std::string, int> checked;
    for (const json& c : doc.at("cases")) {
        const std::string tok = c.at("tokenizer");
        const json& t = doc.at("texts").at(c.at("text").get<std::size_t>());
        const std::string text = t.at("text");
        const bool special = c.at("add_special_tokens");
        SCOPED_TRACE(tok + " / " + t.at("name").get<std::string>() + (special ? " (special)" : ""));
        const auto spans = fixture(tok).encode_spans(text, special);
        std::vector<std::int32_t> ids;
        for (const auto& s : spans) ids.push_back(s.id);
        ASSERT_EQ(ids, c.at("ids").get<std::vector<std::int32_t>>());
        const auto offsets = c.at("offsets").get<std::vector<std::vector<std::size_t>>>();
        for (std::size_t i = 0; i < spans.size(); ++i) {
            if (c.at("normalization_unchanged")) {
                EXPECT_EQ(spans[i].begin, offsets[i][0]) << "token " << i;
                EXPECT_EQ(spans[i].end, offsets[i][1]) << "token " << i;
            } else if (offsets[i][1] > offsets[i][0]) {  // a changed stretch: ours covers it whole
                EXPECT_LE(spans[i].begin, offsets[i][0]) << "token " << i;
                EXPECT_GE(spans[i].end, offsets[i][1]) << "token " << i;
            }
        }
        EXPECT_EQ(fixture(tok).decode(ids), c.at("decoded").get<std::string>());
        EXPECT_EQ(fixture(tok).decode(ids, true), c.at("decoded_skip_special").get<std::string>());
        ++checked[tok];
    }
    EXPECT_EQ(checked.size(), 3u);
}

TEST(TokenizerFixtures, TheWholeTextIsManyTokensAndSpecialTokensAreRecognised) {
    const Tokenizer& q = fixture("qwen2_style.json");
    const std::string text = kvasir::read_text_file(kDir + "multilingual.txt");
    EXPECT_GT(q.encode(text).size(), 600u);  // not one token per line: the test would be hollow
    const auto im = q.encode("<|im_start|>user");
    ASSERT_FALSE(im.empty());
    EXPECT_TRUE(q.is_special(im[0]));
    EXPECT_EQ(q.piece(im[0]).value(), "<|im_start|>");
    // Llama 3 style: BOS from the template, only with add_special_tokens.
    const Tokenizer& l = fixture("llama3_style.json");
    const auto with = l.encode("hi"), without = l.encode("hi", false);
    ASSERT_EQ(with.size(), without.size() + 1);
    EXPECT_EQ(l.piece(with[0]).value(), "<|begin_of_text|>");
    EXPECT_TRUE(std::equal(without.begin(), without.end(), with.begin() + 1));
    EXPECT_NE(l.describe().find("TemplateProcessing"), std::string::npos);
}

// A tokenizer.json written by hand: ByteLevel without regex, so a word is
// the whole text, and merges whose order decides the result.
json hand(json merges, bool ignore_merges = false) {
    json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}, {"Ġ", 6}, {"Ġa", 7}, {"cab", 8}};
    return {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", json::array()},
            {"normalizer", nullptr},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
            {"post_processor", nullptr},
            {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
            {"model",
             {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", ignore_merges},
              {"vocab", vocab}, {"merges", merges}}}};
}

std::vector<std::int32_t> ids_of(const json& j, const std::string& text) {
    return Tokenizer::parse(j.dump(), "hand.json").encode(text);
}

TEST(TokenizerBpe, TheLowestRankedPairMergesFirstLeftmostOnTies) {
    // "abc": (a,b) ranked before (b,c) → ab + c → abc.
    EXPECT_EQ(ids_of(hand(json::array({"a b", "b c", "ab c"})), "abc"), (std::vector<std::int32_t>{5}));
    // (b,c) first → a + bc, and no (a,bc) merge: stays two.
    EXPECT_EQ(ids_of(hand(json::array({"b c", "a b", "ab c"})), "abc"), (std::vector<std::int32_t>{0, 4}));
    // "abab" with only (a,b): both pairs merge → ab ab.
    EXPECT_EQ(ids_of(hand(json::array({"a b"})), "abab"), (std::vector<std::int32_t>{3, 3}));
    // "aab" → a + ab: the only pair in the merges is (a,b), at position 1.
    EXPECT_EQ(ids_of(hand(json::array({"a b"})), "aab"), (std::vector<std::int32_t>{0, 3}));
    // The pair form of merges (tokenizers ≥ 0.20) is the same merges.
    EXPECT_EQ(ids_of(hand(json::array({json::array({"a", "b"}), json::array({"ab", "c"})})), "abc"),
              (std::vector<std::int32_t>{5}));
    // A space is the byte-level piece Ġ (U+0120): " a" → Ġa once merged.
    EXPECT_EQ(ids_of(hand(json::array({"Ġ a"})), " a"), (std::vector<std::int32_t>{7}));
    // ignore_merges: a word that is itself a piece is taken whole ("cab"
    // has no merge path), otherwise merged as usual.
    EXPECT_EQ(ids_of(hand(json::array({"a b"}), true), "cab"), (std::vector<std::int32_t>{8}));
    EXPECT_EQ(ids_of(hand(json::array({"a b"}), false), "cab"), (std::vector<std::int32_t>{2, 3}));
    // Bytes outside the vocabulary (no byte_fallback, no unk) are dropped, and
    // their neighbours then merge as if adjacent (tokenizers 0.23.3 gives the
    // same: a BPE with only a, b, ab encodes "axb" as [ab]).
    EXPECT_EQ(ids_of(hand(json::array({"a b"})), "axb"), (std::vector<std::int32_t>{3}));
    EXPECT_EQ(ids_of(hand(json::array()), "axb"), (std::vector<std::int32_t>{0, 1}));
}

TEST(TokenizerBpe, DecodeMapsBytesBackAndReplacesBrokenUtf8) {
    const Tokenizer t = Tokenizer::parse(hand(json::array({"a b", "Ġ a"})).dump(), "hand.json");
    const std::vector<std::int32_t> ids = {7, 1, 6, 2};
    EXPECT_EQ(t.decode(ids), " ab c");
    EXPECT_THROW(t.decode(std::vector<std::int32_t>{99}), Error);
    // A byte-level vocabulary holding one lone continuation byte (0x80 → U+0122 "Ģ"
    // in GPT-2's map: the 35th byte that is not printable): decoded alone it
    // is not UTF-8 and becomes U+FFFD.
    json j = hand(json::array());
    j["model"]["vocab"]["Ģ"] = 9;
    EXPECT_EQ(Tokenizer::parse(j.dump(), "x").decode(std::vector<std::int32_t>{0, 9, 0}), "a\xEF\xBF\xBD" "a");
    EXPECT_EQ(Tokenizer::parse(j.dump(), "x").vocab_size(), 10);
}

TEST(TokenizerUtf8, InvalidInputIsNamedAtItsByte) {
    EXPECT_EQ(kvasir::first_invalid_utf8("abc"), std::nullopt);
    EXPECT_EQ(kvasir::first_invalid_utf8("ab\xC3"), 2u);          // truncated
    EXPECT_EQ(kvasir::first_invalid_utf8("\xC0\xAF"), 0u);       // overlong
    EXPECT_EQ(kvasir::first_invalid_utf8("x\xED\xA0\x80"), 1u);   // surrogate
    EXPECT_EQ(kvasir::first_invalid_utf8("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
    EXPECT_EQ(kvasir::first_invalid_utf8("é日🙂"), std::nullopt);
    const Tokenizer t = Tokenizer::parse(hand(json::array()).dump(), "hand.json");
    try {
        t.encode("ok\xFFno");
        FAIL() << "invalid UTF-8 accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input);
        EXPECT_NE(std::string(e.what()).find("byte 2"), std::string::npos) << e.what();
    }
}

void expect_refused(const json& j, ErrorCode code, const std::string& fragment) {
    try {
        (void)Tokenizer::parse(j.dump(), "t.json");
        ADD_FAILURE() << "accepted; expected: " << fragment;
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), code) << e.what();
        const std::string m = e.what();
        EXPECT_NE(m.find(fragment), std::string::npos) << m;
        EXPECT_EQ(m.find('\n'), std::string::npos) << m;
        EXPECT_EQ(m.rfind("t.json", 0), 0u) << m;
    }
}

TEST(TokenizerRefuses, UnsupportedComponentsByName) {
    json j = hand(json::array());
    j["model"]["type"] = "Unigram";
    expect_refused(j, ErrorCode::unsupported, "/model: model \"Unigram\"");
    j = hand(json::array());
    j["normalizer"] = {{"type", "Lowercase"}};
    expect_refused(j, ErrorCode::unsupported, "/normalizer: normalizer \"Lowercase\"");
    j = hand(json::array());
    j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}};
    expect_refused(j, ErrorCode::unsupported, "pre-tokenizer \"Metaspace\"");
    j = hand(json::array());
    j["post_processor"] = {{"type", "RobertaProcessing"}};
    expect_refused(j, ErrorCode::unsupported, "post-processor \"RobertaProcessing\"");
    j = hand(json::array());
    j["model"]["dropout"] = 0.1;
    expect_refused(j, ErrorCode::unsupported, "/model/dropout");
    j = hand(json::array());
    j["model"]["continuing_subword_prefix"] = "##";
    expect_refused(j, ErrorCode::unsupported, "continuing_subword_prefix");
    j = hand(json::array());
    j["model"]["some_future_option"] = true;
    expect_refused(j, ErrorCode::unsupported, "unknown key \"some_future_option\"");
    j = hand(json::array());
    j["truncation"] = {{"max_length", 512}};
    expect_refused(j, ErrorCode::unsupported, "/truncation");
    // ByteLevel not last: its mapped text is not what a later split expects.
    j = hand(json::array());
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers", json::array({j["pre_tokenizer"], {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Isolated"}}})}};
    expect_refused(j, ErrorCode::unsupported, "after ByteLevel");
    // A decoder this build lacks is refused when decoding, not when encoding.
    j = hand(json::array());
    j["decoder"] = {{"type", "WordPiece"}};
    const Tokenizer t = Tokenizer::parse(j.dump(), "t.json");
    EXPECT_EQ(t.encode("ab").size(), 2u);
    EXPECT_THROW(t.decode(std::vector<std::int32_t>{0}), Error);
}

TEST(TokenizerRefuses, MalformedFilesAsBadInput) {
    expect_refused(json::array(), ErrorCode::bad_input, "expected an object");
    json j = hand(json::array({"a x"}));
    expect_refused(j, ErrorCode::bad_input, "/model/merges/0: \"a\" + \"x\": the second is not in the vocabulary");
    j = hand(json::array({"c c"}));
    expect_refused(j, ErrorCode::bad_input, "the merged piece is not in the vocabulary");
    j = hand(json::array({"abc"}));
    expect_refused(j, ErrorCode::bad_input, "not two pieces");
    j = hand(json::array());
    j["model"]["vocab"]["zz"] = 3;
    expect_refused(j, ErrorCode::bad_input, "id 3 is also");
    j = hand(json::array());
    j["model"]["vocab"]["zz"] = -1;
    expect_refused(j, ErrorCode::bad_input, "/model/vocab/zz: token id -1 outside");
    j = hand(json::array());
    j["model"]["vocab"]["zz"] = 4294967296LL;
    expect_refused(j, ErrorCode::bad_input, "outside [0, 2^31)");
    j = hand(json::array());
    j["model"]["vocab"][std::string(5000, 'q')] = 10;
    expect_refused(j, ErrorCode::bad_input, "a piece of 5000 bytes");
    j = hand(json::array());
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
    expect_refused(j, ErrorCode::bad_input, "/pre_tokenizer/pattern/Regex: the regex does not compile");
    j = hand(json::array());
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", " "}}}, {"behavior", "Sideways"}};
    expect_refused(j, ErrorCode::unsupported, "split behavior \"Sideways\"");
    j = hand(json::array());
    j["model"]["unk_token"] = "<unk>";
    expect_refused(j, ErrorCode::bad_input, "unk_token \"<unk>\" is not in the vocabulary");
    j = hand(json::array());
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}})},
                           {"special_tokens", json::object()}};
    expect_refused(j, ErrorCode::bad_input, "\"<s>\" is not in special_tokens");
    // Duplicate keys: nlohmann would keep one of two ids without a word.
    const std::string dup = hand(json::array()).dump();
    const std::string twice = dup.substr(0, dup.find("\"vocab\":{") + 9) + "\"a\":0,\"a\":1," +
                              dup.substr(dup.find("\"vocab\":{") + 9 + std::string("\"a\":0,").size());
    try {
        (void)Tokenizer::parse(twice, "t.json");
        ADD_FAILURE() << "duplicate key accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("duplicate key"), std::string::npos) << e.what();
    }
    EXPECT_THROW((void)Tokenizer::parse("{\"model\": ", "t.json"), Error);
}

TEST(TokenizerAddedTokens, LeftmostLongestWithStripAndSingleWordRules) {
    json j = hand(json::array({"a b"}));
    j["added_tokens"] = json::array({
        {{"id", 20}, {"content", "<x>"}, {"single_word", false}, {"lstrip", true}, {"rstrip", false}, {"normalized", false}, {"special", true}},
        {{"id", 21}, {"content", "<x>>"}, {"single_word", false}, {"lstrip", false}, {"rstrip", true}, {"normalized", false}, {"special", true}},
        {{"id", 22}, {"content", "cc"}, {"single_word", true}, {"lstrip", false}, {"rstrip", false}, {"normalized", true}, {"special", false}},
    });
    const Tokenizer t = Tokenizer::parse(j.dump(), "t.json");
    // "a  <x>b": lstrip swallows the two spaces → a, <x>, b.
    EXPECT_EQ(t.encode("a  <x>b"), (std::vector<std::int32_t>{0, 20, 1}));
    const auto sp = t.encode_spans("a  <x>b");
    EXPECT_EQ(sp[1].begin, 1u);
    EXPECT_EQ(sp[1].end, 6u);
    // Longest wins at the same start: <x>> over <x>; its rstrip takes the space.
    EXPECT_EQ(t.encode("<x>> ab"), (std::vector<std::int32_t>{21, 3}));
    // single_word: "cc" only between non-word characters.
    EXPECT_EQ(t.encode("cc"), (std::vector<std::int32_t>{22}));
    EXPECT_EQ(t.encode("acc"), (std::vector<std::int32_t>{0, 2, 2}));
    EXPECT_EQ(t.encode("a cc"), (std::vector<std::int32_t>{0, 6, 22}));
    EXPECT_EQ(t.decode(std::vector<std::int32_t>{0, 20, 1}), "a<x>b");
    EXPECT_EQ(t.decode(std::vector<std::int32_t>{0, 20, 1}, true), "ab");
}

}  // namespace
