#!/usr/bin/env python3
"""Write a synthetic Hugging Face checkpoint with Qwen3-30B-A3B (or Qwen3.5-MoE) dimensions.

    scripts/make_synthetic_checkpoint.py OUTDIR [--layers N] [--seed S] [--vocab V] [--arch qwen3_5_moe]

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
Qwen3_5MoeTextConfig defaults, which follow the released Qwen3.5-35B-A3B. The
larger Qwen3.5-122B-A10B shares the layout (48 layers, 36 Gated DeltaNet + 12
gated attention, 256 experts, 8 routed + 1 shared active, vocab 248320, ~250 GB
BF16, per its model cards); its hidden and expert widths are not in any source
this project can read, so they are not guessed here. Zero-centred RMSNorm
weights (the model scales by 1 + w) are N(0, 0.2^2).

OUTDIR receives ``config.json`` (a qwen3_moe config as the real
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
N(0, (4/sqrt(hidden))^2). f32 values are rounded to BF16 to nearest even.

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


def config_qwen35(layers: int, vocab: int) -> dict:
    """A Qwen3_5MoeConfig (the multimodal wrapper) with Qwen3.5-35B-A3B's text dimensions."""
    q = Q35
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


def tensor_specs_qwen35(layers: int, vocab: int) -> list[tuple[str, tuple[int, ...], str]]:
    q = Q35
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
        scale = np.float32({"embed": EMBED_STD, "router": ROUTER_LOGIT_STD / np.sqrt(cols),
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


def write(outdir: str, layers: int, seed: int, vocab: int, arch: str = "qwen3_moe") -> None:
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(config_qwen35(layers, vocab) if arch == "qwen3_5_moe" else config(layers, vocab), f, indent=2)
        f.write("\n")
    specs = tensor_specs_qwen35(layers, vocab) if arch == "qwen3_5_moe" else tensor_specs(layers, vocab)
    header: dict = {"__metadata__": {"format": "pt", "generator": "kvasir-equiv scripts/make_synthetic_checkpoint.py",
                                     "seed": str(seed)}}
    offset = 0
    for name, shape, _ in specs:
        nbytes = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned
    path = os.path.join(outdir, "model.safetensors")
    start = time.time()
    with open(path + ".partial", "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for i, (name, shape, kind) in enumerate(specs):
            for chunk in values(name, shape, kind, seed):
                f.write(to_bf16_bits(chunk).tobytes())
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
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (default 2; the real model has 48)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=VOCAB,
                    help=f"vocabulary size (default {VOCAB}, the real one; embed + lm_head are 2·vocab·2048 BF16)")
    ap.add_argument("--arch", choices=["qwen3_moe", "qwen3_5_moe"], default="qwen3_moe",
                    help="qwen3_moe: Qwen3-30B-A3B (default); qwen3_5_moe: Qwen3.5-35B-A3B's hybrid layout, fused experts")
    a = ap.parse_args()
    if a.layers < 1 or a.vocab < 1:
        ap.error("--layers and --vocab must be positive")
    write(a.outdir, a.layers, a.seed, a.vocab, a.arch)


if __name__ == "__main__":
    main()
