// Byte-level BPE from tokenizer.json (tokenizer.hpp explains what is covered).
// The pipeline is tokenizers' own, stage by stage:
//   1. added tokens with "normalized": false are split out of the raw text;
//   2. each remaining stretch is normalized, and the added tokens with
//      "normalized": true are split out of the normalized text;
//   3. the pre-tokenizer cuts every remaining stretch into words;
//   4. BPE turns each word into ids;
//   5. the post-processor adds its special tokens.
// Offsets are carried through every stage as byte ranges of the input.
#include "kvasir/model/tokenizer.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/core/json_schema.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <filesystem>
#include <limits>
#include <map>
#include <queue>
#include <set>
#include <unordered_map>

namespace kvasir {

namespace {

using json = nlohmann::json;

constexpr std::size_t kMaxFileBytes = 256u << 20;
constexpr std::size_t kMaxVocab = 4u << 20;
constexpr std::size_t kMaxMerges = 4u << 20;
constexpr std::size_t kMaxAdded = 1u << 20;
constexpr std::size_t kMaxTokenBytes = 4096;
constexpr std::size_t kMaxRegexBytes = 64u << 10;
constexpr std::size_t kMaxSequence = 64;  // components of one Sequence

// ---------------------------------------------------------------------------
// UTF-8
// ---------------------------------------------------------------------------

// Length of the valid UTF-8 character at s[i], or 0 when invalid; `bad` is
// then the length of the maximal subpart (Unicode's "substitution of maximal
// subparts", which Rust's from_utf8_lossy follows): at least 1.
std::size_t utf8_char(std::string_view s, std::size_t i, std::size_t* bad = nullptr) {
    const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = b(i);
    std::size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) need = 2;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else {
        if (bad) *bad = 1;
        return 0;
    }
    for (std::size_t k = 1; k <= need; ++k) {
        const bool ok = i + k < s.size() && b(i + k) >= (k == 1 ? lo : 0x80) && b(i + k) <= (k == 1 ? hi : 0xBF);
        if (!ok) {
            if (bad) *bad = k;
            return 0;
        }
    }
    return need + 1;
}

std::int32_t utf8_code_point(std::string_view s, std::size_t i, std::size_t n) {
    const auto b = [&](std::size_t k) { return static_cast<std::int32_t>(static_cast<unsigned char>(s[i + k])); };
    switch (n) {
        case 1: return b(0);
        case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
        case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
        default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    }
}

void append_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

std::string utf8_lossy(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (std::size_t i = 0; i < s.size();) {
        std::size_t bad = 0;
        const std::size_t n = utf8_char(s, i, &bad);
        if (n) {
            out.append(s.substr(i, n));
            i += n;
        } else {
            out += "\xEF\xBF\xBD";
            i += bad;
        }
    }
    return out;
}

// GPT-2's bytes_to_unicode: the printable bytes map to themselves, the others
// (controls, space, 0x7F-0xA0, 0xAD) to U+0100 onwards in byte order.
struct ByteMap {
    std::array<std::string, 256> to_char;
    std::unordered_map<std::uint32_t, unsigned char> to_byte;
    ByteMap() {
        std::uint32_t next = 256;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            const std::uint32_t cp = printable ? static_cast<std::uint32_t>(b) : next++;
            append_utf8(to_char[b], cp);
            to_byte.emplace(cp, static_cast<unsigned char>(b));
        }
    }
};
const ByteMap& byte_map() {
    static const ByteMap m;
    return m;
}

// ---------------------------------------------------------------------------
// PCRE2
// ---------------------------------------------------------------------------

struct Match {
    std::size_t begin, end;
};

class Regex {
public:
    Regex(const std::string& pattern, bool literal, const std::string& where) {
        KVASIR_CHECK(pattern.size() <= kMaxRegexBytes, ErrorCode::bad_input, "{}: a pattern of {} bytes (at most {})", where,
                     pattern.size(), kMaxRegexBytes);
        KVASIR_CHECK(!first_invalid_utf8(pattern), ErrorCode::bad_input, "{}: the pattern is not valid UTF-8", where);
        int err = 0;
        PCRE2_SIZE off = 0;
        const std::uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
        code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &off, nullptr);
        if (!code_) {
            std::array<PCRE2_UCHAR, 256> msg{};
            pcre2_get_error_message(err, msg.data(), msg.size());
            fail(ErrorCode::bad_input, "{}: the regex does not compile at offset {}: {}", where, off,
                 reinterpret_cast<const char*>(msg.data()));
        }
        jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
    }
    ~Regex() { pcre2_code_free(code_); }
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    // Every match in s (empty ones included), searching on from the end of
    // each match, one character on after an empty one, never at s's end —
    // tokenizers' Oniguruma find_iter.
    std::vector<Match> find_all(std::string_view s) const {
        std::vector<Match> out;
        pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
        pcre2_match_context* mc = pcre2_match_context_create(nullptr);
        pcre2_jit_stack* js = jit_ ? pcre2_jit_stack_create(32u << 10, 8u << 20, nullptr) : nullptr;
        if (!md || !mc || (jit_ && !js)) {
            pcre2_match_data_free(md);
            pcre2_match_context_free(mc);
            pcre2_jit_stack_free(js);
            throw std::bad_alloc();
        }
        pcre2_set_match_limit(mc, 100'000'000);
        pcre2_set_depth_limit(mc, 1'000'000);
        if (js) pcre2_jit_stack_assign(mc, nullptr, js);
        std::size_t pos = 0;
        int rc = 0;
        while (pos < s.size()) {
            rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, PCRE2_NO_UTF_CHECK, md, mc);
            if (rc < 0) break;
            const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
            const Match m{ov[0], ov[1]};
            out.push_back(m);
            pos = m.end > m.begin ? m.end : m.begin + std::max<std::size_t>(1, utf8_char(s, m.begin));
        }
        pcre2_match_data_free(md);
        pcre2_match_context_free(mc);
        pcre2_jit_stack_free(js);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
            std::array<PCRE2_UCHAR, 256> msg{};
            pcre2_get_error_message(rc, msg.data(), msg.size());
            fail(ErrorCode::bad_input, "tokenizer regex failed on the input text: {}", reinterpret_cast<const char*>(msg.data()));
        }
        return out;
    }

private:
    pcre2_code* code_ = nullptr;
    bool jit_ = false;
};

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---------------------------------------------------------------------------
// JSON access with pointers in every message
// ---------------------------------------------------------------------------

struct Node {
    const json& j;
    std::string ptr;
    const std::string& src;

    [[noreturn]] void bad(std::string_view what) const { fail(ErrorCode::bad_input, "{}: {}: {}", src, ptr.empty() ? "/" : ptr, what); }
    [[noreturn]] void unsupported(std::string_view what) const {
        fail(ErrorCode::unsupported, "{}: {}: {}", src, ptr.empty() ? "/" : ptr, what);
    }
    Node at(const std::string& key) const {
        if (!j.is_object() || !j.contains(key)) bad(fmt::format("missing \"{}\"", key));
        return Node{j.at(key), json_pointer_child(ptr, key), src};
    }
    std::optional<Node> find(const std::string& key) const {
        if (!j.is_object() || !j.contains(key)) return std::nullopt;
        return Node{j.at(key), json_pointer_child(ptr, key), src};
    }
    Node at(std::size_t i) const { return Node{j.at(i), json_pointer_child(ptr, i), src}; }
    void object() const {
        if (!j.is_object()) bad(fmt::format("expected an object, got {}", describe_json_value(j)));
    }
    void array(std::size_t max) const {
        if (!j.is_array()) bad(fmt::format("expected an array, got {}", describe_json_value(j)));
        if (j.size() > max) bad(fmt::format("{} entries (at most {})", j.size(), max));
    }
    // Keys other than `known` change behaviour this reader does not know.
    void only(std::initializer_list<const char*> known) const {
        object();
        for (const auto& item : j.items()) {
            const std::string& k = item.key();
            if (std::none_of(known.begin(), known.end(), [&](const char* n) { return k == n; }))
                unsupported(fmt::format("unknown key \"{}\" (this reader implements {})", k, fmt::join(known, ", ")));
        }
    }
    std::string str(std::size_t max = kMaxTokenBytes) const {
        if (!j.is_string()) bad(fmt::format("expected a string, got {}", describe_json_value(j)));
        const auto& s = j.get_ref<const std::string&>();
        if (s.size() > max) bad(fmt::format("a string of {} bytes (at most {})", s.size(), max));
        return s;
    }
    bool boolean() const {
        if (!j.is_boolean()) bad(fmt::format("expected true or false, got {}", describe_json_value(j)));
        return j.get<bool>();
    }
    bool boolean_or(const std::string& key, bool dflt) const {
        const auto n = find(key);
        return n && !n->j.is_null() ? n->boolean() : dflt;
    }
    std::int32_t id() const {
        if (!j.is_number_integer()) bad(fmt::format("expected a token id, got {}", describe_json_value(j)));
        const std::int64_t v = j.is_number_unsigned() ? static_cast<std::int64_t>(std::min<std::uint64_t>(j.get<std::uint64_t>(), 1ull << 40))
                                                      : j.get<std::int64_t>();
        if (v < 0 || v > std::numeric_limits<std::int32_t>::max()) bad(fmt::format("token id {} outside [0, 2^31)", v));
        return static_cast<std::int32_t>(v);
    }
    std::string type() const { return at("type").str(64); }
};

// ---------------------------------------------------------------------------
// Components
// ---------------------------------------------------------------------------

enum class NormForm { nfc, nfd, nfkc, nfkd };

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct Split {
    std::shared_ptr<Regex> re;
    Behavior behavior = Behavior::isolated;
    bool invert = false;
};

struct PreStep {
    enum Kind { split, byte_level } kind;
    Split s;                     // split
    bool add_prefix_space = false;  // byte_level
};

struct TemplateItem {
    bool sequence = false;              // the text's own tokens ("$A")
    std::vector<std::int32_t> ids;      // a special token's ids
};

struct AddedToken {
    std::int32_t id = 0;
    std::string content;
    bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
    std::string pattern;  // what is matched: content, normalized when `normalized`
};

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

struct Merge {
    std::int32_t rank, result;
};

// A normalized stretch of the input and how its bytes map back: blocks of
// (normalized begin, original begin, original end, exact) in order; within an
// exact block byte k of the normalized text is byte k of the original.
struct Aligned {
    std::string text;
    struct Block {
        std::size_t norm_begin, orig_begin, orig_end;
        bool exact;
    };
    std::vector<Block> blocks;

    std::pair<std::size_t, std::size_t> original(std::size_t b, std::size_t e) const {
        if (blocks.empty()) return {0, 0};
        const auto block_at = [&](std::size_t pos) -> const Block& {  // the last block starting at or before pos
            const auto it = std::upper_bound(blocks.begin(), blocks.end(), pos,
                                             [](std::size_t p, const Block& k) { return p < k.norm_begin; });
            return it == blocks.begin() ? blocks.front() : *(it - 1);
        };
        const Block& bb = block_at(b);
        const Block& eb = e > b ? block_at(e - 1) : bb;
        const std::size_t ob = bb.exact ? bb.orig_begin + (b - bb.norm_begin) : bb.orig_begin;
        const std::size_t oe = eb.exact ? eb.orig_begin + (e - eb.norm_begin) : eb.orig_end;
        return {ob, std::max(ob, oe)};
    }
};

}  // namespace

struct Tokenizer::Impl {
    std::string source;
    // model
    std::unordered_map<std::string, std::int32_t> vocab;
    std::map<std::int32_t, std::string> pieces;  // id → piece (vocab and added)
    std::unordered_map<std::uint64_t, Merge> merges;
    std::size_t n_merges = 0;
    bool ignore_merges = false, byte_fallback = false, fuse_unk = false;
    std::optional<std::int32_t> unk;
    // components
    std::vector<NormForm> normalizer;
    std::vector<PreStep> pre;
    std::vector<TemplateItem> single_template;  // empty: no template
    bool byte_level_decoder = false, has_decoder = false;
    std::string decoder_type;
    std::vector<AddedToken> added;
    std::array<std::vector<const AddedToken*>, 256> added_raw, added_normalized;  // by first byte
    bool any_raw = false, any_normalized = false;
    std::set<std::int32_t> special_ids;
    std::string describe;

    std::string normalize_run(std::string_view s) const;
    Aligned normalize(std::string_view s, std::size_t orig_offset) const;
    void bpe(std::string_view word, std::size_t prefix, std::size_t prefix_align, std::vector<TokenSpan>& out,
             std::size_t base) const;
};

namespace {

// Splits [begin, end) of s at every match of `tokens` (leftmost-longest,
// tokenizers' find_matches): (range, added token or nullptr), covering it all.
struct Cut {
    std::size_t begin, end;
    const AddedToken* token;
};

bool is_word_char(std::string_view s, std::size_t i, std::size_t n) {
    const std::int32_t cp = utf8_code_point(s, i, n);
    if (cp == '_') return true;
    const utf8proc_category_t c = utf8proc_category(cp);
    // \w of the regex crate: letters, marks, decimal and letter numbers, connector punctuation.
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) || (c >= UTF8PROC_CATEGORY_MN && c <= UTF8PROC_CATEGORY_ME) ||
           c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_PC;
}
bool is_space_char(std::int32_t cp) {
    // Unicode White_Space (Rust's char::is_whitespace, the \s of tokenizers' strip rules).
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}
std::size_t prev_char_start(std::string_view s, std::size_t i) {
    std::size_t k = i - 1;
    while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    return k;
}

// Added tokens by their pattern's first byte.
using AddedIndex = std::array<std::vector<const AddedToken*>, 256>;

std::vector<Cut> cut_added(std::string_view s, const AddedIndex& index, bool any) {
    std::vector<Cut> out;
    std::size_t start = 0;
    std::size_t i = 0;
    while (i < s.size() && any) {
        const AddedToken* best = nullptr;
        for (const AddedToken* t : index[static_cast<unsigned char>(s[i])])
            if (s.compare(i, t->pattern.size(), t->pattern) == 0 && (!best || t->pattern.size() > best->pattern.size())) best = t;
        if (!best) {
            ++i;
            continue;
        }
        std::size_t b = i, e = i + best->pattern.size();
        i = e;  // the next match is searched after this one, kept or not
        if (best->single_word) {
            const bool left_ok = b == 0 || !is_word_char(s, prev_char_start(s, b), b - prev_char_start(s, b));
            const bool right_ok = e == s.size() || !is_word_char(s, e, utf8_char(s, e));
            if (!left_ok || !right_ok) continue;
        }
        if (best->lstrip) {
            std::size_t nb = b;
            while (nb > 0) {
                const std::size_t p = prev_char_start(s, nb);
                if (!is_space_char(utf8_code_point(s, p, nb - p))) break;
                nb = p;
            }
            b = std::max(nb, start);
        }
        if (best->rstrip) {
            while (e < s.size()) {
                const std::size_t n = utf8_char(s, e);
                if (!is_space_char(utf8_code_point(s, e, n))) break;
                e += n;
            }
            i = e;
        }
        if (start < b) out.push_back({start, b, nullptr});
        out.push_back({b, e, best});
        start = e;
    }
    if (start < s.size() || out.empty()) out.push_back({start, s.size(), nullptr});
    return out;
}

// tokenizers' SplitDelimiterBehavior over (range, is_match) pieces.
std::vector<Match> split_pieces(std::string_view s, const Split& sp) {
    std::vector<std::pair<Match, bool>> m;
    std::size_t prev = 0;
    for (const Match& x : sp.re->find_all(s)) {
        if (prev != x.begin) m.push_back({{prev, x.begin}, false});
        m.push_back({x, true});
        prev = x.end;
    }
    if (prev != s.size()) m.push_back({{prev, s.size()}, false});
    if (sp.invert)
        for (auto& p : m) p.second = !p.second;
    std::vector<Match> out;
    bool previous_match = false;
    switch (sp.behavior) {
        case Behavior::isolated:
            for (const auto& p : m) out.push_back(p.first);
            break;
        case Behavior::removed:
            for (const auto& p : m)
                if (!p.second) out.push_back(p.first);
            break;
        case Behavior::merged_with_previous:
            for (const auto& [r, is_match] : m) {
                if (is_match && !previous_match && !out.empty())
                    out.back().end = r.end;
                else
                    out.push_back(r);
                previous_match = is_match;
            }
            break;
        case Behavior::merged_with_next:
            for (auto it = m.rbegin(); it != m.rend(); ++it) {
                if (it->second && !previous_match && !out.empty())
                    out.back().begin = it->first.begin;
                else
                    out.push_back(it->first);
                previous_match = it->second;
            }
            std::reverse(out.begin(), out.end());
            break;
        case Behavior::contiguous:
            for (const auto& [r, is_match] : m) {
                if (is_match == previous_match && !out.empty())
                    out.back().end = r.end;
                else
                    out.push_back(r);
                previous_match = is_match;
            }
            break;
    }
    std::erase_if(out, [](const Match& r) { return r.begin == r.end; });
    return out;
}

Behavior parse_behavior(const Node& n) {
    const std::string b = n.str(64);
    if (b == "Removed") return Behavior::removed;
    if (b == "Isolated") return Behavior::isolated;
    if (b == "MergedWithPrevious") return Behavior::merged_with_previous;
    if (b == "MergedWithNext") return Behavior::merged_with_next;
    if (b == "Contiguous") return Behavior::contiguous;
    n.unsupported(fmt::format("split behavior \"{}\"", b));
}

}  // namespace

std::string Tokenizer::Impl::normalize_run(std::string_view s) const {
    std::string cur(s);
    for (const NormForm f : normalizer) {
        int opts = UTF8PROC_STABLE;
        switch (f) {
            case NormForm::nfc: opts |= UTF8PROC_COMPOSE; break;
            case NormForm::nfd: opts |= UTF8PROC_DECOMPOSE; break;
            case NormForm::nfkc: opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
            case NormForm::nfkd: opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
        }
        utf8proc_uint8_t* out = nullptr;
        const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(cur.data()),
                                                static_cast<utf8proc_ssize_t>(cur.size()), &out,
                                                static_cast<utf8proc_option_t>(opts));
        if (n < 0) {
            std::free(out);
            if (n == UTF8PROC_ERROR_NOMEM) throw std::bad_alloc();
            fail(ErrorCode::bad_input, "{}: normalizing the text failed: {}", source, utf8proc_errmsg(n));
        }
        cur.assign(reinterpret_cast<const char*>(out), static_cast<std::size_t>(n));
        std::free(out);
    }
    return cur;
}

// Unicode normalization forms leave ASCII alone, and nothing composes across
// the start of an ASCII character (it is a starter no composition takes as a
// second element), so the text normalizes run by run — an ASCII stretch as it
// is, each non-ASCII run together with the ASCII character before it — and the
// offsets of every unchanged run stay exact.
Aligned Tokenizer::Impl::normalize(std::string_view s, std::size_t orig_offset) const {
    Aligned a;
    if (normalizer.empty()) {
        a.text.assign(s);
        a.blocks.push_back({0, orig_offset, orig_offset + s.size(), true});
        return a;
    }
    std::size_t i = 0;
    while (i < s.size()) {
        // [i, j): a run of ASCII; the last ASCII character joins a following non-ASCII run.
        std::size_t j = i;
        while (j < s.size() && static_cast<unsigned char>(s[j]) < 0x80) ++j;
        if (j == s.size()) {
            a.blocks.push_back({a.text.size(), orig_offset + i, orig_offset + j, true});
            a.text.append(s.substr(i, j - i));
            break;
        }
        const std::size_t run = j > i ? j - 1 : j;  // start of the non-ASCII run, with its ASCII lead
        if (run > i) {
            a.blocks.push_back({a.text.size(), orig_offset + i, orig_offset + run, true});
            a.text.append(s.substr(i, run - i));
        }
        std::size_t k = j;
        while (k < s.size() && static_cast<unsigned char>(s[k]) >= 0x80) ++k;
        const std::string_view piece = s.substr(run, k - run);
        const std::string norm = normalize_run(piece);
        a.blocks.push_back({a.text.size(), orig_offset + run, orig_offset + k, norm == piece});
        a.text += norm;
        i = k;
    }
    if (a.blocks.empty()) a.blocks.push_back({0, orig_offset, orig_offset, true});
    return a;
}

// BPE over one word. `word` is in the model's alphabet form: raw bytes that a
// byte-level tokenizer maps first. Symbols carry byte ranges of the word;
// `prefix` leading bytes are an added prefix space, standing for the
// `prefix_align` bytes of the input's first character.
void Tokenizer::Impl::bpe(std::string_view word, std::size_t prefix, std::size_t prefix_align, std::vector<TokenSpan>& out,
                          std::size_t base) const {
    const bool byte_level = !pre.empty() && pre.back().kind == PreStep::byte_level;
    // The prefix space stands aligned with the word's first character, as
    // tokenizers' NormalizedString::prepend aligns it.
    const auto span_of = [&](std::size_t b, std::size_t e) {
        const std::size_t ob = b < prefix ? 0 : b - prefix, oe = e <= prefix ? prefix_align : e - prefix;
        return std::pair{base + ob, base + std::max(ob, oe)};
    };
    std::string mapped;
    std::vector<std::pair<std::size_t, std::size_t>> char_bytes;  // per model character: byte range in word
    if (byte_level) {
        for (std::size_t i = 0; i < word.size(); ++i) {
            mapped += byte_map().to_char[static_cast<unsigned char>(word[i])];
            char_bytes.emplace_back(i, i + 1);
        }
    } else {
        mapped.assign(word);
        for (std::size_t i = 0; i < word.size();) {
            const std::size_t n = std::max<std::size_t>(1, utf8_char(word, i));
            char_bytes.emplace_back(i, i + n);
            i += n;
        }
    }
    if (ignore_merges) {
        if (const auto it = vocab.find(mapped); it != vocab.end()) {
            const auto [b, e] = span_of(0, word.size());
            out.push_back({it->second, b, e});
            return;
        }
    }
    // The initial symbols: each model character's id, unknown ones through
    // byte_fallback or unk (fused when fuse_unk), or dropped as tokenizers does.
    struct Sym {
        std::int32_t id;
        std::size_t b, e;
        int prev, next;
        bool alive;
    };
    std::vector<Sym> sym;
    std::size_t mpos = 0;
    for (const auto& [cb, ce] : char_bytes) {
        const std::size_t n = byte_level ? byte_map().to_char[static_cast<unsigned char>(word[cb])].size() : ce - cb;
        const std::string ch = mapped.substr(mpos, n);
        mpos += n;
        if (const auto it = vocab.find(ch); it != vocab.end()) {
            sym.push_back({it->second, cb, ce, 0, 0, true});
            continue;
        }
        if (byte_fallback) {
            std::vector<std::int32_t> ids;
            for (const char c : ch) {
                const auto it = vocab.find(fmt::format("<0x{:02X}>", static_cast<unsigned char>(c)));
                if (it == vocab.end()) break;
                ids.push_back(it->second);
            }
            if (ids.size() == ch.size()) {
                for (const std::int32_t id : ids) sym.push_back({id, cb, ce, 0, 0, true});
                continue;
            }
        }
        if (unk) {
            if (fuse_unk && !sym.empty() && sym.back().id == *unk)
                sym.back().e = ce;
            else
                sym.push_back({*unk, cb, ce, 0, 0, true});
        }
    }
    for (std::size_t i = 0; i < sym.size(); ++i) {
        sym[i].prev = static_cast<int>(i) - 1;
        sym[i].next = i + 1 < sym.size() ? static_cast<int>(i) + 1 : -1;
    }
    // tokenizers' Word::merge_all: the lowest-ranked pair first, leftmost on ties.
    struct Cand {
        std::int32_t rank;
        int pos;
        std::int32_t right_id;  // the pair as it was when pushed
        bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<>> q;
    const auto push = [&](int p) {
        if (p < 0 || sym[p].next < 0) return;
        const auto it = merges.find(pair_key(sym[p].id, sym[sym[p].next].id));
        if (it != merges.end()) q.push({it->second.rank, p, sym[sym[p].next].id});
    };
    for (std::size_t i = 0; i + 1 < sym.size(); ++i) push(static_cast<int>(i));
    while (!q.empty()) {
        const Cand c = q.top();
        q.pop();
        Sym& l = sym[c.pos];
        if (!l.alive || l.next < 0 || sym[l.next].id != c.right_id) continue;
        const auto it = merges.find(pair_key(l.id, sym[l.next].id));
        if (it == merges.end() || it->second.rank != c.rank) continue;
        Sym& r = sym[l.next];
        l.id = it->second.result;
        l.e = r.e;
        r.alive = false;
        l.next = r.next;
        if (r.next >= 0) sym[r.next].prev = c.pos;
        push(l.prev);
        push(c.pos);
    }
    for (const Sym& s : sym) {
        if (!s.alive) continue;
        const auto [b, e] = span_of(s.b, s.e);
        out.push_back({s.id, b, e});
    }
}

// ---------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------

namespace {

// A "Sequence" component (nested at most 4 deep): each entry of its list
// `key` parsed by `each`. False when `n` is not one.
template <class F>
bool sequence_of(const Node& n, const std::string& type, const char* key, int depth, F&& each) {
    if (type != "Sequence" || depth >= 4) return false;
    n.only({"type", key});
    const Node list = n.at(key);
    list.array(kMaxSequence);
    for (std::size_t i = 0; i < list.j.size(); ++i) each(list.at(i));
    return true;
}

void parse_normalizer(const Node& n, std::vector<NormForm>& out, std::vector<std::string>& names, int depth) {
    if (n.j.is_null()) return;
    n.object();
    const std::string t = n.type();
    if (sequence_of(n, t, "normalizers", depth, [&](const Node& e) { parse_normalizer(e, out, names, depth + 1); })) return;
    n.only({"type"});
    if (t == "NFC") out.push_back(NormForm::nfc);
    else if (t == "NFD") out.push_back(NormForm::nfd);
    else if (t == "NFKC") out.push_back(NormForm::nfkc);
    else if (t == "NFKD") out.push_back(NormForm::nfkd);
    else n.unsupported(fmt::format("normalizer \"{}\" (implemented: NFC, NFD, NFKC, NFKD, Sequence)", t));
    names.push_back(t);
}

void parse_pre(const Node& n, std::vector<PreStep>& out, std::vector<std::string>& names, int depth) {
    if (n.j.is_null()) return;
    n.object();
    const std::string t = n.type();
    if (sequence_of(n, t, "pretokenizers", depth, [&](const Node& e) { parse_pre(e, out, names, depth + 1); })) return;
    if (!out.empty() && out.back().kind == PreStep::byte_level)
        n.unsupported(fmt::format("pre-tokenizer \"{}\" after ByteLevel (implemented: ByteLevel last)", t));
    if (t == "Split") {
        n.only({"type", "pattern", "behavior", "invert"});
        const Node pat = n.at("pattern");
        pat.only({"Regex", "String"});
        PreStep s{PreStep::split, {}, false};
        if (pat.j.size() != 1) pat.bad("expected one of \"Regex\" or \"String\"");
        const bool literal = pat.j.contains("String");
        const Node p = pat.at(literal ? "String" : "Regex");
        s.s.re = std::make_shared<Regex>(p.str(kMaxRegexBytes), literal, fmt::format("{}: {}", n.src, p.ptr));
        s.s.behavior = parse_behavior(n.at("behavior"));
        s.s.invert = n.boolean_or("invert", false);
        out.push_back(std::move(s));
        names.push_back(literal ? "Split(String)" : "Split(Regex)");
    } else if (t == "ByteLevel") {
        n.only({"type", "add_prefix_space", "trim_offsets", "use_regex"});
        const bool use_regex = n.boolean_or("use_regex", true);
        if (use_regex) {
            PreStep s{PreStep::split, {}, false};
            s.s.re = std::make_shared<Regex>(kGpt2Pattern, false, "GPT-2 pattern");
            s.s.behavior = Behavior::isolated;
            // ByteLevel's own regex runs after the prefix space is added: the
            // byte_level step below adds it and then splits (see encode).
            PreStep b{PreStep::byte_level, s.s, n.boolean_or("add_prefix_space", false)};
            out.push_back(std::move(b));
        } else {
            out.push_back(PreStep{PreStep::byte_level, {}, n.boolean_or("add_prefix_space", false)});
        }
        names.push_back(use_regex ? "ByteLevel(GPT-2 regex)" : "ByteLevel");
    } else {
        n.unsupported(fmt::format("pre-tokenizer \"{}\" (implemented: Split, ByteLevel, Sequence)", t));
    }
}

void parse_post(const Node& n, std::vector<TemplateItem>& tmpl, std::vector<std::string>& names, int depth) {
    if (n.j.is_null()) return;
    n.object();
    const std::string t = n.type();
    if (sequence_of(n, t, "processors", depth, [&](const Node& e) { parse_post(e, tmpl, names, depth + 1); })) return;
    if (t == "ByteLevel") {
        // Ids unchanged; trim_offsets would only narrow offsets around spaces.
        n.only({"type", "add_prefix_space", "trim_offsets", "use_regex"});
        names.push_back("ByteLevel");
    } else if (t == "TemplateProcessing") {
        n.only({"type", "single", "pair", "special_tokens"});
        if (!tmpl.empty()) n.unsupported("a second TemplateProcessing");
        const Node specials = n.at("special_tokens");
        specials.object();
        const Node single = n.at("single");
        single.array(kMaxSequence);
        bool has_sequence = false;
        for (std::size_t i = 0; i < single.j.size(); ++i) {
            const Node item = single.at(i);
            item.object();
            if (item.j.size() != 1) item.bad("expected one of \"SpecialToken\" or \"Sequence\"");
            if (item.j.contains("Sequence")) {
                const Node s = item.at("Sequence");
                s.only({"id", "type_id"});
                if (s.at("id").str(8) != "A") s.at("id").unsupported("a single-sequence template naming a sequence other than A");
                tmpl.push_back({true, {}});
                has_sequence = true;
            } else {
                const Node s = item.at("SpecialToken");
                s.only({"id", "type_id"});
                const std::string name = s.at("id").str();
                const auto st = specials.find(name);
                if (!st) s.at("id").bad(fmt::format("\"{}\" is not in special_tokens", name));
                const Node ids = st->at("ids");
                ids.array(kMaxSequence);
                TemplateItem ti;
                for (std::size_t k = 0; k < ids.j.size(); ++k) ti.ids.push_back(ids.at(k).id());
                tmpl.push_back(std::move(ti));
            }
        }
        if (!has_sequence) single.bad("the template has no $A");
        names.push_back("TemplateProcessing");
    } else {
        n.unsupported(fmt::format("post-processor \"{}\" (implemented: ByteLevel, TemplateProcessing, Sequence)", t));
    }
}

// The BPE model of root/model: its options, vocabulary, unk token and merges.
void parse_bpe_model(const Node& root, Tokenizer::Impl& im) {
    const std::string& source = im.source;
    const Node model = root.at("model");
    model.object();
    const std::string mtype = model.j.contains("type") ? model.type() : std::string("BPE");
    if (mtype != "BPE") model.unsupported(fmt::format("model \"{}\" (implemented: BPE)", mtype));
    model.only({"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", "byte_fallback",
                "ignore_merges", "vocab", "merges"});
    if (const auto d = model.find("dropout"); d && !d->j.is_null() && !(d->j.is_number() && d->j.get<double>() == 0.0))
        d->unsupported("BPE dropout (random merges: no fixed ids)");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
        if (const auto n = model.find(k); n && !n->j.is_null() && !n->str().empty())
            n->unsupported(fmt::format("BPE {} (implemented: none)", k));
    }
    im.ignore_merges = model.boolean_or("ignore_merges", false);
    im.byte_fallback = model.boolean_or("byte_fallback", false);
    im.fuse_unk = model.boolean_or("fuse_unk", false);
    const Node vocab = model.at("vocab");
    vocab.object();
    KVASIR_CHECK(vocab.j.size() <= kMaxVocab, ErrorCode::bad_input, "{}: {}: {} pieces (at most {})", source, vocab.ptr,
                 vocab.j.size(), kMaxVocab);
    im.vocab.reserve(vocab.j.size());
    for (const auto& [piece, idj] : vocab.j.items()) {
        const Node idn{idj, json_pointer_child(vocab.ptr, piece), source};
        if (piece.size() > kMaxTokenBytes) idn.bad(fmt::format("a piece of {} bytes (at most {})", piece.size(), kMaxTokenBytes));
        if (piece.empty()) idn.bad("an empty piece");
        const std::int32_t id = idn.id();
        if (!im.pieces.emplace(id, piece).second) idn.bad(fmt::format("id {} is also \"{}\"", id, im.pieces.at(id)));
        im.vocab.emplace(piece, id);
    }
    if (const auto u = model.find("unk_token"); u && !u->j.is_null()) {
        const std::string s = u->str();
        const auto it = im.vocab.find(s);
        if (it == im.vocab.end()) u->bad(fmt::format("unk_token \"{}\" is not in the vocabulary", s));
        im.unk = it->second;
    }
    const Node merges = model.at("merges");
    merges.array(kMaxMerges);
    im.merges.reserve(merges.j.size());
    for (std::size_t i = 0; i < merges.j.size(); ++i) {
        const Node m = merges.at(i);
        std::string a, b;
        if (m.j.is_string()) {
            const std::string s = m.str(2 * kMaxTokenBytes + 1);
            const std::size_t sp = s.find(' ');
            if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
                m.bad(fmt::format("\"{}\" is not two pieces separated by one space", s));
            a = s.substr(0, sp), b = s.substr(sp + 1);
        } else {
            m.array(2);
            if (m.j.size() != 2) m.bad("expected a pair of pieces");
            a = m.at(0).str(), b = m.at(1).str();
        }
        const auto ia = im.vocab.find(a), ib = im.vocab.find(b), ir = im.vocab.find(a + b);
        if (ia == im.vocab.end() || ib == im.vocab.end() || ir == im.vocab.end())
            m.bad(fmt::format("\"{}\" + \"{}\": {} is not in the vocabulary", a, b,
                              ia == im.vocab.end() ? "the first" : ib == im.vocab.end() ? "the second" : "the merged piece"));
        // A repeated pair keeps its last rank, as tokenizers' merge map does.
        im.merges[pair_key(ia->second, ib->second)] = Merge{static_cast<std::int32_t>(i), ir->second};
    }
    im.n_merges = merges.j.size();
}

// root/added_tokens, and their match patterns (normalized with the
// normalizer, which the caller parsed first, where the token says so).
void parse_added_tokens(const Node& root, Tokenizer::Impl& im) {
    if (const auto at = root.find("added_tokens"); at && !at->j.is_null()) {
        at->array(kMaxAdded);
        for (std::size_t i = 0; i < at->j.size(); ++i) {
            const Node t = at->at(i);
            t.only({"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
            AddedToken a;
            a.id = t.at("id").id();
            a.content = t.at("content").str();
            if (a.content.empty()) t.at("content").bad("an empty added token");
            if (first_invalid_utf8(a.content)) t.at("content").bad("not valid UTF-8");
            a.single_word = t.boolean_or("single_word", false);
            a.lstrip = t.boolean_or("lstrip", false);
            a.rstrip = t.boolean_or("rstrip", false);
            a.special = t.boolean_or("special", false);
            a.normalized = t.boolean_or("normalized", !a.special);
            // An added token may reuse a vocabulary id; decode shows its content (tokenizers' id_to_token).
            im.pieces[a.id] = a.content;
            if (a.special) im.special_ids.insert(a.id);
            im.added.push_back(std::move(a));
        }
    }
    for (AddedToken& a : im.added) {
        a.pattern = a.normalized ? im.normalize_run(a.content) : a.content;
        if (a.pattern.empty()) continue;
        (a.normalized ? im.added_normalized : im.added_raw)[static_cast<unsigned char>(a.pattern[0])].push_back(&a);
        (a.normalized ? im.any_normalized : im.any_raw) = true;
    }
}

}  // namespace

Tokenizer Tokenizer::parse(std::string_view json_text, const std::string& source) {
    KVASIR_CHECK(json_text.size() <= kMaxFileBytes, ErrorCode::bad_input, "{}: {} bytes (a tokenizer.json is at most {})", source,
                 json_text.size(), kMaxFileBytes);
    const json doc = parse_json_strict(std::string(json_text), source);
    auto im = std::make_shared<Impl>();
    im->source = source;
    const Node root{doc, "", source};
    root.object();
    for (const char* k : {"truncation", "padding"}) {
        if (const auto n = root.find(k); n && !n->j.is_null())
            n->unsupported(fmt::format("{} is set: it changes which tokens a text gives (set it to null)", k));
    }
    parse_bpe_model(root, *im);
    std::vector<std::string> norm_names, pre_names, post_names;
    if (const auto n = root.find("normalizer")) parse_normalizer(*n, im->normalizer, norm_names, 0);
    parse_added_tokens(root, *im);
    if (const auto n = root.find("pre_tokenizer")) parse_pre(*n, im->pre, pre_names, 0);
    if (const auto n = root.find("post_processor")) parse_post(*n, im->single_template, post_names, 0);
    if (const auto d = root.find("decoder"); d && !d->j.is_null()) {
        d->object();
        im->has_decoder = true;
        im->decoder_type = d->type();
        im->byte_level_decoder = im->decoder_type == "ByteLevel";
    }
    for (const TemplateItem& t : im->single_template)
        for (const std::int32_t id : t.ids)
            KVASIR_CHECK(im->pieces.count(id), ErrorCode::bad_input, "{}: /post_processor: special token id {} is in neither the vocabulary nor added_tokens",
                         source, id);
    im->describe = fmt::format("BPE, {} pieces, {} merges, {} added tokens{}{}; {}; {}; post: {}", im->vocab.size(), im->n_merges,
                               im->added.size(), im->ignore_merges ? ", ignore_merges" : "",
                               im->byte_fallback ? ", byte_fallback" : "",
                               norm_names.empty() ? "no normalizer" : fmt::format("{}", fmt::join(norm_names, " + ")),
                               pre_names.empty() ? "no pre-tokenizer" : fmt::format("{}", fmt::join(pre_names, " + ")),
                               post_names.empty() ? "none" : fmt::format("{}", fmt::join(post_names, " + ")));
    return Tokenizer(std::move(im));
}

Tokenizer Tokenizer::load(const std::string& path) { return parse(read_text_file(path, kMaxFileBytes), path); }

// ---------------------------------------------------------------------------
// Encoding and decoding
// ---------------------------------------------------------------------------

std::vector<TokenSpan> Tokenizer::encode_spans(std::string_view text, bool add_special_tokens) const {
    const Impl& im = *impl_;
    if (const auto bad = first_invalid_utf8(text))
        fail(ErrorCode::bad_input, "the text is not valid UTF-8 at byte {}", *bad);
    const AddedIndex& raw_tokens = im.added_raw;
    const AddedIndex& norm_tokens = im.added_normalized;

    std::vector<TokenSpan> body;
    const auto pre_tokenize = [&](const Aligned& al, std::size_t b, std::size_t e) {
        // Words as (begin, end) in al.text, with a prefix-space flag.
        struct Word {
            std::size_t b, e;
            bool prefix;
            std::size_t align;  // the bytes a prefix space is aligned with: the piece's first character
        };
        std::vector<Word> words{{b, e, false, 0}};
        for (const PreStep& st : im.pre) {
            std::vector<Word> next;
            for (const Word& w : words) {
                const std::string_view ws = std::string_view(al.text).substr(w.b, w.e - w.b);
                if (st.kind == PreStep::split) {
                    for (const Match& m : split_pieces(ws, st.s)) next.push_back({w.b + m.begin, w.b + m.end, false, 0});
                    continue;
                }
                // ByteLevel: the prefix space, then (use_regex) GPT-2's split on the spaced text.
                const bool prefix = st.add_prefix_space && (ws.empty() || ws[0] != ' ');
                const std::size_t align = ws.empty() ? 0 : std::max<std::size_t>(1, utf8_char(ws, 0));
                if (!st.s.re) {
                    next.push_back({w.b, w.e, prefix, align});
                    continue;
                }
                const std::string spaced = prefix ? " " + std::string(ws) : std::string(ws);
                for (const Match& m : split_pieces(spaced, st.s)) {
                    const bool has_prefix = prefix && m.begin == 0;
                    const std::size_t sb = prefix ? (m.begin == 0 ? 0 : m.begin - 1) : m.begin;
                    const std::size_t se = prefix ? m.end - 1 : m.end;
                    next.push_back({w.b + sb, w.b + se, has_prefix, align});
                }
            }
            words = std::move(next);
        }
        std::vector<TokenSpan> toks;
        for (const Word& w : words) {
            const std::string word = (w.prefix ? std::string(" ") : std::string()) + al.text.substr(w.b, w.e - w.b);
            if (word.empty()) continue;
            toks.clear();
            im.bpe(word, w.prefix ? 1 : 0, w.align, toks, w.b);
            for (TokenSpan t : toks) {
                const auto [ob, oe] = al.original(t.begin, t.end);
                body.push_back({t.id, ob, oe});
            }
        }
    };

    for (const Cut& c : cut_added(text, raw_tokens, im.any_raw)) {
        if (c.token) {
            body.push_back({c.token->id, c.begin, c.end});
            continue;
        }
        if (c.begin == c.end) continue;
        const Aligned al = im.normalize(text.substr(c.begin, c.end - c.begin), c.begin);
        for (const Cut& n : cut_added(al.text, norm_tokens, im.any_normalized)) {
            if (n.token) {
                const auto [ob, oe] = al.original(n.begin, n.end);
                body.push_back({n.token->id, ob, oe});
            } else if (n.begin < n.end) {
                pre_tokenize(al, n.begin, n.end);
            }
        }
    }
    // Offsets on character boundaries of the input.
    for (TokenSpan& t : body) {
        while (t.begin > 0 && t.begin < text.size() && (static_cast<unsigned char>(text[t.begin]) & 0xC0) == 0x80) --t.begin;
        while (t.end < text.size() && (static_cast<unsigned char>(text[t.end]) & 0xC0) == 0x80) ++t.end;
    }
    if (!add_special_tokens || im.single_template.empty()) return body;
    std::vector<TokenSpan> out;
    for (const TemplateItem& t : im.single_template) {
        if (t.sequence)
            out.insert(out.end(), body.begin(), body.end());
        else
            for (const std::int32_t id : t.ids) out.push_back({id, 0, 0});
    }
    return out;
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
    std::vector<std::int32_t> ids;
    for (const TokenSpan& t : encode_spans(text, add_special_tokens)) ids.push_back(t.id);
    return ids;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const {
    const Impl& im = *impl_;
    std::vector<const std::string*> toks;
    for (const std::int32_t id : ids) {
        const auto it = im.pieces.find(id);
        KVASIR_CHECK(it != im.pieces.end(), ErrorCode::bad_input, "{}: no token has id {}", im.source, id);
        if (skip_special_tokens && im.special_ids.count(id)) continue;
        toks.push_back(&it->second);
    }
    if (!im.has_decoder) {
        std::string out;
        for (std::size_t i = 0; i < toks.size(); ++i) out += (i ? " " : "") + *toks[i];
        return out;
    }
    KVASIR_CHECK(im.byte_level_decoder, ErrorCode::unsupported, "{}: /decoder: decoder \"{}\" (implemented: ByteLevel)", im.source,
                 im.decoder_type);
    std::string bytes;
    for (const std::string* t : toks) {
        std::string mapped;
        bool all = true;
        for (std::size_t i = 0; i < t->size() && all;) {
            const std::size_t n = utf8_char(*t, i);
            if (!n) break;
            const auto it = byte_map().to_byte.find(static_cast<std::uint32_t>(utf8_code_point(*t, i, n)));
            if (it == byte_map().to_byte.end())
                all = false;
            else
                mapped += static_cast<char>(it->second);
            i += n;
        }
        bytes += all ? mapped : *t;
    }
    return utf8_lossy(bytes);
}

std::optional<std::string> Tokenizer::piece(std::int32_t id) const {
    const auto it = impl_->pieces.find(id);
    if (it == impl_->pieces.end()) return std::nullopt;
    return it->second;
}

bool Tokenizer::is_special(std::int32_t id) const { return impl_->special_ids.count(id) > 0; }

std::int64_t Tokenizer::vocab_size() const { return impl_->pieces.empty() ? 0 : std::int64_t{impl_->pieces.rbegin()->first} + 1; }

std::string Tokenizer::describe() const { return impl_->describe; }

const std::string& Tokenizer::source() const { return impl_->source; }

std::string tokenizer_path_for(const std::string& model_path) {
    std::error_code ec;
    const std::filesystem::path p(model_path);
    std::filesystem::path cand;
    if (std::filesystem::is_directory(p, ec))
        cand = p / "tokenizer.json";
    else if (p.extension() == ".safetensors")
        cand = p.parent_path() / "tokenizer.json";
    else if (p.extension() == ".gguf")
        cand = std::filesystem::path(p).replace_extension(".tokenizer.json");
    else
        return {};
    return std::filesystem::is_regular_file(cand, ec) ? cand.string() : std::string();
}

Tokenizer load_tokenizer_for(const std::string& model_path, const std::string& override_path) {
    if (!override_path.empty()) return Tokenizer::load(override_path);
    const std::string p = tokenizer_path_for(model_path);
    KVASIR_CHECK(!p.empty(), ErrorCode::bad_input, "no tokenizer.json beside {} (give --tokenizer FILE)", model_path);
    return Tokenizer::load(p);
}

std::optional<std::size_t> first_invalid_utf8(std::string_view text) {
    for (std::size_t i = 0; i < text.size();) {
        const std::size_t n = utf8_char(text, i);
        if (!n) return i;
        i += n;
    }
    return std::nullopt;
}

}  // namespace kvasir
