#!/usr/bin/env bash
# inspect and matrix on the committed fixtures, and bad model files.
# Usage: test_cli_model.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
tmp=$(mktemp -d)

out=$("$bin" inspect fixtures/models/qwen3_moe_tiny)
check "inspect names the architecture and layers" grep -q "qwen3_moe: 4 layers, hidden 96" <<<"$out"
check "inspect marks layer 2 dense" grep -qE "^2 +dense" <<<"$out"
check "inspect shows experts" grep -q "MoE: 8 experts × 64 wide, top-2" <<<"$out"
"$bin" inspect fixtures/models/qwen3_moe_tiny.q8_0.gguf --json >"$tmp/i.json"
check "inspect --json on GGUF lists Q8_0 tensors" grep -q '"dtype": "Q8_0"' "$tmp/i.json"
check "inspect --json on GGUF gives the format" grep -q '"format": "gguf"' "$tmp/i.json"
"$bin" inspect fixtures/models/mixtral_tiny --tensors >"$tmp/m.txt"
check "inspect --tensors lists mixtral expert tensors" grep -q "block_sparse_moe.experts.0.w1.weight" "$tmp/m.txt"

"$bin" matrix --backends cpu-ref,cpu,cpu:acc=f16 --markdown "$tmp/m.md" -o "$tmp/m.json" >"$tmp/m.out"
check "matrix exits 0" test $? -eq 0
check "matrix markdown has the pair table" grep -q "| cpu vs cpu-ref |" "$tmp/m.md"
check "matrix json records the model fingerprint" grep -q '"model_fingerprint"' "$tmp/m.json"
"$bin" matrix --backends cpu-ref,cpu --timings >/dev/null 2>"$tmp/mt.err"
check "matrix --timings: the layer's load phase" grep -qE "^  load +[0-9.]+ GB of weights in" "$tmp/mt.err"
check "matrix --timings: the moe row split per node" grep -qE "^  moe +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$" "$tmp/mt.err"


printf 'GGUF\x03\x00\x00\x00' >"$tmp/trunc.gguf"
expect_usage_error "trunc.gguf" inspect "$tmp/trunc.gguf"
mkdir "$tmp/bad" && cp fixtures/models/qwen3_moe_tiny/config.json "$tmp/bad/"
printf '\xff\xff\xff\xff\xff\xff\xff\x7f{}' >"$tmp/bad/model.safetensors"
expect_usage_error "model.safetensors: header length" inspect "$tmp/bad"
expect_usage_error "no-such-model" inspect "$tmp/no-such-model"
expect_usage_error "layer 2" ops --model fixtures/models/qwen3_moe_tiny --layer 2 --ops moe
expect_usage_error "--layer 9 is outside" matrix --layer 9
expect_usage_error "--layer needs --model" ops --layer 1
# The contract's own family: the hybrid fixtures (Gated DeltaNet + gated
# attention, made by transformers) audited end to end, each node in its process.
for m in qwen3_5_moe_tiny qwen3_next_tiny olmoe_tiny gpt_oss_tiny deepseek_v3_tiny kimi_k2_tiny glm4_moe_tiny; do
  "$bin" audit -p protocols/ci.json --model fixtures/models/$m -b cpu-ref,cpu,opencl:0 -o "$tmp/$m.json" >"$tmp/$m.out" 2>&1
  rc=$?
  check "audit of $m: cpu and opencl:0 fit → exit 0" test $rc -eq 0
  check "audit of $m: every step ran" python3 -c "
import json,sys; d=json.load(open(sys.argv[1]))
assert [n['verdict'] for n in d['nodes']] == ['reference','fit','fit'], [n['verdict'] for n in d['nodes']]
for s in ('ops','drift','logits','decide','generate','perplexity','determinism'): assert s in d['steps'], s" "$tmp/$m.json"
done
# Dense decoders: every step runs; routing agreement does not apply and is
# not judged (said once), the decide step says "no MoE layers".
for m in llama_tiny qwen2_tiny mistral_tiny qwen3_tiny qwen3_5_tiny; do
  "$bin" audit -p protocols/ci.json --model fixtures/models/$m -b cpu-ref,cpu,opencl:0 -o "$tmp/$m.json" \
    --markdown "$tmp/$m.md" >"$tmp/$m.out" 2>&1
  rc=$?
  check "audit of dense $m: cpu and opencl:0 fit → exit 0" test $rc -eq 0
  check "audit of dense $m: routing agreement not judged, said why" python3 -c "
import json,sys; d=json.load(open(sys.argv[1]))
assert [n['verdict'] for n in d['nodes']] == ['reference','fit','fit'], [n['verdict'] for n in d['nodes']]
for n in d['nodes'][1:]:
    why = 'no MoE layers: the model has no router'
    assert n['not_applicable'] == {'decide.routing_agreement_min': why, 'decide.routing_clear_flips_max': why}, n['not_applicable']
    assert all(not c['criterion'].startswith('decide.routing_') for t in n['criteria'].values() for c in t)
for r in d['steps']['decide']['results']: assert r['routing_free'] == 'no MoE layers', r
for s in ('ops','drift','logits','decide','generate','perplexity','determinism'): assert s in d['steps'], s" "$tmp/$m.json"
  check "audit of dense $m: the text report says routing agreement does not apply" \
    grep -q "not judged: decide.routing_agreement_min does not apply to this model" "$tmp/$m.out"
  check "audit of dense $m: the markdown says so too" grep -q "Not judged: \`decide.routing_agreement_min\`" "$tmp/$m.md"
done
"$bin" decide --model fixtures/models/mistral_tiny -b cpu-ref,cpu >"$tmp/dense_decide.txt" 2>&1
check "decide on a dense model: top-1 only, no routing tables" \
  bash -c "grep -q 'no MoE layers: routing agreement and border tokens do not apply' '$tmp/dense_decide.txt' && ! grep -q 'per MoE layer' '$tmp/dense_decide.txt'"
out=$("$bin" inspect fixtures/models/qwen2_tiny 2>&1)
check "inspect qwen2_tiny: the sliding layers and no router" \
  bash -c "grep -q 'sliding-window attention (8 keys) on layers 1, 2' <<<'$out' && grep -q 'router: none: no MoE layers' <<<'$out'"
out=$("$bin" inspect fixtures/models/llama_tiny.gguf 2>&1)
check "inspect llama_tiny.gguf (llama.cpp's converter): a dense llama GGUF" grep -q "^llama: 3 layers, hidden 64" <<<"$out"
"$bin" inspect fixtures/models/llama_tiny.gguf --json >"$tmp/lg.json"
check "inspect --json llama_tiny.gguf: the GGUF's rope frequency factors" python3 -c "
import json,sys; a=json.load(open(sys.argv[1]))['config']
assert a['architecture']=='llama' and len(a['rope_freq_factors'])==8 and a['rope_freq_factors'][0]==1.0 and a['rope_freq_factors'][2]==8.0, a" "$tmp/lg.json"
# The sigmoid-routed families: inspect states MLA's ranks and widths, the router's rule, dense and MoE layers.
out=$("$bin" inspect fixtures/models/deepseek_v3_tiny 2>&1)
check "inspect deepseek_v3_tiny: MLA with q-LoRA, the grouped sigmoid router, dense layer 0" \
  grep -q "MLA attention: q-LoRA rank 32 (q_a_proj → q_a_layernorm → q_b_proj); kv latent rank 32 + one shared rope key 8 wide" <<<"$out"
check "inspect deepseek_v3_tiny: router rule" grep -q "sigmoid over 8 experts, top-2 selected on score + e_score_correction_bias within the best 2 of 4 groups, weights renormalised to sum 1, × 2.5; plus a shared expert 16 wide" <<<"$out"
check "inspect deepseek_v3_tiny: layers" grep -q "^layers: dense 0, MoE 1-3$" <<<"$out"
"$bin" inspect fixtures/models/kimi_k2_tiny --json >"$tmp/kimi.json"
check "inspect --json kimi_k2_tiny: MLA without q-LoRA, one group, yarn scale" python3 -c "
import json,math,sys; a=json.load(open(sys.argv[1]))['config']
m=a['mla']; assert m=={'q_lora_rank':0,'kv_lora_rank':48,'qk_nope_head_dim':24,'qk_rope_head_dim':8,'v_head_dim':16,'rope_interleave':True}, m
r=a['router']; assert r['n_group']==1 and r['routed_scaling_factor']==2.827 and r['score_correction_bias'] and r['first_k_dense_replace']==1, r
ms=0.1*math.log(32)+1; assert abs(a['attention_scale']-ms*ms/math.sqrt(32))<1e-12, a['attention_scale']
assert a['full_forward'] is True and a['rotary_dims']==8" "$tmp/kimi.json"
out=$("$bin" inspect fixtures/models/deepseek_v3_tiny.gguf 2>&1)
check "inspect deepseek_v3_tiny.gguf (llama.cpp's converter): MLA read back from the MQA form" \
  grep -q "MLA attention: q-LoRA rank 32 .* per head q·k over 16 nope + 8 rope dims, values 16 wide" <<<"$out"
"$bin" inspect fixtures/models/gpt_oss_tiny --json >"$tmp/go.json"
check "inspect --json gpt_oss_tiny: yarn, sinks, plain experts" python3 -c "
import json,sys; a=json.load(open(sys.argv[1]))['config']
assert a['rope_yarn']['truncate'] is False and abs(a['rope_yarn']['attention_factor']-1.3465735902799727)<1e-12, a
assert a['attention_sinks'] and a['expert_format']=='plain' and a['swiglu_limit']==1.0, a" "$tmp/go.json"
"$bin" inspect fixtures/models/gpt_oss_tiny_mxfp4.gguf --json >"$tmp/gg.json"
check "inspect --json gpt_oss_tiny_mxfp4.gguf (llama.cpp's converter): MXFP4 stacks, llama.cpp's swiglu and yarn" python3 -c "
import json,sys; a=json.load(open(sys.argv[1]))['config']
assert a['architecture']=='gpt_oss' and a['expert_format']=='gguf MXFP4' and a['swiglu_limit']==7.0, a
assert a['rope_yarn']['truncate'] is True and abs(a['rope_yarn']['attention_factor']-1.3465735902799727)<1e-12, a" "$tmp/gg.json"
out=$("$bin" inspect fixtures/models/gpt_oss_tiny_mxfp4.gguf 2>&1)
check "inspect gpt_oss_tiny_mxfp4.gguf: the sliding layers of llama.cpp's default pattern" \
  grep -q 'sliding-window attention (8 keys) on layers 0, 2' <<<"$out"
out=$("$bin" inspect fixtures/models/llama_tiny 2>&1)
check "inspect llama_tiny: the llama3 rope scaling" grep -q "with llama3 frequency scaling (factor 8" <<<"$out"
expect_usage_error "the model has no MoE layer" matrix --model fixtures/models/llama_tiny
# gpt-oss with MXFP4 experts: inspect names the format; malformed MXFP4 tensors are refused naming the tensor.
out=$("$bin" inspect fixtures/models/gpt_oss_tiny_mxfp4 2>&1)
check "inspect gpt_oss_tiny_mxfp4: MXFP4 experts, sinks, the sliding layers" \
  bash -c "grep -q 'expert weights MXFP4' <<<'$out' && grep -q 'attention sinks' <<<'$out' && grep -q 'on layers 0, 2' <<<'$out'"
"$bin" audit -p protocols/ci.json --model fixtures/models/gpt_oss_tiny_mxfp4 -b cpu-ref,cpu >"$tmp/mx.out" 2>&1
check "audit of gpt_oss_tiny_mxfp4: cpu fit → exit 0" test $? -eq 0
# Rewrite one tensor's header entry (same byte count, so the file stays valid safetensors).
mxbad() {  # mxbad DIR TENSOR KEY JSONVALUE
  mkdir -p "$1" && cp fixtures/models/gpt_oss_tiny_mxfp4/config.json "$1/"
  python3 - "$1/model.safetensors" "$2" "$3" "$4" <<'PY'
import json, struct, sys
src = "fixtures/models/gpt_oss_tiny_mxfp4/model.safetensors"
data = open(src, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
head = json.loads(data[8:8 + n])
head[sys.argv[2]][sys.argv[3]] = json.loads(sys.argv[4])
h = json.dumps(head).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + data[8 + n:])
PY
}
mxbad "$tmp/mx1" model.layers.0.mlp.experts.gate_up_proj_blocks shape '[8, 128, 4, 8]'
expect_usage_error "gate_up_proj_blocks.*shape" ops --model "$tmp/mx1" --layer 0 --ops moe
mxbad "$tmp/mx2" model.layers.1.mlp.experts.down_proj_scales dtype '"I8"'
expect_usage_error "MXFP4 tensor 'model.layers.1.mlp.experts.down_proj_scales' has dtype I8, expected U8" \
  logits --model "$tmp/mx2" -b cpu-ref,cpu
"$bin" inspect fixtures/models/qwen3_5_moe_tiny >"$tmp/q35.txt" 2>&1
check "inspect shows the hybrid layout" grep -q "hybrid: 2 Gated DeltaNet layers" "$tmp/q35.txt"
check "inspect says the experts are fused and the vision tower ignored" \
  bash -c "grep -q 'experts stored fused' '$tmp/q35.txt' && grep -q '^ignored: .*model.visual' '$tmp/q35.txt'"

rm -rf "$tmp"
echo "$failures failed"
[ "$failures" -eq 0 ]
