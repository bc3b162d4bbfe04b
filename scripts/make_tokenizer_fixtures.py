#!/usr/bin/env python3
"""Tokenizer fixtures: byte-level BPE tokenizer.json files trained by Hugging Face
`tokenizers`, and the ids, offsets and decoded texts `tokenizers` gives for a
multilingual test text — what tests/model/test_tokenizer.cpp holds the C++
tokenizer to, id for id.

    pip install -r scripts/requirements-fixtures.txt   # tokenizers==0.23.3
    python scripts/make_tokenizer_fixtures.py          # writes fixtures/tokenizers/

Three tokenizers, each the shape of a real family's tokenizer.json:

* qwen2_style.json  — NFC; Split(Qwen2's regex, Isolated) + ByteLevel(no prefix
  space, no regex); post-processor ByteLevel; added special tokens
  <|endoftext|>, <|im_start|>, <|im_end|> (normalized false); no BOS.
* llama3_style.json — no normalizer; Split(Llama 3's regex: digits in groups of
  up to three) + ByteLevel; BPE ignore_merges; TemplateProcessing adding the
  BOS <|begin_of_text|>; a special <mask> with lstrip and rstrip, and a
  non-special, normalized, single_word added token "foo_bar".
* gpt2_style.json   — NFKC; ByteLevel(add_prefix_space, GPT-2's regex);
  post-processor ByteLevel; <|endoftext|>.

Each is trained on the same small corpus (below), so the test text — which
repeats some of the corpus and adds scripts and symbols it never saw —
exercises long merges and the byte-level fallback alike. Output is a pure
function of the corpus and the pinned version (the trainer is
deterministic): re-running writes the same bytes.

fixtures/tokenizers/cases.json: the texts (name, text), and for each tokenizer and text,
tokenizers' `encode(text, add_special_tokens=...)` ids and offsets (converted
from character to UTF-8 byte offsets), `decode(ids)` with and without
skip_special_tokens, and whether NFC/NFKC leaves the text unchanged (where it
does not, the C++ offsets cover each changed stretch whole: the test then
checks containment, not equality).
"""

from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "fixtures" / "tokenizers"
PINNED = "0.23.3"

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
                 r"\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs on.",
    "It's a truth universally acknowledged that we'll need more tokens, isn't it? I'm sure they've said so.",
    "Numbers: 3.14159, 2718281828, 1,000,000 and 42 — dates like 2026-12-02 and times 13:07:00.",
    "def forward(self, x):\n    return self.linear(x) + x  # residual\n\n\tif x is None:\n\t\traise ValueError('x')\n",
    "Привет, мир! Это проверка токенизатора на русском языке.",
    "こんにちは世界。日本語のテキストです。中文也在这里：你好，世界！",
    "Ελληνικά γράμματα, العربية نص، עברית, हिन्दी भाषा, 한국어 문장입니다.",
    "Café, naïve, façade, jalapeño, Zürich, São Paulo, Œuvre, straße.",
    "Emoji 🙂🚀 and symbols ∑ ∫ √ ≤ ≥ ≠ € £ ¥ © ® ™ — “quotes” ‘single’ «guillemets».",
    "<html><body class=\"main\">Hello &amp; welcome</body></html>",
    "   leading spaces, trailing spaces   \n\n\nblank lines\r\nwindows line end",
]

# The test text: the corpus again, and what it never saw.
NOVEL = [
    "Ünïcödé in decomposed form: e\u0301 a\u0308 n\u0303 (NFC composes them), Hangul jamo \u1112\u1161\u11ab.",
    "Fullwidth ＡＢＣ１２３ and the ligature ﬁ, superscript ² and ① (NFKC changes these).",
    "Family 👩\u200d👩\u200d👧, flag 🇩🇪, skin tone 👍🏽, keycap 1️⃣, variation ♥️.",
    "Non-breaking\u00a0space, ideographic\u3000space, thin\u2009space, zero\u200bwidth.",
    "Tabs\tand\t\tmore\ttabs; a run of spaces:          end.",
    "Thai ภาษาไทย, Georgian ქართული, Armenian Հայերեն, Amharic አማርኛ, Tamil தமிழ்.",
    "SHOUTING DON'T, WE'LL, THEY'VE, I'M; mixed Don'T We'Ll.",
    "1234567890 12 123 1234 0.5e-10 0x1F -7",
    "Special tokens inline: <|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n<|endoftext|>",
    "Masked: a <mask> b  <mask>  c<mask>d and foo_bar, xfoo_bar, foo_barx, (foo_bar).",
    "Lone surrogate-free astral: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐛𝐨𝐥𝐝 𓀀 🀄.",
]

EDGE = [
    "", " ", "  ", "\n", "\n\n\n", "\r\n", "\t", "a", "A\u0301", "ﬁ",
    "<|endoftext|>", "<|im_start|><|im_end|>", "<mask>", " <mask> ", "foo_bar", "<|endoftext|><|endoftext|>",
    "x" * 300, " " * 100 + "x", "日" * 50, "🙂" * 20, "'s's's", "...!!!???", "a\u00a0\u00a0b",
]


def check_version() -> None:
    import tokenizers

    if tokenizers.__version__ != PINNED:
        sys.exit(f"make_tokenizer_fixtures.py: needs tokenizers=={PINNED} (scripts/requirements-fixtures.txt), "
                 f"found {tokenizers.__version__}")


def build(kind: str):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    ignore = kind == "llama3"
    tok = Tokenizer(models.BPE(ignore_merges=ignore))
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    elif kind == "llama3":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    else:
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        specials = ["<|endoftext|>"]
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=1, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 3, trainer=trainer)
    if kind == "llama3":
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, special=True, normalized=False)])
        tok.add_tokens([AddedToken("foo_bar", single_word=True, normalized=True, special=False)])
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                           special_tokens=[("<|begin_of_text|>", bos)])
    return tok


def byte_offsets(text: str, offsets) -> list[list[int]]:
    prefix = [0]
    for ch in text:
        prefix.append(prefix[-1] + len(ch.encode("utf-8")))
    return [[prefix[b], prefix[e]] for b, e in offsets]


def main() -> None:
    check_version()
    from tokenizers import Tokenizer

    OUT.mkdir(parents=True, exist_ok=True)
    text = "\n".join(CORPUS + NOVEL) + "\n"
    (OUT / "multilingual.txt").write_text(text, encoding="utf-8", newline="")
    texts = [("multilingual.txt", text)] + [(f"line {i}", t) for i, t in enumerate(CORPUS + NOVEL)] + \
            [(f"edge {i}", t) for i, t in enumerate(EDGE)]
    index = {name: i for i, (name, _) in enumerate(texts)}
    cases = []
    for kind in ("qwen2", "llama3", "gpt2"):
        path = OUT / f"{kind}_style.json"
        build(kind).save(str(path), pretty=True)
        tok = Tokenizer.from_file(str(path))  # what is tested is the file, as saved
        form = {"qwen2": "NFC", "llama3": None, "gpt2": "NFKC"}[kind]
        for name, t in texts:
            for special in (True, False):
                enc = tok.encode(t, add_special_tokens=special)
                cases.append({
                    "tokenizer": path.name, "text": index[name], "add_special_tokens": special,
                    "ids": enc.ids, "offsets": byte_offsets(t, enc.offsets),
                    "normalization_unchanged": form is None or unicodedata.normalize(form, t) == t,
                    "decoded": tok.decode(enc.ids, skip_special_tokens=False),
                    "decoded_skip_special": tok.decode(enc.ids, skip_special_tokens=True),
                })
    # One case per line: a reviewable diff when the pinned version moves.
    head = {"generator": "scripts/make_tokenizer_fixtures.py", "tokenizers": PINNED}
    lines = [json.dumps(head, ensure_ascii=False)[:-1] + ',\n "texts": [']
    lines += [" " + json.dumps({"name": n, "text": t}, ensure_ascii=False) + ("," if i + 1 < len(texts) else "")
              for i, (n, t) in enumerate(texts)]
    lines += ' ],\n "cases": ['.split("\n")
    lines += [" " + json.dumps(c, ensure_ascii=False) + ("," if i + 1 < len(cases) else "") for i, c in enumerate(cases)]
    lines += [" ]", "}"]
    (OUT / "cases.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} cases for 3 tokenizers to {OUT}")


if __name__ == "__main__":
    main()
