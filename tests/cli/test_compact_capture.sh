#!/usr/bin/env bash
# Compact captures (issue 43, capture --compact; metrics/compact.hpp), run for real on the
# trained fixture:
#  * size: the logits step's tensors cost 1,024 bytes per 32 positions at K = 3 (32 bytes a
#    position: top-3 ids and log-probabilities, the log-sum-exp, the hidden-state fingerprint),
#    against 4·V bytes a position for the full rows — whatever V is;
#  * what compact keeps is what the full rows give: the compact capture's top-K ids and
#    log-probabilities are those computed here with numpy from the full capture's rows;
#  * verdicts: the honest nodes and the substitution variants of steps/substitution.hpp,
#    captured full and compact, judged by compare against a full reference and against a
#    compact one: the same verdict for every node, but one at K = 3: requant=q4_k, whose
#    tolerant-tier failure (KL p99 3.6e-2 > 3e-2) the top-3 cannot prove — KL's rigorous lower
#    bound from 3 tokens a position reaches 2.0e-2 (logits.kl_lower_p99): unfit-sensitive from a
#    compact capture, unfit from a full one — asserted as what it is. At K = 16 (4,352 bytes per
#    32 positions) the bound reaches 3.0e-2 and every verdict equals the full captures'. Compact
#    nodes have KL and L∞ listed as not measured, with why.
# Usage: test_compact_capture.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
pyn=$(python_with numpy)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
steps=ops,drift,logits,decide,generate,invariance
nodes="cpu-ref cpu opencl:0 cpu:storage=bf16 cpu:requant=q8_0 cpu:requant=q4_k cpu:requant=mxfp4 cpu:kv=f16 cpu:kv=fp8 cpu:topk=1 cpu:skip_layer=2 cpu:perturb=0.001"
full=() compact=() compact16=()
for n in $nodes; do
  f=$(printf '%s' "$n" | tr ':=,.' '____')
  "$bin" capture --steps $steps -b "$n" -o "$tmp/$f.full.safetensors" >/dev/null 2>&1 || echo "FAIL: capture $n"
  "$bin" capture --steps $steps -b "$n" --compact -o "$tmp/$f.compact.safetensors" >/dev/null 2>&1 || echo "FAIL: capture --compact $n"
  "$bin" capture --steps $steps -b "$n" --compact --top-k 16 -o "$tmp/$f.c16.safetensors" >/dev/null 2>&1 ||
    echo "FAIL: capture --compact --top-k 16 $n"
  full+=("$tmp/$f.full.safetensors") compact+=("$tmp/$f.compact.safetensors") compact16+=("$tmp/$f.c16.safetensors")
done
check "compact: 1,024 bytes per 32 positions for the logits step (K = 3), the same top-K as the full rows" \
  "$pyn" - "${full[1]}" "${compact[1]}" <<'PY'
import sys
sys.path.insert(0, "scripts")
import numpy as np
import capture_format as c
_, f = c.read_capture(sys.argv[1])
_, k = c.read_capture(sys.argv[2])
assert "logits.logits" in f and "logits.logits" not in k, (sorted(f), sorted(k))
logit_bytes = sum(v.nbytes for n, v in k.items() if n.startswith("logits."))
t, vocab = f["logits.logits"].shape
assert t % 32 == 0 and logit_bytes == 1024 * t // 32, (logit_bytes, t)
print("  %d positions: %d bytes compact, %d full (%d a position: 4 x vocab %d)" % (
    t, logit_bytes, f["logits.logits"].nbytes, 4 * vocab, vocab))
x = f["logits.logits"].astype(np.float64)
m = x.max(axis=1, keepdims=True)
lse = (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]
ids = np.argsort(-x, axis=1, kind="stable")[:, :3]
assert (ids == k["logits.top_ids"]).all()
lp = np.take_along_axis(x, ids, axis=1) - lse[:, None]
assert np.abs(lp - k["logits.top_logprobs"]).max() <= 1e-6 * np.abs(lp).max(), np.abs(lp - k["logits.top_logprobs"]).max()
assert np.abs(lse - k["logits.lse"]).max() <= 1e-6 * np.abs(lse).max()
for n in ("logits.fingerprint_index", "logits.fingerprint_value"):
    assert (f[n] == k[n]).all(), n
PY
"$bin" compare "${full[@]}" --only-steps $steps --gate none -o "$tmp/full.json" >/dev/null 2>&1
"$bin" compare "${full[0]}" "${compact[@]:1}" --only-steps $steps --gate none -o "$tmp/mixed.json" >/dev/null 2>&1
"$bin" compare "${compact[@]}" --only-steps $steps --gate none -o "$tmp/compact.json" >/dev/null 2>&1
check "the same verdicts full and compact (full or compact reference), q4_k's tolerant tier the one exception" \
  python3 - "$tmp/full.json" "$tmp/mixed.json" "$tmp/compact.json" <<'PY'
import json, sys
full, mixed, compact = (json.load(open(p)) for p in sys.argv[1:])
v = lambda d: {n["node"]: n["verdict"] for n in d["nodes"]}
print("  full:    " + ", ".join("%s=%s" % kv for kv in v(full).items()))
for name, d in (("mixed", mixed), ("compact", compact)):
    for node, verdict in v(full).items():
        want = "unfit-sensitive" if node == "cpu:requant=q4_k" else verdict
        assert v(d)[node] == want, (name, node, v(d)[node], verdict)
    assert v(full)["cpu:requant=q4_k"] == "unfit", v(full)
    assert v(full)["cpu"] == v(full)["opencl:0"] == "fit", v(full)
    for n in d["nodes"]:
        if n["verdict"] == "reference":
            continue
        nm = n["not_measurable"]
        assert "logits.kl_p99" in nm and "logits.linf_max" in nm and "compact capture" in nm["logits.kl_p99"], (name, n["node"], nm)
        lb = {c["criterion"]: c for t in n["criteria"].values() for c in t}["logits.kl_lower_p99"]
        assert lb["measured"] and lb["value"] >= 0, (name, n["node"], lb)
        if n["node"] == "cpu:requant=q4_k":  # proves the sensitive tier, not the tolerant one
            assert 1e-6 < lb["value"] < 0.03, (name, lb)
print("  the same from a full and from a compact reference; KL and L-infinity named as not measured, "
      "KL's lower bound measured (q4_k: %.3g < 3e-2)" % {c["criterion"]: c for t in [x for n in compact["nodes"]
      if n["node"] == "cpu:requant=q4_k" for x in n["criteria"].values()] for c in t}["logits.kl_lower_p99"]["value"])
PY
"$bin" compare "${full[0]}" "${compact16[@]:1}" --only-steps $steps --gate none -o "$tmp/mixed16.json" >/dev/null 2>&1
"$bin" compare "${compact16[@]}" --only-steps $steps --gate none -o "$tmp/compact16.json" >/dev/null 2>&1
check "K = 16: 4,352 bytes per 32 positions and every verdict the full captures' (q4_k caught by KL's lower bound)" \
  "$pyn" - "$tmp/full.json" "$tmp/mixed16.json" "$tmp/compact16.json" "${compact16[1]}" <<'PY'
import json, os, sys
sys.path.insert(0, "scripts")
import capture_format as c
full, mixed, compact = (json.load(open(p)) for p in sys.argv[1:4])
_, k = c.read_capture(sys.argv[4])
t = k["logits.lse"].shape[0]
size = sum(v.nbytes for n, v in k.items() if n.startswith("logits."))
assert size == 4352 * t // 32, (size, t)
v = lambda d: {n["node"]: n["verdict"] for n in d["nodes"]}
for name, d in (("mixed", mixed), ("compact", compact)):
    assert v(d) == v(full), (name, v(d), v(full))
    q4 = [n for n in d["nodes"] if n["node"] == "cpu:requant=q4_k"][0]
    failed = [c["criterion"] for c in q4["criteria"]["tolerant"] if not c["pass"]]
    assert failed == ["logits.kl_lower_p99"], (name, failed)
print("  %d positions: %d bytes; the same verdicts as full for all %d nodes, full or compact reference" % (t, size, len(v(full))))
PY
echo "$failures failed"
[ "$failures" -eq 0 ]
