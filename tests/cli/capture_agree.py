#!/usr/bin/env python3
"""A float64 external node's capture against the oracle's (cpu-ref) capture:
same seeded inputs, same routing; only the summation order and libm differ.
Every value tensor within REL of the reference (max|d| / max|ref|), every id
tensor equal row by row as sets. Prints a line per tensor; exit 1 on any miss.

Usage: capture_agree.py REF.safetensors GOT.safetensors [--rel 1e-11]
(the tests' Python: numpy; run from the repo root)."""
import argparse
import sys

sys.path.insert(0, "scripts")
import numpy as np  # noqa: E402
import capture_format as c  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("ref")
ap.add_argument("got")
ap.add_argument("--rel", type=float, default=1e-11)
a = ap.parse_args()
_, ref = c.read_capture(a.ref)
_, got = c.read_capture(a.got)
bad = 0
for name in sorted(got):
    g, r = np.asarray(got[name]), np.asarray(ref.get(name))
    if name.endswith(".ids"):
        ok = all(set(x) == set(y) for x, y in zip(g.tolist(), r.tolist()))
        print(f"{name}: ids {'equal as sets' if ok else 'DIFFER'}")
    else:
        g, r = g.astype(np.float64), r.astype(np.float64)
        rel = float(np.max(np.abs(g - r)) / np.max(np.abs(r)))
        ok = g.shape == r.shape and rel <= a.rel
        print(f"{name}: max|d|/max|ref| {rel:.2e}")
    bad += not ok
sys.exit(1 if bad else 0)
