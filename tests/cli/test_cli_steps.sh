#!/usr/bin/env bash
# Protocol steps 2–6 as subcommands: each runs on the default fixture with
# exit 0, its --json parses and carries its schema (drift, logits, decide,
# generate, perplexity: views of the audit, so the audit report's), -o writes
# the same document; bad token
# files and unknown backends are one-line usage errors (exit 2).
# Usage: test_cli_steps.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
tmp=$(mktemp -d)
nodes="cpu-ref,cpu"

json_parses() {  # file (python3 is required, as by every CLI test: no weaker fallback)
  python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$1"
}

for step in drift logits decide generate perplexity; do
  extra=""
  [ "$step" = perplexity ] && extra="--context 32"
  [ "$step" = generate ] && extra="--new-tokens 4"
  # shellcheck disable=SC2086
  "$bin" "$step" --backends "$nodes" $extra --json -o "$tmp/$step.o.json" >"$tmp/$step.json"
  rc=$?
  check "$step --json exits 0" test "$rc" -eq 0
  check "$step --json parses" json_parses "$tmp/$step.json"
  schema="kvasir-equiv/$step/1"
  case $step in drift|logits|decide|generate|perplexity) schema="kvasir-equiv/audit/1" ;; esac
  check "$step --json has schema $schema" grep -q "\"schema\": \"$schema\"" "$tmp/$step.json"
  check "$step -o writes the same document" cmp -s "$tmp/$step.json" "$tmp/$step.o.json"
  # shellcheck disable=SC2086
  "$bin" "$step" --backends "$nodes" $extra >"$tmp/$step.txt"
  check "$step table exits 0" test $? -eq 0
done
check "drift json has the fitted exponent" grep -q '"alpha"' "$tmp/drift.json"
check "drift table states the routing" grep -q "routing pinned by the reference" "$tmp/drift.txt"
check "logits json has KL p99" grep -q '"p99"' "$tmp/logits.json"
check "decide json shows both authorities" bash -c "grep -q '\"top1_pinned\"' '$tmp/decide.json' && grep -q '\"routing_free\"' '$tmp/decide.json'"
check "decide table lists the planted border token" grep -q "L3/t23" "$tmp/decide.txt"
check "generate json has the first divergence" grep -q '"first_divergence"' "$tmp/generate.json"
check "perplexity json has the ratio" grep -q '"ratio"' "$tmp/perplexity.json"

# task: the audit's task step on --items (judged by trained.json's task tolerances), 20 items of the cloze file.
head -20 fixtures/tasks/qwen3_moe_trained_cloze.jsonl >"$tmp/items.jsonl"
"$bin" task -m fixtures/models/qwen3_moe_trained --items "$tmp/items.jsonl" --backends "$nodes" --json >"$tmp/task.json"
check "task --json exits 0" test $? -eq 0
check "task: the audit's task step, its view named, the items pinned by their sha256" python3 -c '
import json, sys, hashlib
d = json.load(open(sys.argv[1])); t = d["steps"]["task"]; v = d["protocol"]["view"]
assert d["schema"] == "kvasir-equiv/audit/1" and v["view"] == "task" and v["of"]["id"] == "trained", v
assert v["settings"]["sha256"] == hashlib.sha256(open(sys.argv[2], "rb").read()).hexdigest(), v
assert t["items"] == 20 and t["results"][0]["node"] == "cpu" and t["results"][0]["agreement"] == 1.0, t' "$tmp/task.json" "$tmp/items.jsonl"
expect_usage_error "--items is required" task

# Issue #41: each step command is a view of the audit's step — on ci.json's stream, `drift` (and the other
# token steps) and `audit --steps drift` write the same section of the report, figure for figure.
for step in drift logits decide; do
  python3 -c "import json,sys; d=json.load(open('protocols/ci.json'))['steps'][sys.argv[1]]['tokens']; ids=open('protocols/'+d['path']).read().split()
print(' '.join(ids[d['offset']:d['offset']+d['count']]))" "$step" >"$tmp/$step.ids"
  "$bin" "$step" -b cpu-ref,cpu,cpu:acc=f16 --tokens-file "$tmp/$step.ids" --seed 20261129 -p protocols/ci.json \
    -o "$tmp/$step.view.json" >/dev/null 2>&1
  "$bin" audit -p protocols/ci.json --steps "$step" -b cpu-ref,cpu,cpu:acc=f16 --in-process -o "$tmp/$step.audit.json" >/dev/null 2>&1
  check "$step command == audit --steps $step: the same section of the report, the same verdicts" python3 -c '
import json, sys
v, a = (json.load(open(f)) for f in sys.argv[1:3]); s = sys.argv[3]
assert v["steps"][s] == a["steps"][s], (v["steps"][s], a["steps"][s])
assert [(n["node"], n["verdict"]) for n in v["nodes"]] == [(n["node"], n["verdict"]) for n in a["nodes"]], (v["nodes"], a["nodes"])' \
    "$tmp/$step.view.json" "$tmp/$step.audit.json" "$step"
done

"$bin" drift --backends "$nodes" --repeat --json >"$tmp/repeat.json"
check "--repeat reports bit-identical runs" grep -q '"bit_identical": true' "$tmp/repeat.json"
"$bin" decide --backends "$nodes" --perturb-router 0.03 --json >"$tmp/perturb.json"
check "--perturb-router flips a border token" grep -q '"border_flipped": [1-9]' "$tmp/perturb.json"
printf '1 2 3\n4 5 6 7 8\n' >"$tmp/ok.txt"
view_tokens() {  # file count: the view's tokens, and the logits step's positions, are COUNT
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); n=int(sys.argv[2])
assert d["protocol"]["view"]["tokens"]["count"] == n and d["steps"]["logits"]["positions"] == n, d["protocol"]["view"]' "$1" "$2"
}
"$bin" logits --backends "$nodes" --tokens-file "$tmp/ok.txt" --json >"$tmp/file.json"
check "--tokens-file is used" view_tokens "$tmp/file.json" 8
"$bin" logits --backends "$nodes" --tokens 5 --json >"$tmp/seeded.json"
check "--tokens N gives N seeded ids" view_tokens "$tmp/seeded.json" 5
# A view gates as audit does when asked: cpu:acc=f16 fails default.json's drift tolerances; by default it is shown, exit 0.
"$bin" drift --backends cpu-ref,cpu:acc=f16 >/dev/null 2>&1
check "drift: a view exits 0 by default (--gate none)" test $? -eq 0
"$bin" drift --backends cpu-ref,cpu:acc=f16 --gate sensitive >"$tmp/gated.txt" 2>&1
check "drift --gate sensitive: exit 1 for the f16 accumulator" test $? -eq 1
check "drift --gate sensitive: the verdict names drift.final_rel" grep -q "unfit-sensitive.*drift.final_rel" "$tmp/gated.txt"

printf '1 2\n3 oops 4\n' >"$tmp/bad.txt"
expect_usage_error "bad.txt:2:3: token 4 'oops'" logits --backends "$nodes" --tokens-file "$tmp/bad.txt"
printf '1 2 999\n' >"$tmp/range.txt"
expect_usage_error "range.txt:1:5: token 3 id 999 is outside the vocabulary" drift --tokens-file "$tmp/range.txt"
: >"$tmp/empty.txt"
expect_usage_error "empty.txt: no token ids" generate --tokens-file "$tmp/empty.txt"
expect_usage_error "no-such-file.txt" perplexity --stream "$tmp/no-such-file.txt"
expect_usage_error "unknown backend" decide --backends cpu-ref,warp-drive
expect_usage_error "exclude each other" logits --tokens 4 --tokens-file "$tmp/ok.txt"
expect_usage_error "--tokens" drift --tokens 0
expect_usage_error "--threshold must be > 0" drift --threshold -1
expect_usage_error "--new-tokens must be in 1..4096" generate --new-tokens 0
expect_usage_error "--perturb-router must be ≥ 0" decide --perturb-router -1
expect_usage_error "--context must be in 2..65536" perplexity --context 1
# Step 6 scored as llama-perplexity scores (second half of each window) with its --kl-divergence statistics:
# audit and capture + compare agree, the counts are the windows' second halves, f32 vs the oracle is tiny.
python3 tests/cli/protocol_variant.py protocols/ci.json "$tmp/kld.json" ci-kld --steps perplexity \
  --set 'perplexity.score="second_half"' --set 'perplexity.kl_divergence={"base_rounding": "exact"}'
"$bin" audit -p "$tmp/kld.json" -b cpu-ref,cpu --in-process -o "$tmp/kld_audit.json" >/dev/null 2>&1
"$bin" capture -p "$tmp/kld.json" -b cpu-ref -o "$tmp/kr.safetensors" >/dev/null 2>&1
"$bin" capture -p "$tmp/kld.json" -b cpu -o "$tmp/kc.safetensors" >/dev/null 2>&1
"$bin" compare -p "$tmp/kld.json" "$tmp/kr.safetensors" "$tmp/kc.safetensors" -o "$tmp/kld_cmp.json" >/dev/null 2>&1
check "perplexity second_half + kl_divergence: audit == capture/compare, llama.cpp's figures for cpu vs cpu-ref" python3 -c "
import json,sys
a,c=(json.load(open(f))['steps']['perplexity'] for f in sys.argv[1:3])
d=json.load(open('$tmp/kld.json'))['steps']['perplexity']; n,C=d['tokens']['count'],d['context']
want=sum(len(range((e-b)//2, e-b-1)) for b,e in [(b,min(n,b+C)) for b in range(0,n,C)] if e-b>=2)
assert a['predictions']==want and a['scored'].startswith('second half'), (a['predictions'], want)
ka,kc=a['results'][0]['llamacpp_kl_divergence'],c['results'][0]['llamacpp_kl_divergence']
assert ka==kc, 'audit and compare differ'
assert ka['predictions']==want and abs(ka['Mean KLD']['value'])<1e-9 and ka['Same top p']['value']==1.0, ka
print('predictions', want, 'Mean KLD', ka['Mean KLD']['value'], 'RMS dp', ka['RMS Δp']['value'])" "$tmp/kld_audit.json" "$tmp/kld_cmp.json"
# The same scoring from the command line, as llama-perplexity's users give it (issue #44): --score second-half
# --kl-divergence over the shipped protocol gives the edited protocol's figures — in an isolated audit (the
# children get the flags), in capture + compare (compare finds the shipped protocol by its hash with the flags
# applied) and in the perplexity command itself on the same 128 tokens.
"$bin" audit -p protocols/ci.json --steps perplexity -b cpu-ref,cpu --score second-half --kl-divergence \
  -o "$tmp/kld_flags.json" >/dev/null 2>&1
"$bin" capture -p protocols/ci.json --steps perplexity -b cpu-ref --score second-half --kl-divergence=exact \
  -o "$tmp/fr.safetensors" >/dev/null 2>&1
"$bin" capture -p protocols/ci.json --steps perplexity -b cpu --score second-half --kl-divergence \
  -o "$tmp/fc.safetensors" >/dev/null 2>&1
"$bin" compare "$tmp/fr.safetensors" "$tmp/fc.safetensors" --score second-half --kl-divergence \
  -o "$tmp/kld_flags_cmp.json" >/dev/null 2>&1
tr -s ' \n' '\n\n' <fixtures/tokens/default.txt | grep . | head -128 >"$tmp/ci128.txt"
"$bin" perplexity -b cpu-ref,cpu --stream "$tmp/ci128.txt" --context 32 --score second-half --kl-divergence \
  -o "$tmp/kld_cmd.json" >/dev/null 2>&1
check "--score second-half --kl-divergence: audit, capture/compare and perplexity give the protocol's figures" python3 -c "
import json,sys
want=json.load(open(sys.argv[1]))['steps']['perplexity']['results'][0]
for f in sys.argv[2:4]:
    got=json.load(open(f))['steps']['perplexity']['results'][0]
    assert got==want, (f, got, want)
cmd=json.load(open(sys.argv[4]))['steps']['perplexity']
assert cmd['scored'].startswith('second half') and cmd['kl_divergence_base_rounding']=='exact', cmd
r=[x for x in cmd['results'] if x['node']=='cpu'][0]
assert r==want, (r, want)  # the view is the audit's step: the same entry, every figure
assert cmd['predictions']==want['llamacpp_kl_divergence']['predictions'], (cmd['predictions'], want)
print('identical; predictions', cmd['predictions'])" "$tmp/kld_audit.json" "$tmp/kld_flags.json" "$tmp/kld_flags_cmp.json" \
  "$tmp/kld_cmd.json"
check "compare without the flags names them (the captures' hash is the flags' protocol)" bash -c \
  "'$bin' compare '$tmp/fr.safetensors' '$tmp/fc.safetensors' 2>&1 >/dev/null | grep -qF 'needs the same options here'"
# A flag that says what the protocol says changes nothing, its hash included: compare finds ci.json without it.
"$bin" capture -p protocols/ci.json --steps perplexity -b cpu-ref --score all -o "$tmp/same_r.safetensors" >/dev/null 2>&1
"$bin" capture -p protocols/ci.json --steps perplexity -b cpu -o "$tmp/same_c.safetensors" >/dev/null 2>&1
check "--score all on a protocol that scores all: the shipped protocol's hash" bash -c \
  "'$bin' compare --only-steps perplexity '$tmp/same_r.safetensors' '$tmp/same_c.safetensors' | grep -qE '^cpu +fit'"
rm -rf "$tmp"
echo "$failures failed"
[ "$failures" -eq 0 ]
