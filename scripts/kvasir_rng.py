#!/usr/bin/env python3
"""kvasir's seeded inputs ("kvasir-rng/1"), vectorised with numpy.

The same definition as lib/kvasir/core/rng.hpp and the pure-Python reference
scripts/rng_reference.py, bit for bit: Philox4x32-10 on uint64 lanes holding
32-bit words, FNV-1a 64 stream ids, uniform = (bits + 0.5) * 2^-32, and the
Box-Muller normal with the libm-free det_log / det_sincos_2pi. numpy float64
ufuncs are single IEEE operations (correctly rounded, never fused into an FMA),
so evaluating the same operations in the same order gives the same bits as the
C++ build and as the Python reference.

API (mirrors rng.hpp):
  seeded_normal(seed, name, shape, mean, sd, dtype=np.float32)
      mean + sd * normal(i), in float64, rounded ONCE to dtype
  seeded_uniform(seed, name, shape, lo, hi, dtype=np.float32)
      lo + (hi - lo) * uniform(i), in float64, rounded ONCE to dtype
  dtype: np.float64, np.float32, np.float16, or "bf16" (returns the uint16
  bit patterns: numpy has no bfloat16).
  stream_bits / stream_uniform / stream_normal(seed, name, indices): elements
  at arbitrary flat indices (uint64).

  scripts/kvasir_rng.py --check   replays fixtures/rng_vectors.json (all of it)
                                  and random cases against rng_reference.py;
                                  exits 1 on any mismatch.
"""

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np

VERSION = "kvasir-rng/1"

_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = 0x9E3779B9
_W1 = 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)

_X = float.fromhex
_SQRT_HALF = _X("0x1.6a09e667f3bcdp-1")
_LN2_HI = _X("0x1.62e42feep-1")
_LN2_LO = _X("0x1.a39ef35793c76p-33")
_LOG_L = [_X(h) for h in (
    "0x1.5555555555555p-1", "0x1.999999999999ap-2", "0x1.2492492492492p-2", "0x1.c71c71c71c71cp-3",
    "0x1.745d1745d1746p-3", "0x1.3b13b13b13b14p-3", "0x1.1111111111111p-3", "0x1.e1e1e1e1e1e1ep-4",
    "0x1.af286bca1af28p-4", "0x1.8618618618618p-4", "0x1.642c8590b2164p-4")]
_TWO_PI_HEAD = _X("0x1.921fap+2")
_TWO_PI_TAIL = _X("0x1.54442d184698ap-18")
_SIN_S = [_X(h) for h in (
    "-0x1.4abbce625be53p+5", "0x1.466bc6775aae2p+6", "-0x1.32d2cce62bd86p+6",
    "0x1.50783487ee782p+5", "-0x1.e3074fde8871fp+3", "0x1.e8f434d018d63p+1",
    "-0x1.6fadb9f155744p-1", "0x1.aaec32af93359p-4", "-0x1.8a404211f9547p-7")]
_COS_C = [_X(h) for h in (
    "-0x1.3bd3cc9be45dep+4", "0x1.03c1f081b5ac4p+6", "-0x1.55d3c7e3cbffap+6", "0x1.e1f506891babbp+5",
    "-0x1.a6d1f2a204a8cp+4", "0x1.f9d38a3763cc3p+2", "-0x1.b6e24f44b128fp+0", "0x1.20c62c2f2d7f5p-2",
    "-0x1.2a0c591af8314p-5", "0x1.ef6e308d6d1c4p-9")]
_TWO_M32 = 2.0 ** -32

# Blocks per chunk: large enough to amortise numpy's per-call cost, small
# enough that the temporaries stay in cache.
CHUNK_BLOCKS = 1 << 15


# --- scalar helpers -------------------------------------------------------------
def tensor_stream_id(name):
    """FNV-1a 64 over the UTF-8 bytes of the name."""
    h = 0xCBF29CE484222325
    for byte in name.encode("utf-8"):
        h ^= byte
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


# --- vectorised core ------------------------------------------------------------
def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 over arrays of counters (any integer arrays holding 32-bit
    words; broadcast together) and a scalar key. Returns four uint64 arrays of
    32-bit words."""
    c0 = np.asarray(c0, dtype=np.uint64)
    c1 = np.asarray(c1, dtype=np.uint64)
    c2 = np.asarray(c2, dtype=np.uint64)
    c3 = np.asarray(c3, dtype=np.uint64)
    c0, c1, c2, c3 = np.broadcast_arrays(c0, c1, c2, c3)
    c0, c1, c2, c3 = c0.copy(), c1.copy(), c2.copy(), c3.copy()
    k0 = int(k0) & 0xFFFFFFFF
    k1 = int(k1) & 0xFFFFFFFF
    for rnd in range(10):
        if rnd:
            k0 = (k0 + _W0) & 0xFFFFFFFF
            k1 = (k1 + _W1) & 0xFFFFFFFF
        p0 = c0 * _M0  # < 2^64: exact in uint64
        p1 = c2 * _M1
        n0 = p1 >> _SHIFT32
        n0 ^= c1
        n0 ^= np.uint64(k0)
        n2 = p0 >> _SHIFT32
        n2 ^= c3
        n2 ^= np.uint64(k1)
        p1 &= _MASK32
        p0 &= _MASK32
        c0, c1, c2, c3 = n0, p1, n2, p0
    return c0, c1, c2, c3


def _blocks(seed, stream, b):
    """The four words of blocks b (uint64 array) of one stream."""
    b = np.asarray(b, dtype=np.uint64)
    s0 = np.uint64(stream & 0xFFFFFFFF)
    s1 = np.uint64(stream >> 32)
    return philox4x32_10(b & _MASK32, b >> _SHIFT32, s0, s1, seed & 0xFFFFFFFF, seed >> 32)


def uniform_from_bits(bits):
    """(bits + 0.5) * 2^-32 in float64 (exact)."""
    u = np.asarray(bits, dtype=np.uint64).astype(np.float64)
    u += 0.5
    u *= _TWO_M32
    return u


def det_log(x):
    """det_log of rng.hpp for any float64 array (all doubles, specials included)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m, k = np.frexp(x)  # exact, subnormals included: x = m * 2^k, m in [0.5, 1)
        below = m < _SQRT_HALF
        m = np.where(below, m * 2.0, m)
        dk = k.astype(np.float64) - below.astype(np.float64)  # small integers: exact
        f = m - 1.0
        s = f / (2.0 + f)
        z = s * s
        hfsq = 0.5 * f
        hfsq *= f
        p = np.full_like(z, _LOG_L[10])
        for j in range(9, -1, -1):
            p *= z
            p += _LOG_L[j]
        r = z * p
        # dk*LN2_HI + (f - (hfsq - (s*(hfsq + r) + dk*LN2_LO)))
        t = hfsq + r
        t *= s
        t += dk * _LN2_LO
        t = hfsq - t
        t = f - t
        out = dk * _LN2_HI
        out += t
        special = ~(np.isfinite(x) & (x > 0.0))
        if special.any():
            out = np.where(np.isnan(x), x, out)
            out = np.where(x < 0.0, np.nan, out)
            out = np.where(x == 0.0, -np.inf, out)
            out = np.where(x == np.inf, np.inf, out)
    return out


def det_sincos_2pi(u):
    """(sin(2 pi u), cos(2 pi u)) of rng.hpp for a float64 array u in [0, 1]."""
    u = np.asarray(u, dtype=np.float64)
    q = np.floor(4.0 * u + 0.5)
    f = u - q * 0.25
    z = f * f
    ps = np.full_like(z, _SIN_S[8])
    for j in range(7, -1, -1):
        ps *= z
        ps += _SIN_S[j]
    # sn = f*H + f*(T + z*ps)
    ps *= z
    ps += _TWO_PI_TAIL
    ps *= f
    sn = f * _TWO_PI_HEAD
    sn += ps
    pc = np.full_like(z, _COS_C[9])
    for j in range(8, -1, -1):
        pc *= z
        pc += _COS_C[j]
    pc *= z
    cs = pc + 1.0  # 1 + z*pc (addition commutes exactly)
    qi = q.astype(np.int64) & 3
    swap = (qi & 1) != 0
    s = np.where(swap, cs, sn)
    c = np.where(swap, sn, cs)
    s = np.where((qi & 2) != 0, -s, s)
    c = np.where(((qi + 1) & 2) != 0, -c, c)  # quadrants 1 and 2 negate cos
    return s, c


def _normals_from_words(w0, w1, w2, w3):
    """Box-Muller on the lane pairs (0,1) and (2,3): [nblocks, 4] float64."""
    out = np.empty((w0.shape[0], 4), dtype=np.float64)
    for pair, (wa, wb) in enumerate(((w0, w1), (w2, w3))):
        ua = uniform_from_bits(wa)
        ub = uniform_from_bits(wb)
        lr = det_log(ua)
        lr *= -2.0
        r = np.sqrt(lr)
        s, c = det_sincos_2pi(ub)
        out[:, 2 * pair] = r * c
        out[:, 2 * pair + 1] = r * s
    return out


def _round_half_bits(x, mant, bias):
    """rng_detail::f16_bits / bf16_bits: float64 -> 16-bit pattern, one RNE
    rounding (gradual underflow, overflow to infinity). NaN not handled."""
    b = np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)
    sign = ((b >> np.uint64(48)) & np.uint64(0x8000)).astype(np.uint64)
    e = ((b >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64) - 1023
    inf = np.uint64((2 * bias + 1) << mant)
    shift = (52 - mant) + np.maximum(0, (1 - bias) - e)
    zero = shift > 53
    shift_c = np.minimum(shift, 53).astype(np.uint64)
    sig = (b & np.uint64(0x000FFFFFFFFFFFFF)) | np.uint64(0x0010000000000000)
    q = sig >> shift_c
    rem = sig & ((np.uint64(1) << shift_c) - np.uint64(1))
    half = np.uint64(1) << (shift_c - np.uint64(1))
    up = (rem > half) | ((rem == half) & ((q & np.uint64(1)) == np.uint64(1)))
    q = q + up.astype(np.uint64)
    normal = e >= 1 - bias
    exp_field = np.where(normal, e + bias - 1, 0).astype(np.uint64)
    mag = np.where(normal, (exp_field << np.uint64(mant)) + q, q)
    mag = np.where(zero, np.uint64(0), mag)
    mag = np.where(e > bias, inf, mag)
    # float64 zero/subnormal inputs: below half the smallest 16-bit subnormal
    mag = np.where(e == -1023, np.uint64(0), mag)
    return (sign | mag).astype(np.uint16)


def _normalise_dtype(dtype):
    if isinstance(dtype, str) and dtype.lower() in ("bf16", "bfloat16"):
        return "bf16"
    if isinstance(dtype, str) and dtype.lower() in ("f64", "f32", "f16"):
        dtype = {"f64": np.float64, "f32": np.float32, "f16": np.float16}[dtype.lower()]
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16)):
        raise ValueError(f"dtype {dtype!r} is not a float type (f64, f32, f16, bf16)")
    return dt


def _store(v, dt):
    if dt == "bf16":
        return _round_half_bits(v, 7, 127)
    if dt == np.dtype(np.float16):
        return _round_half_bits(v, 10, 15).view(np.float16)
    return v.astype(dt)  # float64 -> float32 is IEEE RNE: one rounding


def _generate(kind, seed, name, shape, a, scale, dtype, chunk_blocks):
    seed = int(seed)
    if not 0 <= seed < 2 ** 64:
        raise ValueError(f"seed {seed} outside 0..2^64-1")
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(d) for d in shape)
    dt = _normalise_dtype(dtype)
    n = math.prod(shape)
    out = np.empty(n, dtype=np.uint16 if dt == "bf16" else dt)
    stream = tensor_stream_id(name)
    nblocks = (n + 3) // 4
    a = float(a)
    scale = float(scale)
    for b0 in range(0, nblocks, chunk_blocks):
        b1 = min(nblocks, b0 + chunk_blocks)
        w = _blocks(seed, stream, np.arange(b0, b1, dtype=np.uint64))
        if kind == "normal":
            v = _normals_from_words(*w)
        else:
            v = np.stack([uniform_from_bits(x) for x in w], axis=1)
        v *= scale
        v += a  # a + scale*z: addition commutes exactly
        v = v.reshape(-1)
        e0 = 4 * b0
        e1 = min(n, 4 * b1)
        out[e0:e1] = _store(v[: e1 - e0], dt)
    return out.reshape(shape)


def seeded_normal(seed, name, shape, mean, sd, dtype=np.float32, chunk_blocks=CHUNK_BLOCKS):
    """Tensor of shape `shape`: element i = mean + sd * normal(i) in float64,
    rounded once to dtype. Bit-identical to kvasir::seeded_normal."""
    if not (math.isfinite(mean) and math.isfinite(sd)):
        raise ValueError(f"seeded_normal for tensor '{name}': mean {mean} and stddev {sd} must be finite")
    return _generate("normal", seed, name, shape, mean, sd, dtype, chunk_blocks)


def seeded_uniform(seed, name, shape, lo, hi, dtype=np.float32, chunk_blocks=CHUNK_BLOCKS):
    """Tensor of shape `shape`: element i = lo + (hi - lo) * uniform(i) in
    float64, rounded once to dtype. Bit-identical to kvasir::seeded_uniform."""
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise ValueError(f"seeded_uniform for tensor '{name}': bounds [{lo}, {hi}] must be finite with lo <= hi")
    width = float(hi) - float(lo)
    if not math.isfinite(width):
        raise ValueError(f"seeded_uniform for tensor '{name}': width of [{lo}, {hi}] overflows")
    return _generate("uniform", seed, name, shape, lo, width, dtype, chunk_blocks)


def stream_bits(seed, name, indices):
    """bits(i) of the stream for a uint64 array of flat indices."""
    i = np.asarray(indices, dtype=np.uint64)
    w = _blocks(int(seed), tensor_stream_id(name), i >> np.uint64(2))
    lane = (i & np.uint64(3)).astype(np.int64)
    return np.choose(lane, w).astype(np.uint32)


def stream_uniform(seed, name, indices):
    return uniform_from_bits(stream_bits(seed, name, indices))


def stream_normal(seed, name, indices):
    i = np.asarray(indices, dtype=np.uint64).reshape(-1)
    w = _blocks(int(seed), tensor_stream_id(name), i >> np.uint64(2))
    z = _normals_from_words(*w)
    return z[np.arange(i.shape[0]), (i & np.uint64(3)).astype(np.int64)]


# --- the check --------------------------------------------------------------------
def _bits_of(arr, dtype_name):
    if dtype_name == "f64":
        return [int(v) for v in np.asarray(arr, dtype=np.float64).view(np.uint64).reshape(-1)]
    if dtype_name == "f32":
        return [int(v) for v in np.asarray(arr, dtype=np.float32).view(np.uint32).reshape(-1)]
    if dtype_name == "f16":
        return [int(v) for v in np.asarray(arr, dtype=np.float16).view(np.uint16).reshape(-1)]
    return [int(v) for v in np.asarray(arr, dtype=np.uint16).reshape(-1)]


class _Checker:
    def __init__(self):
        self.failures = 0
        self.checked = 0

    def eq(self, got, want, what):
        self.checked += 1
        if got != want:
            self.failures += 1
            if self.failures <= 20:
                print(f"MISMATCH {what}: got {got!r} want {want!r}", file=sys.stderr)


def check_fixture(path, ck):
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    ck.eq(doc["format"], VERSION, "fixture format")
    for kat in doc["philox4x32_10"]:
        c = [int(v, 16) for v in kat["counter"]]
        k = [int(v, 16) for v in kat["key"]]
        got = [int(w[0]) for w in philox4x32_10(*[np.array([v]) for v in c], k[0], k[1])]
        ck.eq(got, [int(v, 16) for v in kat["output"]], f"philox {kat['counter']}")
    xs = np.array([float.fromhex(x) for x, _ in doc["det_log"]])
    got = det_log(xs)
    for x, g, (_, want) in zip(xs, got, doc["det_log"]):
        ck.eq(float(g).hex(), float.fromhex(want).hex(), f"det_log({float(x).hex()})")
    us = np.array([float.fromhex(e[0]) for e in doc["det_sincos_2pi"]])
    s, c = det_sincos_2pi(us)
    for u, gs, gc, e in zip(us, s, c, doc["det_sincos_2pi"]):
        ck.eq((float(gs).hex(), float(gc).hex()),
              (float.fromhex(e[1]).hex(), float.fromhex(e[2]).hex()), f"det_sincos_2pi({float(u).hex()})")
    for st in doc["streams"]:
        seed = int(st["seed"], 16)
        name = st["name"]
        ck.eq(tensor_stream_id(name), int(st["stream_id"], 16), f"stream id of {name!r}")
        idx = np.arange(len(st["bits"]), dtype=np.uint64)
        ck.eq([int(v) for v in stream_bits(seed, name, idx)], [int(v, 16) for v in st["bits"]], f"bits {name!r}")
        ck.eq([float(v).hex() for v in stream_uniform(seed, name, idx)],
              [float.fromhex(v).hex() for v in st["uniform"]], f"uniform {name!r}")
        ck.eq([float(v).hex() for v in stream_normal(seed, name, idx)],
              [float.fromhex(v).hex() for v in st["normal"]], f"normal {name!r}")
        for at in st["at"]:
            i = np.array([int(at["index"], 16)], dtype=np.uint64)
            ck.eq(int(stream_bits(seed, name, i)[0]), int(at["bits"], 16), f"bits {name!r}@{at['index']}")
            ck.eq(float(stream_uniform(seed, name, i)[0]).hex(), float.fromhex(at["uniform"]).hex(),
                  f"uniform {name!r}@{at['index']}")
            ck.eq(float(stream_normal(seed, name, i)[0]).hex(), float.fromhex(at["normal"]).hex(),
                  f"normal {name!r}@{at['index']}")
    for t in doc["tensors"]:
        seed = int(t["seed"], 16)
        dtn = t["dtype"]
        dt = {"f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": "bf16"}[dtn]
        if t["kind"] == "normal":
            arr = seeded_normal(seed, t["name"], t["shape"], float.fromhex(t["mean"]), float.fromhex(t["stddev"]), dt)
        else:
            arr = seeded_uniform(seed, t["name"], t["shape"], float.fromhex(t["lo"]), float.fromhex(t["hi"]), dt)
        ck.eq(list(arr.shape), list(t["shape"]), f"tensor shape {t['name']!r}")
        ck.eq(_bits_of(arr, dtn), [int(v, 16) for v in t["bits"]], f"tensor {t['kind']} {t['name']!r} {dtn}")


def check_against_reference(ck, cases, rng_seed):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import rng_reference as ref  # noqa: E402 (the stdlib-only reference next to this file)

    rnd = random.Random(rng_seed)
    names = ["", "x", "ops/moe/expert3.gate", "ops/router_sigmoid/bias", "émbed·tökens ✓", "a/b/c" * 7]
    for case in range(cases):
        seed = rnd.choice([0, 1, 20261129, 2 ** 64 - 1, rnd.getrandbits(64)])
        name = rnd.choice(names + [f"t{rnd.getrandbits(20)}"])
        shape = [rnd.randint(1, 5) for _ in range(rnd.randint(1, 3))]
        dtn = rnd.choice(["f64", "f32", "f16", "bf16"])
        dt = {"f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": "bf16"}[dtn]
        chunk = rnd.choice([1, 2, 3, CHUNK_BLOCKS])  # chunk boundaries must not matter
        if rnd.random() < 0.7:
            mean = rnd.choice([0.0, 1.0, -1.5, rnd.uniform(-10, 10)])
            sd = rnd.choice([1.0, 0.1, 2.0, 1.0 / math.sqrt(rnd.choice([64, 512, 2048, 768])), rnd.uniform(0, 5)])
            got = seeded_normal(seed, name, shape, mean, sd, dt, chunk_blocks=chunk)
            want = ref.tensor_bits("normal", seed, name, shape, mean, sd, dtn)
            what = f"case {case}: normal seed={seed} name={name!r} shape={shape} mean={mean!r} sd={sd!r} {dtn}"
        else:
            lo = rnd.uniform(-5, 1)
            hi = lo + rnd.uniform(0, 4)
            got = seeded_uniform(seed, name, shape, lo, hi, dt, chunk_blocks=chunk)
            want = ref.tensor_bits("uniform", seed, name, shape, lo, hi, dtn)
            what = f"case {case}: uniform seed={seed} name={name!r} shape={shape} [{lo!r},{hi!r}] {dtn}"
        ck.eq(_bits_of(got, dtn), want, what)
    # Random single indices across the whole 64-bit counter range.
    for case in range(cases):
        seed = rnd.getrandbits(64)
        name = rnd.choice(names)
        idx = [rnd.getrandbits(rnd.choice([8, 33, 64])) for _ in range(4)]
        st = ref.Stream(seed, name)
        a = np.array(idx, dtype=np.uint64)
        ck.eq([int(v) for v in stream_bits(seed, name, a)], [st.bits(i) for i in idx], f"bits at {idx}")
        ck.eq([float(v).hex() for v in stream_normal(seed, name, a)], [st.normal(i).hex() for i in idx],
              f"normal at {idx}")
    # det_log over the whole double range and det_sincos on the uniform grid.
    xs = [math.ldexp(rnd.random() + 0.5, rnd.randint(-1074, 1023)) for _ in range(4000)]
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    got = det_log(np.array(xs))
    ck.eq([float(v).hex() for v in got], [ref.det_log(x).hex() for x in xs], "det_log random doubles")
    us = [(rnd.getrandbits(32) + 0.5) * 2.0 ** -32 for _ in range(4000)] + [0.0, 1.0, 0.125, 0.375, 0.625, 0.875]
    s, c = det_sincos_2pi(np.array(us))
    ck.eq([(float(a).hex(), float(b).hex()) for a, b in zip(s, c)],
          [tuple(v.hex() for v in ref.det_sincos_2pi(u)) for u in us], "det_sincos_2pi random uniforms")


def check_chunking(ck):
    """A tensor over several chunks equals one generated block by block."""
    a = seeded_normal(7, "ops/moe/expert0.gate", (3, 4097), 0.0, 0.03, np.float32)
    b = seeded_normal(7, "ops/moe/expert0.gate", (3, 4097), 0.0, 0.03, np.float32, chunk_blocks=5)
    ck.eq(a.tobytes() == b.tobytes(), True, "chunking independence (normal)")
    a = seeded_uniform(7, "u", (10001,), -1.0, 3.0, np.float64)
    b = seeded_uniform(7, "u", (10001,), -1.0, 3.0, np.float64, chunk_blocks=7)
    ck.eq(a.tobytes() == b.tobytes(), True, "chunking independence (uniform)")


def main():
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="replay fixtures/rng_vectors.json and random cases against rng_reference.py")
    ap.add_argument("--fixture", type=Path, default=root / "fixtures" / "rng_vectors.json")
    ap.add_argument("--cases", type=int, default=300, help="random cases against the reference (--check)")
    ap.add_argument("--random-seed", type=int, default=None, help="seed of the random cases (default: time)")
    ap.add_argument("--bench", type=int, default=0, metavar="N", help="time N normals in float32")
    args = ap.parse_args()
    if args.bench:
        t0 = time.perf_counter()
        x = seeded_normal(1, "bench", (args.bench,), 0.0, 1.0, np.float32)
        dt = time.perf_counter() - t0
        print(f"{args.bench} normals in {dt:.2f} s ({args.bench / dt / 1e6:.1f} M/s), mean {float(x.mean()):.4f}")
        return 0
    if not args.check:
        ap.print_help()
        return 0
    rs = args.random_seed if args.random_seed is not None else int(time.time())
    ck = _Checker()
    check_fixture(args.fixture, ck)
    n_fixture = ck.checked
    check_chunking(ck)
    check_against_reference(ck, args.cases, rs)
    if ck.failures:
        print(f"kvasir_rng.py --check: {ck.failures} of {ck.checked} checks FAILED (random seed {rs})", file=sys.stderr)
        return 1
    print(f"kvasir_rng.py --check: OK, {ck.checked} checks bit-identical ({n_fixture} from {args.fixture.name}, "
          f"the rest against rng_reference.py, random seed {rs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
