#!/usr/bin/env python3
"""Evidence for a protocol's tolerances: run `kvasir-equiv audit` repeatedly
(different seeds, different fixture models) and tabulate, per node and per
criterion, the worst measured value and the smallest margin over all runs,
plus every verdict seen. The output is Markdown for protocols/README.md.

Usage:
  scripts/calibrate_protocol.py --binary build/kvasir-equiv --protocol protocols/default.json \
      --seeds 1 2 3 --models fixtures/models/qwen3_moe_tiny fixtures/models/mixtral_tiny \
      --backends cpu-ref,cpu,opencl:0,cpu:acc=f16 > calibration.md

A node whose verdict differs between runs is a flaky tolerance: the script
says so in the table and exits 1. Standard library only.
"""
import argparse
import json
import math
import subprocess
import sys
import time


def run_audit(binary, protocol, model, seed, backends):
    cmd = [binary, "audit", "--protocol", protocol, "--seed", str(seed), "--gate", "none", "--json"]
    if model:
        cmd += ["--model", model]
    if backends:
        cmd += ["--backends", backends]
    t0 = time.monotonic()
    out = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout), time.monotonic() - t0


def as_float(v):
    if v is None:
        return math.nan
    if isinstance(v, str):
        return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[v]
    return float(v)


def fmt(v):
    if math.isnan(v):
        return "nan"
    if 0.99 <= v < 1:
        return f"1-{1 - v:.1e}"
    if v == 0 or (abs(v) >= 1e-3 and abs(v) < 1e4):
        return f"{v:.4g}"
    return f"{v:.2e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--protocol", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    ap.add_argument("--models", nargs="*", default=[""], help="model paths; '' = the protocol's")
    ap.add_argument("--backends", default="")
    ap.add_argument("--tier", choices=["sensitive", "tolerant", "both"], default="both")
    args = ap.parse_args()

    # (node, tier, criterion) -> {worst value, min margin, direction, tolerance}
    table = {}
    verdicts = {}
    runs = 0
    wall = []
    for model in args.models:
        for seed in args.seeds:
            rep, dt = run_audit(args.binary, args.protocol, model, seed, args.backends)
            wall.append(dt)
            runs += 1
            for node in rep["nodes"]:
                name = node["node"]
                verdicts.setdefault(name, []).append(node["verdict"])
                for tier in ("sensitive", "tolerant"):
                    for c in node["criteria"][tier]:
                        key = (name, tier, c["criterion"])
                        v, m = as_float(c["value"]), as_float(c["margin"])
                        e = table.setdefault(key, {"worst": v, "margin": m, "dir": c["direction"],
                                                   "tol": as_float(c["tolerance"]), "unit": c["margin_unit"]})
                        worse = (v > e["worst"]) if c["direction"] == "max" else (v < e["worst"])
                        if math.isnan(v) or worse:
                            e["worst"] = v
                        if math.isnan(m) or m < e["margin"]:
                            e["margin"] = m

    flaky = [n for n, vs in verdicts.items() if len(set(vs)) > 1]
    print(f"{runs} audits ({len(args.models)} model(s) x seeds {' '.join(map(str, args.seeds))}), "
          f"protocol `{args.protocol}`, {sum(wall) / len(wall):.1f} s per audit.\n")
    print("| node | verdicts over all runs |")
    print("|---|---|")
    for n, vs in verdicts.items():
        counts = {v: vs.count(v) for v in dict.fromkeys(vs)}
        print(f"| `{n}` | {', '.join(f'{v} x{k}' for v, k in counts.items())}{' **FLAKY**' if n in flaky else ''} |")
    tiers = ["sensitive", "tolerant"] if args.tier == "both" else [args.tier]
    for tier in tiers:
        print(f"\n**{tier} tier**: worst value over all runs / tolerance / smallest margin\n")
        nodes = [n for n in verdicts if any(k[0] == n and k[1] == tier for k in table)]
        crits = sorted({k[2] for k in table if k[1] == tier})
        print("| criterion | " + " | ".join(f"`{n}`" for n in nodes) + " |")
        print("|---|" + "---|" * len(nodes))
        for c in crits:
            cells = []
            for n in nodes:
                e = table.get((n, tier, c))
                if e is None:
                    cells.append("")
                    continue
                sign = "≤" if e["dir"] == "max" else "≥"
                ok = e["margin"] >= 0 if not math.isnan(e["margin"]) else False
                mark = "" if ok else " ✗"
                cells.append(f"{fmt(e['worst'])} {sign} {fmt(e['tol'])} ({e['margin']:+.2g}){mark}")
            print(f"| {c} | " + " | ".join(cells) + " |")
    return 1 if flaky else 0


if __name__ == "__main__":
    sys.exit(main())
