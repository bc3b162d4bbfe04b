// A model's own tokenizer, read from its Hugging Face `tokenizer.json`.
//
// What is implemented is the byte-level BPE family that today's checkpoints
// ship (GPT-2, Llama 3, Qwen 2/3/3.5, DeepSeek-V3, GLM, gpt-oss), producing
// exactly the ids the `tokenizers` library produces:
//
//   added tokens   split out of the text first, leftmost-longest (aho-corasick
//                  LeftmostLongest in tokenizers), with their lstrip / rstrip /
//                  single_word rules; those with "normalized": false are
//                  matched on the raw text, the others on the normalized text
//   normalizer     null, NFC / NFD / NFKC / NFKD (utf8proc), Sequence
//   pre_tokenizer  null, Split (a Regex — PCRE2 with Unicode properties — or a
//                  String; behaviors Isolated, Removed, MergedWithPrevious,
//                  MergedWithNext, Contiguous; invert), ByteLevel
//                  (add_prefix_space, use_regex: GPT-2's pattern), Sequence
//   model          BPE: vocab, merges (the "a b" and the ["a", "b"] forms),
//                  ignore_merges, byte_fallback, unk_token / fuse_unk
//   post_processor null, ByteLevel, TemplateProcessing (the `single` template:
//                  BOS/EOS), Sequence
//   decoder        null, ByteLevel (for decode(): generate's continuations)
//
// Anything else — another model (Unigram, WordPiece, WordLevel), normalizer
// (Lowercase, Replace, Prepend …), pre-tokenizer (Metaspace, Digits,
// Whitespace …), post-processor (Bert, Roberta) or a BPE option that changes
// the algorithm (dropout, continuing_subword_prefix, end_of_word_suffix) —
// is refused with Error(unsupported) naming the component and its JSON
// pointer, never approximated.
//
// The file is untrusted: at most 256 MiB, every size bounded (vocabulary and
// merges ≤ 4 Mi entries, a token ≤ 4 KiB, a regex ≤ 64 KiB), every id in
// [0, 2^31), every merge's parts and result in the vocabulary, duplicate ids
// refused; a regex that exceeds PCRE2's match or depth limits on some input
// is Error(bad_input) for that input. Input text must be valid UTF-8.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

// One token of an encoding and the bytes of the input text it came from:
// [begin, end) on UTF-8 character boundaries (a token holding part of a
// character covers the whole character, as tokenizers' offsets do). Tokens
// the post-processor adds (BOS) cover nothing (begin == end == 0). Where the
// normalizer changed a stretch of text (e.g. NFC composed e + ◌́ into é),
// every token of that stretch covers the whole stretch.
struct TokenSpan {
    std::int32_t id = 0;
    std::size_t begin = 0;
    std::size_t end = 0;
};

class Tokenizer {
public:
    // Parses tokenizer.json text; `source` names it in errors.
    static Tokenizer parse(std::string_view json_text, const std::string& source);
    static Tokenizer load(const std::string& path);

    // Tokenizes `text` (valid UTF-8). add_special_tokens applies the
    // post-processor (tokenizers' encode(text, add_special_tokens=True)).
    std::vector<TokenSpan> encode_spans(std::string_view text, bool add_special_tokens = true) const;
    std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens = true) const;

    // The text of `ids` through the decoder (tokenizers' decode); bytes that
    // are not valid UTF-8 become U+FFFD as there. Unknown ids are
    // Error(bad_input); a decoder this build does not implement is
    // Error(unsupported) naming it.
    std::string decode(std::span<const std::int32_t> ids, bool skip_special_tokens = false) const;

    // The piece an id stands for as stored (byte-level pieces in their
    // mapped form, e.g. "Ġthe"); nullopt for an unknown id.
    std::optional<std::string> piece(std::int32_t id) const;
    bool is_special(std::int32_t id) const;

    // 1 + the largest id of the vocabulary and the added tokens.
    std::int64_t vocab_size() const;
    // One line for `inspect` / reports: "BPE, 2048 pieces, 1790 merges, 3
    // added tokens; NFC; Split(Regex) + ByteLevel; post: ByteLevel".
    std::string describe() const;
    const std::string& source() const;

    struct Impl;

private:
    explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<const Impl> impl_;
};

// Where a model's tokenizer.json is: folder F → F/tokenizer.json, F/x.safetensors
// → F/tokenizer.json, P.gguf → P.tokenizer.json beside it (a GGUF's own
// tokenizer metadata is not read). Empty when that file does not exist.
std::string tokenizer_path_for(const std::string& model_path);

// `override_path` when given, else tokenizer_path_for(model_path); Error(bad_input)
// "no tokenizer.json beside MODEL (give --tokenizer FILE)" when neither exists.
Tokenizer load_tokenizer_for(const std::string& model_path, const std::string& override_path = {});

// The byte offset of the first byte of `text` that is not valid UTF-8, or
// nullopt (overlong forms, surrogates and code points above U+10FFFF are
// invalid, as in every strict decoder).
std::optional<std::size_t> first_invalid_utf8(std::string_view text);

}  // namespace kvasir
