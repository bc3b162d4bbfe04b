#!/usr/bin/env python3
"""Helper of tests/cli/test_llamacpp_node.sh (not a test itself): the three logit figures of one GGUF —
llama.cpp vs cpu-ref, cpu:qdot=llamacpp vs cpu-ref, cpu:qdot=llamacpp vs llama.cpp (normwise relative over the
protocol's logits positions) — printed as a Markdown row, and the check that qdot agrees with llama.cpp at least
100 times better than either agrees with the f64 oracle.

  qdot_check.py NAME REF.safetensors LLAMACPP.safetensors QDOT.safetensors
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import capture_format  # noqa: E402


def logits(p):
    return np.asarray(capture_format.read_capture(p)[1]["logits.logits"], np.float64)


name, r, l, q = sys.argv[1], logits(sys.argv[2]), logits(sys.argv[3]), logits(sys.argv[4])
rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))  # noqa: E731
lr, qr, ql = rel(l, r), rel(q, r), rel(q, l)
print(f"| {name} | {lr:.2e} | {qr:.2e} | {ql:.2e} |")
sys.exit(0 if ql * 100 <= min(lr, qr) else 1)
