#!/usr/bin/env python3
"""A float64 external node's capture against the oracle's (cpu-ref) capture:
same seeded inputs, same routing; only the summation order and libm differ.
Every value tensor within REL of the reference (max|d| / max|ref|), every id
tensor equal row by row as sets. Prints a line per tensor; exit 1 on any miss.

With --bits: every tensor of both captures equal byte for byte, and the same
tensor names (two machines whose node promises the same bits, e.g. the cpu
node on x86-64 and on AArch64).

Usage: capture_agree.py REF.safetensors GOT.safetensors [--rel 1e-11 | --bits]
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
ap.add_argument("--bits", action="store_true")
a = ap.parse_args()
_, ref = c.read_capture(a.ref)
_, got = c.read_capture(a.got)
bad = 0
if a.bits:
    for name in sorted(set(got) | set(ref)):
        if name not in got or name not in ref:
            print(f"{name}: only in {'the reference' if name in ref else 'the other'} capture")
            bad += 1
            continue
        g, r = np.asarray(got[name]), np.asarray(ref[name])
        ok = g.dtype == r.dtype and g.shape == r.shape and g.tobytes() == r.tobytes()
        print(f"{name}: {g.dtype}{list(g.shape)} {'same bits' if ok else 'DIFFER'}")
        bad += not ok
    print(f"{len(set(got) | set(ref))} tensors, {bad} differ")
    sys.exit(1 if bad else 0)
for name in sorted(got):
    g, r = np.asarray(got[name]), np.asarray(ref.get(name))
    if name.endswith(".ids"):
        ok = all(set(x) == set(y) for x, y in zip(g.tolist(), r.tolist()))
        print(f"{name}: ids {'equal as sets' if ok else 'DIFFER'}")
    else:
        g, r = g.astype(np.float64), r.astype(np.float64)
        d, m = float(np.max(np.abs(g - r))), float(np.max(np.abs(r)))
        rel = d / m if m > 0 else (0.0 if d == 0 else float("inf"))
        ok = g.shape == r.shape and rel <= a.rel
        print(f"{name}: max|d|/max|ref| {rel:.2e}")
    bad += not ok
sys.exit(1 if bad else 0)
