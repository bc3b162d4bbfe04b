#!/usr/bin/env python3
"""Helper of the CLI tests (not a test itself): a variant of a shipped protocol written elsewhere (a test's
temporary folder), its relative paths (model, token streams) made absolute so that it still finds them.

  protocol_variant.py SRC OUT ID [--steps a,b] [--set STEP.KEY=JSON ...] [--tier NAME=VALUE ...]

--steps keeps only these steps (and the tolerances of their criteria); --set sets steps.STEP.KEY (KEY may be
dotted: logits.tokens.count=8); --tier adds a tolerance to both tiers ({"value": VALUE, "why": "test"}).
"""
import argparse
import json
import os


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("id")
    ap.add_argument("--steps")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--tier", action="append", default=[])
    a = ap.parse_args()
    base = os.path.dirname(os.path.abspath(a.src))
    d = json.load(open(a.src, encoding="utf-8"))
    d["id"] = a.id
    if "model" in d:
        d["model"] = os.path.abspath(os.path.join(base, d["model"]))
    for s in d["steps"].values():
        for k in ("tokens", "prompt"):
            if isinstance(s.get(k), dict):
                s[k]["path"] = os.path.abspath(os.path.join(base, s[k]["path"]))
    if a.steps:
        keep = a.steps.split(",")
        d["steps"] = {k: v for k, v in d["steps"].items() if k in keep}
        prefixes = tuple(k + "." for k in keep) + (("shard.",) if "ops" in keep else ())
        d["tiers"] = {t: {k: v for k, v in c.items() if k.startswith(prefixes) or k in keep} for t, c in d["tiers"].items()}
    for item in a.set:
        path, value = item.split("=", 1)
        keys = path.split(".")
        node = d["steps"]
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = json.loads(value)
    for item in a.tier:
        name, value = item.split("=", 1)
        for t in d["tiers"].values():
            t[name] = {"value": json.loads(value), "why": "test"}
    json.dump(d, open(a.out, "w", encoding="utf-8"), indent=1)


if __name__ == "__main__":
    main()
