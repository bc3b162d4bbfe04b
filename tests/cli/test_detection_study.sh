#!/usr/bin/env bash
# The detection study (issue 43, scripts/detection_study.py) on a small budget: two
# samples at 16 and 320 tokens, honest cpu and opencl:0 against three substitutions.
# Asserts what must hold whatever the arithmetic: the shipped protocol passes every
# honest sample at 320 tokens (its decide bound needs them: at 16 tokens no node can
# show 99 % agreement, and every honest verdict is then not fit — reported, not hidden);
# a skipped layer is caught by the verdict and by some statistic at zero false positives
# with AUC 1 at both budgets; the AUCs in the output equal a Mann–Whitney U computed here
# from the records (an independent implementation); every sample of every node is there.
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
echo "$failures failed"
[ "$failures" -eq 0 ]
