#!/usr/bin/env python3
"""Helpers of tests/cli/test_llamacpp_node.sh for llama-perplexity's statistics (not a test itself).

  llamacpp_kld_check.py protocol BASE.kld OUT_DIR BOS
      the token stream llama-perplexity evaluated (its --kl-divergence-base file holds it; the first token of
      every chunk replaced by BOS, as llama-perplexity feeds it) → OUT_DIR/tokens.txt, and a protocol running
      only step 6 on it in llama-perplexity's windows: OUT_DIR/kld.json
  llamacpp_kld_check.py compare LLAMA_PERPLEXITY_STDOUT COMPARE.json NODE
      every figure llama-perplexity printed equals kvasir's (perplexity step, llamacpp_kl_divergence of NODE)
      to the digits it printed
"""
import hashlib
import json
import re
import struct
import sys
from pathlib import Path


def protocol(kld_path, out_dir, bos):
    raw = Path(kld_path).read_bytes()
    assert raw[:8] == b"_logits_", "not a llama-perplexity --kl-divergence-base file"
    n_ctx, n_vocab, n_chunk = struct.unpack_from("<Iii", raw, 8)
    tokens = list(struct.unpack_from(f"<{n_ctx * n_chunk}i", raw, 20))
    for c in range(n_chunk):
        tokens[c * n_ctx] = bos
    out = Path(out_dir)
    text = " ".join(str(t) for t in tokens) + "\n"
    (out / "tokens.txt").write_text(text)
    doc = {
        "format": "kvasir-equiv/protocol/1", "id": "llamacpp-kld", "version": 1,
        "description": "step 6 as llama-perplexity --kl-divergence runs it (tests/cli/test_llamacpp_node.sh)",
        "reference": "cpu-ref", "seed": 1,
        "steps": {"perplexity": {
            "tokens": {"path": "tokens.txt", "sha256": hashlib.sha256(text.encode()).hexdigest(), "offset": 0,
                       "count": len(tokens)},
            "context": n_ctx, "score": "second_half", "kl_divergence": {"base_rounding": "llamacpp-u16"}}},
        "tiers": {"sensitive": {"perplexity.ratio_max": {"value": 1.0, "why": "test"}},
                  "tolerant": {"perplexity.ratio_max": {"value": 1.0, "why": "test"}}},
    }
    (out / "kld.json").write_text(json.dumps(doc, indent=1))
    print(f"{n_chunk} chunks of {n_ctx} tokens, vocabulary {n_vocab}")


NUM = r"(-?[0-9.]+)"
PATTERNS = {  # llama-perplexity's line → (kvasir key, value or uncertainty, scale, decimals printed)
    rf"Mean PPL\(Q\)\s*:\s*{NUM} ±\s*{NUM}": ("Mean PPL(Q)", 1, 6),
    rf"Mean PPL\(base\)\s*:\s*{NUM} ±\s*{NUM}": ("Mean PPL(base)", 1, 6),
    rf"Cor\(ln\(PPL\(Q\)\), ln\(PPL\(base\)\)\):\s*{NUM}%": ("Cor(ln(PPL(Q)), ln(PPL(base)))", 100, 2),
    rf"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s*{NUM} ±\s*{NUM}": ("Mean ln(PPL(Q)/PPL(base))", 1, 6),
    rf"Mean PPL\(Q\)/PPL\(base\)\s*:\s*{NUM} ±\s*{NUM}": ("Mean PPL(Q)/PPL(base)", 1, 6),
    rf"Mean PPL\(Q\)-PPL\(base\)\s*:\s*{NUM} ±\s*{NUM}": ("Mean PPL(Q)-PPL(base)", 1, 6),
    rf"Mean    KLD:\s*{NUM} ±\s*{NUM}": ("Mean KLD", 1, 6),
    rf"Maximum KLD:\s*{NUM}": ("Maximum KLD", 1, 6),
    rf"99.9%   KLD:\s*{NUM}": ("99.9% KLD", 1, 6),
    rf"99.0%   KLD:\s*{NUM}": ("99.0% KLD", 1, 6),
    rf"95.0%   KLD:\s*{NUM}": ("95.0% KLD", 1, 6),
    rf"90.0%   KLD:\s*{NUM}": ("90.0% KLD", 1, 6),
    rf"Median  KLD:\s*{NUM}": ("Median KLD", 1, 6),
    rf"10.0%   KLD:\s*{NUM}": ("10.0% KLD", 1, 6),
    rf" 5.0%   KLD:\s*{NUM}": ("5.0% KLD", 1, 6),
    rf" 1.0%   KLD:\s*{NUM}": ("1.0% KLD", 1, 6),
    rf" 0.1%   KLD:\s*{NUM}": ("0.1% KLD", 1, 6),
    rf"Minimum KLD:\s*{NUM}": ("Minimum KLD", 1, 6),
    rf"Mean    Δp:\s*{NUM} ±\s*{NUM} %": ("Mean Δp", 100, 3),
    rf"Maximum Δp:\s*{NUM}%": ("Maximum Δp", 100, 3),
    rf"99.9%   Δp:\s*{NUM}%": ("99.9% Δp", 100, 3),
    rf"99.0%   Δp:\s*{NUM}%": ("99.0% Δp", 100, 3),
    rf"95.0%   Δp:\s*{NUM}%": ("95.0% Δp", 100, 3),
    rf"90.0%   Δp:\s*{NUM}%": ("90.0% Δp", 100, 3),
    rf"75.0%   Δp:\s*{NUM}%": ("75.0% Δp", 100, 3),
    rf"Median  Δp:\s*{NUM}%": ("Median Δp", 100, 3),
    rf"25.0%   Δp:\s*{NUM}%": ("25.0% Δp", 100, 3),
    rf"10.0%   Δp:\s*{NUM}%": ("10.0% Δp", 100, 3),
    rf" 5.0%   Δp:\s*{NUM}%": ("5.0% Δp", 100, 3),
    rf" 1.0%   Δp:\s*{NUM}%": ("1.0% Δp", 100, 3),
    rf" 0.1%   Δp:\s*{NUM}%": ("0.1% Δp", 100, 3),
    rf"Minimum Δp:\s*{NUM}%": ("Minimum Δp", 100, 3),
    rf"RMS Δp    :\s*{NUM} ±\s*{NUM} %": ("RMS Δp", 100, 3),
    rf"Same top p:\s*{NUM} ±\s*{NUM} %": ("Same top p", 100, 3),
}


def compare(stdout_path, report_path, node):
    text = Path(stdout_path).read_text(encoding="utf-8", errors="replace")
    text = text[text.index("====== Perplexity statistics ======"):]
    d = json.loads(Path(report_path).read_text())
    res = [e for e in d["steps"]["perplexity"]["results"] if e["node"] == node][0]["llamacpp_kl_divergence"]
    bad, n = [], 0
    for pat, (key, scale, decimals) in PATTERNS.items():
        m = re.search(pat, text)
        if not m:
            bad.append(f"llama-perplexity printed no line for {key!r}")
            continue
        ours = res[key]
        pairs = [(m.group(1), ours["value"] if isinstance(ours, dict) else ours)]
        if m.lastindex == 2:
            pairs.append((m.group(2), ours["uncertainty"]))
        for printed, value in pairs:
            n += 1
            # equal to the printed digits: within half a unit of the last one, plus llama.cpp's f32 per-token terms
            # (~1e-6 relative of the value)
            tol = 0.5 * 10 ** -decimals + 2e-6 * abs(float(printed))
            if abs(scale * float(value) - float(printed)) > tol:
                bad.append(f"{key}: llama-perplexity {printed}, kvasir {scale * float(value):.9g} (tolerance {tol:.2g})")
    for b in bad:
        print("MISMATCH:", b)
    print(f"{n - len(bad)} of {n} figures equal to llama-perplexity's printed digits")
    return 0 if not bad and n > 0 else 1


if __name__ == "__main__":
    if sys.argv[1] == "protocol":
        protocol(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(compare(sys.argv[2], sys.argv[3], sys.argv[4]))
