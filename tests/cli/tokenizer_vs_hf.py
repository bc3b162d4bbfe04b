#!/usr/bin/env python3
"""Random multilingual texts through Hugging Face tokenizers and through
`kvasir-equiv tokenize`: the ids (and decoded texts) must be identical.

    tokenizer_vs_hf.py BIN TOKENIZER_JSON... [--texts N] [--seed S]

Texts are drawn (seeded) from pieces of many scripts, digits, punctuation,
whitespace runs, combining marks, emoji sequences and the tokenizer's own
added tokens, so each run covers inputs no fixture lists. Exit 1 on the first
difference, naming the text and the first differing position.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

PIECES = [
    "the", " the", "The", "THE", " quick", "fox", "jumps", "'s", "'LL", "n't", "don't", " I'm",
    "Привет", " мир", "ёжик", "日本語", "の", "テスト", "中文", "字符", "한국어", "\u1112\u1161\u11ab",
    "العربية", " نص", "עברית", "हिन्दी", "ภาษาไทย", "ქართული", "Ελληνικά", "ß", "ﬁ", "Ａ", "１２",
    "e\u0301", "a\u0308", "\u0301", "🙂", "🚀", "👩\u200d👩\u200d👧", "🇩🇪", "👍🏽", "1️⃣",
    "0", "7", "42", "1234", "3.14", "-", "—", "...", "!?", "“", "”", "«", "»", "(", ")", "{", "}", "#", "@", "_", "__",
    " ", "  ", "    ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2009", "\u200b",
    "def ", "return ", "x**2", "<div>", "&amp;", "foo_bar", "<mask>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|begin_of_text|>", "<", "|", ">", "'", '"', "\\", "/",
]


def texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(1, 40)
        out.append("".join(rng.choice(PIECES) for _ in range(k)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("tokenizers", nargs="+")
    ap.add_argument("--texts", type=int, default=40)
    ap.add_argument("--seed", type=int, default=20261202)
    a = ap.parse_args()
    from tokenizers import Tokenizer

    batch = texts(a.seed, a.texts)
    with tempfile.TemporaryDirectory() as d:
        for path in a.tokenizers:
            hf = Tokenizer.from_file(path)
            for i, t in enumerate(batch):
                f = Path(d) / "t.txt"
                f.write_text(t, encoding="utf-8", newline="")
                for special in (True, False):
                    args = [a.bin, "tokenize", "--tokenizer", path, "--text", str(f), "--json"] + ([] if special else ["--no-special"])
                    r = subprocess.run(args, capture_output=True, text=True)
                    if r.returncode != 0:
                        sys.exit(f"FAIL {path} text {i}: kvasir-equiv exit {r.returncode}: {r.stderr.strip()}")
                    ours = json.loads(r.stdout)["ids"]
                    want = hf.encode(t, add_special_tokens=special).ids
                    if ours != want:
                        k = next((j for j, (x, y) in enumerate(zip(ours, want)) if x != y), min(len(ours), len(want)))
                        sys.exit(f"FAIL {path} text {i} {t!r}: ids differ at {k}: ours {ours[k:k+5]}, tokenizers {want[k:k+5]}")
                ids = Path(d) / "ids.txt"
                ids.write_text(" ".join(map(str, want)))
                r = subprocess.run([a.bin, "tokenize", "--tokenizer", path, "--decode", "--text", str(ids), "--json"],
                                   capture_output=True, text=True)
                if r.returncode != 0 or json.loads(r.stdout)["text"] != hf.decode(want, skip_special_tokens=False):
                    sys.exit(f"FAIL {path} text {i} {t!r}: decode differs: {r.stdout[:200]} {r.stderr.strip()}")
            print(f"ok: {Path(path).name}: {len(batch)} random texts, ids with and without special tokens and decode equal tokenizers")


if __name__ == "__main__":
    main()
