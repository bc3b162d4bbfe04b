#!/usr/bin/env python3
"""Independent reference of kvasir's seeded inputs ("kvasir-rng/1").

Pure standard-library Python: Philox4x32-10, the FNV-1a stream id, the uniform
and Box-Muller normal transforms with the same libm-free log and sin/cos
algorithms as lib/kvasir/core/rng.cpp (the definition is written down in
lib/kvasir/core/rng.hpp). Python floats are IEEE binary64 and never fuse a*b+c,
so the same sequence of operations gives the same bits as the C++ build.

Usage:
  scripts/rng_reference.py            # (re)write fixtures/rng_vectors.json
  scripts/rng_reference.py --check    # fail if the committed file differs
  scripts/rng_reference.py --out FILE

Before writing, the script checks itself: the Random123 known answers for
Philox4x32-10, the published FNV-1a 64 test vectors, that every polynomial
constant is the double nearest its exact value, and that det_log and
det_sincos_2pi agree with math.log/sin/cos to a few ulp.
"""

import argparse
import json
import math
import random
import struct
import sys
from fractions import Fraction
from pathlib import Path

VERSION = "kvasir-rng/1"
MASK32 = 0xFFFFFFFF
MASK64 = 0xFFFFFFFFFFFFFFFF

# --- Philox4x32-10 ----------------------------------------------------------
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85


def philox4x32_10(counter, key):
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for rnd in range(10):
        if rnd:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        p0 = PHILOX_M0 * c0
        p1 = PHILOX_M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32)
    return [c0, c1, c2, c3]


def tensor_stream_id(name):
    h = 0xCBF29CE484222325
    for byte in name.encode("utf-8"):
        h ^= byte
        h = (h * 0x100000001B3) & MASK64
    return h


# --- the libm-free transcendental functions ----------------------------------
# Hex literals, identical to rng.cpp; verify_constants() re-derives each one
# from exact rationals so a typo cannot hide in both files.
X = float.fromhex
SQRT_HALF = X("0x1.6a09e667f3bcdp-1")
LN2_HI = X("0x1.62e42feep-1")
LN2_LO = X("0x1.a39ef35793c76p-33")
LOG_L = [X(h) for h in (
    "0x1.5555555555555p-1", "0x1.999999999999ap-2", "0x1.2492492492492p-2", "0x1.c71c71c71c71cp-3",
    "0x1.745d1745d1746p-3", "0x1.3b13b13b13b14p-3", "0x1.1111111111111p-3", "0x1.e1e1e1e1e1e1ep-4",
    "0x1.af286bca1af28p-4", "0x1.8618618618618p-4", "0x1.642c8590b2164p-4")]
TWO_PI_HEAD = X("0x1.921fap+2")
TWO_PI_TAIL = X("0x1.54442d184698ap-18")
SIN_S = [X(h) for h in (
    "-0x1.4abbce625be53p+5", "0x1.466bc6775aae2p+6", "-0x1.32d2cce62bd86p+6",
    "0x1.50783487ee782p+5", "-0x1.e3074fde8871fp+3", "0x1.e8f434d018d63p+1",
    "-0x1.6fadb9f155744p-1", "0x1.aaec32af93359p-4", "-0x1.8a404211f9547p-7")]
COS_C = [X(h) for h in (
    "-0x1.3bd3cc9be45dep+4", "0x1.03c1f081b5ac4p+6", "-0x1.55d3c7e3cbffap+6", "0x1.e1f506891babbp+5",
    "-0x1.a6d1f2a204a8cp+4", "0x1.f9d38a3763cc3p+2", "-0x1.b6e24f44b128fp+0", "0x1.20c62c2f2d7f5p-2",
    "-0x1.2a0c591af8314p-5", "0x1.ef6e308d6d1c4p-9")]

PI_TEXT = ("3.14159265358979323846264338327950288419716939937510"
           "58209749445923078164062862089986280348253421170679")
LN2_TEXT = ("0.69314718055994530941723212145817656807550013436025"
            "52541206800094933936219696947156058633269964186875")


def det_log(x):
    if math.isnan(x):
        return x
    if x < 0.0:
        return math.nan
    if x == 0.0:
        return -math.inf
    if x == math.inf:
        return x
    m, k = math.frexp(x)  # exact: x = m * 2^k, m in [0.5, 1)
    if m < SQRT_HALF:
        m = m * 2.0
        k -= 1
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    hfsq = 0.5 * f * f
    p = LOG_L[10]
    for j in range(9, -1, -1):
        p = LOG_L[j] + z * p
    r = z * p
    dk = float(k)
    return dk * LN2_HI + (f - (hfsq - (s * (hfsq + r) + dk * LN2_LO)))


def det_sincos_2pi(u):
    """(sin(2 pi u), cos(2 pi u))."""
    q = math.floor(4.0 * u + 0.5)
    qf = float(q)
    f = u - qf * 0.25
    z = f * f
    ps = SIN_S[8]
    for j in range(7, -1, -1):
        ps = SIN_S[j] + z * ps
    sn = f * TWO_PI_HEAD + f * (TWO_PI_TAIL + z * ps)
    pc = COS_C[9]
    for j in range(8, -1, -1):
        pc = COS_C[j] + z * pc
    cs = 1.0 + z * pc
    quadrant = q & 3
    if quadrant == 0:
        return sn, cs
    if quadrant == 1:
        return cs, -sn
    if quadrant == 2:
        return -sn, -cs
    return -cs, sn


# --- streams ------------------------------------------------------------------
def uniform_from_bits(bits):
    return (float(bits) + 0.5) * 2.0 ** -32


def block(seed, stream, b):
    return philox4x32_10([b & MASK32, b >> 32, stream & MASK32, stream >> 32], [seed & MASK32, seed >> 32])


def normals_of_block(bits):
    out = [0.0] * 4
    for pair in range(2):
        ua = uniform_from_bits(bits[2 * pair])
        ub = uniform_from_bits(bits[2 * pair + 1])
        r = math.sqrt(-2.0 * det_log(ua))
        s, c = det_sincos_2pi(ub)
        out[2 * pair] = r * c
        out[2 * pair + 1] = r * s
    return out


class Stream:
    def __init__(self, seed, name):
        self.seed = seed
        self.stream = tensor_stream_id(name)

    def bits(self, i):
        return block(self.seed, self.stream, i // 4)[i % 4]

    def uniform(self, i):
        return uniform_from_bits(self.bits(i))

    def normal(self, i):
        return normals_of_block(block(self.seed, self.stream, i // 4))[i % 4]


# --- rounding a double once to a storage dtype ---------------------------------
def round_binary(x, precision, emin, emax):
    """Nearest value (ties to even) with `precision` significand bits, gradual
    underflow below 2^emin, overflow to inf at 2^(emax+1); exact rationals."""
    if x == 0.0 or not math.isfinite(x):
        return x
    _, e = math.frexp(abs(x))
    exponent = max(e - 1, emin)
    quantum = Fraction(2) ** (exponent - (precision - 1))
    n = round(Fraction(abs(x)) / quantum)  # Fraction rounding is half-to-even
    r = n * quantum
    if r >= Fraction(2) ** (emax + 1):
        return math.copysign(math.inf, x)
    return math.copysign(float(r), x)


def to_dtype_bits(dtype, x):
    """Round x once to dtype; return the stored bit pattern."""
    if dtype == "f64":
        return struct.unpack("<Q", struct.pack("<d", x))[0]
    if dtype == "f32":
        r = round_binary(x, 24, -126, 127)
        return struct.unpack("<I", struct.pack("<f", r))[0]
    if dtype == "f16":
        r = round_binary(x, 11, -14, 15)
        return struct.unpack("<H", struct.pack("<e", r))[0]
    if dtype == "bf16":
        r = round_binary(x, 8, -126, 127)
        return struct.unpack("<I", struct.pack("<f", r))[0] >> 16  # r is exact in f32
    raise ValueError(dtype)


def tensor_bits(kind, seed, name, shape, a, b, dtype):
    n = math.prod(shape)
    st = Stream(seed, name)
    out = []
    for blk in range((n + 3) // 4):
        bits = block(st.seed, st.stream, blk)
        if kind == "normal":
            vals = [a + b * z for z in normals_of_block(bits)]
        else:
            width = b - a
            vals = [a + width * uniform_from_bits(w) for w in bits]
        for lane in range(4):
            if 4 * blk + lane < n:
                out.append(to_dtype_bits(dtype, vals[lane]))
    return out


# --- self checks --------------------------------------------------------------
RANDOM123_KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([MASK32] * 4, [MASK32] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]

FNV1A64_KAT = [("", 0xCBF29CE484222325), ("a", 0xAF63DC4C8601EC8C), ("foobar", 0x85944171F73967E8)]


def check(cond, what):
    if not cond:
        sys.exit(f"rng_reference.py: self-check failed: {what}")


def verify_constants():
    pi = Fraction(PI_TEXT)
    ln2 = Fraction(LN2_TEXT)
    two_pi = 2 * pi
    check(SQRT_HALF == math.sqrt(0.5), "SQRT_HALF")
    check(Fraction(LN2_HI) == Fraction(math.floor(ln2 * 2 ** 32), 2 ** 32), "LN2_HI")
    check(LN2_LO == float(ln2 - Fraction(LN2_HI)), "LN2_LO")
    for j, c in enumerate(LOG_L, start=1):
        check(c == float(Fraction(2, 2 * j + 1)), f"LOG_L[{j}]")
    check(Fraction(TWO_PI_HEAD) == Fraction(math.floor(two_pi * 2 ** 17), 2 ** 17), "TWO_PI_HEAD")
    check(TWO_PI_TAIL == float(two_pi - Fraction(TWO_PI_HEAD)), "TWO_PI_TAIL")
    for j, c in enumerate(SIN_S, start=1):
        n = 2 * j + 1
        check(c == float((-1) ** j * two_pi ** n / math.factorial(n)), f"SIN_S n={n}")
    for j, c in enumerate(COS_C, start=1):
        n = 2 * j
        check(c == float((-1) ** j * two_pi ** n / math.factorial(n)), f"COS_C n={n}")


def ulp_error(got, want):
    if got == want:
        return 0.0
    return abs(got - want) / math.ulp(want)


def verify_transcendentals():
    """Loose agreement with the platform libm (a few ulp); test_rng.cpp measures
    the real accuracy against long double."""
    rng = random.Random(12345)
    worst_log = worst_trig = 0.0
    for _ in range(20000):
        u = uniform_from_bits(rng.getrandbits(32))
        worst_log = max(worst_log, ulp_error(det_log(u), math.log(u)))
        x = math.ldexp(rng.random() + 0.5, rng.randint(-1070, 1020))
        worst_log = max(worst_log, ulp_error(det_log(x), math.log(x)))
        # Reference on the exactly reduced argument (|2 pi f| <= pi/4): rounding
        # 2*pi*u for the full angle would cost math.sin itself many ulp.
        q = math.floor(4.0 * u + 0.5)
        angle = 2.0 * math.pi * (u - q * 0.25)
        rs, rc = math.sin(angle), math.cos(angle)
        want = [(rs, rc), (rc, -rs), (-rs, -rc), (-rc, rs)][q & 3]
        s, c = det_sincos_2pi(u)
        worst_trig = max(worst_trig, ulp_error(s, want[0]), ulp_error(c, want[1]))
    check(worst_log <= 2.0, f"det_log vs math.log: {worst_log:.2f} ulp")
    check(worst_trig <= 4.0, f"det_sincos_2pi vs math.sin/cos: {worst_trig:.2f} ulp")
    return worst_log, worst_trig


def self_check():
    for counter, key, want in RANDOM123_KAT:
        check(philox4x32_10(counter, key) == want, f"Philox4x32-10 known answer for counter {counter}")
    for name, want in FNV1A64_KAT:
        check(tensor_stream_id(name) == want, f"FNV-1a 64 of {name!r}")
    verify_constants()
    return verify_transcendentals()


# --- the fixture ----------------------------------------------------------------
STREAMS = [
    (0, ""),
    (1, "x"),
    (0x0123456789ABCDEF, "model.layers.0.mlp.experts.17.down_proj.weight"),
    (0xFFFFFFFFFFFFFFFF, "émbed·tökens ✓"),
]
FIRST = 64
# Far indices exercise the high counter word (b >> 32) and the last block.
FAR_INDICES = [1_000_003, 4 * 2 ** 32 + 2, 0xDEADBEEFCAFE, MASK64]

TENSORS = [
    # kind, seed, name, shape, (mean, stddev) or (lo, hi), dtype
    ("normal", 42, "x", [3, 7], 0.0, 1.0, "f32"),
    ("normal", 7, "blk.0.ffn_gate.weight", [5, 5], 0.25, 0.02, "f32"),
    ("normal", 7, "blk.0.ffn_gate.weight", [6], 0.25, 0.02, "f64"),
    ("normal", 3, "h", [2, 9], -1.5, 3.0, "f16"),
    ("normal", 3, "h", [2, 9], -1.5, 3.0, "bf16"),
    ("uniform", 99, "router.bias", [11], -0.5, 2.0, "f32"),
    ("uniform", 99, "router.bias", [11], -0.5, 2.0, "f16"),
]
HEX_DIGITS = {"f64": 16, "f32": 8, "f16": 4, "bf16": 4}


def log_points():
    """Edges of det_log's reduction (both sides of the sqrt(1/2) boundary, in
    several binades), the ends of the uniform grid, subnormals, huge values,
    and a fixed pseudo-random spread."""
    pts = [2.0 ** -1074, 3 * 2.0 ** -1074, X("0x1.fffffffffffffp-1023"), 2.0 ** -1022, 2.0 ** -33,
           1.0 - 2.0 ** -33, 0.5, 1.0 - 2.0 ** -53, 1.0, 1.0 + 2.0 ** -52, 2.0, 3.0, 10.0, 1e300,
           X("0x1.fffffffffffffp+1023")]
    for k in (0, -1, -33, 1, 700):
        for j in range(-6, 7):
            pts.append(math.ldexp(SQRT_HALF + j * 2.0 ** -53, k))
    rng = random.Random(2718)
    pts += [uniform_from_bits(rng.getrandbits(32)) for _ in range(32)]
    pts += [math.ldexp(rng.random() + 0.5, rng.randint(-1074, 1023)) for _ in range(32)]
    return [p for p in pts if p > 0.0]


def sincos_points():
    """Quadrant and octant seams (where the reduction switches) and a spread."""
    pts = [0.0, 1.0, 0.25, 0.5, 0.75]
    for k in range(9):
        for j in (1, 2, 3, 1000):
            pts += [k / 8.0 + j * 2.0 ** -33, k / 8.0 - j * 2.0 ** -33]
    rng = random.Random(31415)
    pts += [uniform_from_bits(rng.getrandbits(32)) for _ in range(32)]
    return [p for p in pts if 0.0 <= p <= 1.0]


def hex32(v):
    return f"0x{v:08x}"


def build():
    doc = {
        "format": VERSION,
        "generator": "scripts/rng_reference.py",
        "definition": "lib/kvasir/core/rng.hpp",
        "philox4x32_10": [
            {"counter": [hex32(c) for c in ctr], "key": [hex32(k) for k in key],
             "output": [hex32(o) for o in philox4x32_10(ctr, key)]}
            for ctr, key, _ in RANDOM123_KAT
        ],
        "det_log": [[x.hex(), det_log(x).hex()] for x in log_points()],
        "det_sincos_2pi": [[u.hex(), *(v.hex() for v in det_sincos_2pi(u))] for u in sincos_points()],
        "streams": [],
        "tensors": [],
    }
    for seed, name in STREAMS:
        st = Stream(seed, name)
        entry = {
            "seed": f"0x{seed:016x}",
            "name": name,
            "stream_id": f"0x{st.stream:016x}",
            "bits": [hex32(st.bits(i)) for i in range(FIRST)],
            "uniform": [st.uniform(i).hex() for i in range(FIRST)],
            "normal": [st.normal(i).hex() for i in range(FIRST)],
            "at": [{"index": f"0x{i:x}", "bits": hex32(st.bits(i)), "uniform": st.uniform(i).hex(),
                    "normal": st.normal(i).hex()} for i in FAR_INDICES],
        }
        doc["streams"].append(entry)
    for kind, seed, name, shape, a, b, dtype in TENSORS:
        width = HEX_DIGITS[dtype]
        entry = {"kind": kind, "seed": f"0x{seed:016x}", "name": name, "shape": shape, "dtype": dtype}
        if kind == "normal":
            entry.update(mean=a.hex(), stddev=b.hex())
        else:
            entry.update(lo=a.hex(), hi=b.hex())
        entry["bits"] = [f"0x{v:0{width}x}" for v in tensor_bits(kind, seed, name, shape, a, b, dtype)]
        doc["tensors"].append(entry)
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def main():
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=root / "fixtures" / "rng_vectors.json")
    ap.add_argument("--check", action="store_true", help="compare with the existing file instead of writing")
    args = ap.parse_args()

    worst_log, worst_trig = self_check()
    text = build()
    if args.check:
        old = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if old != text:
            sys.exit(f"rng_reference.py: {args.out} is out of date; rerun scripts/rng_reference.py")
        print(f"{args.out}: up to date")
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(args.out)
    print(f"wrote {args.out} ({len(text.encode('utf-8'))} bytes); self-checks passed "
          f"(det_log {worst_log:.2f} ulp, det_sincos_2pi {worst_trig:.2f} ulp vs math)")


if __name__ == "__main__":
    main()
