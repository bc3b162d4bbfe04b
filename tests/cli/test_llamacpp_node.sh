#!/usr/bin/env bash
# llama.cpp as a node (issue 17), run for real: scripts/llamacpp_node.py drives
# llama.cpp (built by scripts/setup_llamacpp.sh from the llama-cpp-python sdist
# into BUILD/llamacpp) on GGUF files made by llama.cpp's own converter, and
# `compare` judges its captures against the oracle's.
#  * llama_tiny.gguf (dense, all F32): llama.cpp's defaults (flash attention
#    auto, F16 KV cache) move the logits by ~1e-2 (unfit for sensitive ranks);
#    F32 KV with flash attention off agrees to ~5e-6 (fit).
#  * gpt_oss_tiny.gguf (F32 experts): llama.cpp's gpt-oss graph (sinks,
#    sliding layers, yarn, clamped SwiGLU) agrees with kvasir's reading of the
#    GGUF (swiglu limit 7, floored/ceiled yarn range) to ~1e-5: an independent
#    check of those semantics. gpt_oss_tiny_mxfp4.gguf: llama.cpp's logits are
#    far outside the oracle's f32 tolerances there (unfit), which the report
#    shows (README: Q8_0 activations explain part of it).
#  * deepseek_v3_tiny.gguf (MLA, arch deepseek2), qwen3_next_tiny.gguf and
#    qwen3_5_moe_tiny.gguf (Gated DeltaNet hybrids): llama.cpp's graphs agree
#    with kvasir's reading of the converter's files to ~2e-5 on the logits.
#  * llama-perplexity --kl-divergence's statistics: every figure it prints
#    equals kvasir's perplexity step on the same token stream (its own base
#    file's), llama.cpp's uint16 base rounding applied (tests/cli/llamacpp_kld_check.py).
#  * cpu:qdot=llamacpp (activations as llama.cpp's CPU backend quantises them)
#    reproduces llama.cpp's Q8_0 and Q6_K logits ~1e5 times closer than either
#    is to the f64 oracle (GGUFs quantised by llama-quantize).
#  * a free-running node: routing agreement not measurable, steps it cannot
#    provide (ops, drift, invariance) listed as not judged, never passed; the
#    llama-cpp-python version and the settings in every capture.
# Usage: test_llamacpp_node.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
lc="$(cd "$(dirname "$bin")" && pwd)/llamacpp"
py="$lc/venv/bin/python"
export LLAMA_CPP_LIB_PATH="$lc/build/bin"
if [ ! -x "$py" ] || ! "$py" -c "import llama_cpp" 2>/dev/null; then
  echo "FAIL: no llama.cpp under $lc (scripts/test builds it: scripts/setup_llamacpp.sh)"
  echo "1 failed"
  exit 1
fi
echo "using llama-cpp-python $("$py" -c 'import llama_cpp; print(llama_cpp.__version__)') from $lc"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ci=protocols/ci.json
node() { "$py" scripts/llamacpp_node.py -p $ci --kvasir "$bin" -q "$@"; }
verdicts() {  # compare JSON → "node=verdict ..." on one line
  python3 -c "
import json,sys; d=json.load(open(sys.argv[1]))
print(' '.join(n['node']+'='+n['verdict'] for n in d['nodes']))" "$1"
}

# --- a dense llama: llama.cpp's defaults vs F32 KV without flash attention --------------
m=fixtures/models/llama_tiny.gguf
"$bin" capture -p $ci -m $m -b cpu-ref -o "$tmp/ref.safetensors" >/dev/null 2>&1
check "cpu-ref capture of llama_tiny.gguf" test -s "$tmp/ref.safetensors"
node -m $m -o "$tmp/default.safetensors"; rc=$?
check "llamacpp_node.py with llama.cpp's defaults → exit 0" test $rc -eq 0
node -m $m -o "$tmp/f32.safetensors" --flash-attn off --kv-type f32; rc=$?
check "llamacpp_node.py --flash-attn off --kv-type f32 → exit 0" test $rc -eq 0
"$bin" compare -p $ci "$tmp/ref.safetensors" "$tmp/default.safetensors" "$tmp/f32.safetensors" -o "$tmp/cmp.json" \
  >"$tmp/cmp.txt" 2>&1; rc=$?
check "compare: a node fails the sensitive gate → exit 1" test $rc -eq 1
v=$(verdicts "$tmp/cmp.json")
check "defaults (flash attention auto, F16 KV) unfit, F32 KV + no flash attention unfit-sensitive: $v" \
  test "$v" = "cpu-ref=reference llama.cpp:fa=auto,kv=f16=unfit llama.cpp:fa=off,kv=f32=unfit-sensitive"
# Why: llama.cpp is not batch-invariant (a request's logits change when other sequences share its batch:
# the sensitive tier asks for the same bits) — at F32 KV without flash attention that is the ONLY failing
# criterion; with its defaults the batch moves a request by ~1e-2 (past the tolerant tier too) and the
# logits, KL and perplexity fail the sensitive tier. Its prefill-vs-decode deviation at F16 KV depends on
# the kernels llama.cpp picks for the CPU: guarded max_rel below the tolerant 0.1 on the CI machine,
# 0.20 (max|Δ| 2.9e-3) on a 2-vCPU EPYC without AVX-512 — so the tolerant failures are invariance
# criteria only (batch always), never the request's own logits.
check "F32 KV, no flash attention: every criterion passes but batch invariance (bits differ by ~1e-6)" python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); n=[x for x in d['nodes'] if x['node']=='llama.cpp:fa=off,kv=f32'][0]
bad=[c['criterion'] for t in ('sensitive','tolerant') for c in n['criteria'][t] if not c['pass']]
assert bad == ['invariance.batch_max_rel'], bad
b=[x for x in d['steps']['invariance']['nodes'] if x['node']==n['node']][0]['batch']
assert all(0 < e['max_abs'] < 1e-4 for e in b), b" "$tmp/cmp.json"
check "defaults: the batch moves a request past the tolerant tier, logits fail the sensitive one" python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); n=[x for x in d['nodes'] if x['node']=='llama.cpp:fa=auto,kv=f16'][0]
sens={c['criterion'] for c in n['criteria']['sensitive'] if not c['pass']}; tol={c['criterion'] for c in n['criteria']['tolerant'] if not c['pass']}
assert {'logits.linf_max','invariance.batch_max_rel'} <= sens, (sens, tol)
assert 'invariance.batch_max_rel' in tol and tol <= {'invariance.batch_max_rel','invariance.prefill_decode_max_rel'}, (sens, tol)" "$tmp/cmp.json"
check "the measured logit deltas: defaults ~1e-2, F32 KV < 1e-4" python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); r={e['node']:e for e in d['steps']['logits']['results']}
a=r['llama.cpp:fa=auto,kv=f16']['linf']['max']; b=r['llama.cpp:fa=off,kv=f32']['linf']['max']
print('linf', a, b); assert 1e-3 < a < 1e-1 and b < 1e-4 and r['llama.cpp:fa=off,kv=f32']['free_running'], (a, b)" "$tmp/cmp.json"
check "free-running: ops, drift and single-op invariance not judged (not captured), never passed" python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); n=[x for x in d['nodes'] if x['node']=='llama.cpp:fa=off,kv=f32'][0]
nm=n['not_measurable']; judged={c['criterion'] for c in n['criteria']['sensitive']}
assert {'ops.max_rel','drift.final_rel','invariance.ops_max_rel'} <= set(nm), nm
assert 'not captured by this node' in nm['drift.final_rel'], nm
assert not (set(nm) & judged), judged
assert {'logits.linf_max','logits.kl_p99','perplexity.ratio_max','generate.first_divergence_min','decide.top1_agreement_min','determinism',
        'invariance.batch_max_rel','invariance.prefill_decode_max_rel','invariance.repeat_unique_max'} <= judged, judged
assert n['not_applicable'].get('decide.routing_agreement_min','').startswith('no MoE layers'), n['not_applicable']" "$tmp/cmp.json"
check "the text report lists what was not judged for the llama.cpp node" \
  grep -q "not judged for llama.cpp:fa=off,kv=f32: drift.alpha_max, drift.final_rel (step drift not captured" "$tmp/cmp.txt"
check "report valid against protocols/report.schema.json" python3 scripts/validate_report.py "$tmp/cmp.json"
check "the capture records llama-cpp-python's version, llama.cpp's settings and authority none" "$py" -c "
import json,sys; sys.path.insert(0,'scripts'); import capture_format
meta,_=capture_format.read_capture(sys.argv[1]); caps=json.loads(meta['capabilities'])
import llama_cpp
assert caps['authority']=='none' and caps['extra']['llama_cpp_python']==llama_cpp.__version__, caps
s=json.loads(meta['llama_cpp_settings']); assert s['flash_attn']=='off' and s['type_k']=='f32', s
assert json.loads(meta['not_captured']).keys() == {'ops','drift'}, meta['not_captured']" "$tmp/f32.safetensors"

# --- gpt-oss: llama.cpp's own graph vs kvasir's reading of the GGUF --------------------------
# ci.json with teacher forcing on (and its criterion in both tiers): llama.cpp is fed the oracle's tokens
# from the oracle's capture (--reference-capture).
tf="$tmp/tf.json"
python3 tests/cli/protocol_variant.py $ci "$tf" ci-teacher-forced --set generate.teacher_forcing=true \
  --tier generate.divergences_max=0
for g in gpt_oss_tiny gpt_oss_tiny_mxfp4; do
  m=fixtures/models/$g.gguf
  "$bin" capture -p "$tf" -m $m -b cpu-ref -o "$tmp/$g.ref.safetensors" >/dev/null 2>&1
  "$py" scripts/llamacpp_node.py -p "$tf" --kvasir "$bin" -q -m $m -o "$tmp/$g.f32.safetensors" --flash-attn off \
    --kv-type f32 --reference-capture "$tmp/$g.ref.safetensors"
  "$bin" compare -p "$tf" "$tmp/$g.ref.safetensors" "$tmp/$g.f32.safetensors" -o "$tmp/$g.json" >/dev/null 2>&1
done
"$py" scripts/llamacpp_node.py -p "$tf" --kvasir "$bin" -q -m fixtures/models/gpt_oss_tiny.gguf -o "$tmp/free.safetensors" \
  --flash-attn off --kv-type f32
"$bin" compare -p "$tf" "$tmp/gpt_oss_tiny.ref.safetensors" "$tmp/free.safetensors" -o "$tmp/free.json" >/dev/null 2>&1
check "without --reference-capture, teacher-forced divergences are not measurable on the free-running node" python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); n=[x for x in d['nodes'] if x['verdict']!='reference'][0]
assert 'without the reference' in n['not_measurable']['generate.divergences_max'], n['not_measurable']" "$tmp/free.json"
check "gpt_oss_tiny.gguf (F32 experts): llama.cpp agrees with kvasir's reading (limit 7, floored yarn range): all but batch invariance pass" \
  python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); n=[x for x in d['nodes'] if x['verdict']!='reference'][0]
bad=[c['criterion'] for t in ('sensitive','tolerant') for c in n['criteria'][t] if not c['pass']]
assert bad in ([], ['invariance.batch_max_rel']), bad" "$tmp/gpt_oss_tiny.json"
check "gpt_oss_tiny.gguf: logits within 1e-4, routing agreement not measurable, teacher-forced divergences judged" python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); r=d['steps']['logits']['results'][0]['linf']['max']
n=[x for x in d['nodes'] if x['verdict']!='reference'][0]
print('linf', r); assert r < 1e-4, r
assert 'exposes no expert choices' in n['not_measurable']['decide.routing_agreement_min'], n['not_measurable']
assert d['steps']['generate']['results'][0]['teacher_forced_divergences'] == 0, d['steps']['generate']" "$tmp/gpt_oss_tiny.json"
check "gpt_oss_tiny_mxfp4.gguf: llama.cpp's MXFP4 arithmetic moves the logits far past f32 (unfit)" python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); r=d['steps']['logits']['results'][0]['linf']['max']
v=[x['verdict'] for x in d['nodes'] if x['verdict']!='reference'][0]
print('linf', r, v); assert r > 1e-2 and v in ('unfit', 'unfit-sensitive'), (r, v)" "$tmp/gpt_oss_tiny_mxfp4.json"

# --- DeepSeek-V3 (MLA) and the Qwen hybrids: llama.cpp's graphs vs kvasir's reading of the converter's GGUFs --
# deepseek2: attn_k_b / attn_v_b reassembled into kv_b_proj, yarn's mscale correction from yarn_log_multiplier,
# the grouped sigmoid router with exp_probs_b; qwen3next / qwen35moe: Gated DeltaNet from attn_qkv / attn_gate /
# ssm_* (qwen35moe's tiled v heads put back in HF order), norms stored as 1 + w, ssm_a = −exp(A_log).
# llama.cpp computes the same models (teacher-forced, F32 KV, no flash attention).
for g in deepseek_v3_tiny qwen3_next_tiny qwen3_5_moe_tiny; do
  m=fixtures/models/$g.gguf
  "$bin" capture -p "$tf" -m $m -b cpu-ref -o "$tmp/$g.ref.safetensors" >/dev/null 2>&1
  "$py" scripts/llamacpp_node.py -p "$tf" --kvasir "$bin" -q -m $m -o "$tmp/$g.f32.safetensors" --flash-attn off \
    --kv-type f32 --reference-capture "$tmp/$g.ref.safetensors"
  "$bin" compare -p "$tf" "$tmp/$g.ref.safetensors" "$tmp/$g.f32.safetensors" -o "$tmp/$g.json" >/dev/null 2>&1
  check "$g.gguf: llama.cpp agrees with kvasir's reading to < 1e-4 on the logits; all but batch invariance pass" \
    python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); r=d['steps']['logits']['results'][0]['linf']['max']
n=[x for x in d['nodes'] if x['verdict']!='reference'][0]
bad=[c['criterion'] for t in ('sensitive','tolerant') for c in n['criteria'][t] if not c['pass']]
print('linf', r); assert r < 1e-4 and bad in ([], ['invariance.batch_max_rel']), (r, bad)
assert d['steps']['generate']['results'][0]['teacher_forced_divergences'] == 0, d['steps']['generate']" "$tmp/$g.json"
done

# --- llama-perplexity's statistics, same definitions -------------------------------------------
# llama-perplexity scores llama_tiny.gguf on a text (F32 KV, no flash attention) and keeps its base file;
# then, --kl-divergence, the defaults (flash attention on, F16 KV) against it, printing its statistics.
# kvasir runs step 6 on the very token stream that base file holds (score second_half, base rounded as
# the file rounds it: llamacpp-u16), both settings through llamacpp_node.py, and compare must print the
# same figures to llama-perplexity's digits.
lp="$lc/build/bin/llama-perplexity"
# llama.cpp's logger may lose the tail of stdout at exit (the statistics block) on a loaded machine:
# scripts/llamacpp_log_flush.cpp, built by the setup script, flushes it.
export LD_PRELOAD="$lc/build/bin/libkvasir_log_flush.so"
python3 -c "
import random; w=['the','of','and','model','node','audit','tensor','expert','router','layer','rope','cache']
r=random.Random(7); print(' '.join(r.choice(w) for _ in range(600)))" >"$tmp/text.txt"
m=fixtures/models/llama_tiny.gguf
common=(-m $m -c 64 -b 64 -ub 64 -t 2)
"$lp" "${common[@]}" -f "$tmp/text.txt" -fa off -ctk f32 -ctv f32 --kl-divergence-base "$tmp/base.kld" \
  >"$tmp/lp_base.out" 2>"$tmp/lp_base.err"; rc=$?
check "llama-perplexity writes its base file" test $rc -eq 0 -a -s "$tmp/base.kld"
"$lp" "${common[@]}" -fa on -ctk f16 -ctv f16 --kl-divergence --kl-divergence-base "$tmp/base.kld" \
  >"$tmp/lp_kld.out" 2>"$tmp/lp_kld.err"; rc=$?
check "llama-perplexity --kl-divergence prints its statistics (exit $rc)" grep -q "KL divergence statistics" "$tmp/lp_kld.out"
grep -q "KL divergence statistics" "$tmp/lp_kld.out" || tail -5 "$tmp/lp_kld.err" "$tmp/lp_kld.out"
unset LD_PRELOAD
python3 tests/cli/llamacpp_kld_check.py protocol "$tmp/base.kld" "$tmp" 1
for cfg in "off f32 base" "on f16 cand"; do
  set -- $cfg
  "$py" scripts/llamacpp_node.py -p "$tmp/kld.json" --kvasir "$bin" -q -m $m -o "$tmp/kld_$3.safetensors" \
    --flash-attn $1 --kv-type $2 --batch 64 --ubatch 64 --threads 2 --ctx 64
done
"$bin" compare -p "$tmp/kld.json" -r "llama.cpp:fa=off,kv=f32" "$tmp/kld_base.safetensors" "$tmp/kld_cand.safetensors" \
  -o "$tmp/kld_cmp.json" >/dev/null 2>&1
check "every figure llama-perplexity --kl-divergence printed equals kvasir's (perplexity step)" \
  python3 tests/cli/llamacpp_kld_check.py compare "$tmp/lp_kld.out" "$tmp/kld_cmp.json" "llama.cpp:fa=on,kv=f16"

# --- cpu:qdot=llamacpp: llama.cpp's quantised arithmetic as a cpu variant -----------------------------
# A random dense llama wide enough for k-quants (every row a multiple of 256), made with the gguf package,
# quantised by llama-quantize --pure; llama_tiny.gguf quantised to Q8_0. On each: logits of llama.cpp
# (F32 KV, no flash attention), of cpu:qdot=llamacpp and of cpu-ref on the first 8 positions; qdot must
# agree with llama.cpp at least 100 times better than either agrees with the oracle (qdot_check.py).
q8="$tmp/q.json"
python3 tests/cli/protocol_variant.py $ci "$q8" qdot --steps logits --set logits.tokens.count=8
"$py" tests/cli/make_dense_gguf.py fixtures/models/llama_tiny.gguf "$tmp/dense.gguf"
quant="$lc/build/bin/llama-quantize"
for t in Q8_0 Q6_K Q4_K; do "$quant" --pure "$tmp/dense.gguf" "$tmp/dense.$t.gguf" $t >/dev/null 2>&1; done
"$quant" fixtures/models/llama_tiny.gguf "$tmp/llama_tiny.Q8_0.gguf" Q8_0 >/dev/null 2>&1
echo "| GGUF | llama.cpp vs cpu-ref | cpu:qdot=llamacpp vs cpu-ref | cpu:qdot=llamacpp vs llama.cpp |"
for g in dense.Q8_0 dense.Q6_K llama_tiny.Q8_0 dense.Q4_K; do
  m="$tmp/$g.gguf"
  "$bin" capture -p "$q8" -m "$m" -b cpu-ref -o "$tmp/qr.safetensors" >/dev/null 2>&1
  "$bin" capture -p "$q8" -m "$m" -b cpu:qdot=llamacpp -o "$tmp/qq.safetensors" >/dev/null 2>&1
  for mode in batch token-by-token; do
    extra=(); [ $mode = token-by-token ] && extra=(--token-by-token)
    "$py" scripts/llamacpp_node.py -p "$q8" --kvasir "$bin" -q -m "$m" -o "$tmp/ql.safetensors" --flash-attn off \
      --kv-type f32 "${extra[@]}"
    "$py" tests/cli/qdot_check.py "$g.gguf, llama.cpp $mode" "$tmp/qr.safetensors" "$tmp/ql.safetensors" \
      "$tmp/qq.safetensors"; rc=$?
    # The one exception, reported and asserted as what it is: on the all-Q4_K model llama.cpp's batched
    # (prefill) path differs from its own token-by-token path by ~2e-2 from position 1 on; the variant is
    # its token-by-token arithmetic.
    if [ $g = dense.Q4_K ] && [ $mode = batch ]; then
      check "all-Q4_K: llama.cpp's batched logits are NOT its token-by-token ones (qdot matches the latter)" test $rc -ne 0
    else
      check "cpu:qdot=llamacpp reproduces llama.cpp's $g arithmetic, $mode (>= 100x closer than to cpu-ref)" test $rc -eq 0
    fi
  done
done

# gpt-oss MXFP4: llama.cpp routes for itself, so the variant must too (logits --no-authority): its logits then
# sit where llama.cpp's do — the 2.5 between llama.cpp and the oracle is Q8_0 activations flipping the MoE
# routing (pinned to the oracle's routing the variant moves them by 0.23 only).
python3 -c "import json; d=json.load(open('$ci'))['steps']['logits']['tokens']; ids=open('protocols/'+d['path']).read().split()
print(' '.join(ids[d['offset']:d['offset']+d['count']]))" >"$tmp/ci_tokens.txt"
"$bin" logits -m fixtures/models/gpt_oss_tiny_mxfp4.gguf -b cpu-ref,cpu:qdot=llamacpp --tokens-file "$tmp/ci_tokens.txt" \
  --no-authority --json >"$tmp/qfree.json" 2>/dev/null
check "gpt_oss_tiny_mxfp4.gguf: cpu:qdot=llamacpp running its own router lands where llama.cpp does" python3 -c "
import json,sys
q=[r for r in json.load(open(sys.argv[1]))['steps']['logits']['results'] if r['node']!='cpu-ref'][0]['linf']
l=json.load(open(sys.argv[2]))['steps']['logits']['results'][0]['linf']
print('linf vs cpu-ref: llama.cpp max %.7g mean %.7g, qdot free max %.7g mean %.7g' % (l['max'], l['mean'], q['max'], q['mean']))
assert l['max'] > 1 and abs(q['max']-l['max']) < 1e-3*l['max'] and abs(q['mean']-l['mean']) < 1e-3*l['mean'], (q, l)" \
  "$tmp/qfree.json" "$tmp/gpt_oss_tiny_mxfp4.json"

# --- bad input: one line, exit 2 -------------------------------------------------------------
for args in "-m nonexistent.gguf -o $tmp/x.safetensors" "-m fixtures/models/llama_tiny.gguf -o $tmp/x.safetensors --steps ops" \
            "-m fixtures/models/llama_tiny.gguf -o $tmp/x.safetensors --threads 0"; do
  err=$(node $args 2>&1); rc=$?
  check "llamacpp_node.py $args → exit 2, one line: $err" bash -c "[ $rc -eq 2 ] && [ \$(printf '%s\n' \"\$1\" | grep -c .) -eq 1 ]" _ "$err"
done
err=$(node -m fixtures/models/llama_tiny.gguf -o "$tmp/x.safetensors" --reference-capture "$tmp/gpt_oss_tiny.ref.safetensors" 2>&1); rc=$?
check "a reference capture of another protocol/model is refused (exit 2, one line): $err" \
  bash -c "[ $rc -eq 2 ] && grep -q 'differs from this run' <<<\"\$1\" && [ \$(printf '%s\n' \"\$1\" | grep -c .) -eq 1 ]" _ "$err"
check "no capture written on bad input" test ! -e "$tmp/x.safetensors"

echo "$failures failed"
[ "$failures" -eq 0 ]
