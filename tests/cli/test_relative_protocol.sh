#!/usr/bin/env bash
# Noise-floor-relative tolerances (issue #18, protocols/relative.json) on a
# deep model with large logits (tests/cli/make_deep_model.py: 32 layers, the
# fixture's lm_head x200, written by the safetensors library): correct f32
# arithmetic moves its logits by more than the default protocol's absolute
# 1e-3, so default.json fails the f32 nodes; relative.json, whose sensitive
# tier is a multiple of what the plain cpu node (the floor, measured in the
# same run) shows, finds them fit — and still fails f16 accumulation and a
# flipped weight bit. Python: numpy + safetensors (BUILD/pyvenv, as the
# other node tests); judging uses Debian's python3 json only.
# Usage: test_relative_protocol.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
require_test_python "the deep model" numpy safetensors
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" tests/cli/make_deep_model.py fixtures/models/qwen3_moe_tiny "$tmp/deep" --layers 32 --logit-scale 200 >/dev/null
check "the deep model is written" test -s "$tmp/deep/model.safetensors"
nodes=cpu-ref,cpu,opencl:0,cpu:acc=f16,cpu:fault=bitflip
for p in default relative; do
  OMP_WAIT_POLICY=passive "$bin" audit -p protocols/$p.json -m "$tmp/deep" --backends $nodes --gate none -o "$tmp/$p.json" >"$tmp/$p.out" 2>&1
  check "audit -p protocols/$p.json on the deep model exits 0 (gate none)" test $? -eq 0
done
check "the verdicts are what relative.json claims" /usr/bin/python3 - "$tmp/default.json" "$tmp/relative.json" <<'PY'
import json, sys
d, r = (json.load(open(f)) for f in sys.argv[1:3])
dv = {n["node"]: n for n in d["nodes"]}
rv = {n["node"]: n for n in r["nodes"]}
def crit(n, tier, name):
    return next(c for c in n["criteria"][tier] if c["criterion"] == name)
ok = True
def expect(cond, what):
    global ok
    print(("ok  " if cond else "BAD ") + what)
    ok = ok and cond
for f32 in ("cpu", "opencl:0"):
    lin = crit(dv[f32], "sensitive", "logits.linf_max")
    expect(dv[f32]["verdict"] == "unfit-sensitive" and not lin["pass"] and lin["value"] > 1e-3,
           f"default.json: {f32} unfit-sensitive, logits.linf_max {lin['value']:.3g} > 1e-3 (an honest f32 node failed)")
expect(rv["cpu"]["verdict"] == "fit" and rv["cpu"].get("floor") is True, "relative.json: cpu is the floor and fit")
expect("logits.linf_max" in rv["cpu"]["not_measurable"], "relative.json: the floor's own x_floor criteria are not judged by it")
lin = crit(rv["opencl:0"], "sensitive", "logits.linf_max")
floor = crit(dv["cpu"], "sensitive", "logits.linf_max")["value"]
expect(rv["opencl:0"]["verdict"] == "fit", f"relative.json: opencl:0 fit (linf {lin['value']:.3g} <= {lin['tolerance']:.3g})")
expect(lin["floor"]["relative"] and lin["floor"]["node"] == "cpu" and abs(lin["tolerance"] - 30 * lin["floor"]["floor_value"]) <= 1e-12 * lin["tolerance"]
       and abs(lin["floor"]["floor_value"] - floor) <= 1e-15 * floor,
       f"relative.json: opencl's tolerance is 30 x the floor cpu's {floor:.3g} (the same figure default.json measured on cpu)")
expect(rv["cpu:acc=f16"]["verdict"] in ("unfit-sensitive", "unfit"), f"relative.json: f16 accumulation caught ({rv['cpu:acc=f16']['verdict']})")
b = crit(rv["cpu:fault=bitflip"], "sensitive", "bound.probable_violations_max")
expect(rv["cpu:fault=bitflip"]["verdict"] in ("unfit-sensitive", "unfit") and b["value"] > 0,
       f"relative.json: the weight bitflip caught ({b['value']:.0f} probable-bound violations)")
sys.exit(0 if ok else 1)
PY
echo "$failures failed, $skips skipped"
[ "$failures" -eq 0 ]
