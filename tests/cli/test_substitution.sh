#!/usr/bin/env bash
# Substitution variants (issue 43, steps/substitution.hpp), run for real:
#  * requant=q8_0|q4_k|mxfp4 is llama.cpp's quantised model: a random F32 llama
#    GGUF quantised by llama.cpp's own llama-quantize (--pure, the token
#    embedding kept F32) and run by cpu-ref gives the same logits and residual
#    stream, bit for bit, as cpu-ref running the F32 file with requant= — so the
#    weights the variant multiplies by are llama.cpp's dequantised weights, byte
#    for byte. Rows of 64 (Q4_K falls back to Q5_0) and of 80 (F16) included.
#  * an audit of the trained fixture names each variant and judges it: every
#    substitution is caught (not fit), the honest cpu node is fit.
#  * a substitution where there is no model (ops without --model) or with a
#    bad value: exit 2, one line.
# Usage: test_substitution.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
lc="$(cd "$(dirname "$bin")" && pwd)/llamacpp"
py="$lc/venv/bin/python"
quant="$lc/build/bin/llama-quantize"
if [ ! -x "$quant" ] || ! "$py" -c "import gguf" 2>/dev/null; then
  echo "FAIL: no llama-quantize / gguf under $lc (scripts/test builds it: scripts/setup_llamacpp.sh)"
  echo "1 failed"
  exit 1
fi
pyn=$(python_with numpy)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
p="$tmp/q.json"
python3 tests/cli/protocol_variant.py protocols/ci.json "$p" substitution --steps logits,drift --set logits.tokens.count=8

"$py" tests/cli/make_dense_gguf.py fixtures/models/llama_tiny.gguf "$tmp/wide.gguf"
"$py" tests/cli/make_dense_gguf.py fixtures/models/llama_tiny.gguf "$tmp/narrow.gguf" 64 80
for case in wide:Q8_0 wide:Q4_K wide:MXFP4_MOE narrow:Q4_K narrow:Q8_0 narrow:MXFP4_MOE; do
  g=${case%%:*} t=${case#*:}
  opt=$(echo "${t%_MOE}" | tr 'A-Z' 'a-z')
  "$quant" --pure --token-embedding-type f32 "$tmp/$g.gguf" "$tmp/$g.$t.gguf" "$t" >"$tmp/quant.log" 2>&1 ||
    { echo "FAIL: llama-quantize $g $t"; cat "$tmp/quant.log"; failures=$((failures + 1)); continue; }
  "$bin" capture -p "$p" -m "$tmp/$g.$t.gguf" -b cpu-ref -o "$tmp/llama.safetensors" >/dev/null 2>&1
  "$bin" capture -p "$p" -m "$tmp/$g.gguf" -b "cpu-ref:requant=$opt" -o "$tmp/sub.safetensors" >/dev/null 2>&1
  check "$g.gguf: cpu-ref:requant=$opt = cpu-ref on llama-quantize's $t file, logits and residual stream bit for bit" \
    "$pyn" - "$tmp/llama.safetensors" "$tmp/sub.safetensors" <<'PY'
import sys
sys.path.insert(0, "scripts")
import numpy as np
import capture_format as c
a, b = c.read_capture(sys.argv[1])[1], c.read_capture(sys.argv[2])[1]
names = ["logits.logits"] + sorted(k for k in a if k.startswith("drift.hidden."))
assert len(names) > 2, names
for k in names:
    x, y = a[k], b[k]
    assert x.shape == y.shape and x.tobytes() == y.tobytes(), (k, float(np.max(np.abs(x - y))))
print("  %d tensors identical (%s)" % (len(names), ", ".join(names)))
PY
done
grep -q "falling back to *q5_0" <(for t in Q4_K; do "$quant" --pure --token-embedding-type f32 "$tmp/narrow.gguf" "$tmp/x.gguf" $t 2>&1; done)
check "narrow.gguf: llama-quantize really fell back (Q4_K → Q5_0 for rows of 64)" test $? -eq 0

# --- an audit names and judges every variant -----------------------------------------------
variants="cpu:requant=q8_0,cpu:requant=q4_k,cpu:requant=mxfp4,cpu:kv=f16,cpu:kv=fp8,cpu:topk=1,cpu:skip_layer=2,cpu:perturb=0.001"
"$bin" audit -b "cpu-ref,cpu,$variants" -o "$tmp/audit.json" >"$tmp/audit.txt" 2>&1; rc=$?
check "audit with substitution nodes → exit 1 (they fail the gate)" test $rc -eq 1
check "every substitution is caught (not fit), the honest cpu node is fit" python3 - "$tmp/audit.json" "$variants" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
v = {n["node"]: n["verdict"] for n in d["nodes"]}
print("  " + ", ".join("%s=%s" % kv for kv in v.items()))
assert v["cpu"] == "fit", v
for name in sys.argv[2].split(","):
    assert v[name] in ("unfit", "unfit-sensitive"), (name, v.get(name))
PY

# --- refusals ----------------------------------------------------------------------------------
expect_usage_error "needs the model" ops -b cpu-ref,cpu:requant=q8_0
expect_usage_error "requant must be" audit -b cpu-ref,cpu:requant=q3_k
expect_usage_error "topk=8 is not below" audit -b cpu-ref,cpu:topk=8
expect_usage_error "skip_layer=9" capture -b cpu:skip_layer=9 -o "$tmp/x.safetensors"
check "no capture written on bad input" test ! -e "$tmp/x.safetensors"

echo "$failures failed"
[ "$failures" -eq 0 ]
