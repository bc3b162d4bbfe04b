#!/usr/bin/env bash
# The detection study (issue 43, scripts/detection_study.py) on a small budget: two
# samples at 16 and 320 tokens, honest cpu and opencl:0 against three substitutions.
# Asserts what must hold whatever the arithmetic: the shipped protocol passes every
# honest sample at 320 tokens (its decide bound needs them: at 16 tokens no node can
# show 99 % agreement, and every honest verdict is then not fit — reported, not hidden);
# a skipped layer is caught by the verdict and by some statistic at zero false positives
# with AUC 1 at both budgets; the AUCs in the output equal a Mann–Whitney U computed here
# from the records (an independent implementation); every sample of every node is there.
# Then llama.cpp as an honest node (and its defaults reported apart), below.
# Usage: test_detection_study.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 scripts/detection_study.py --kvasir "$bin" --budgets 16,320 --samples 2 --steps drift,logits,decide \
  --honest cpu,opencl:0 --substitutions cpu:requant=q4_k,cpu:skip_layer=1,cpu:perturb=0.001 \
  -o "$tmp/study.json" --markdown "$tmp/study.md" >"$tmp/out.txt" 2>"$tmp/err.txt"; rc=$?
check "detection_study.py → exit 0" test $rc -eq 0
cat "$tmp/study.md" | head -12
check "the study's claims hold" python3 - "$tmp/study.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
recs = d["records"]
assert len(recs) == 2 * 2 * 5, len(recs)  # budgets × samples × (2 honest + 3 substituted)
assert d["honest_false_positives"]["320"] == 0, d["honest_false_positives"]
assert d["honest_false_positives"]["16"] == 1, d["honest_false_positives"]
skip = d["substitutions"]["cpu:skip_layer=1"]["per_budget"]
for b in ("16", "320"):
    assert skip[b]["verdict"]["zero_fp_detection"] == 1 or b == "16", skip[b]["verdict"]
    best = max(v["zero_fp_detection"] for k, v in skip[b].items() if k != "verdict")
    assert best == 1 and max(v["auc"] for v in skip[b].values()) == 1, (b, best)
# AUC by Mann–Whitney U with midranks, from the records, for every statistic of every substitution.
def score(r, st):
    if st == "verdict":
        return {"fit": 0, "unfit-sensitive": 1, "unfit": 2, "error": 3}[r["verdict"]]
    c = r["criteria"].get(st)
    if c is None or c["value"] is None:
        return None
    v = float(c["value"]) if not isinstance(c["value"], str) else float("inf")
    return v if c["direction"] == "max" else -v
checked = 0
for s, sd in d["substitutions"].items():
    for b, stats in sd["per_budget"].items():
        for st, got in stats.items():
            pos = [score(r, st) for r in recs if r["node"] == s and str(r["budget"]) == b]
            neg = [score(r, st) for r in recs if r["role"] == "honest" and str(r["budget"]) == b]
            pos, neg = [x for x in pos if x is not None], [x for x in neg if x is not None]
            allv = sorted(pos + neg)
            rank = {}
            for i, v in enumerate(allv):
                rank.setdefault(v, []).append(i + 1)
            r_pos = sum(sum(rank[v]) / len(rank[v]) for v in pos)
            u = r_pos - len(pos) * (len(pos) + 1) / 2
            assert abs(u / (len(pos) * len(neg)) - got["auc"]) < 1e-12, (s, b, st, got)
            checked += 1
assert checked > 50, checked
print("  %d AUCs equal Mann-Whitney U; honest false positives %s" % (checked, d["honest_false_positives"]))
PY
# llama.cpp as a node of the study, run for real on the Qwen3.5-MoE hybrid GGUF fixture: llama.cpp F32 (f32 KV
# cache, no flash attention) among the honest nodes, its defaults reported apart. What must hold: every llama.cpp
# sample is there with the steps it can run (logits, decide), judged by compare like an audit's node; llama.cpp F32
# agrees with the oracle as closely as the cpu node (KL p99 < 1e-9: no routing flip on these tokens); its defaults
# (f16 KV cache) and kv=f16 are caught at zero false positives by KL p99 with llama.cpp F32 counted honest.
lc="$(cd "$(dirname "$bin")" && pwd)/llamacpp"
export LLAMA_CPP_LIB_PATH="$lc/build/bin"
if [ ! -x "$lc/venv/bin/python" ] || ! "$lc/venv/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "FAIL: no llama.cpp under $lc (scripts/test builds it: scripts/setup_llamacpp.sh)"
  failures=$((failures + 1))
else
  python3 scripts/detection_study.py --kvasir "$bin" -p protocols/ci.json -m fixtures/models/qwen3_5_moe_tiny.gguf \
    --budgets 16,64 --samples 2 --steps logits,decide --honest cpu --substitutions cpu:kv=f16,cpu:requant=q4_k \
    --llamacpp "honest:--kv-type f32 --flash-attn off" --llamacpp "reported:" \
    -o "$tmp/llama.json" >"$tmp/llama.out" 2>"$tmp/llama.err"; rc=$?
  check "detection_study.py --llamacpp → exit 0" test $rc -eq 0
  check "llama.cpp F32 honest, its defaults reported apart" python3 - "$tmp/llama.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
recs = d["records"]
f32, dflt = "llama.cpp:kv-type=f32,flash-attn=off", "llama.cpp:defaults"
assert d["honest"] == ["cpu", f32], d["honest"]
for name, role in ((f32, "honest"), (dflt, "reported")):
    mine = [r for r in recs if r["node"] == name]
    assert len(mine) == 4 and all(r["role"] == role for r in mine), (name, mine)
    for r in mine:
        steps = {c["step"] for c in r["criteria"].values()}
        assert steps == {"logits", "decide"}, steps
        assert r["criteria"].get("decide.routing_agreement_min", {}).get("value") is None  # no routing exposed
for r in recs:
    if r["node"] in ("cpu", f32):
        assert r["criteria"]["logits.kl_p99"]["value"] < 1e-9, r
assert set(d["reported"]) == {dflt} and set(d["substitutions"]) == {"cpu:kv=f16", "cpu:requant=q4_k"}, d.keys()
for name in ("cpu:kv=f16", "cpu:requant=q4_k"):
    for b in ("16", "64"):
        kl = d["substitutions"][name]["per_budget"][b]["logits.kl_p99"]
        assert kl["zero_fp_detection"] == 1 and kl["auc"] == 1, (name, b, kl)
for b in ("16", "64"):
    kl = d["reported"][dflt]["per_budget"][b]["logits.kl_p99"]
    assert kl["zero_fp_detection"] == 1 and kl["auc"] == 1, (b, kl)
print("  llama.cpp F32 KL p99 worst %.2g; defaults and kv=f16 caught at zero false positives" %
      max(r["criteria"]["logits.kl_p99"]["value"] for r in recs if r["node"] == f32))
PY
fi

echo "$failures failed"
[ "$failures" -eq 0 ]
