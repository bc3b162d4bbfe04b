#!/usr/bin/env python3
"""Write a synthetic Hugging Face checkpoint with Qwen3-30B-A3B (or Qwen3.5-MoE, DeepSeek-V3) dimensions.

    scripts/make_synthetic_checkpoint.py OUTDIR [--layers N] [--seed S] [--vocab V]
                                         [--arch qwen3_moe|qwen3_5_moe|qwen3_5_moe_122b|deepseek_v3]

--arch qwen3_5_moe writes the contract's own family (SPEC.md: layer-0 experts of
Qwen3.5-MoE) as the released checkpoints lay it out: the multimodal wrapper
(Qwen3_5MoeForConditionalGeneration, text model under text_config, tensors under
model.language_model.; no vision tower: the tool ignores it anyway), the hybrid
stack (layer l is Gated DeltaNet unless (l + 1) % 4 == 0, full_attention_interval
4), 256 experts of moe_intermediate 512 stored FUSED ([E, 2I, H] gate_up_proj,
[E, H, I] down_proj, the transformers 5 layout some published checkpoints use),
top-8, one shared expert of 512 with its sigmoid gate, hidden 2048, 16 query / 2
KV heads of head_dim 256, Gated DeltaNet 16 key / 32 value heads of 128, conv
kernel 4, vocab 248320. Where the figures come from: transformers 5.24's
Qwen3_5MoeTextConfig defaults, which follow the released Qwen3.5-35B-A3B.
Zero-centred RMSNorm weights (the model scales by 1 + w) are N(0, 0.2^2).

--arch qwen3_5_moe_122b writes the same layout with Qwen3.5-122B-A10B's text
dimensions (48 layers in the real model, 36 Gated DeltaNet + 12 gated attention):
hidden 3072, 256 fused experts of moe_intermediate 1024, top-8, one shared expert
of 1024, 32 query / 2 KV heads of head_dim 256, Gated DeltaNet 16 key / 64 value
heads of 128, conv kernel 4, vocab 248320, partial rotary 0.25, rope theta 1e7,
rms_norm_eps 1e-6, untied lm_head. Where they come from: the text_config of the
published re-uploads nvidia/Qwen3.5-122B-A10B-NVFP4 and Qwen/Qwen3.5-122B-A10B-FP8
(which keep the base model's config), agreeing with the model cards of the
GPTQ/MXFP4 re-uploads (48 layers, 3:1 pattern, 256 experts, 8 + 1 active, vocab
248320, ~250 GB BF16). Check: these figures give 122,111,526,912 language-model
parameters (122.1B, as the GGUF releases state) and 9.77B active per token.

--arch deepseek_v3 writes a DeepseekV3ForCausalLM checkpoint (model_type
deepseek_v3) with the layer dimensions of deepseek-ai/DeepSeek-V3's config.json:
hidden 7168; MLA attention with 128 heads (num_key_value_heads 128), q_lora_rank
1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim
128 (q_a_proj [1536, H], q_a_layernorm [1536], q_b_proj [128*192, 1536],
kv_a_proj_with_mqa [512+64, H], kv_a_layernorm [512], kv_b_proj [128*256, 512],
o_proj [H, 128*128]); rope theta 1e4 with YaRN (factor 40, original 4096,
beta_fast 32, beta_slow 1, mscale = mscale_all_dim = 1.0; rope_interleave true),
max_position_embeddings 163840; the first_k_dense_replace = 3 first layers a
dense SwiGLU of intermediate_size 18432, the others MoE: sigmoid router
(scoring_func sigmoid, topk_method noaux_tc) over 256 experts in n_group 8
groups, topk_group 4, top-8, norm_topk_prob, routed_scaling_factor 2.5, experts
of moe_intermediate_size 2048 (one tensor per expert) plus n_shared_experts 1
shared expert of 2048 with no gate; rms_norm_eps 1e-6, vocab 129280, untied
lm_head. The router's mlp.gate.weight [256, H] and mlp.gate.e_score_correction_bias
[256] are F32 (transformers 5.24 creates both in float32 and lists them in
_keep_in_fp32_modules_strict), every other tensor BF16: the file mixes dtypes.
The bias is N(0, 0.02^2), small values of both signs like DeepSeek's trained
ones (never zero: a zero bias would hide a reader that drops it). The RMSNorm
weights multiply (not 1 + w): 1 + N(0, 0.2^2). Not written: the released
checkpoint's FP8 block quantisation (weights here are BF16, as DeepSeek's own
fp8_cast_bf16 makes them) and its multi-token-prediction layer (config.json has
num_nextn_predict_layers 0). Size: about 1.17 GB per dense layer, 23.0 GB per
MoE layer, plus 3.71 GB for embeddings and lm_head at the full vocab (at --vocab
4096: 117 MB); --layers 4 --vocab 4096 (3 dense + 1 MoE) is 26.6 GB.

Without --arch (qwen3_moe), OUTDIR receives ``config.json`` (a qwen3_moe config as the real
Qwen/Qwen3-30B-A3B ships it, with num_hidden_layers = N) and
``model.safetensors`` (BF16, every tensor the model needs, named as
transformers names them). Dimensions: hidden 2048, 128 experts of
moe_intermediate 768, top-8 with renormalised weights, 32 query / 4 KV heads of
head_dim 128 with q/k RMSNorm, vocab 151936, untied lm_head. Size: about
1.2 GB per layer plus 1.24 GB for embeddings and lm_head at the full vocab
(2 layers: 3.7 GB); --vocab makes the last part smaller.

The weights are random, never a trained model, and are generated on demand:
the files are never committed (write them under out/, which git ignores, e.g.
``out/qwen3-30b-a3b-synthetic``). Each tensor has its own numpy PCG64 stream
seeded from (seed, tensor name), so layer 0 is the same whatever --layers is
and two runs give byte-identical files.

Distributions (as scripts/make_fixtures.py, scaled to this width so routing and
logits are neither flat nor one-hot): matrices N(0, 1/fan_in); router
N(0, (2/sqrt(hidden))^2), i.e. router logits of std ~2 on RMS-normalised
input; RMSNorm weights 1 + N(0, 0.2^2); embeddings N(0, 0.5^2); lm_head
N(0, (4/sqrt(hidden))^2); deepseek_v3's e_score_correction_bias N(0, 0.02^2).
f32 values are rounded to BF16 to nearest even (deepseek_v3's two F32 router
tensors are written as drawn).

The file is written tensor by tensor, in chunks of 16 M values (the header
first: every size is known), so memory stays at a few hundred MB. numpy has no bfloat16, so the safetensors
container is written directly (8-byte little-endian header length, JSON header,
raw little-endian data); when the ``safetensors`` package is installed the
result is opened with it as a check.

Needs numpy (and optionally safetensors): python3 -m venv /tmp/venv &&
/tmp/venv/bin/pip install numpy safetensors.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time

import numpy as np

HIDDEN = 2048
EXPERTS = 128
MOE_FFN = 768
TOP_K = 8
HEADS = 32
KV_HEADS = 4
HEAD_DIM = 128
VOCAB = 151936
DENSE_FFN = 6144  # intermediate_size in the real config; unused (every layer is MoE)

NORM_WEIGHT_STD = 0.2
EMBED_STD = 0.5
ROUTER_LOGIT_STD = 2.0
LM_HEAD_LOGIT_STD = 4.0


DSV3 = dict(hidden=7168, dense_ffn=18432, moe_ffn=2048, experts=256, top_k=8, n_group=8, topk_group=4,
            shared=1, first_dense=3, heads=128, q_lora=1536, kv_lora=512, nope=128, rope=64, v_dim=128,
            vocab=129280)
BIAS_STD = 0.02  # e_score_correction_bias


def config(layers: int, vocab: int) -> dict:
    """Qwen/Qwen3-30B-A3B's config.json, with num_hidden_layers and vocab_size set."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "decoder_sparse_step": 1,
        "eos_token_id": 151645,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": DENSE_FFN,
        "max_position_embeddings": 40960,
        "max_window_layers": layers,
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": MOE_FFN,
        "norm_topk_prob": True,
        "num_attention_heads": HEADS,
        "num_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "num_hidden_layers": layers,
        "num_key_value_heads": KV_HEADS,
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab,
        "kvasir_synthetic": "random weights from scripts/make_synthetic_checkpoint.py, not a trained model",
    }


Q35 = dict(hidden=2048, experts=256, moe_ffn=512, shared_ffn=512, top_k=8, heads=16, kv_heads=2, head_dim=256,
           lin_k_heads=16, lin_v_heads=32, lin_k_dim=128, lin_v_dim=128, conv=4, vocab=248320, interval=4)
# Qwen3.5-122B-A10B (sources in the module docstring): wider hidden and experts,
# twice the query and Gated DeltaNet value heads; everything else as the 35B.
Q35_122B = dict(Q35, hidden=3072, moe_ffn=1024, shared_ffn=1024, heads=32, lin_v_heads=64)


def config_qwen35(layers: int, vocab: int, q: dict = Q35) -> dict:
    """A Qwen3_5MoeConfig (the multimodal wrapper) with Qwen3.5-MoE text dimensions (35B-A3B's by default)."""
    types = ["full_attention" if (l + 1) % q["interval"] == 0 else "linear_attention" for l in range(layers)]
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": {
            "model_type": "qwen3_5_moe_text", "vocab_size": vocab, "hidden_size": q["hidden"],
            "num_hidden_layers": layers, "num_attention_heads": q["heads"], "num_key_value_heads": q["kv_heads"],
            "head_dim": q["head_dim"], "hidden_act": "silu", "rms_norm_eps": 1e-06, "attention_bias": False,
            "linear_conv_kernel_dim": q["conv"], "linear_key_head_dim": q["lin_k_dim"],
            "linear_value_head_dim": q["lin_v_dim"], "linear_num_key_heads": q["lin_k_heads"],
            "linear_num_value_heads": q["lin_v_heads"], "moe_intermediate_size": q["moe_ffn"],
            "shared_expert_intermediate_size": q["shared_ffn"], "num_experts_per_tok": q["top_k"],
            "num_experts": q["experts"], "layer_types": types, "max_position_embeddings": 262144,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                "mrope_section": [11, 11, 10], "mrope_interleaved": True},
            "tie_word_embeddings": False},
        "kvasir_synthetic": "random weights from scripts/make_synthetic_checkpoint.py, not a trained model",
    }


def tensor_specs_qwen35(layers: int, vocab: int, q: dict = Q35) -> list[tuple[str, tuple[int, ...], str]]:
    H, E, I = q["hidden"], q["experts"], q["moe_ffn"]
    key_dim, value_dim = q["lin_k_heads"] * q["lin_k_dim"], q["lin_v_heads"] * q["lin_v_dim"]
    conv_dim = 2 * key_dim + value_dim
    q_dim, kv_dim = q["heads"] * q["head_dim"], q["kv_heads"] * q["head_dim"]
    pre = "model.language_model."
    out = [(pre + "embed_tokens.weight", (vocab, H), "embed"), (pre + "norm.weight", (H,), "norm0"),
           ("lm_head.weight", (vocab, H), "lm_head")]
    for l in range(layers):
        p = f"{pre}layers.{l}."
        out += [(p + "input_layernorm.weight", (H,), "norm0"), (p + "post_attention_layernorm.weight", (H,), "norm0")]
        if (l + 1) % q["interval"] == 0:
            a = p + "self_attn."
            out += [(a + "q_proj.weight", (2 * q_dim, H), "matrix"), (a + "k_proj.weight", (kv_dim, H), "matrix"),
                    (a + "v_proj.weight", (kv_dim, H), "matrix"), (a + "o_proj.weight", (H, q_dim), "matrix"),
                    (a + "q_norm.weight", (q["head_dim"],), "norm0"), (a + "k_norm.weight", (q["head_dim"],), "norm0")]
        else:
            a = p + "linear_attn."
            out += [(a + "in_proj_qkv.weight", (conv_dim, H), "matrix"), (a + "in_proj_z.weight", (value_dim, H), "matrix"),
                    (a + "in_proj_b.weight", (q["lin_v_heads"], H), "matrix"),
                    (a + "in_proj_a.weight", (q["lin_v_heads"], H), "matrix"),
                    (a + "conv1d.weight", (conv_dim, 1, q["conv"]), "matrix"),
                    (a + "dt_bias", (q["lin_v_heads"],), "norm"), (a + "A_log", (q["lin_v_heads"],), "norm0"),
                    (a + "norm.weight", (q["lin_v_dim"],), "norm"), (a + "out_proj.weight", (H, value_dim), "matrix")]
        m = p + "mlp."
        out += [(m + "gate.weight", (E, H), "router"), (m + "experts.gate_up_proj", (E, 2 * I, H), "matrix"),
                (m + "experts.down_proj", (E, H, I), "matrix"), (m + "shared_expert.gate_proj.weight", (q["shared_ffn"], H), "matrix"),
                (m + "shared_expert.up_proj.weight", (q["shared_ffn"], H), "matrix"),
                (m + "shared_expert.down_proj.weight", (H, q["shared_ffn"]), "matrix"),
                (m + "shared_expert_gate.weight", (1, H), "matrix")]
    return sorted(out)


def config_dsv3(layers: int, vocab: int) -> dict:
    """deepseek-ai/DeepSeek-V3's config.json (less auto_map, quantization_config and the MTP layer),
    with num_hidden_layers and vocab_size set."""
    d = DSV3
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "aux_loss_alpha": 0.001,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "ep_size": 1,
        "first_k_dense_replace": d["first_dense"],
        "hidden_act": "silu",
        "hidden_size": d["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": d["dense_ffn"],
        "kv_lora_rank": d["kv_lora"],
        "max_position_embeddings": 163840,
        "model_type": "deepseek_v3",
        "moe_intermediate_size": d["moe_ffn"],
        "moe_layer_freq": 1,
        "n_group": d["n_group"],
        "n_routed_experts": d["experts"],
        "n_shared_experts": d["shared"],
        "norm_topk_prob": True,
        "num_attention_heads": d["heads"],
        "num_experts_per_tok": d["top_k"],
        "num_hidden_layers": layers,
        "num_key_value_heads": d["heads"],
        "num_nextn_predict_layers": 0,  # the released checkpoint has 1 (layer 61, MTP); not written here
        "pretraining_tp": 1,
        "q_lora_rank": d["q_lora"],
        "qk_nope_head_dim": d["nope"],
        "qk_rope_head_dim": d["rope"],
        "rms_norm_eps": 1e-06,
        "rope_interleave": True,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "seq_aux": True,
        "tie_word_embeddings": False,
        "topk_group": d["topk_group"],
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.33.1",
        "use_cache": True,
        "v_head_dim": d["v_dim"],
        "vocab_size": vocab,
        "kvasir_synthetic": "random weights from scripts/make_synthetic_checkpoint.py, not a trained model",
    }


def tensor_specs_dsv3(layers: int, vocab: int) -> list[tuple[str, tuple[int, ...], str] | tuple[str, tuple[int, ...], str, str]]:
    """(name, shape, kind[, dtype]): the router weight and its correction bias F32, the rest BF16."""
    d = DSV3
    H, I, F = d["hidden"], d["moe_ffn"], d["dense_ffn"]
    heads, qk = d["heads"], d["nope"] + d["rope"]
    out = [("model.embed_tokens.weight", (vocab, H), "embed"), ("model.norm.weight", (H,), "norm"),
           ("lm_head.weight", (vocab, H), "lm_head")]
    for l in range(layers):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        out += [(p + "input_layernorm.weight", (H,), "norm"), (p + "post_attention_layernorm.weight", (H,), "norm"),
                (a + "q_a_proj.weight", (d["q_lora"], H), "matrix"), (a + "q_a_layernorm.weight", (d["q_lora"],), "norm"),
                (a + "q_b_proj.weight", (heads * qk, d["q_lora"]), "matrix"),
                (a + "kv_a_proj_with_mqa.weight", (d["kv_lora"] + d["rope"], H), "matrix"),
                (a + "kv_a_layernorm.weight", (d["kv_lora"],), "norm"),
                (a + "kv_b_proj.weight", (heads * (d["nope"] + d["v_dim"]), d["kv_lora"]), "matrix"),
                (a + "o_proj.weight", (H, heads * d["v_dim"]), "matrix")]
        m = p + "mlp."
        if l < d["first_dense"]:
            out += [(m + "gate_proj.weight", (F, H), "matrix"), (m + "up_proj.weight", (F, H), "matrix"),
                    (m + "down_proj.weight", (H, F), "matrix")]
            continue
        S = I * d["shared"]
        out += [(m + "gate.weight", (d["experts"], H), "router", "F32"),
                (m + "gate.e_score_correction_bias", (d["experts"],), "bias", "F32"),
                (m + "shared_experts.gate_proj.weight", (S, H), "matrix"),
                (m + "shared_experts.up_proj.weight", (S, H), "matrix"),
                (m + "shared_experts.down_proj.weight", (H, S), "matrix")]
        for e in range(d["experts"]):
            x = f"{m}experts.{e}."
            out += [(x + "gate_proj.weight", (I, H), "matrix"), (x + "up_proj.weight", (I, H), "matrix"),
                    (x + "down_proj.weight", (H, I), "matrix")]
    return sorted(out)


def tensor_specs(layers: int, vocab: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, kind) of every tensor, kind selecting the distribution."""
    q_dim, kv_dim = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    out = [("model.embed_tokens.weight", (vocab, HIDDEN), "embed"),
           ("model.norm.weight", (HIDDEN,), "norm"),
           ("lm_head.weight", (vocab, HIDDEN), "lm_head")]
    for l in range(layers):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (HIDDEN,), "norm"),
                (p + "post_attention_layernorm.weight", (HIDDEN,), "norm"),
                (p + "self_attn.q_proj.weight", (q_dim, HIDDEN), "matrix"),
                (p + "self_attn.k_proj.weight", (kv_dim, HIDDEN), "matrix"),
                (p + "self_attn.v_proj.weight", (kv_dim, HIDDEN), "matrix"),
                (p + "self_attn.o_proj.weight", (HIDDEN, q_dim), "matrix"),
                (p + "self_attn.q_norm.weight", (HEAD_DIM,), "norm"),
                (p + "self_attn.k_norm.weight", (HEAD_DIM,), "norm"),
                (p + "mlp.gate.weight", (EXPERTS, HIDDEN), "router")]
        for e in range(EXPERTS):
            m = f"{p}mlp.experts.{e}."
            out += [(m + "gate_proj.weight", (MOE_FFN, HIDDEN), "matrix"),
                    (m + "up_proj.weight", (MOE_FFN, HIDDEN), "matrix"),
                    (m + "down_proj.weight", (HIDDEN, MOE_FFN), "matrix")]
    return sorted(out)


CHUNK = 1 << 24  # elements generated at a time (the embedding alone is 311 M)


def values(name: str, shape: tuple[int, ...], kind: str, seed: int):
    """The tensor's f32 values, in row-major chunks of at most CHUNK elements
    (one stream: the chunking does not change the values)."""
    rng = np.random.default_rng([seed, *name.encode()])
    cols = shape[-1]
    rows = int(np.prod(shape)) // cols
    step = max(1, CHUNK // cols)
    if kind == "norm":
        scale, shift = np.float32(NORM_WEIGHT_STD), np.float32(1.0)
    elif kind == "norm0":  # zero-centred RMSNorm weight: the model scales by 1 + w
        scale, shift = np.float32(NORM_WEIGHT_STD), np.float32(0.0)
    else:
        scale = np.float32({"embed": EMBED_STD, "router": ROUTER_LOGIT_STD / np.sqrt(cols), "bias": BIAS_STD,
                            "lm_head": LM_HEAD_LOGIT_STD / np.sqrt(cols), "matrix": 1.0 / np.sqrt(cols)}[kind])
        shift = np.float32(0.0)
    for r in range(0, rows, step):
        z = rng.standard_normal((min(step, rows - r), cols), dtype=np.float32)
        z *= scale
        z += shift
        yield z


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """Round f32 to bfloat16, nearest even (inputs are finite), as uint16 bits."""
    u = a.view(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return (u >> np.uint32(16)).astype(np.uint16)


ARCHS = {  # --arch: (config, tensor specs, real vocab)
    "qwen3_moe": (config, tensor_specs, VOCAB),
    "qwen3_5_moe": (config_qwen35, tensor_specs_qwen35, Q35["vocab"]),
    "qwen3_5_moe_122b": (lambda l, v: config_qwen35(l, v, Q35_122B), lambda l, v: tensor_specs_qwen35(l, v, Q35_122B),
                         Q35_122B["vocab"]),
    "deepseek_v3": (config_dsv3, tensor_specs_dsv3, DSV3["vocab"]),
}
DTYPE_BYTES = {"BF16": 2, "F32": 4}


def write(outdir: str, layers: int, seed: int, vocab: int, arch: str = "qwen3_moe") -> None:
    make_config, make_specs, _ = ARCHS[arch]
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(make_config(layers, vocab), f, indent=2)
        f.write("\n")
    # (name, shape, kind, dtype): a spec without a dtype is BF16
    specs = [(s[0], s[1], s[2], s[3] if len(s) > 3 else "BF16") for s in make_specs(layers, vocab)]
    header: dict = {"__metadata__": {"format": "pt", "generator": "kvasir-equiv scripts/make_synthetic_checkpoint.py",
                                     "seed": str(seed)}}
    offset = 0
    for name, shape, _, dtype in specs:
        nbytes = DTYPE_BYTES[dtype] * int(np.prod(shape))
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned
    path = os.path.join(outdir, "model.safetensors")
    start = time.time()
    with open(path + ".partial", "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for i, (name, shape, kind, dtype) in enumerate(specs):
            for chunk in values(name, shape, kind, seed):
                f.write(to_bf16_bits(chunk).tobytes() if dtype == "BF16" else chunk.astype("<f4", copy=False).tobytes())
            if sys.stderr.isatty() and (i % 64 == 0 or i + 1 == len(specs)):
                print(f"\r{i + 1}/{len(specs)} tensors", end="", file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    os.replace(path + ".partial", path)
    size = os.path.getsize(path)
    print(f"{path}: {len(specs)} tensors, {size / 1e9:.2f} GB, {layers} layers, vocab {vocab}, "
          f"seed {seed}, {time.time() - start:.1f} s")
    try:
        from safetensors import safe_open
    except ImportError:
        return
    with safe_open(path, framework="numpy") as st:
        assert len(list(st.keys())) == len(specs), "safetensors sees a different tensor count"
    print("checked with safetensors.safe_open")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (default 2; the real models have 48 qwen3_moe, 40 qwen3_5_moe, 48 qwen3_5_moe_122b, "
                         "61 deepseek_v3, whose first 3 are dense)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=None,
                    help=f"vocabulary size (default the real one: {VOCAB} qwen3_moe, {Q35['vocab']} qwen3_5_moe, "
                         f"{DSV3['vocab']} deepseek_v3; embed + lm_head are 2·vocab·hidden BF16)")
    ap.add_argument("--arch", choices=list(ARCHS), default="qwen3_moe",
                    help="qwen3_moe: Qwen3-30B-A3B (default); qwen3_5_moe: Qwen3.5-35B-A3B's hybrid layout, fused "
                         "experts; qwen3_5_moe_122b: the same layout at Qwen3.5-122B-A10B's widths; deepseek_v3: DeepSeek-V3 (MLA, 3 dense layers then sigmoid-routed MoE)")
    ap.add_argument("--count", action="store_true",
                    help="print the parameter count of the tensors this would write (nothing is written; OUTDIR unused)")
    a = ap.parse_args()
    if a.vocab is None:
        a.vocab = ARCHS[a.arch][2]
    if a.layers < 1 or a.vocab < 1:
        ap.error("--layers and --vocab must be positive")
    if a.count:
        print(param_count(a.arch, a.layers, a.vocab))
        return
    write(a.outdir, a.layers, a.seed, a.vocab, a.arch)


def param_count(arch: str, layers: int, vocab: int) -> int:
    """Values in every tensor the checkpoint holds (the language model: no vision tower, no MTP layer)."""
    return sum(int(np.prod(s[1])) for s in ARCHS[arch][1](layers, vocab))


if __name__ == "__main__":
    main()
