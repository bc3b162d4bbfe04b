#!/usr/bin/env python3
"""Write a synthetic Hugging Face checkpoint with Qwen3-30B-A3B dimensions.

    scripts/make_synthetic_checkpoint.py OUTDIR [--layers N] [--seed S] [--vocab V]

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


def write(outdir: str, layers: int, seed: int, vocab: int) -> None:
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(config(layers, vocab), f, indent=2)
        f.write("\n")
    specs = tensor_specs(layers, vocab)
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
    a = ap.parse_args()
    if a.layers < 1 or a.vocab < 1:
        ap.error("--layers and --vocab must be positive")
    write(a.outdir, a.layers, a.seed, a.vocab)


if __name__ == "__main__":
    main()
