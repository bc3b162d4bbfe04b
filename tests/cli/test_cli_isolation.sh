#!/usr/bin/env bash
# One process per node (lib/kvasir/audit/isolation.hpp): a node that
# segfaults, hangs, or allocates without bound is that node's `error` with
# the reason; every other node is judged, the reports are written and valid,
# exit 1. The reference crashing ends the audit with exit 3 and a clear
# message; a bug of kvasir-equiv inside a step (fault=internal) is exit 3 in
# audit (isolated and in-process) and capture, never blamed on a node.
# Isolation changes no figure: the isolated report equals --in-process's.
# Usage: test_cli_isolation.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The audits of this script keep their children's captures under $tmp, so
# "no child left running" looks at this script's children only (other CLI
# tests run capture children of their own in parallel).
export TMPDIR="$tmp"
ci=protocols/ci.json

# field NODE KEY FILE: a node's verdict or its errors (as JSON) from a report.
node_field() {
  python3 - "$@" <<'PY'
import json, sys
node, key, path = sys.argv[1:4]
for n in json.load(open(path))["nodes"]:
    if n["node"] == node:
        v = n[key]
        print(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False))
PY
}

# Each process fault: the node is an error with its reason, cpu is still fit.
# Limits only where the case needs them: the healthy nodes must finish even on
# a loaded machine. Each takes well under a second on an idle 2-core machine,
# but CI runs this beside the heaviest tests (this script took 204 s there
# against 24 s idle), and a 15 s timeout once stopped the reference itself;
# 60 s is the margin that costs least while staying far above any slowdown seen.
for case in "segv|SIGSEGV (Segmentation fault)|" "hang|timed out after 60 s|--node-timeout 60" \
            "oom|exceeded 1 GiB of memory of its own|--node-memory 1"; do
  IFS='|' read -r fault want limits <<<"$case"
  # shellcheck disable=SC2086
  "$bin" audit -p $ci -b cpu-ref,cpu,cpu:fault=$fault $limits \
    -o "$tmp/$fault.json" --junit "$tmp/$fault.xml" >"$tmp/$fault.out" 2>"$tmp/$fault.err"; rc=$?
  check "fault=$fault: exit 1 (got $rc)" test $rc -eq 1
  [ $rc -eq 1 ] || tail -5 "$tmp/$fault.err"
  check "fault=$fault: the node is an error" test "$(node_field cpu:fault=$fault verdict "$tmp/$fault.json")" = error
  errs=$(node_field cpu:fault=$fault errors "$tmp/$fault.json")
  check "fault=$fault: its reason says '$want' ($errs)" grep -qF "$want" <<<"$errs"
  check "fault=$fault: the other node is still judged fit" test "$(node_field cpu verdict "$tmp/$fault.json")" = fit
  check "fault=$fault: the text report names the reason" grep -qF "$want" "$tmp/$fault.out"
  check "fault=$fault: JSON report valid against the schema" python3 scripts/validate_report.py "$tmp/$fault.json"
  check "fault=$fault: JUnit report valid" python3 scripts/validate_report.py --junit "$tmp/$fault.xml"
done
check "no child is left running" bash -c "! pgrep -f '[k]vasir-equiv capture .*$tmp/kvasir-audit-' >/dev/null"

# The reference crashing: exit 3, one clear line, no report written.
err=$("$bin" audit -p $ci -b cpu-ref,cpu --reference cpu:fault=segv -o "$tmp/ref.json" 2>&1 >/dev/null); rc=$?
check "reference crash → exit 3" test $rc -eq 3
check "reference crash → the message names the reference and the signal" \
  grep -qF "the reference node cpu:fault=segv crashed: SIGSEGV" <<<"$err"
check "reference crash → no report" test ! -e "$tmp/ref.json"

# A bug of this tool inside a step: exit 3 everywhere, never a node's error.
"$bin" audit -p $ci -b cpu-ref,cpu:fault=internal -o "$tmp/int.json" >/dev/null 2>"$tmp/int.err"; rc=$?
check "internal error in a step (isolated audit) → exit 3" test $rc -eq 3
check "internal error → message says internal and names the node" grep -qF "internal error while running node cpu:fault=internal" "$tmp/int.err"
check "internal error → no report" test ! -e "$tmp/int.json"
"$bin" audit -p $ci -b cpu-ref,cpu:fault=internal --in-process >/dev/null 2>&1; rc=$?
check "internal error in a step (--in-process) → exit 3" test $rc -eq 3
"$bin" capture -p $ci -b cpu:fault=internal -o "$tmp/int.safetensors" >/dev/null 2>&1; rc=$?
check "internal error in a step (capture) → exit 3" test $rc -eq 3
check "internal error (capture) → no capture file" test ! -e "$tmp/int.safetensors"

# Isolation changes no figure: the isolated and in-process reports are equal
# (the isolation block and timings aside).
"$bin" audit -p $ci -b cpu-ref,cpu,cpu:acc=f16,cpu:fault=nan -o "$tmp/iso.json" >/dev/null 2>&1
"$bin" audit -p $ci -b cpu-ref,cpu,cpu:acc=f16,cpu:fault=nan -o "$tmp/inp.json" --in-process >/dev/null 2>&1
check "isolated == in-process: every verdict, criterion value, pair matrix and drift series" python3 - "$tmp/iso.json" "$tmp/inp.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for k in ("nodes", "pairs", "drift", "summary", "exit_code"):
    assert a[k] == b[k], k
for step in ("ops", "drift", "logits", "decide", "generate", "perplexity", "determinism", "invariance"):
    assert a["steps"][step] == b["steps"][step], step
assert a["steps"]["isolation"]["mode"] == "one child process per node"
PY

# Nodes at once (--jobs) change no figure either: -j 3 (three children beside
# each other after the reference) gives -j 1's report, and both name their mode
# in --timings. A crash among concurrent nodes is still that node's error.
"$bin" audit -p $ci -b cpu-ref,cpu,cpu:acc=f16,cpu:fault=nan -j 1 -o "$tmp/j1.json" --timings >/dev/null 2>"$tmp/j1.err"
"$bin" audit -p $ci -b cpu-ref,cpu,cpu:acc=f16,cpu:fault=nan -j 3 -o "$tmp/j3.json" --timings >/dev/null 2>"$tmp/j3.err"
check "-j 3 == -j 1: the whole report" python3 - "$tmp/j1.json" "$tmp/j3.json" "$tmp/iso.json" <<'PY'
import json, sys
a, b, c = (json.load(open(p)) for p in sys.argv[1:4])
assert a == b, [k for k in a if a[k] != b.get(k)]
assert a["nodes"] == c["nodes"] and a["pairs"] == c["pairs"]
PY
check "-j 1 --timings says one at a time" grep -qE "^  nodes  one at a time; the audit took [0-9.]+ s" "$tmp/j1.err"
check "-j 3 --timings says 3 at once" grep -qE "^  nodes  3 at once \\(each node" "$tmp/j3.err"
"$bin" audit -p $ci -b cpu-ref,cpu,cpu:fault=segv,cpu:acc=f16 -j 3 -o "$tmp/jseg.json" >/dev/null 2>&1; rc=$?
check "-j 3 with a crashing node → exit 1" test $rc -eq 1
check "-j 3: the crashing node is an error, its neighbours judged" python3 -c "
import json,sys; d={n['node']: n for n in json.load(open(sys.argv[1]))['nodes']}
assert d['cpu:fault=segv']['verdict']=='error' and 'SIGSEGV' in json.dumps(d['cpu:fault=segv']['errors'])
assert d['cpu']['verdict']=='fit'" "$tmp/jseg.json"
# The reference crashing while the others run beside it: they are killed, exit 3, no report.
err=$("$bin" audit -p $ci -b cpu-ref,cpu,cpu:acc=f16 --reference cpu:fault=segv -j 3 -o "$tmp/jref.json" 2>&1 >/dev/null); rc=$?
check "-j 3: reference crash → exit 3" test $rc -eq 3
check "-j 3: reference crash → the message names the reference and the signal" \
  grep -qF "the reference node cpu:fault=segv crashed: SIGSEGV" <<<"$err"
check "-j 3: reference crash → no report" test ! -e "$tmp/jref.json"
expect_usage_error "--jobs" audit -p $ci --jobs 0

# Shared decisions (capture --decisions-out / --decisions-in, what every
# isolated audit's node processes do): the reference's process decides once;
# a capture that reads its decisions has the bits of one that runs the
# authority itself. Decisions of another seed, a reader that is the authority
# and both flags at once are refused by name; a writer that failed ends a
# waiting reader.
py=$(test_python numpy)
dec="$tmp/decisions"
"$bin" capture -p $ci -b cpu-ref --decisions-out "$dec" -o "$tmp/dref.safetensors" >/dev/null 2>&1; rc=$?
check "capture --decisions-out → exit 0" test $rc -eq 0
check "--decisions-out: one file per sharing step ($(ls "$dec" | tr '\n' ' '))" test "$(ls "$dec" | grep -c '\.decisions$')" -ge 5
"$bin" capture -p $ci -b cpu:acc=f16 --decisions-in "$dec" -o "$tmp/din.safetensors" >/dev/null 2>&1; rc=$?
check "capture --decisions-in → exit 0" test $rc -eq 0
"$bin" capture -p $ci -b cpu:acc=f16 -o "$tmp/dplain.safetensors" >/dev/null 2>&1
"$py" tests/cli/capture_agree.py "$tmp/dplain.safetensors" "$tmp/din.safetensors" --bits >"$tmp/dbits.out" 2>&1; rc=$?
check "decisions read from the reference's folder give the bits of deciding here ($(tail -1 "$tmp/dbits.out"))" test $rc -eq 0
# The task step's (only in the trained protocol): every request's routing.
"$bin" capture -b cpu-ref --steps task --decisions-out "$tmp/dect" -o /dev/null >/dev/null 2>&1
"$bin" capture -b cpu --steps task --decisions-in "$tmp/dect" -o "$tmp/tin.safetensors" >/dev/null 2>&1; rc=$?
"$bin" capture -b cpu --steps task -o "$tmp/tplain.safetensors" >/dev/null 2>&1
"$py" tests/cli/capture_agree.py "$tmp/tplain.safetensors" "$tmp/tin.safetensors" --bits >"$tmp/tbits.out" 2>&1 && [ $rc -eq 0 ]; rc=$?
check "the task's shared routing gives the bits of deciding here ($(tail -1 "$tmp/tbits.out"))" test $rc -eq 0
"$bin" capture -p $ci -b cpu-ref --seed 7 --decisions-out "$tmp/dec7" -o /dev/null >/dev/null 2>&1
expect_usage_error "seed is '7'" capture -p $ci -b cpu --decisions-in "$tmp/dec7" -o "$tmp/x.safetensors"
expect_usage_error "is the authority" capture -p $ci -b cpu-ref --decisions-in "$dec" -o "$tmp/x.safetensors"
expect_usage_error "either decides or reads" capture -p $ci -b cpu --decisions-in "$dec" --decisions-out "$dec" -o "$tmp/x.safetensors"
mkdir -p "$tmp/decf" && touch "$tmp/decf/failed"
err=$("$bin" capture -p $ci -b cpu --decisions-in "$tmp/decf" -o "$tmp/x.safetensors" 2>&1 >/dev/null); rc=$?
check "a failed writer ends the waiting reader (exit $rc, not 0)" test $rc -ne 0
check "... naming the step it waited for" grep -q "failed before deciding step" <<<"$err"

# The default run: the f16-accumulation contrast is shown, not gated.
"$bin" audit -p $ci -b cpu-ref,cpu >/dev/null 2>&1
"$bin" audit -p $ci -o "$tmp/default.json" >"$tmp/default.out" 2>&1; rc=$?
check "default nodes on a healthy machine → exit 0" test $rc -eq 0
check "the contrast node is marked in the text report" grep -qE "^cpu:acc=f16 +unfit-sensitive +contrast" "$tmp/default.out"
check "the contrast node is marked in the JSON report" python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); n=[x for x in d['nodes'] if x['node']=='cpu:acc=f16'][0]
assert n.get('contrast') is True and n['verdict']=='unfit-sensitive' and d['exit_code']==0" "$tmp/default.json"
"$bin" audit -p $ci -b cpu-ref,cpu,cpu:acc=f16 >/dev/null 2>&1; rc=$?
check "naming cpu:acc=f16 in --backends gates it → exit 1" test $rc -eq 1

# --resume DIR (issue #42): an audit killed mid-run (the parent and its node processes, SIGKILL, once the
# reference's capture is complete) and run again with the same folder reuses what was complete and gives the
# report of an uninterrupted audit, byte for byte.
rn="cpu-ref,cpu:acc=f16,cpu"  # with --jobs 1 the slowest runs right after the reference: a wide window for the kill
"$bin" audit -p protocols/default.json -b "$rn" --jobs 1 -o "$tmp/whole.json" >/dev/null 2>&1
setsid "$bin" audit -p protocols/default.json -b "$rn" --jobs 1 --resume "$tmp/resume" -o "$tmp/killed.json" \
  >/dev/null 2>&1 &
audit_pid=$!
for _ in $(seq 1500); do
  [ "$(find "$tmp/resume" -name 'node-*.safetensors' 2>/dev/null | wc -l)" -ge 1 ] && break
  sleep 0.02
done
kill -KILL -- -"$audit_pid" 2>/dev/null
pkill -KILL -f -- "$tmp/resume/node-" 2>/dev/null
wait "$audit_pid" 2>/dev/null
check "the killed audit wrote no report" test ! -e "$tmp/killed.json"
kept=$(find "$tmp/resume" -name 'node-*.safetensors' | wc -l)
check "the killed audit left the reference's capture and not every node's ($kept of 3)" \
  bash -c "[ $kept -ge 1 ] && [ $kept -lt 3 ]"
"$bin" audit -p protocols/default.json -b "$rn" --jobs 1 --resume "$tmp/resume" -o "$tmp/resumed.json" \
  >/dev/null 2>"$tmp/resumed.err"
check "the resumed audit reused the $kept complete captures" grep -q "^resume: $kept of 3 node captures reused" "$tmp/resumed.err"
check "resumed report == uninterrupted report, byte for byte" cmp -s "$tmp/whole.json" "$tmp/resumed.json"
"$bin" audit -p protocols/default.json -b "$rn" --jobs 1 --resume "$tmp/resume" -o "$tmp/again.json" \
  >/dev/null 2>"$tmp/again.err"
check "a complete folder: every capture reused, the same report" \
  bash -c "grep -q '^resume: 3 of 3 node captures reused' '$tmp/again.err' && cmp -s '$tmp/whole.json' '$tmp/again.json'"
# Another seed: nothing of the folder is this run's; every node runs again (and says why).
"$bin" audit -p protocols/default.json -b "$rn" --jobs 1 --seed 7 --resume "$tmp/resume" -o /dev/null \
  >/dev/null 2>"$tmp/seed7.err"
check "another seed: every node runs again, naming why" \
  bash -c "grep -q '^resume: cpu runs again: its capture is of another seed' '$tmp/seed7.err' && grep -q '^resume: 0 of 3' '$tmp/seed7.err'"
expect_usage_error "--in-process excludes --resume" audit -p $ci --in-process --resume "$tmp/resume"

# Limits: bad values are usage errors.
expect_usage_error "--node-timeout" audit -p $ci --node-timeout 0
expect_usage_error "--node-memory" audit -p $ci --node-memory -1

echo "$failures failed"
[ "$failures" -eq 0 ]
