#!/usr/bin/env python3
"""Helper of tests/cli/test_llamacpp_node.sh (not a test itself): a random dense llama GGUF wide enough for
llama.cpp's k-quants (every matrix row a multiple of 256), F32, written with the gguf package (PyPI, installed
into the llama.cpp venv by scripts/setup_llamacpp.sh), with llama_tiny.gguf's tokenizer metadata so that
llama.cpp loads it.

  make_dense_gguf.py TOKENIZER_SOURCE.gguf OUT.gguf [HIDDEN FFN]

HIDDEN and FFN (default 256 and 512) set the widths: 64 and 80 make rows that llama-quantize cannot store in
k-quants (64: Q4_K falls back to Q5_0) or in any 32-element block (80: F16).
"""
import sys

import gguf
import numpy as np

src, out = sys.argv[1], sys.argv[2]
H, F = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (256, 512)
L, NH, NKV, V = 2, 4, 2, 320
D = H // NH
rng = np.random.Generator(np.random.PCG64(20261201))
w = gguf.GGUFWriter(out, "llama")
w.add_block_count(L)
w.add_context_length(512)
w.add_embedding_length(H)
w.add_feed_forward_length(F)
w.add_head_count(NH)
w.add_head_count_kv(NKV)
w.add_rope_freq_base(10000.0)
w.add_layer_norm_rms_eps(1e-5)
w.add_rope_dimension_count(D)
w.add_vocab_size(V)
w.add_file_type(gguf.LlamaFileType.ALL_F32)
rd = gguf.GGUFReader(src)
for name in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
    w.add_string(name, str(bytes(rd.fields[name].parts[-1]), "utf-8"))
tokens = [str(bytes(rd.fields["tokenizer.ggml.tokens"].parts[i]), "utf-8") for i in rd.fields["tokenizer.ggml.tokens"].data]
w.add_token_list(tokens)
w.add_token_scores([float(rd.fields["tokenizer.ggml.scores"].parts[i][0]) for i in rd.fields["tokenizer.ggml.scores"].data])
w.add_token_types([int(rd.fields["tokenizer.ggml.token_type"].parts[i][0]) for i in rd.fields["tokenizer.ggml.token_type"].data])
w.add_bos_token_id(1)
w.add_eos_token_id(2)


def mat(rows, cols, scale):
    return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)


w.add_tensor("token_embd.weight", mat(V, H, 1.0))
w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
w.add_tensor("output.weight", mat(V, H, 1 / np.sqrt(H)))
for l in range(L):
    p = f"blk.{l}."
    w.add_tensor(p + "attn_norm.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    w.add_tensor(p + "attn_q.weight", mat(NH * D, H, 1 / np.sqrt(H)))
    w.add_tensor(p + "attn_k.weight", mat(NKV * D, H, 1 / np.sqrt(H)))
    w.add_tensor(p + "attn_v.weight", mat(NKV * D, H, 1 / np.sqrt(H)))
    w.add_tensor(p + "attn_output.weight", mat(H, NH * D, 1 / np.sqrt(H)))
    w.add_tensor(p + "ffn_norm.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    w.add_tensor(p + "ffn_gate.weight", mat(F, H, 1 / np.sqrt(H)))
    w.add_tensor(p + "ffn_up.weight", mat(F, H, 1 / np.sqrt(H)))
    w.add_tensor(p + "ffn_down.weight", mat(H, F, 1 / np.sqrt(F)))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
