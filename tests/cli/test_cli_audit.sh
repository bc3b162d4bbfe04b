#!/usr/bin/env bash
# audit from the command line: exit codes per gate, every report file (the
# JSON checked against the shipped schema and the JUnit XML by Python's XML
# parser via scripts/validate_report.py), bad protocols refused with the JSON
# pointer of the problem, and an audit killed mid-way leaving the previous
# report intact and no partial file.
# Usage: test_cli_audit.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
tmp=$(mktemp -d)
ci=protocols/ci.json

# Gate decides the exit code.
"$bin" audit -p $ci -b cpu-ref,cpu >"$tmp/fit.out"; rc=$?
check "all nodes fit → exit 0" test $rc -eq 0
check "summary line names the verdict counts" grep -q "1 fit, 0 unfit-sensitive, 0 unfit, 0 error → exit 0 (gate sensitive)" "$tmp/fit.out"

"$bin" audit -p $ci -b cpu-ref,cpu,cpu:acc=f16 \
  -o "$tmp/r.json" --junit "$tmp/r.xml" --markdown "$tmp/r.md" --csv "$tmp/r.csv" \
  --svg-heatmap "$tmp/h.svg" --svg-drift "$tmp/d.svg" >"$tmp/f16.out"; rc=$?
check "f16 accumulation under the sensitive gate → exit 1" test $rc -eq 1
check "f16 accumulation is unfit-sensitive" grep -qE "^cpu:acc=f16 +unfit-sensitive +FAIL" "$tmp/f16.out"
"$bin" audit -p $ci -b cpu-ref,cpu,cpu:acc=f16 --gate tolerant >/dev/null; rc=$?
check "the same nodes under --gate tolerant → exit 0" test $rc -eq 0
"$bin" audit -p $ci -b cpu-ref,cpu:fault=nan --gate tolerant >"$tmp/nan.out"; rc=$?
check "a NaN node fails even the tolerant gate → exit 1" test $rc -eq 1
check "the NaN node is an error" grep -qE "^cpu:fault=nan +error" "$tmp/nan.out"
"$bin" audit -p $ci -b cpu-ref,cpu:fault=nan --gate none >/dev/null; rc=$?
check "--gate none reports but never fails → exit 0" test $rc -eq 0

# The invariance step tells a batch-variant node (split-K chosen by shape)
# from the batch-invariant f32 cpu: same arithmetic class, different company.
"$bin" audit -p $ci -b cpu-ref,cpu,cpu:split_k=shape -o "$tmp/inv.json" >"$tmp/inv.out"; rc=$?
check "a batch-variant node under the sensitive gate → exit 1" test $rc -eq 1
check "the batch-variant node is unfit-sensitive" grep -qE "^cpu:split_k=shape +unfit-sensitive +FAIL +invariance\." "$tmp/inv.out"
check "cpu is still fit" grep -qE "^cpu +fit +pass" "$tmp/inv.out"
check "the invariance table shows cpu identical in every batch" \
  grep -qE "^  cpu +identical +identical +identical " "$tmp/inv.out"
check "the report names the failing batch figure" python3 - "$tmp/inv.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
nodes = {n["node"]: n for n in doc["steps"]["invariance"]["nodes"]}
split = nodes["cpu:split_k=shape"]
assert split["ops"]["matmul"] > 0 and split["ops"]["softmax"] == 0, split["ops"]
assert any(not b["bit_identical"] for b in split["batch"]), split["batch"]
assert all(b["bit_identical"] for b in nodes["cpu"]["batch"]), nodes["cpu"]["batch"]
PY
check "backends --help lists the contrast variant" bash -c "'$bin' backends | grep -q 'cpu:split_k=shape'"

# --steps: the invariance step alone (any step subset), in a process per node
# and in this process: the same verdicts as the full audit gives on those
# criteria, no other step run or judged, the subset named in every report.
"$bin" audit -p $ci -b cpu-ref,cpu,cpu:split_k=shape --steps invariance -o "$tmp/only.json" \
  --markdown "$tmp/only.md" >"$tmp/only.out"; rc=$?
check "--steps invariance: the batch-variant node still fails → exit 1" test $rc -eq 1
check "--steps invariance: the header names the subset" grep -qE "^kvasir-equiv audit +protocol ci v[0-9]+ \(sha256:[0-9a-f]+\) +steps invariance only" "$tmp/only.out"
check "--steps invariance: the batch-variant node's verdict line as in the full audit" \
  bash -c "diff <(grep -E '^cpu:split_k=shape ' '$tmp/inv.out') <(grep -E '^cpu:split_k=shape ' '$tmp/only.out')"
check "--steps invariance: cpu fit on an invariance criterion" grep -qE "^cpu +fit +pass +invariance\." "$tmp/only.out"
check "--steps invariance: no other step's table" bash -c "! grep -qE '^(Drift over depth|Step 6)' '$tmp/only.out'"
check "--steps invariance: the Markdown report names the subset" grep -q "steps judged: invariance only" "$tmp/only.md"
check "--steps invariance: the JSON names the subset, holds only that step, and no other criterion" python3 - "$tmp/only.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["protocol"]["steps_judged"] == ["invariance"], doc["protocol"]
assert set(doc["steps"]) == {"invariance", "isolation"}, list(doc["steps"])
judged = [c["criterion"] for n in doc["nodes"] for tier in ("sensitive", "tolerant")
          for c in n.get("criteria", {}).get(tier, [])]
assert judged and all(c.startswith("invariance.") for c in judged), judged
PY
check "--steps report valid against protocols/report.schema.json" "$(python_with jsonschema)" scripts/validate_report.py "$tmp/only.json"
"$bin" audit -p $ci -b cpu-ref,cpu,cpu:split_k=shape --steps invariance --in-process -o "$tmp/only_ip.json" >/dev/null; rc=$?
check "--steps --in-process → exit 1 too" test $rc -eq 1
check "--steps: in this process, the same step section and verdicts" python3 - "$tmp/only.json" "$tmp/only_ip.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
assert a["steps"]["invariance"] == b["steps"]["invariance"]
assert a["nodes"] == b["nodes"]
assert b["protocol"]["steps_judged"] == ["invariance"]
PY
"$bin" audit -p $ci -b cpu-ref,cpu --steps drift,ops -o "$tmp/two.json" >/dev/null; rc=$?
check "--steps drift,ops → exit 0" test $rc -eq 0
check "--steps drift,ops: run and named in protocol order" python3 - "$tmp/two.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["protocol"]["steps_judged"] == ["ops", "drift"], doc["protocol"]
assert [s for s in doc["steps"] if s != "isolation"] == ["ops", "drift"], list(doc["steps"])
PY

# --timings: where the time went on stderr; the report itself is unchanged.
# In this process (--in-process) the load phase is the audit's own; with a
# process per node each child reads its weights inside its step seconds.
"$bin" audit -p $ci -b cpu-ref,cpu --timings >/dev/null 2>"$tmp/iso_t.err"; rc=$?
check "--timings (process per node) keeps the exit code" test $rc -eq 0
check "--timings (process per node): the load happens in each node's process" grep -qE "^  load +each node's process reads its own weights" "$tmp/iso_t.err"
check "--timings (process per node): a row per step with a column per node" grep -qE "^  logits +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$" "$tmp/iso_t.err"
"$bin" audit -p $ci -b cpu-ref,cpu --in-process --timings -o "$tmp/t.json" >"$tmp/t.out" 2>"$tmp/t.err"; rc=$?
check "--timings keeps the exit code" test $rc -eq 0
check "--timings: the load phase with bytes and GB/s" grep -qE "^  load +[0-9.]+ GB of weights in [0-9.]+ s \([0-9.]+ GB/s\)" "$tmp/t.err"
check "--timings: a column per node and 'other'" grep -qE "^  step +wall +cpu-ref +cpu +other$" "$tmp/t.err"
for s in ops drift logits decide generate perplexity determinism total; do
  check "--timings: a row for $s" grep -qE "^  $s +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$" "$tmp/t.err"
done
check "--timings stays out of stdout" bash -c "! grep -q 'timings' '$tmp/t.out'"
"$bin" audit -p $ci -b cpu-ref,cpu --in-process -o "$tmp/t2.json" >/dev/null 2>&1
check "--timings stays out of the report (byte-identical JSON)" cmp -s "$tmp/t.json" "$tmp/t2.json"

# Every report file, checked by independent parsers.
for f in r.json r.xml r.md r.csv h.svg d.svg; do check "$f written" test -s "$tmp/$f"; done
pyjs=$(python_with jsonschema)
check "a python3 with jsonschema exists (setup installs python3-jsonschema)" test -n "$pyjs"
check "JSON report valid against protocols/report.schema.json (Python jsonschema)" \
  "${pyjs:-false}" scripts/validate_report.py "$tmp/r.json"
check "JUnit XML accepted by an XML parser with consistent counts" python3 scripts/validate_report.py --junit "$tmp/r.xml"
check "JUnit has a failure for the sensitive f16 node" grep -q '<failure' "$tmp/r.xml"
check "JSON records exit code 1" grep -q '"exit_code": 1' "$tmp/r.json"
check "Markdown has the verdict table" grep -q "unfit-sensitive" "$tmp/r.md"
check "CSV header names every node" grep -q '^node,cpu-ref,cpu,cpu:acc=f16' "$tmp/r.csv"
check "heatmap is SVG" grep -q '<svg' "$tmp/h.svg"
check "drift plot has sqrt(L) and L guides" test "$(grep -c 'class="guide"' "$tmp/d.svg")" -ge 2
"$bin" audit -p $ci -b cpu-ref,cpu --json >"$tmp/stdout.json"
check "--json prints the report on stdout" python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['schema']=='kvasir-equiv/audit/1'" "$tmp/stdout.json"

# Bad usage and bad protocols: exit 2, one line, naming the problem.
expect_usage_error "--gate" audit -p $ci --gate maybe
expect_usage_error "--steps: protocol 'ci' does not run step \"invarance\" (it runs: ops, drift, logits, decide, generate, perplexity, determinism, invariance)" audit -p $ci --steps invarance
expect_usage_error "no-such.json" audit -p "$tmp/no-such.json"
python3 - "$tmp" <<'PY'
import copy, json, os, sys
base = json.load(open("protocols/ci.json"))
tokens = os.path.abspath("fixtures/tokens/default.txt")  # the copies live elsewhere
for step in base["steps"].values():
    for key in ("tokens", "prompt"):
        if isinstance(step.get(key), dict):
            step[key]["path"] = tokens
base.pop("model", None)
def write(name, edit):
    doc = copy.deepcopy(base)
    edit(doc)
    json.dump(doc, open(os.path.join(sys.argv[1], name), "w"))
write("type.json", lambda d: d["tiers"]["sensitive"]["logits.kl_p99"].update(value="tiny"))
write("unknown.json", lambda d: d["steps"]["ops"].update(shapez=1))
write("missing.json", lambda d: d["tiers"]["tolerant"].pop("perplexity.ratio_max"))
PY
expect_usage_error "/tiers/sensitive/logits.kl_p99/value" audit -p "$tmp/type.json"
expect_usage_error "/steps/ops/shapez" audit -p "$tmp/unknown.json"
expect_usage_error "/tiers/tolerant" audit -p "$tmp/missing.json"

# Killed mid-way: the previous report stays, no partial or temporary file.
echo '{"previous": true}' >"$tmp/keep.json"
mkdir -p "$tmp/children"
TMPDIR="$tmp/children" "$bin" audit -b cpu-ref,cpu,cpu:acc=f16 -o "$tmp/keep.json" --junit "$tmp/keep.xml" >/dev/null 2>&1 &
pid=$!
sleep 2
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
sleep 0.5
check "no node process outlives the killed audit" bash -c "! pgrep -f '[k]vasir-equiv capture.*$tmp/children' >/dev/null"
check "the previous report is intact after kill -9" grep -q '"previous": true' "$tmp/keep.json"
check "no JUnit file appeared" test ! -e "$tmp/keep.xml"
check "no temporary file left beside it" test -z "$(find "$tmp" -name '*.tmp-*')"

# Only the reference: nothing compared, said in words, no empty table, exit 1.
"$bin" audit -p $ci -b cpu-ref >"$tmp/alone.out" 2>&1; rc=$?
check "only the reference → exit 1 (nothing compared is never a pass)" test $rc -eq 1
check "only the reference → the report says nothing was compared" grep -q "No node was compared with the reference" "$tmp/alone.out"
check "only the reference → no pair table" bash -c "! grep -q 'max|Δ|' '$tmp/alone.out'"

# Progress (issue #42): on a terminal a line per step and node with the time elapsed and, once there is a
# pace, the time left, rewritten in place; nothing when stderr is a file (logs, CI). `script` (util-linux)
# gives the run a terminal.
"$bin" audit -p $ci -b cpu-ref,cpu --in-process -o /dev/null >/dev/null 2>"$tmp/notty.err"
check "no terminal: no progress on stderr" bash -c "! grep -qaE 'elapsed|\\[[0-9]+/[0-9]+ ' '$tmp/notty.err' && ! grep -qa \$'\\r' '$tmp/notty.err'"
script -qec "'$bin' audit -p $ci -b cpu-ref,cpu --in-process -o /dev/null" /dev/null >"$tmp/tty.out" 2>&1
check "a terminal: progress per step and node, elapsed, then the time left" bash -c \
  "grep -qaE '\\[1/[0-9]+ +0%\\] ops' '$tmp/tty.out' && grep -qaE '— cpu \\(2/2\\)' '$tmp/tty.out' && grep -qa 'elapsed' '$tmp/tty.out'"
script -qec "'$bin' audit -p $ci -b cpu-ref,cpu -o /dev/null" /dev/null >"$tmp/tty_iso.out" 2>&1
check "a terminal, one process per node: a line per node process" grep -qaE '\[2/2 +50%\] node processes — cpu ' "$tmp/tty_iso.out"

rm -rf "$tmp"
echo "$failures failed"
[ "$failures" -eq 0 ]
