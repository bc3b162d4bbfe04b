#!/usr/bin/env python3
"""Reference values for kvasir's binomial confidence bounds (lib/kvasir/metrics/stats.hpp), computed by
statsmodels and scipy — an implementation nobody on this project wrote.

Writes fixtures/stats/binomial_bounds.json:
  bounds:   one-sided lower / upper bounds of k successes in n at confidence c: the two-sided interval of
            statsmodels.stats.proportion.proportion_confint(k, n, alpha=2(1 - c), method) for method
            "wilson" and "beta" (Clopper–Pearson)
  trials:   the fewest n with n of n successes whose lower bound reaches a rate (searched with the same call)
  decide:   the trials N at which a node keeping an observed rate is decided against a threshold: the
            lower bound of floor(observed*N) of N reaches it (observed above), or the upper bound of
            ceil(observed*N) of N falls below it (observed below) — the same doubling + bisection as
            binomial_trials_to_decide, on statsmodels' bounds
  normal:   scipy.stats.norm.ppf(p)
  betainc:  scipy.special.betainc(a, b, x)

    pip install scipy statsmodels   (the fixture venv: scripts/requirements-fixtures.txt + these two)
    python3 scripts/make_binomial_reference.py
Versions used are written into the file.
"""
import json
import math
from importlib import metadata
from pathlib import Path

import scipy.special
import scipy.stats
from statsmodels.stats.proportion import proportion_confint

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "stats" / "binomial_bounds.json"


def bounds(k, n, c, method):
    lo, hi = proportion_confint(k, n, alpha=2 * (1 - c), method=method)
    return float(lo), float(hi)


def trials(rate, c, method):
    lo, hi = 1, 1
    while bounds(hi, hi, c, method)[0] < rate:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if bounds(mid, mid, c, method)[0] >= rate:
            hi = mid
        else:
            lo = mid
    return hi


def decide(observed, threshold, c, method):
    above = observed > threshold

    def decided(n):
        if above:
            return bounds(min(n, math.floor(observed * n)), n, c, method)[0] >= threshold
        return bounds(min(n, math.ceil(observed * n)), n, c, method)[1] < threshold

    hi = 1
    while not decided(hi):
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        if decided(mid):
            hi = mid
        else:
            lo = mid
    return hi


def main():
    cases = []
    for n in (1, 5, 24, 64, 100, 268, 1000, 10000):
        for k in sorted({0, 1, n // 2, max(n - 1, 0), n}):
            for c in (0.9, 0.95, 0.99):
                for method in ("wilson", "beta"):
                    lo, hi = bounds(k, n, c, method)
                    cases.append(dict(k=k, n=n, confidence=c, method=method, lower=lo, upper=hi))
    tr = [dict(rate=r, confidence=c, method=m, n=trials(r, c, m))
          for r in (0.9, 0.95, 0.99, 0.999) for c in (0.95, 0.99) for m in ("wilson", "beta")]
    dec = [dict(observed=o, threshold=t, confidence=c, method=m, n=decide(o, t, c, m))
           for o in (1.0, 0.999, 0.995, 0.98, 0.95, 0.9, 0.8, 0.5) for t in (0.85, 0.9, 0.95, 0.99)
           for c in (0.95, 0.99) for m in ("wilson", "beta") if o != t]
    normal = [dict(p=p, x=float(scipy.stats.norm.ppf(p)))
              for p in (1e-12, 1e-6, 0.001, 0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 0.95, 0.975, 0.99, 0.999, 1 - 1e-9)]
    betainc = [dict(a=a, b=b, x=x, value=float(scipy.special.betainc(a, b, x)))
               for a, b in ((1, 1), (0.5, 0.5), (2, 5), (24, 1), (64, 3), (500, 501), (9999, 2))
               for x in (1e-6, 0.01, 0.3, 0.5, 0.7, 0.99, 0.999999)]
    doc = dict(versions={p: metadata.version(p) for p in ("scipy", "statsmodels", "numpy")},
               bounds=cases, trials=tr, decide=dec, normal=normal, betainc=betainc)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(OUT, len(cases), "bounds,", len(tr), "trial counts,", len(dec), "decisions")


if __name__ == "__main__":
    main()
