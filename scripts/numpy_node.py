#!/usr/bin/env python3
"""An external node: protocol step 1 ("ops") computed with numpy, written as a
kvasir-equiv capture (protocols/CAPTURE.md) for `kvasir-equiv compare`.

  scripts/numpy_node.py --protocol protocols/ci.json -o numpy.safetensors
  scripts/numpy_node.py -p protocols/default.json -o numpy64.safetensors --dtype float64

Inputs are regenerated from the protocol's seed with kvasir's counter RNG
(scripts/kvasir_rng.py, bit-identical to lib/kvasir/core/rng.cpp) exactly as
lib/kvasir/steps/op_delta.cpp draws them with "weights": "seeded"; every op of
the protocol's list then runs in numpy in the chosen dtype (default float32,
what a numpy user would run). The MoE block's routing is pinned by the
reference (cpu-ref, f64), recomputed here in float64: softmax router, top-k
with ties to the lower expert id, weights renormalised over the chosen. The
Gated DeltaNet ops (causal_conv1d, gated_delta) continue a decode from a seeded
conv history and recurrent state, as lib/kvasir/backend/linear_attention.hpp
defines them.

Needs only python3 and numpy; the `safetensors` package is used when present.
Exit codes: 0 written, 2 bad usage or a protocol this node cannot run.
"""

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import capture_format  # noqa: E402
import kvasir_rng  # noqa: E402

ALL_OPS = ["matmul", "swiglu", "softmax", "rmsnorm", "rope_neox", "rope_normal", "rope_yarn", "router_softmax", "router_sigmoid",
           "moe", "causal_conv1d", "gated_delta", "attention", "attention_sinks", "clamped_swiglu"]


class UsageError(Exception):
    pass


# --- the protocol's step 1 ---------------------------------------------------------
class OpsSpec:
    """steps.ops of a protocol document, as Protocol::ops_config() reads it."""

    def __init__(self, doc, seed_override=None):
        steps = doc.get("steps", {})
        if "ops" not in steps:
            raise UsageError("the protocol has no steps.ops: nothing for an ops-only node to compute")
        o = steps["ops"]
        if o.get("weights") != "seeded":
            raise UsageError(f"steps.ops.weights is {o.get('weights')!r}: this node computes only "
                             "\"weights\": \"seeded\" (model weights are not read here)")
        s = o["shapes"]
        self.seed = int(doc["seed"]) if seed_override is None else int(seed_override)
        if not 0 <= self.seed < 2 ** 64:
            raise UsageError(f"seed {self.seed} is outside 0..2^64-1")
        self.T = int(o["tokens"])
        self.H = int(s["hidden"])
        self.I = int(s["intermediate"])
        self.E = int(s["experts"])
        self.k = int(s["top_k"])
        self.V = int(s["vocab"])
        self.heads = int(s["heads"])
        self.head_dim = int(s["head_dim"])
        self.theta = float(o["rope_theta"])
        self.eps = float(o["rms_eps"])
        self.shards = int(o["shards"])
        self.position_offset = 0
        self.ops = list(o["ops"])
        unknown = [op for op in self.ops if op not in ALL_OPS]
        if unknown:
            raise UsageError(f"unknown op(s) {unknown} (known: {', '.join(ALL_OPS)})")
        if not 1 <= self.k <= self.E or not 1 <= self.shards <= self.E or self.head_dim % 2:
            raise UsageError("steps.ops shapes out of range (top_k, shards <= experts; even head_dim)")

    def wants(self, op):
        return op in self.ops

    def positions(self):
        return np.arange(self.position_offset, self.position_offset + self.T, dtype=np.int64)

    def sigmoid_groups(self):
        """(n_group, topk_group) of the router_sigmoid op: DeepSeek-V3 grouping
        where the shape allows it (op_delta.cpp)."""
        E, k = self.E, self.k
        if E % 4 == 0 and E // 4 >= 2 and k <= 2 * (E // 4):
            return 4, 2
        return 1, 1

    def linear_dims(self):
        """(nk, nv, dk, dv, K) of the Gated DeltaNet ops with seeded weights
        (op_delta.cpp): nk = max(1, heads/4) key heads, nv = 2·nk value heads,
        both of head_dim; conv kernel 4."""
        nk = max(1, self.heads // 4)
        return nk, 2 * nk, self.head_dim, self.head_dim, 4


def seeded_input(spec, op, name, shape, mean, sd):
    """op_delta.cpp input(): seeded_normal(seed, "ops/<op>/<name>", ...) in f32."""
    return kvasir_rng.seeded_normal(spec.seed, f"ops/{op}/{name}", shape, mean, sd, np.float32)


def yarn_inv_freq(d, theta=10000.0, factor=40.0, original=4096.0, beta_fast=32.0, beta_slow=1.0, truncate=True):
    """DeepSeek-V3's yarn table (transformers' _compute_yarn_parameters, here in float64), for rope_yarn."""
    def correction_dim(rot):
        return d * math.log(original / (rot * 2 * math.pi)) / (2 * math.log(theta))
    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    i = np.arange(d // 2, dtype=np.float64)
    ramp = np.clip((i - low) / (high - low), 0.0, 1.0)
    pos_freq = theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    extrapolation = 1.0 - ramp
    return (1.0 / (factor * pos_freq)) * (1.0 - extrapolation) + (1.0 / pos_freq) * extrapolation


def moe_inputs(spec):
    """make_moe_inputs (seeded): x, router weight, and per expert (gate, up, down), all f32."""
    sh = 1.0 / math.sqrt(float(spec.H))
    si = 1.0 / math.sqrt(float(spec.I))
    x = seeded_input(spec, "moe", "x", (spec.T, spec.H), 0.0, 1.0)
    router = seeded_input(spec, "moe", "router", (spec.E, spec.H), 0.0, sh)
    experts = []
    for e in range(spec.E):
        experts.append((seeded_input(spec, "moe", f"expert{e}.gate", (spec.I, spec.H), 0.0, sh),
                        seeded_input(spec, "moe", f"expert{e}.up", (spec.I, spec.H), 0.0, sh),
                        seeded_input(spec, "moe", f"expert{e}.down", (spec.H, spec.I), 0.0, si)))
    return x, router, experts


def select_topk(scores, k, bias=None, n_group=1, topk_group=1):
    """backend.cpp select_topk: order by (score + bias), grouped if n_group > 1
    (group score = sum of its two best; stable, keep topk_group groups), ties
    to the lower expert id. Arithmetic in the dtype of `scores`. -> int32 [T, k]."""
    scores = np.asarray(scores)
    T, E = scores.shape
    sel = scores + bias.astype(scores.dtype)[None, :] if bias is not None else scores.copy()
    if n_group > 1:
        gs = E // n_group
        grouped = sel.reshape(T, n_group, gs)
        top2 = -np.sort(-grouped, axis=2)[:, :, :2]
        gscore = top2[:, :, 0] + top2[:, :, 1]
        gorder = np.argsort(-gscore, axis=1, kind="stable")
        keep = np.zeros((T, n_group), dtype=bool)
        np.put_along_axis(keep, gorder[:, :topk_group], True, axis=1)
        sel = np.where(np.repeat(keep, gs, axis=1), sel, -np.inf)
    order = np.argsort(-sel, axis=1, kind="stable")  # stable: equal scores keep ascending ids
    return order[:, :k].astype(np.int32)


def reference_routing(x, router_w, k):
    """The reference's (cpu-ref, f64) routing plan of the moe op: logits in
    float64 from the f32 inputs, softmax (max-subtracted), top-k with ties to
    the lower id, weights = chosen / sum(chosen) with the sum taken in id-rank
    order (Backend::route). -> ids int32 [T,k], weights float64 [T,k]."""
    logits = x.astype(np.float64) @ router_w.astype(np.float64).T
    m = logits.max(axis=1, keepdims=True)
    ex = np.exp(logits - m)
    scores = ex / ex.sum(axis=1, keepdims=True)
    ids = select_topk(scores, k)
    chosen = np.take_along_axis(scores, ids.astype(np.int64), axis=1)
    total = np.zeros(chosen.shape[0])
    for j in range(k):  # sequential, as route() sums
        total = total + chosen[:, j]
    return ids, chosen / total[:, None]


# --- numpy compute -------------------------------------------------------------------
def blas_info():
    try:
        cfg = np.show_config(mode="dicts")  # numpy >= 1.25
        b = cfg.get("Build Dependencies", {}).get("blas", {})
        name = b.get("name", "?")
        ver = b.get("version", "")
        return f"{name} {ver}".strip()
    except Exception:
        pass
    try:  # older numpy (Debian 12's 1.24): the distutils-era config dicts
        conf = np.__config__
        for attr in ("blas_opt_info", "blas_ilp64_opt_info", "openblas_info", "blas_info"):
            info = getattr(conf, attr, None)
            if info and info.get("libraries"):
                return "BLAS " + ",".join(info["libraries"])
    except Exception:
        pass
    return "BLAS unknown"


def cpu_has_fma():
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return " fma " in f" {line.split(':', 1)[1].strip()} "
    except OSError:
        pass
    return platform.machine().lower() in ("arm64", "aarch64")  # every AArch64 FPU fuses


def cpu_name():
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class NumpyOps:
    """Each op as a numpy user writes it, in one dtype."""

    backend = "numpy"

    def __init__(self, dtype):
        self.dt = np.dtype(dtype)

    def runtime(self):
        return (f"numpy {np.__version__} / python {platform.python_version()} / {blas_info()}")

    def threads(self):
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            if os.environ.get(var, "").isdigit():
                return int(os.environ[var])
        return os.cpu_count() or 1

    def fma(self):
        # BLAS kernels (OpenBLAS, MKL, Accelerate) fuse multiply-adds wherever
        # the CPU has FMA; the element-wise ufuncs never do.
        return cpu_has_fma()

    def tensor(self, a):
        return np.asarray(a).astype(self.dt, copy=False)

    def numpy(self, t):
        return np.asarray(t)

    def matmul(self, x, w):
        return x @ w.T

    def silu(self, g):
        return g / (self.dt.type(1) + np.exp(-g))

    def swiglu(self, gate, up):
        return self.silu(gate) * up

    def softmax(self, x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def sigmoid(self, x):
        return self.dt.type(1) / (self.dt.type(1) + np.exp(-x))

    def rmsnorm(self, x, w, eps):
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(ms + self.dt.type(eps)) * w

    def rope(self, x, positions, theta, layout, inv_freq=None):
        T, nh, d = x.shape
        half = d // 2
        # The Hugging Face recipe, in the working dtype throughout (a given table: rounded to it).
        if inv_freq is None:
            inv_freq = self.dt.type(1) / (self.dt.type(theta) ** (np.arange(0, d, 2).astype(self.dt) / self.dt.type(d)))
        else:
            inv_freq = np.asarray(inv_freq, dtype=np.float64).astype(self.dt)
        angle = positions.astype(self.dt)[:, None] * inv_freq[None, :]  # [T, half]
        c = np.cos(angle)[:, None, :]
        s = np.sin(angle)[:, None, :]
        if layout == "neox":
            a, b = x[..., :half], x[..., half:]
            return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = b * c + a * s
        return out

    def router(self, logits, k, scoring, bias=None, n_group=1, topk_group=1):
        scores = self.softmax(logits) if scoring == "softmax" else self.sigmoid(logits)
        return scores, select_topk(scores, k, bias, n_group, topk_group)

    def moe_block(self, x, experts, ids, weights, expert_filter=None):
        """Σ_j w[t,j]·down(silu(gate x)·up x), experts in ascending order, each
        on the tokens routed to it, accumulated in the working dtype."""
        T, H = x.shape
        acc = np.zeros((T, H), dtype=self.dt)
        w = weights.astype(self.dt)
        for e, (g, u, d) in enumerate(experts):
            if expert_filter is not None and not expert_filter[e]:
                continue
            tok, slot = np.nonzero(ids == e)
            if tok.size == 0:
                continue
            xg = x[tok]
            y = self.matmul(self.swiglu(self.matmul(xg, g), self.matmul(xg, u)), d)
            acc[tok] += w[tok, slot][:, None] * y  # each token at most once per expert
        return acc

    def add(self, a, b):
        return a + b

    def clamped_swiglu(self, gate, up, alpha, limit):
        """gpt-oss (transformers GptOssExperts._apply_gate): (clamp(up, ±limit) + 1) · g·σ(g·alpha), g = min(gate, limit)."""
        g = np.minimum(gate, self.dt.type(limit))
        u = np.clip(up, self.dt.type(-limit), self.dt.type(limit))
        return (u + self.dt.type(1)) * (g * self.sigmoid(g * self.dt.type(alpha)))

    def attention(self, q, keys, values, scale, window=0, sinks=None):
        """Causal GQA softmax attention of q [T, nh, D] over caches [S, D] per kv head (query r at position
        S − T + r), keys p − window < j ≤ p when window > 0, and per head a sink logit joining the softmax."""
        T, nh, D = q.shape
        S = keys[0].shape[0]
        rep = nh // len(keys)
        out = np.zeros((T, nh * D), dtype=self.dt)
        for h in range(nh):
            k, v = keys[h // rep], values[h // rep]
            s = (q[:, h] @ k.T) * self.dt.type(scale)  # [T, S]
            p = np.arange(S - T, S)[:, None]
            j = np.arange(S)[None, :]
            visible = (j <= p) & ((j > p - window) if window > 0 else True)
            s = np.where(visible, s, -np.inf).astype(self.dt)
            if sinks is not None:
                s = np.concatenate([s, np.full((T, 1), sinks[h], dtype=self.dt)], axis=1)
            w = self.softmax(s)[:, :S]
            out[:, h * D:(h + 1) * D] = w @ v
        return out

    def causal_conv1d_silu(self, x, w, history):
        """silu of the depthwise causal conv: the K−1 history rows, then x;
        y[t] = Σ_j w[:, j]·rows[t + j], the taps summed in ascending j."""
        T = x.shape[0]
        K = w.shape[1]
        rows = np.concatenate([history, x], axis=0)  # [K-1+T, C]
        s = np.zeros_like(x)
        for j in range(K):
            s = s + w[:, j][None, :] * rows[j:j + T]
        return self.silu(s)

    def softplus(self, x):
        """torch's softplus (beta 1, threshold 20): x itself above 20."""
        lim = self.dt.type(20)
        return np.where(x > lim, x, np.log1p(np.exp(np.minimum(x, lim))))

    def l2norm(self, x, eps=1e-6):
        return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + self.dt.type(eps))

    def gated_delta(self, q, k, v, a, b, a_log, dt_bias, state):
        """The recurrent gated delta rule (transformers' torch_recurrent_gated_delta_rule
        with q/k l2-normalised), all value heads at once, token by token:
        S ← S·exp(g); S += k ⊗ (v − Sᵀk)·β; out = Sᵀq/√dk. -> out [T, nv, dv]."""
        T, nk, dk = q.shape
        nv = v.shape[1]
        rep = nv // nk
        qn = np.repeat(self.l2norm(q), rep, axis=1) / np.sqrt(self.dt.type(dk))  # [T, nv, dk]
        kn = np.repeat(self.l2norm(k), rep, axis=1)
        g = -np.exp(a_log)[None, :] * self.softplus(a + dt_bias[None, :])  # [T, nv]
        beta = self.sigmoid(b)
        S = state.copy()  # [nv, dk, dv]
        out = np.empty(v.shape, dtype=self.dt)
        for t in range(T):
            S = S * np.exp(g[t])[:, None, None]
            mem = np.einsum("hij,hi->hj", S, kn[t])
            delta = (v[t] - mem) * beta[t][:, None]
            S = S + kn[t][:, :, None] * delta[:, None, :]
            out[t] = np.einsum("hij,hi->hj", S, qn[t])
        return out


# --- step 1 on a node ----------------------------------------------------------------
def run_ops(spec, be, log=lambda *_: None):
    """Every op of the protocol's list on backend `be`; -> {tensor name: numpy array}."""
    T, H, I, E, k = spec.T, spec.H, spec.I, spec.E, spec.k
    sh = 1.0 / math.sqrt(float(H))
    out = {}
    pos = spec.positions()
    for op in ALL_OPS:  # op_delta.cpp's order
        if not spec.wants(op):
            continue
        t0 = time.perf_counter()
        if op == "matmul":
            x = be.tensor(seeded_input(spec, op, "x", (T, H), 0.0, 1.0))
            w = be.tensor(seeded_input(spec, op, "w", (I, H), 0.0, sh))
            out["ops.matmul.out"] = be.numpy(be.matmul(x, w))
        elif op == "swiglu":
            g = be.tensor(seeded_input(spec, op, "gate", (T, I), 0.0, 2.0))
            u = be.tensor(seeded_input(spec, op, "up", (T, I), 0.0, 1.0))
            out["ops.swiglu.out"] = be.numpy(be.swiglu(g, u))
        elif op == "softmax":
            x = be.tensor(seeded_input(spec, op, "x", (T, spec.V), 0.0, 3.0))
            out["ops.softmax.out"] = be.numpy(be.softmax(x))
        elif op == "rmsnorm":
            x = be.tensor(seeded_input(spec, op, "x", (T, H), 0.0, 1.0))
            w = be.tensor(seeded_input(spec, op, "weight", (H,), 1.0, 0.1))
            out["ops.rmsnorm.out"] = be.numpy(be.rmsnorm(x, w, spec.eps))
        elif op in ("rope_neox", "rope_normal"):
            x = be.tensor(seeded_input(spec, op, "x", (T, spec.heads, spec.head_dim), 0.0, 1.0))
            layout = "neox" if op == "rope_neox" else "normal"
            out[f"ops.{op}.out"] = be.numpy(be.rope(x, pos, spec.theta, layout))
        elif op == "rope_yarn":
            x = be.tensor(seeded_input(spec, op, "x", (T, spec.heads, spec.head_dim), 0.0, 1.0))
            out["ops.rope_yarn.out"] = be.numpy(be.rope(x, pos, 10000.0, "neox", yarn_inv_freq(spec.head_dim)))
        elif op == "router_softmax":
            logits = be.tensor(seeded_input(spec, op, "logits", (T, E), 0.0, 1.0))
            scores, ids = be.router(logits, k, "softmax")
            out["ops.router_softmax.out"] = be.numpy(scores)
            out["ops.router_softmax.ids"] = np.asarray(be.numpy(ids), dtype=np.int32)
        elif op == "router_sigmoid":
            logits = be.tensor(seeded_input(spec, op, "logits", (T, E), 0.0, 1.0))
            bias = be.tensor(seeded_input(spec, op, "bias", (E,), 0.0, 0.1))
            n_group, topk_group = spec.sigmoid_groups()
            scores, ids = be.router(logits, k, "sigmoid", bias, n_group, topk_group)
            # scaling 2.5 and renormalisation act on the combine weights only,
            # which the capture does not hold: out = the E scores, ids = the choice
            out["ops.router_sigmoid.out"] = be.numpy(scores)
            out["ops.router_sigmoid.ids"] = np.asarray(be.numpy(ids), dtype=np.int32)
        elif op == "moe":
            x32, router_w, experts32 = moe_inputs(spec)
            t1 = time.perf_counter()
            ids, weights = reference_routing(x32, router_w, k)
            x = be.tensor(x32)
            experts = [tuple(be.tensor(m) for m in ex) for ex in experts32]
            del experts32
            out["ops.moe.out"] = be.numpy(be.moe_block(x, experts, ids, weights))
            combined = None
            for s in range(spec.shards):
                mine = [(e * spec.shards // E) == s for e in range(E)]
                part = be.moe_block(x, experts, ids, weights, mine)
                combined = part if combined is None else be.add(combined, part)
            out["ops.moe.shard_combined"] = be.numpy(combined)
            log(f"  moe inputs (RNG, {3 * E} expert matrices) {t1 - t0:.2f} s")
        elif op == "causal_conv1d":
            nk, nv, dk, dv, K = spec.linear_dims()
            C = 2 * nk * dk + nv * dv  # the q, k, v channels the conv runs over
            x = be.tensor(seeded_input(spec, op, "x", (T, C), 0.0, 1.0))
            w = be.tensor(seeded_input(spec, op, "weight", (C, K), 0.0, 1.0 / math.sqrt(float(K))))
            hist = be.tensor(seeded_input(spec, op, "history", (K - 1, C), 0.0, 1.0))
            out["ops.causal_conv1d.out"] = be.numpy(be.causal_conv1d_silu(x, w, hist))
        elif op == "gated_delta":
            nk, nv, dk, dv, _ = spec.linear_dims()
            g_in = [seeded_input(spec, op, "q", (T, nk, dk), 0.0, 1.0),
                    seeded_input(spec, op, "k", (T, nk, dk), 0.0, 1.0),
                    seeded_input(spec, op, "v", (T, nv, dv), 0.0, 1.0),
                    seeded_input(spec, op, "a", (T, nv), 0.0, 1.0),
                    seeded_input(spec, op, "b", (T, nv), 0.0, 1.0),
                    seeded_input(spec, op, "A_log", (nv,), 1.0, 0.5),
                    seeded_input(spec, op, "dt_bias", (nv,), 0.0, 1.0),
                    seeded_input(spec, op, "state", (nv, dk, dv), 0.0, 0.1)]
            out["ops.gated_delta.out"] = be.numpy(be.gated_delta(*[be.tensor(t) for t in g_in]))
        elif op in ("attention", "attention_sinks"):
            # op_delta.cpp: T queries at positions T..2T−1 of a 2T-key cache, heads/2 kv heads (heads when odd),
            # scale 1/√head_dim; attention_sinks adds a window of max(1, T/2) and a sink per head.
            nh, D = spec.heads, spec.head_dim
            nkv = nh // 2 if nh % 2 == 0 else nh
            q = be.tensor(seeded_input(spec, op, "q", (T, nh, D), 0.0, 1.0))
            ks = [be.tensor(seeded_input(spec, op, f"k{g}", (2 * T, D), 0.0, 1.0)) for g in range(nkv)]
            vs = [be.tensor(seeded_input(spec, op, f"v{g}", (2 * T, D), 0.0, 1.0)) for g in range(nkv)]
            scale = 1.0 / math.sqrt(float(D))
            if op == "attention":
                out["ops.attention.out"] = be.numpy(be.attention(q, ks, vs, scale))
            else:
                sinks = be.tensor(seeded_input(spec, op, "sinks", (nh,), 0.0, 1.0))
                out["ops.attention_sinks.out"] = be.numpy(be.attention(q, ks, vs, scale, max(1, T // 2), sinks))
        elif op == "clamped_swiglu":
            g = be.tensor(seeded_input(spec, op, "gate", (T, I), 0.0, 4.0))
            u = be.tensor(seeded_input(spec, op, "up", (T, I), 0.0, 4.0))
            out["ops.clamped_swiglu.out"] = be.numpy(be.clamped_swiglu(g, u, 1.702, 7.0))
        log(f"  {op}: {time.perf_counter() - t0:.2f} s")
    return out


# --- the capture -----------------------------------------------------------------------
def kvasir_version():
    try:
        for line in (HERE.parent / "CMakeLists.txt").read_text(encoding="utf-8").splitlines():
            if line.startswith("project(") and " VERSION " in line:
                return line.split(" VERSION ")[1].split()[0]
    except OSError:
        pass
    return "unknown"


def git_commit():
    try:
        r = subprocess.run(["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if r.returncode == 0:
            c = r.stdout.strip()
            dirty = subprocess.run(["git", "-C", str(HERE), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10)
            return c + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def compact(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def capture_metadata(doc, protocol_hash, spec, capabilities, tool_name):
    return {
        "node": capabilities["node"],
        "capabilities": compact(capabilities),
        "protocol_id": str(doc["id"]),
        "protocol_version": str(doc["version"]),
        "protocol_hash": protocol_hash,
        "seed": str(spec.seed),
        "model_fingerprint": "",  # step 1 with seeded weights reads no model
        "tool": compact({"name": tool_name, "version": kvasir_version(), "git": git_commit()}),
        "steps": compact(["ops"]),
        "errors": compact({}),
    }


def capabilities_of(be, name, dtype, extra=None):
    dname = {"float32": "f32", "float64": "f64"}[np.dtype(dtype).name]
    caps = {
        "node": name,
        "backend": be.backend,
        "device": "cpu",
        "runtime": be.runtime(),
        "storage": dname,
        "accumulation": dname,
        "output": dname,
        "fma": bool(be.fma()),
        "threads": int(be.threads()),
        "deterministic": True,
        "extra": {"cpu": cpu_name(), "routing": "moe pinned by the reference (recomputed in float64)"},
    }
    if extra:
        caps["extra"].update(extra)
    return caps


def node_main(argv, make_backend, backend_name, tool_name, dtypes=("float32", "float64")):
    ap = argparse.ArgumentParser(description=f"Protocol step 1 (ops) with {backend_name}, written as a "
                                             "kvasir-equiv capture (protocols/CAPTURE.md)")
    ap.add_argument("-p", "--protocol", required=True, help="protocol file (steps.ops with \"weights\": \"seeded\")")
    ap.add_argument("-o", "--output", required=True, help="capture file to write (.safetensors)")
    ap.add_argument("--dtype", choices=list(dtypes), default="float32", help="working dtype (default float32)")
    ap.add_argument("--name", help=f"node name in the capture (default {backend_name}:f32 / :f64)")
    ap.add_argument("--seed", type=int, help="override the protocol's seed (recorded in the capture)")
    ap.add_argument("--writer", choices=["auto", "safetensors", "own"], default="auto",
                    help="safetensors container writer (default: the package when importable)")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    log = (lambda *_: None) if args.quiet else (lambda m: print(m, file=sys.stderr))
    try:
        doc, phash = capture_format.load_protocol(args.protocol)
        spec = OpsSpec(doc, args.seed)
    except (OSError, ValueError, KeyError, TypeError, UsageError) as e:
        print(f"{tool_name}: {args.protocol}: {e}", file=sys.stderr)
        return 2
    name = args.name or f"{backend_name}:{'f32' if args.dtype == 'float32' else 'f64'}"
    be = make_backend(args.dtype)
    t0 = time.perf_counter()
    log(f"{tool_name}: {doc.get('id')} v{doc.get('version')} seed {spec.seed}, ops {','.join(spec.ops)}, {args.dtype}")
    tensors = run_ops(spec, be, log)
    caps = capabilities_of(be, name, args.dtype)
    meta = capture_metadata(doc, phash, spec, caps, tool_name)
    h = capture_format.write_capture(args.output, meta, tensors, writer=args.writer)
    log(f"{tool_name}: wrote {args.output} (node {name}, {len(tensors)} tensors, {h[:19]}…) "
        f"in {time.perf_counter() - t0:.1f} s")
    return 0


def main(argv=None):
    return node_main(sys.argv[1:] if argv is None else argv, NumpyOps, "numpy", "scripts/numpy_node.py")


if __name__ == "__main__":
    sys.exit(main())
