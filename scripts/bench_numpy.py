#!/usr/bin/env python3
"""Time in numpy what bench_cpu's moe_layer and matmul benchmarks time in kvasir.

    scripts/bench_numpy.py [--threads N] [--repeat R] [--tokens 16,128] [--matmul]

The MoE layer at Qwen3-30B-A3B shapes, f32 throughout, exactly the work of
bench_cpu's "moe_layer/<node>/T:<T>":
  router logits  x[T,2048] @ W_r[128,2048]^T
  softmax over the 128 experts, top-8, weights renormalised to sum 1
  for each expert that got tokens (ascending id): its 8-per-token SwiGLU MLP
      h = silu(x_e @ gate_e^T) * (x_e @ up_e^T)      gate/up [768, 2048]
      y = h @ down_e^T                                down    [2048, 768]
  and the weighted combine  out[t] += w[t, j] * y   (f32)
GFLOP/s counts the same flops as bench_cpu: 2·T·8·3·2048·768 + 2·T·128·2048.
The 128 experts' weights (2.4 GB of f32) are N(0, 1/fan_in), made once.

--matmul adds x[T,K] @ W[N,K]^T at the expert shapes (T = 1, 16, 128, 512;
768×2048 and 2048×768), the counterpart of bench_cpu's "matmul/…/f32/…".

numpy's BLAS (OpenBLAS in the pip wheel) reads its thread count when numpy is
imported, so --threads sets OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS
before the import. Times are wall clock; the median and the best of --repeat
runs are printed, after one warm-up run.

    python3 -m venv /tmp/venv-perf && /tmp/venv-perf/bin/pip install numpy
    /tmp/venv-perf/bin/python scripts/bench_numpy.py --threads 2 --matmul
"""
from __future__ import annotations

import argparse
import os
import platform
import time

HIDDEN, EXPERTS, FFN, TOP_K = 2048, 128, 768, 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="BLAS threads (default: all CPUs)")
    ap.add_argument("--repeat", type=int, default=20, help="timed runs per case (default 20)")
    ap.add_argument("--tokens", default="16,128", help="T values of the MoE layer (default 16,128)")
    ap.add_argument("--matmul", action="store_true", help="also time the expert-shape matmuls")
    a = ap.parse_args()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(a.threads)

    import numpy as np  # after the thread count is set

    blas = "?"
    try:
        cfg = np.show_config(mode="dicts")
        b = cfg.get("Build Dependencies", {}).get("blas", {})
        blas = f"{b.get('name', '?')} {b.get('version', '')}".strip()
    except Exception:  # older numpy: no mode=dicts
        pass
    print(f"numpy {np.__version__}, BLAS {blas}, {a.threads} thread(s), python {platform.python_version()}, "
          f"load average {' '.join(open('/proc/loadavg').read().split()[:3])}")

    def timed(fn, repeat):
        fn()  # warm-up
        ts = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        ts.sort()
        return ts[len(ts) // 2], ts[0]

    rng = np.random.default_rng(1)

    def normal(shape, std):
        z = rng.standard_normal(shape, dtype=np.float32)
        z *= np.float32(std)
        return z

    if a.matmul:
        for T in (1, 16, 128, 512):
            for N, K in ((FFN, HIDDEN), (HIDDEN, FFN)):
                x = normal((T, K), 1.0)
                w = normal((N, K), 1 / np.sqrt(K))
                med, best = timed(lambda: x @ w.T, max(a.repeat, 50))
                fl = 2.0 * T * N * K
                print(f"matmul T={T:<4d} N={N:<4d} K={K:<4d}  median {med * 1e6:9.1f} us  "
                      f"{fl / med * 1e-9:7.1f} GFLOP/s   best {fl / best * 1e-9:7.1f} GFLOP/s")

    t0 = time.perf_counter()
    router = normal((EXPERTS, HIDDEN), 1 / np.sqrt(HIDDEN))
    gate = normal((EXPERTS, FFN, HIDDEN), 1 / np.sqrt(HIDDEN))
    up = normal((EXPERTS, FFN, HIDDEN), 1 / np.sqrt(HIDDEN))
    down = normal((EXPERTS, HIDDEN, FFN), 1 / np.sqrt(FFN))
    print(f"expert weights: {(gate.nbytes + up.nbytes + down.nbytes) / 1e9:.2f} GB f32, made in "
          f"{time.perf_counter() - t0:.1f} s")

    def moe_layer(x):
        logits = x @ router.T
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        ids = np.argpartition(-p, TOP_K - 1, axis=1)[:, :TOP_K]
        w = np.take_along_axis(p, ids, axis=1)
        w /= w.sum(axis=1, keepdims=True)
        out = np.zeros_like(x)
        for e in np.unique(ids):
            tok, slot = np.nonzero(ids == e)  # a token picks an expert at most once
            xe = x[tok]
            g = xe @ gate[e].T
            h = g / (1.0 + np.exp(-g)) * (xe @ up[e].T)
            out[tok] += w[tok, slot, None] * (h @ down[e].T)
        return out

    for T in (int(t) for t in a.tokens.split(",")):
        x = normal((T, HIDDEN), 1.0)
        med, best = timed(lambda: moe_layer(x), a.repeat)
        fl = 2.0 * T * TOP_K * 3 * HIDDEN * FFN + 2.0 * T * EXPERTS * HIDDEN
        print(f"moe_layer T={T:<4d} median {med * 1e3:8.2f} ms  {fl / med * 1e-9:7.1f} GFLOP/s   "
              f"best {best * 1e3:8.2f} ms  {fl / best * 1e-9:7.1f} GFLOP/s")


if __name__ == "__main__":
    main()
