#!/usr/bin/env python3
"""Write a real-ish size qwen3moe GGUF (all F32, ~1.1 GB) for whole-model benchmarks.

Not a fixture: it is written OUTSIDE the repository (default
/work/bench-models/qwen3moe-bench-f32.gguf) and read by bench/bench_model.cpp
and by llama.cpp's llama-bench on the same file (BENCHMARKS.md, "Whole model").

Shape (Qwen3-MoE layout, llama.cpp tensor names as scripts/make_fixtures.py
writes them): 8 layers, hidden 1024, 16 query heads and 4 kv heads of 128,
q/k RMSNorm, 32 experts of 256 (top 8, renormalised), vocab 16384. Per layer
20 MiB of attention and 96 MiB of experts; a decoded token reads the
attention, the 8 chosen experts (24 MiB) of every layer, and the 64 MiB
lm_head: about 0.42 GB.

The weights are seeded normal values (N(0, 0.02²), norms 1), so nothing here
is a trained model. A SentencePiece-style vocabulary (tokenizer.ggml.model =
"llama": <unk>, <s>, </s>, the 256 byte tokens, then "▁tN" pieces) lets
llama.cpp load the file; the benchmarks feed token ids, never text.

Deterministic: numpy's PCG64 seeded once, tensors drawn in file order, so
the same numpy release writes the same bytes. Tensors are streamed to disk
one at a time (peak memory ~ the largest tensor, the 64 MiB embedding).

Usage: python3 scripts/make_bench_gguf.py [--out PATH]
       (needs numpy and gguf: python3 -m venv V && V/bin/pip install numpy gguf)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import gguf

N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM = 8, 1024, 16, 4, 128
N_EXPERT, N_EXPERT_USED, N_FF_EXP, VOCAB = 32, 8, 256, 16384
SEED = 20260521


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # UNKNOWN, CONTROL, CONTROL, BYTE
    while len(tokens) < VOCAB:
        tokens.append(f"\u2581t{len(tokens)}")
        types.append(1)  # NORMAL
    scores = [0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(VOCAB - 259)]
    return tokens, scores, types


def tensor_shapes() -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy row-major shape, kind) in file order; kind: 'normal' or 'norm'."""
    out = [("token_embd.weight", (VOCAB, N_EMBD), "normal")]
    for i in range(N_LAYER):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", (N_EMBD,), "norm"),
            (b + "attn_q.weight", (N_HEAD * HEAD_DIM, N_EMBD), "normal"),
            (b + "attn_k.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), "normal"),
            (b + "attn_v.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), "normal"),
            (b + "attn_output.weight", (N_EMBD, N_HEAD * HEAD_DIM), "normal"),
            (b + "attn_q_norm.weight", (HEAD_DIM,), "norm"),
            (b + "attn_k_norm.weight", (HEAD_DIM,), "norm"),
            (b + "ffn_norm.weight", (N_EMBD,), "norm"),
            (b + "ffn_gate_inp.weight", (N_EXPERT, N_EMBD), "normal"),
            # Expert stacks, numpy [n_expert, out, in] (ggml ne = [in, out, n_expert]).
            (b + "ffn_gate_exps.weight", (N_EXPERT, N_FF_EXP, N_EMBD), "normal"),
            (b + "ffn_up_exps.weight", (N_EXPERT, N_FF_EXP, N_EMBD), "normal"),
            (b + "ffn_down_exps.weight", (N_EXPERT, N_EMBD, N_FF_EXP), "normal"),
        ]
    out += [("output_norm.weight", (N_EMBD,), "norm"), ("output.weight", (VOCAB, N_EMBD), "normal")]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/work/bench-models/qwen3moe-bench-f32.gguf"))
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)

    w = gguf.GGUFWriter(str(args.out), "qwen3moe")
    w.add_name("kvasir-bench-qwen3moe-1b")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_block_count(N_LAYER)
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF_EXP * N_EXPERT_USED)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_EXPERT_USED)
    w.add_expert_feed_forward_length(N_FF_EXP)
    w.add_expert_weights_norm(True)
    w.add_vocab_size(VOCAB)
    tokens, scores, types = vocabulary()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    shapes = tensor_shapes()
    for name, shape, _ in shapes:
        w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(SEED)
    total = 0
    for name, shape, kind in shapes:
        if kind == "norm":
            arr = np.ones(shape, dtype=np.float32)
        else:
            arr = rng.standard_normal(shape, dtype=np.float32)
            arr *= np.float32(0.02)
        w.write_tensor_data(arr)
        total += arr.nbytes
    w.close()
    print(f"{args.out}: {len(shapes)} tensors, {total / 2**30:.2f} GiB of F32 weights")


if __name__ == "__main__":
    main()
