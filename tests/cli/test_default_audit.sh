#!/usr/bin/env bash
# The default audit (issue #19): `audit` with no --protocol and no --model is
# the trained fixture audited from text — protocols/trained.json on
# fixtures/models/qwen3_moe_trained, every token stream held-out prose through
# the model's own tokenizer, step 6 with the cloze task score — and it exits
# 0 on a healthy machine (cpu and opencl:0 fit, the f16-accumulation contrast
# shown, not gated). Its cpu-ref perplexity and task accuracy are checked
# against what transformers computed in float64 when the fixture was made
# (text_reference.json). A model named with --model gets protocols/default.json
# (token ids, no tokenizer needed); capture follows the same rule and compare
# finds the shipped protocol from the captures' hash.
# Usage: test_default_audit.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
tmp=$(mktemp -d)

"$bin" audit -o "$tmp/d.json" >"$tmp/d.out" 2>"$tmp/d.err"; rc=$?
check "the default audit exits 0 (got $rc)" test $rc -eq 0
check "the default audit: trained protocol, trained fixture, cpu and opencl:0 fit, the contrast unfit-sensitive" python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
assert d['protocol']['id'] == 'trained', d['protocol']
assert d['model']['path'].endswith('fixtures/models/qwen3_moe_trained'), d['model']
v = {n['node']: n['verdict'] for n in d['nodes']}
assert v == {'cpu-ref': 'reference', 'cpu': 'fit', 'opencl:0': 'fit', 'cpu:acc=f16': 'unfit-sensitive'}, v
for s in ('ops', 'drift', 'logits', 'decide', 'generate', 'perplexity', 'task', 'invariance', 'determinism'):
    assert s in d['steps'], s
" "$tmp/d.json"
check "the default audit's cpu-ref perplexity and task accuracy equal transformers' float64 (text_reference.json)" python3 -c "
import json, sys
d = json.load(open(sys.argv[1])); ref = json.load(open(sys.argv[2]))
ppl = d['steps']['perplexity']; task = d['steps']['task']
want = ref['perplexity']['contexts']['128']['f64']
assert ppl['predictions'] == ref['perplexity']['contexts']['128']['n_predictions'], ppl['predictions']
rel = abs(ppl['reference_perplexity'] / want['perplexity'] - 1)
assert rel <= 1e-9, (ppl['reference_perplexity'], want['perplexity'], rel)
c = ref['cloze']['f64']
assert task['items'] == ref['cloze']['n_items'] == 250
assert task['reference_acc'] == c['acc'] and task['reference_acc_norm'] == c['acc_norm'], (task, c)
# Far below the vocabulary: a peaked model, not a flat random one.
vocab = json.load(open(sys.argv[3]))['vocab_size']
assert ppl['reference_perplexity'] < vocab / 20, (ppl['reference_perplexity'], vocab)
print('perplexity', ppl['reference_perplexity'], 'vs', want['perplexity'], 'rel', rel, 'acc', task['reference_acc'])
" "$tmp/d.json" fixtures/models/qwen3_moe_trained/text_reference.json fixtures/models/qwen3_moe_trained/config.json
check "the text report shows step 6: perplexity and the task score per node" \
  grep -q "Step 6: perplexity over 1168 predictions; task score, 250 multiple-choice items" "$tmp/d.out"
check "the step-6 table's reference row: the perplexity and acc of the JSON" \
  grep -qE "^  cpu-ref \(ref\) +40\.0137 +· +0\.4560 ± 0\.0316 +0\.4520 ± 0\.0315" "$tmp/d.out"
check "the text report names the trained protocol and model" \
  bash -c "grep -q 'protocol trained v3' '$tmp/d.out' && grep -q 'qwen3_moe_trained (qwen3_moe)' '$tmp/d.out'"

# A model of one's own, no protocol: default.json (token ids, no tokenizer needed).
"$bin" audit -m fixtures/models/qwen2_tiny -b cpu-ref,cpu -o "$tmp/m.json" >/dev/null 2>&1; rc=$?
check "audit --model without --protocol exits 0 (got $rc)" test $rc -eq 0
check "audit --model without --protocol uses protocols/default.json" python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
assert d['protocol']['id'] == 'default', d['protocol']
assert d['model']['path'].endswith('qwen2_tiny'), d['model']
" "$tmp/m.json"

# capture follows audit's rule; compare finds the shipped protocol by the captures' hash.
"$bin" capture -b cpu-ref --steps ops -o "$tmp/r.st" >"$tmp/r.out" 2>&1
"$bin" capture -b cpu --steps ops -o "$tmp/c.st" >/dev/null 2>&1
check "capture without --protocol: the trained protocol" grep -q "protocol trained v3" "$tmp/r.out"
"$bin" compare "$tmp/r.st" "$tmp/c.st" --only-steps ops -o "$tmp/cmp.json" >/dev/null 2>&1; rc=$?
check "compare without --protocol finds protocols/trained.json from the hash, cpu fit (exit $rc)" python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
assert d['protocol']['id'] == 'trained', d['protocol']
assert {n['node']: n['verdict'] for n in d['nodes']}['cpu'] == 'fit'
" "$tmp/cmp.json"
"$bin" capture -b cpu-ref -m fixtures/models/qwen2_tiny --steps ops -o "$tmp/r2.st" >"$tmp/r2.out" 2>&1
check "capture --model without --protocol: the default protocol" grep -q "protocol default v8" "$tmp/r2.out"
# A protocol that is not shipped: compare must be told which (one line, exit 2).
python3 -c "
import json, os, sys
p = json.load(open('protocols/ci.json'))
p['version'] = 99
root = os.getcwd()
def absolute(o):
    if isinstance(o, dict):
        return {k: (os.path.join(root, 'protocols', v) if k in ('path', 'model') and isinstance(v, str) else absolute(v)) for k, v in o.items()}
    if isinstance(o, list):
        return [absolute(x) for x in o]
    return o
json.dump(absolute(p), open(sys.argv[1], 'w'), indent=1)
" "$tmp/mine.json"
"$bin" capture -p "$tmp/mine.json" -b cpu-ref --steps ops -o "$tmp/r3.st" >/dev/null 2>&1
check "a capture made with an unshipped protocol exists" test -s "$tmp/r3.st"
expect_usage_error "which no protocol shipped in" compare "$tmp/r3.st"
"$bin" compare -p "$tmp/mine.json" "$tmp/r3.st" >/dev/null 2>&1; rc=$?
check "… and with -p it is judged (only the reference: exit 1, got $rc)" test $rc -eq 1

rm -rf "$tmp"
echo "$failures failed"
[ "$failures" -eq 0 ]
