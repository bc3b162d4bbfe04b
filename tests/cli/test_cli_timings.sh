#!/usr/bin/env bash
# --timings on every command that measures: accepted, exit code and stdout
# unchanged, where the time went on stderr, and the OpenCL node's
# weight-cache counters (hits, misses, evictions, bytes uploaded) and its
# host↔device transfers (CI has PoCL, so opencl:0 is there as in
# test_cli_model.sh).
# Usage: test_cli_timings.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
failures=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nodes="cpu-ref,opencl:0"
ci=protocols/ci.json
counters='^  weight cache opencl:0: [0-9]+ hits, [0-9]+ misses, [0-9]+ evictions, [0-9]+ declined, [0-9]+ uncacheable, [0-9]+ oversized; [0-9.]+ GB uploaded; [0-9]+ resident, [0-9.]+ of [0-9.]+ GB$'

# cmd STEP-ROW-NAME ARGS...: runs with and without --timings.
timed() {
  local name="$1" row="$2"; shift 2
  "$bin" "$@" >"$tmp/$name.plain" 2>/dev/null; local rc_plain=$?
  "$bin" "$@" --timings >"$tmp/$name.out" 2>"$tmp/$name.err"; local rc=$?
  check "$name --timings: accepted, same exit code ($rc_plain)" test "$rc" -eq "$rc_plain"
  check "$name --timings: the header on stderr" grep -q "^timings (wall seconds; not part of the report)$" "$tmp/$name.err"
  check "$name --timings: a row for $row" grep -qE "^  $row +[0-9.]+ +[0-9.]+" "$tmp/$name.err"
  check "$name --timings: the weight cache's counters" grep -qE "$counters" "$tmp/$name.err"
  # The node's host↔device traffic (uploads, MB up, downloads, MB down, syncs, launches, allocations).
  check "$name --timings: opencl:0's transfers in all" grep -qE "^  opencl:0 +total +[1-9][0-9]* +[0-9.]+ +[1-9][0-9]* +[0-9.]+ +[1-9][0-9]* +[1-9][0-9]* +[1-9][0-9]*$" "$tmp/$name.err"
}

timed ops ops ops -b "$nodes" --ops matmul,rmsnorm,moe --json
timed drift drift drift -b "$nodes" --tokens 6 --json
timed logits logits logits -b "$nodes" --tokens 6 --json
timed decide decide decide -b "$nodes" --tokens 6 --json
timed generate generate generate -b "$nodes" --tokens 4 --new-tokens 3 --json
timed perplexity perplexity perplexity -b "$nodes" --tokens 40 --context 20 --json
timed matrix moe matrix -b "$nodes" --json
timed audit logits audit -p $ci -b "$nodes" --json
timed audit_in_process logits audit -p $ci -b "$nodes" --in-process --json
timed capture logits capture -p $ci -b opencl:0 --steps ops,logits -o "$tmp/cap.safetensors"
"$bin" capture -p $ci -b cpu-ref --steps ops,logits -o "$tmp/ref.safetensors" >/dev/null
timed compare logits compare -p $ci "$tmp/ref.safetensors" "$tmp/cap.safetensors" --json

# A capture records the traffic step by step (isolated audits and compare show it per step, too).
for name in capture audit compare; do
  check "$name --timings: opencl:0's transfers per step" grep -qE "^  opencl:0 +logits +[1-9][0-9]* +[0-9.]+ +[1-9][0-9]* " "$tmp/$name.err"
done
check "a host node has no transfers row" bash -c "! grep -qE '^  cpu-ref +total ' '$tmp/audit.err'"
# Each node process's peak memory (issue #42), from its capture: the isolated audit and compare. Its own
# memory (anonymous + shared) is part of its resident memory, which adds the mapped weights' pages.
check "audit --timings: each node process's peak memory" python3 -c "
import re, sys
line = [l for l in open(sys.argv[1]) if l.startswith('  memory peak per node process, own / resident with mapped weights:')]
assert len(line) == 1, line
got = dict((n, (float(o), float(r))) for n, o, r in re.findall(r' (\\S+) ([0-9.]+) / ([0-9.]+) GiB', line[0]))
assert set(got) == {'cpu-ref', 'opencl:0'}, got
assert all(0.001 < o <= r + 0.01 and r < 64 for o, r in got.values()), got" "$tmp/audit.err"
check "compare --timings: the captures' peak memory" grep -qE "^  memory peak per node process, own / resident with mapped weights: cpu-ref [0-9.]+ / [0-9.]+ GiB, opencl:0 [0-9.]+ / [0-9.]+ GiB$" "$tmp/compare.err"

# The reports themselves are unchanged by the flag (steps are deterministic).
for c in ops drift logits decide generate perplexity matrix; do
  check "$c --timings: stdout identical to the run without it" cmp -s "$tmp/$c.plain" "$tmp/$c.out"
done

# A model's weights come from its mapping: a decode (generate) hits the cache.
check "generate: weights resident after the first step (hits > 0)" grep -qE "opencl:0: [1-9][0-9]* hits" "$tmp/generate.err"
# weight_cache=0 switches it off; the node's name keeps the option.
"$bin" generate -b cpu-ref,opencl:0:weight_cache=0 --tokens 4 --new-tokens 3 --timings >/dev/null 2>"$tmp/off.err"
check "weight_cache=0: reported off" grep -qE "^  weight cache opencl:0:weight_cache=0: off; [0-9]+ weights uploaded per call" "$tmp/off.err"
expect_usage_error "weight_cache must be a whole number of MiB" logits -b cpu-ref,opencl:0:weight_cache=lots

echo "$failures failed"
[ "$failures" -eq 0 ]
