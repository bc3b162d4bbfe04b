#!/usr/bin/env python3
"""What the audit can catch, measured (issue 43): the audit's own statistics over many
samples and token budgets, honest nodes against substituted ones.

    scripts/detection_study.py --kvasir BUILD/kvasir-equiv [-p PROTOCOL] [-m MODEL]
        [--budgets 8,32,128] [--samples 6] [--steps ops,drift,logits,decide,generate,invariance]
        [--honest cpu,cpu:threads=1,opencl:0] [--substitutions cpu:requant=q4_k,...]
        [-o study.json] [--markdown study.md]

For each token budget B and sample i it runs one `kvasir-equiv audit --gate none` of the
reference, the honest nodes and the substituted nodes (steps/substitution.hpp) on a
variant of the protocol: every token stream of the studied steps cut to B tokens (a
generation keeps its prompt and its n decoded tokens, which its tolerance is set for) at
the i-th of `samples`
offsets spread evenly over the stream (overlapping when the stream is short), the
protocol's seed + i (the seeded op inputs), and perturb_seed = i + 1 for perturb= nodes
(each sample another "fine-tune"). Every criterion the audit reports is a statistic
(oriented so that larger is more suspicious: a `min` criterion is negated; NaN/Inf is
the most suspicious value), and so is the verdict (fit 0, unfit-sensitive 1, unfit 2,
error 3).

Per budget, substitution and statistic it reports (a statistic of the ops step probes the
node's kernels with seeded inputs and reads no tokens; the others run the model):
  * detection at zero false positives: the fraction of the substitution's samples whose
    score exceeds every honest node's score on every sample (the threshold no honest
    sample crosses);
  * ROC AUC: P(substituted score > honest score) + P(equal) / 2 over all pairs;
  * the margin: decades between the least suspicious substituted sample and the most
    suspicious honest one;
and per substitution the smallest budget where some model-run statistic reaches AUC >= 0.999
(and where the verdict catches every sample with no honest false positive). It also checks the protocol's own tolerances
against the honest samples: a criterion an honest node failed is a false positive of the
shipped protocol.

llama.cpp as a node (--llamacpp ROLE:ARGS, repeatable; the model must be a GGUF): per sample
the reference is captured once more (`capture --steps`), scripts/llamacpp_node.py runs
llama.cpp with ARGS (its options: `--kv-type f32 --flash-attn off`; empty for llama.cpp's
defaults) on the same protocol variant, fed the reference's tokens (--reference-capture), and
`compare --gate none` judges its capture like the audit judges a node. ROLE `honest` puts it
beside the honest nodes (the zero-false-positive threshold then covers it); `reported`
measures it like a substitution and lists it apart (llama.cpp's defaults: an f16 KV cache,
a deployment choice rather than a substitution). llama.cpp runs the steps it can (logits,
decide, generate, perplexity, determinism); the others are not measured for it.

The output JSON holds every sample's figures; --markdown writes the tables. The numbers
depend only on the tool's arithmetic (no timing): tests/cli/test_detection_study.sh runs
a small budget in CI. Python's standard library only.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

VERDICT_SCORE = {"fit": 0, "unfit-sensitive": 1, "unfit": 2, "error": 3}
DEFAULT_SUBS = ("cpu:storage=bf16,cpu:requant=q8_0,cpu:requant=q4_k,cpu:requant=mxfp4,cpu:kv=f16,cpu:kv=fp8,"
                "cpu:topk=1,cpu:skip_layer=1,cpu:perturb=0.001")


def split_nodes(text):
    """A comma list of node specs; a piece with '=' and no ':' continues the node before it."""
    out = []
    for piece in filter(None, (p.strip() for p in text.split(","))):
        if out and "=" in piece and ":" not in piece and ":" in out[-1]:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def stream_length(base_dir, steps, path):
    """Tokens available in a stream: the ids in an id file, else (text) the furthest any
    step of the protocol reads it."""
    ref = None
    for s in steps.values():
        for key in ("tokens", "prompt"):
            t = s.get(key)
            if isinstance(t, dict) and t.get("path") == path:
                ref = t if ref is None or t.get("offset", 0) + t.get("count", 0) > ref.get("offset", 0) + ref.get("count", 0) else ref
    if ref.get("format", "ids") == "ids":
        with open(os.path.join(base_dir, path), encoding="utf-8") as f:
            return len(f.read().split())
    return ref.get("offset", 0) + ref.get("count", 0)


def protocol_variant(base, base_dir, studied, budget, sample, samples):
    d = json.loads(json.dumps(base))
    d["id"] = f"{base['id']}-detect-b{budget}-s{sample}"
    if "model" in d:
        d["model"] = os.path.abspath(os.path.join(base_dir, d["model"]))
    d["seed"] = int(base.get("seed", 0)) + sample
    for name, s in d["steps"].items():
        for key in ("tokens", "prompt", "items"):
            t = s.get(key)
            if not isinstance(t, dict) or "path" not in t:
                continue
            path = t["path"]
            t["path"] = os.path.abspath(os.path.join(base_dir, path))
            if name not in studied or key == "items":
                continue
            total = stream_length(base_dir, base["steps"], path)
            count = min(budget, total) if key == "tokens" else t.get("count", 0)
            if key == "tokens":
                t["count"] = count
            room = max(0, total - count - (s.get("n", 0) if key == "prompt" else 0))
            t["offset"] = room * sample // max(1, samples - 1) if samples > 1 else t.get("offset", 0)
    return d


def node_with_seed(spec, sample):
    if "perturb=" in spec and "perturb_seed=" not in spec:
        return spec + f",perturb_seed={sample + 1}"
    return spec


def score_of(value, direction):
    if value is None:
        return None
    if isinstance(value, str) or not math.isfinite(value):
        return math.inf
    return value if direction == "max" else -value


def auc(pos, neg):
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def run(args):
    base_path = os.path.abspath(args.protocol)
    base_dir = os.path.dirname(base_path)
    with open(base_path, encoding="utf-8") as f:
        base = json.load(f)
    studied = args.steps.split(",")
    budgets = [int(b) for b in args.budgets.split(",")]
    honest, subs = split_nodes(args.honest), split_nodes(args.substitutions)
    llama = parse_llamacpp(args.llamacpp)
    honest += [name for role, _, name in llama if role == "honest"]
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for budget in budgets:
            for i in range(args.samples):
                proto = os.path.join(tmp, "p.json")
                with open(proto, "w", encoding="utf-8") as f:
                    json.dump(protocol_variant(base, base_dir, studied, budget, i, args.samples), f)
                nodes = [args.reference] + [h for h in honest if not h.startswith("llama.cpp")] + [node_with_seed(s, i) for s in subs]
                out = os.path.join(tmp, "r.json")
                cmd = [args.kvasir, "audit", "-p", proto, "--steps", args.steps, "--gate", "none", "-o", out,
                       "-b", ",".join(nodes), "-r", args.reference]
                if args.model:
                    cmd += ["-m", args.model]
                print(f"budget {budget} sample {i + 1}/{args.samples}: {len(nodes)} nodes", file=sys.stderr, flush=True)
                must(cmd, "audit")
                with open(out, encoding="utf-8") as f:
                    report = json.load(f)
                records += records_of(report, budget, i, lambda spec: "honest" if spec in [json_name(h, report) for h in honest]
                                      else "substitution")
                if llama:
                    records += llamacpp_records(args, llama, proto, studied, budget, i, tmp)
    return base, studied, budgets, honest, subs, records


def records_of(report, budget, sample, role_of):
    """One record per judged node of an audit/compare report (the reference excluded)."""
    out = []
    for n in report["nodes"]:
        if n["node"] == report["reference"]:
            continue
        spec = n["node"].replace(f",perturb_seed={sample + 1}", "")
        crit = {}
        for tier in n.get("criteria", {}).values():
            for c in tier:
                crit.setdefault(c["criterion"], {"value": c["value"] if c.get("measured") else None,
                                                 "direction": c["direction"], "step": c["step"], "tolerance": {}})
                crit[c["criterion"]]["tolerance"][c["tier"]] = {"value": c["tolerance"], "pass": c["pass"]}
        out.append({"budget": budget, "sample": sample, "node": spec, "role": role_of(spec), "verdict": n["verdict"],
                    "criteria": crit})
    return out


LLAMACPP_STEPS = ("logits", "decide", "generate", "perplexity", "determinism")


def parse_llamacpp(specs):
    """--llamacpp ROLE:ARGS → [(role, [args...], node name)]; the name spells the options out
    ("llama.cpp:kv-type=f32,flash-attn=off", "llama.cpp:defaults")."""
    out = []
    for spec in specs:
        role, _, rest = spec.partition(":")
        if role not in ("honest", "reported"):
            sys.exit(f"detection_study: --llamacpp {spec!r}: ROLE must be honest or reported")
        argv, parts = rest.split(), []
        for a in argv:
            if a.startswith("--"):
                parts.append(a[2:])
            elif parts:
                parts[-1] += "=" + a
        out.append((role, argv, "llama.cpp:" + (",".join(parts) or "defaults")))
    return out


def llamacpp_records(args, llama, proto, studied, budget, sample, tmp):
    """llama.cpp's nodes on one sample: the reference captured, each llama.cpp node run on its tokens,
    compare's judgement."""
    steps = [s for s in studied if s in LLAMACPP_STEPS]
    if not steps:
        return []
    ref = os.path.join(tmp, "ref.safetensors")
    must([args.kvasir, "capture", "-p", proto, "-m", args.model, "-b", args.reference, "--steps", ",".join(steps),
          "-o", ref], "capture of the reference")
    caps, roles = [], {}
    # Its teacher-forced generation decodes the reference's greedy tokens (the reference's generate step).
    teacher = ["--reference-capture", ref] if "generate" in steps else []
    env = dict(os.environ)
    lib = os.path.join(os.path.dirname(os.path.abspath(args.llamacpp_python)), "..", "..", "build", "bin")
    if os.path.isdir(lib) and "LLAMA_CPP_LIB_PATH" not in env:
        env["LLAMA_CPP_LIB_PATH"] = os.path.abspath(lib)
    for k, (role, argv, name) in enumerate(llama):
        cap = os.path.join(tmp, f"llama{k}.safetensors")
        must([args.llamacpp_python, os.path.join(HERE, "llamacpp_node.py"), "-p", proto, "-m", args.model, "-o", cap,
              "--kvasir", args.kvasir, "-q", "--steps", ",".join(steps), "--name", name] + argv + teacher,
             f"llamacpp_node.py {' '.join(argv)}", env)
        caps.append(cap)
        roles[name] = role
    out = os.path.join(tmp, "c.json")
    must([args.kvasir, "compare", "-p", proto, "--gate", "none", "--only-steps", ",".join(steps), "-o", out, ref] + caps,
         "compare of llama.cpp's captures")
    with open(out, encoding="utf-8") as f:
        return records_of(json.load(f), budget, sample, lambda spec: roles[spec])


def must(cmd, what, env=None):
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"detection_study: {what} failed (exit {r.returncode}): {r.stderr.strip()[-2000:]}")


def json_name(spec, report):
    """A spec as the report names the node ("cpu:acc=f32" is "cpu")."""
    for n in report["nodes"]:
        if n["node"] == spec or n["capabilities"].get("node") == spec:
            return n["node"]
    return spec


def analyse(budgets, records):
    order = [r["node"] for r in records]
    subs = sorted({r["node"] for r in records if r["role"] == "substitution"}, key=order.index)
    reported = sorted({r["node"] for r in records if r["role"] == "reported"}, key=order.index)
    stats = ["verdict"] + sorted({c for r in records for c in r["criteria"]})
    result = {"substitutions": {}, "reported": {}, "honest_false_positives": {}, "tolerances": {}}
    for b in budgets:
        hon = [r for r in records if r["budget"] == b and r["role"] == "honest"]
        result["honest_false_positives"][str(b)] = sum(r["verdict"] != "fit" for r in hon) / max(1, len(hon))
    for key, s in [("substitutions", s) for s in subs] + [("reported", s) for s in reported]:
        per = {}
        for b in budgets:
            hon = [r for r in records if r["budget"] == b and r["role"] == "honest"]
            mine = [r for r in records if r["budget"] == b and r["node"] == s]
            row = {}
            for st in stats:
                get = (lambda r: VERDICT_SCORE[r["verdict"]]) if st == "verdict" else (
                    lambda r: score_of(r["criteria"].get(st, {}).get("value"), r["criteria"].get(st, {}).get("direction")))
                h = [v for v in map(get, hon) if v is not None]
                m = [v for v in map(get, mine) if v is not None]
                if not h or not m:
                    continue
                thr = max(h)
                row[st] = {"zero_fp_detection": sum(v > thr for v in m) / len(m), "auc": auc(m, h), "n": len(m),
                           "step": "verdict" if st == "verdict" else next(
                               r["criteria"][st]["step"] for r in mine + hon if st in r["criteria"])}
                # How far apart: decades between the least suspicious substituted sample and the most
                # suspicious honest one (max-direction statistics with positive values; else absent).
                if st != "verdict" and 0 < thr < min(m) < math.inf:
                    row[st]["margin_decades"] = math.log10(min(m) / thr)
                elif st != "verdict" and thr == 0 < min(m):
                    row[st]["margin_decades"] = "inf"  # every honest sample measured exactly 0
            row_verdict = {"caught": sum(r["verdict"] != "fit" for r in mine) / max(1, len(mine))}
            per[str(b)] = row
            per[str(b)]["verdict"] = {**per[str(b)].get("verdict", {}), **row_verdict}
        firsts = {}
        for kind, keep in (("any", lambda st, v: True), ("model_run", lambda st, v: v["step"] not in ("ops", "verdict"))):
            firsts[kind] = None
            for b in budgets:
                cand = [(st, v) for st, v in per[str(b)].items() if "auc" in v and keep(st, v)]
                best = max(cand, key=lambda kv: (kv[1]["auc"], kv[1]["zero_fp_detection"]), default=None)
                if best and best[1]["auc"] >= 0.999:
                    firsts[kind] = {"budget": b, "statistic": best[0]}
                    break
        verdict_all = next((b for b in budgets if per[str(b)]["verdict"]["caught"] == 1.0
                            and result["honest_false_positives"][str(b)] == 0), None)
        result[key][s] = {"per_budget": per, "tokens_to_auc_0999": firsts["any"],
                                      "tokens_to_auc_0999_model_run": firsts["model_run"],
                                      "tokens_verdict_catches_all": verdict_all}
    for r in records:
        if r["role"] != "honest":
            continue
        for name, c in r["criteria"].items():
            t = result["tolerances"].setdefault(name, {"honest_worst": None, "direction": c["direction"], "tolerance": {},
                                                       "honest_failures": 0})
            v = c["value"]
            if v is not None:
                worse = t["honest_worst"] is None or score_of(v, c["direction"]) > score_of(t["honest_worst"], c["direction"])
                t["honest_worst"] = v if worse else t["honest_worst"]
            for tier, tol in c["tolerance"].items():
                t["tolerance"][tier] = tol["value"]
                t["honest_failures"] += 0 if tol["pass"] else 1
    return result


def fmt(x):
    if x is None:
        return "·"
    if isinstance(x, str):
        return x
    return f"{x:.3g}"


def best_of(row, keep):
    cand = {k: v for k, v in row.items() if "auc" in v and keep(k, v)}
    if not cand:
        return None
    margin = lambda v: math.inf if v.get("margin_decades") == "inf" else v.get("margin_decades", -1)
    return max(cand.items(), key=lambda kv: (kv[1]["zero_fp_detection"], kv[1]["auc"], margin(kv[1])))


def cell(best):
    if best is None:
        return "·"
    k, v = best
    if v["zero_fp_detection"] == 0 and v["auc"] < 0.999:
        return f"none separates (best AUC {v['auc']:.3f})"
    m = v.get("margin_decades")
    margin = "" if m is None else (", ∞" if m == "inf" else f", {m:.1f} dec")
    return f"`{k}` {v['zero_fp_detection']:.0%} / {v['auc']:.3f}{margin}"


def markdown(args, budgets, honest, result, records):
    model_run = lambda k, v: v["step"] not in ("ops", "verdict")
    probe = lambda k, v: v["step"] == "ops"
    lines = [f"Study: `{' '.join(os.path.relpath(a) if os.path.exists(a) else a for a in sys.argv)}`", "",
             f"Honest nodes: {', '.join(honest)} (reference {args.reference}); {args.samples} samples per budget; "
             f"steps {args.steps}.", "",
             "Honest verdicts not fit (false positives of the shipped protocol): " +
             ", ".join(f"{b} tokens {result['honest_false_positives'][str(b)]:.0%}" for b in budgets), "",
             "Cells: the statistic that separates best, its detection at zero false positives / ROC AUC, and the "
             "margin in decades between the least suspicious substituted sample and the most suspicious honest one.", "",
             "| substitution | verdict not fit @" + " / @".join(map(str, budgets)) + " | " +
             " | ".join(f"best model-run statistic @{b}" for b in budgets) +
             " | AUC ≥ 0.999 from (model-run) | best op-probe statistic (no tokens) |",
             "|---|---|" + "---|" * len(budgets) + "---|---|"]
    rows = [(s, d, "") for s, d in result["substitutions"].items()]
    rows += [(s, d, " (reported apart: not honest, not a substitution)") for s, d in result["reported"].items()]
    for s, d, note in rows:
        per = d["per_budget"]
        cells = [" / ".join(f"{per[str(b)]['verdict']['caught']:.0%}" for b in budgets)]
        cells += [cell(best_of(per[str(b)], model_run)) for b in budgets]
        first = d["tokens_to_auc_0999_model_run"]
        cells.append("not reached" if first is None else f"{first['budget']} tokens (`{first['statistic']}`)")
        cells.append(cell(best_of(per[str(budgets[-1])], probe)))
        lines.append(f"| `{s}`{note} | " + " | ".join(cells) + " |")
    lines += ["", "Shipped tolerances against the honest samples (worst honest value; a failure is a false positive):", "",
              "| criterion | direction | worst honest | tolerances | honest failures |", "|---|---|---|---|---|"]
    for name, t in sorted(result["tolerances"].items()):
        tol = ", ".join(f"{k} {fmt(v)}" for k, v in sorted(t["tolerance"].items()))
        lines.append(f"| `{name}` | {t['direction']} | {fmt(t['honest_worst'])} | {tol} | {t['honest_failures']} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvasir", required=True, help="the kvasir-equiv binary")
    ap.add_argument("-p", "--protocol", default="protocols/trained.json")
    ap.add_argument("-m", "--model", help="model (default: the protocol's)")
    ap.add_argument("--budgets", default="8,32,128", help="token budgets, comma separated")
    ap.add_argument("--samples", type=int, default=6, help="samples per budget (default 6)")
    ap.add_argument("--steps", default="ops,drift,logits,decide,generate,invariance")
    ap.add_argument("--reference", default="cpu-ref")
    ap.add_argument("--honest", default="cpu,cpu:threads=1,opencl:0")
    ap.add_argument("--substitutions", default=DEFAULT_SUBS)
    ap.add_argument("--llamacpp", action="append", default=[], metavar="ROLE:ARGS",
                    help="a llama.cpp node (repeatable; -m must be a GGUF): ROLE honest or reported, ARGS "
                         "scripts/llamacpp_node.py's options, e.g. 'honest:--kv-type f32 --flash-attn off', 'reported:'")
    ap.add_argument("--llamacpp-python", help="the Python with llama-cpp-python (default: the build folder's "
                                              "llamacpp/venv/bin/python beside --kvasir)")
    ap.add_argument("-o", "--output", help="JSON with every sample's figures and the analysis")
    ap.add_argument("--markdown", help="the tables as Markdown")
    ap.add_argument("--records", help="analyse the records of an earlier -o JSON instead of running audits "
                                      "(its budgets, samples, nodes and steps are used)")
    args = ap.parse_args()
    if args.records:
        with open(args.records, encoding="utf-8") as f:
            old = json.load(f)
        args.samples, args.steps = old["samples"], old.get("steps", args.steps)
        base, studied, budgets, honest, subs, records = ({"id": old["protocol"]}, args.steps.split(","), old["budgets"],
                                                         old["honest"], old["substitutions"], old["records"])
    else:
        if args.samples < 2:
            ap.error("--samples must be at least 2 (an AUC needs several honest samples)")
        if args.llamacpp:
            if not args.model or not args.model.endswith(".gguf"):
                ap.error("--llamacpp needs -m MODEL.gguf (llama.cpp reads GGUF files)")
            args.llamacpp_python = args.llamacpp_python or os.path.join(
                os.path.dirname(os.path.abspath(args.kvasir)), "llamacpp", "venv", "bin", "python")
            if not os.access(args.llamacpp_python, os.X_OK):
                ap.error(f"--llamacpp: no Python at {args.llamacpp_python} (--llamacpp-python)")
        base, studied, budgets, honest, subs, records = run(args)
    result = analyse(budgets, records)
    doc = {"schema": "kvasir-equiv/detection-study/1", "command": sys.argv, "protocol": base["id"],
           "budgets": budgets, "samples": args.samples, "steps": args.steps, "honest": honest, "substitutions": subs,
           "records": records, **result}
    text = markdown(args, budgets, honest, result, records)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, allow_nan=False, default=str)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
