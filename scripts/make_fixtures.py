#!/usr/bin/env python3
"""Build the tiny MoE, hybrid and dense fixtures of kvasir-equiv with Hugging Face transformers.

The tool's forward pass is checked against code nobody on this project wrote:
this script builds tiny *random* models with the public transformers classes
(nothing is downloaded), saves them with ``save_pretrained`` and saves what
transformers computes on them for a fixed token sequence.

Outputs (under --out, default: the repository's fixtures/):

  models/qwen3_moe_tiny/       Qwen3MoeForCausalLM   (q/k norm, 1 dense layer via mlp_only_layers)
  models/qwen3_moe_tiny_bf16/  the same weights rounded to BF16 (references from the BF16 weights upcast)
  models/mixtral_tiny/         MixtralForCausalLM    (no q/k norm, always renormalised top-k)
  models/qwen2_moe_tiny/       Qwen2MoeForCausalLM   (shared expert + sigmoid gate, q/k/v bias,
                                                      norm_topk_prob false, decoder_sparse_step 2, tied embeddings)
  models/qwen3_5_moe_tiny/     Qwen3_5MoeForConditionalGeneration (hybrid: Gated DeltaNet + gated attention;
                                                      multimodal wrapper layout, fused 3D experts, shared expert)
  models/qwen3_next_tiny/      Qwen3NextForCausalLM  (hybrid; fused grouped in_proj_qkvz / in_proj_ba,
                                                      one tensor per expert, shared expert)
  models/qwen3_5_tiny/         Qwen3_5ForConditionalGeneration (dense hybrid, wrapper layout, tied embeddings)
  models/olmoe_tiny/           OlmoeForCausalLM      (q/k norm over the whole projection, softmax top-4 of 16 not
                                                      renormalised)
  models/gpt_oss_tiny/         GptOssForCausalLM     (sinks, sliding/full layers, yarn, biased router, clamped SwiGLU)
  models/gpt_oss_tiny_mxfp4/   the same with MXFP4 experts (*_blocks / *_scales), and mxfp4/vectors.{gguf,safetensors}
  models/llama_tiny/           LlamaForCausalLM      (dense; rope_type llama3 frequency scaling, head_dim from
                                                      hidden/heads, untied)
  models/qwen3_tiny/           Qwen3ForCausalLM      (dense; q/k norm, explicit head_dim 32 != hidden/heads,
                                                      tied embeddings)
  models/qwen2_tiny/           Qwen2ForCausalLM      (dense; q/k/v bias, sliding window 8 on layers 1, 2 via
                                                      use_sliding_window + max_window_layers 1, untied)
  models/mistral_tiny/         MistralForCausalLM    (dense; sliding window 8 on every layer, untied)
  models/deepseek_v3_tiny/     DeepseekV3ForCausalLM (MLA with q LoRA, interleaved rope, yarn with mscale !=
                                                      mscale_all_dim, sigmoid router + correction bias, 4 groups /
                                                      top-2 groups, shared expert, layer 0 dense)
  models/kimi_k2_tiny/         DeepseekV3ForCausalLM, Kimi-K2 style (MLA without q LoRA, 16 experts top-4, one
                                                      group, yarn with beta_fast = beta_slow)
  models/glm4_moe_tiny/        Glm4MoeForCausalLM    (GQA, q/k/v bias, q/k norm, partial rotary 0.5, sigmoid
                                                      router + correction bias, 2 groups / top-1 group, shared expert)
      each: config.json, generation_config.json, model.safetensors (save_pretrained),
            reference.safetensors (below), REFERENCE.md (what every reference tensor is)
  models/qwen3_moe_tiny.gguf            qwen3_moe_tiny converted with gguf.GGUFWriter, all F32
  models/qwen3_moe_tiny.q8_0.gguf       the same with every matrix Q8_0 except the router (F32, as llama.cpp)
  models/qwen3_moe_tiny.q8_0.reference.safetensors
                                        reference data of the Q8_0 file: transformers run on its
                                        dequantised weights (the F32 .gguf holds the very same values
                                        as qwen3_moe_tiny, so qwen3_moe_tiny/reference.safetensors is its reference)
  models/deepseek_v3_tiny.gguf          deepseek_v3_tiny by llama.cpp's own converter (--llama-cpp DIR), arch
                                        deepseek2, with deepseek_v3_tiny.gguf.reference.safetensors (like llama_tiny.gguf,
                                        gpt_oss_tiny*.gguf: see llama_cpp_gguf)
  models/qwen3_next_tiny.gguf           qwen3_next_tiny by llama.cpp's converter (--no-mtp), arch qwen3next
  models/qwen3_5_moe_tiny.gguf          qwen3_5_moe_tiny by llama.cpp's converter (--no-mtp), arch qwen35moe; both
                                        with NAME.gguf.reference.safetensors (float64 part on the GGUF's rounded
                                        f32(1 + w) norms and f32(-exp(A_log)))
  models/README.md                      index of the above
  tokens/default.txt                    default perplexity stream: STREAM_LEN token ids, whitespace
                                        separated, uniform from numpy PCG64(TOKEN_SEED + 1) in
                                        [0, min vocab of all fixtures), so it is valid for every fixture

The prompt of every fixture is the same PROMPT_LEN ids, uniform from numpy
PCG64(TOKEN_SEED) in [0, min vocab); it is saved as ``input_ids``.

Determinism: torch.manual_seed + a torch.Generator per fixture, numpy PCG64 for
token ids, one CPU thread, torch deterministic algorithms, float32 on CPU,
``attn_implementation="eager"`` and ``experts_implementation="eager"`` (the plain
per-expert loop of transformers). Running it twice gives byte-identical files on
the same machine; on another CPU the float32 references may differ by ~1e-6 (BLAS
kernels), so rebuild only what changed: --only NAME... builds the named fixtures
and leaves every other fixture's files untouched (models/README.md is rebuilt from
the files on disk). transformers' torch code paths are the reference: the script
refuses to run with the fla, causal_conv1d or kernels packages installed.

Weights are NOT the std-0.02 transformers init (that gives near-uniform routing
and near-identical logits): matrices are N(0, 1/fan_in) (variance preserving),
the router is N(0, ROUTER_STD^2) so router logits have real gaps, embeddings and
lm_head are large enough that the logits are peaked (greedy decoding is
meaningful), RMSNorm weights are 1 + N(0, 0.2^2) and biases N(0, 0.2^2), so a
forward pass that forgets a norm weight or a bias does not match by accident.
(1 + w) RMSNorms (the hybrids' ZERO_CENTRED_NORMS) store w = N(0, 0.2^2), the same
effective scale; the Gated DeltaNet's A_log is N(A_LOG_MEAN, A_LOG_STD^2) and its
dt_bias N(0, 0.2^2), so the recurrent state decays over a few tokens, not at once.

Border tokens: for the audit of "router authority" some tokens must have a
router gap (k-th minus (k+1)-th softmax probability; for the sigmoid routers the
k-th minus (k+1)-th selection score sigmoid(logit) + bias after the group mask)
below 1e-3, so that
backends which run their own router flip them. Random routers rarely produce
one in 24 tokens, so a few are *planted*: on a given layer the router row of
the (k+1)-th expert of the token with the smallest natural gap is nudged along
that token's router input, which moves exactly that expert's logit for that
token by the amount that leaves the wanted gap (solved in float64). The gaps
stay far above float32 noise (~1e-7), so the f32 and f64 references still
route every token identically (asserted). Which ones were planted is written
to REFERENCE.md. With 16 experts and top-4 (the hybrids) border tokens occur
naturally.

The float64 reference: ``model.double()`` alone is NOT a float64 computation in
transformers 5.24 -- RMSNorm casts to float32, eager attention and the MoE
routers take their softmax in float32 (the DeepSeek-V3 / GLM-4.5 sigmoid routers
compute their logits and sigmoid in float32) and the rotary embedding computes cos/sin
in float32. The f64 references here are computed with those four functions
replaced by float64 versions of the same formula (``pure_float64`` below);
the difference to plain ``model.double()`` is printed and written to
REFERENCE.md. The float64 rotary embedding recomputes inv_freq in float64 too,
for rope_type "llama3" with the branch structure of transformers'
_compute_llama3_parameters (llama3_inv_freq_f64), for "yarn" as _compute_yarn_parameters
(yarn_inv_freq_f64). The sigmoid routers' float64 forward is transformers' own
forward with its float32 casts made float64 (float64_copy). The attention masks are
transformers' own (create_causal_mask / create_sliding_window_causal_mask, built
in the model's dtype: 0 or finfo(dtype).min); every prompt forward records the
mask each attention layer received and checks it against the layer's window
(check_attention_masks). In the hybrids (Qwen3-Next, Qwen3.5) more steps are float32 in
double mode and are replaced too: the (1 + w) RMSNorm, the Gated DeltaNet's
gated RMSNorm, its decay g = -exp(A_log) * softplus(a + dt_bias) (a and
exp(A_log) rounded to float32) and the gated delta rule with its q/k L2 norm
(both torch forms cast q, k, v, g, beta to float32). The float64 gated delta
rule is the RECURRENT form for every call (transformers runs the chunked form
over a prompt): transformers' own torch_recurrent_gated_delta_rule, executed
with its float32 casts made float64 (``float64_copy``). As a sanity figure the
whole float64 forward is also run with the chunked form (same treatment); both
figures go to REFERENCE.md. Every f64 reference is then checked against an
independent plain-numpy float64 forward (``numpy_f64_forward``, with its own
token-by-token delta rule for the hybrids): they agree to ~1e-13.

Summary table printed at the end, per fixture: number of MoE layers; router
gap p_(k) - p_(k+1) (min / median / max over prompt tokens x MoE layers);
border tokens (gap < 1e-3) / all; smallest greedy margin; mean top-1
probability of the prompt logits; max |logits f32 - f64|; max |logits plain
model.double() - f64|; max |numpy f64 - f64 reference|; for the hybrids a line
with the float64 chunked-vs-recurrent delta rule figures. Then every file with
its size and sha256 prefix.

GGUF: tensor names and hyperparameter keys as llama.cpp's convert_hf_to_gguf
writes them for arch "qwen3moe". Experts are stacked exactly as that converter
does (torch.stack over the expert index): numpy [n_expert, n_ff, n_embd] for
ffn_gate_exps / ffn_up_exps and [n_expert, n_embd, n_ff] for ffn_down_exps,
i.e. GGML ne = {n_embd, n_ff, n_expert}. Q and K are NOT permuted: llama.cpp
permutes q/k only for llama-style (interleaved) rope; qwen3moe uses NEOX rope
(rotate_half, as transformers), so the HF row order is kept, as the converter
does for Qwen2/Qwen3 MoE. The dense layer of qwen3_moe_tiny (mlp_only_layers)
is written as blk.N.ffn_gate / ffn_up / ffn_down (llama.cpp's dense FFN names);
stock llama.cpp's qwen3moe graph expects every layer to be MoE, so this file
is for kvasir's reader, not for llama.cpp itself. No tokenizer metadata.

Usage:  python3 scripts/make_fixtures.py [--out DIR] [--only NAME...] [--llama-cpp DIR [--gguf-only]]

--gguf-only (with --llama-cpp): the fixture folders are NOT rebuilt; only the GGUFs llama.cpp's converter makes
of the folders on disk are written, with their references. For a folder built on another CPU whose float32
references a rebuild here would change (~1e-6 .. 7e-5 for the hybrids) or refuse (qwen3_5_moe_tiny's float32
cached-vs-uncached greedy check), e.g. --llama-cpp DIR --gguf-only --only qwen3_next_tiny qwen3_5_moe_tiny.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import importlib.util
import inspect
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from importlib import metadata
from pathlib import Path

# ---------------------------------------------------------------------------
# Pinned versions (scripts/requirements-fixtures.txt). Checked before import.
# ---------------------------------------------------------------------------
PINNED = {
    "numpy": "2.4.6",
    "safetensors": "0.8.0",
    "gguf": "0.19.0",
    "torch": "2.15.0",
    "transformers": "5.24.0",
}


def _check_versions() -> None:
    bad = []
    for pkg, want in PINNED.items():
        try:
            have = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            have = "not installed"
        if have.split("+")[0] != want:
            bad.append(f"{pkg} {have} (want {want})")
    if bad:
        sys.exit("make_fixtures.py: version mismatch: " + ", ".join(bad) +
                 " -- pip install -r scripts/requirements-fixtures.txt")
    # transformers switches the Gated DeltaNet and its causal conv1d to these packages' kernels when
    # they are installed (use_kernel_func_from_hub_with_fallback); the float32 reference data is the
    # output of its torch fallbacks (torch_chunk_gated_delta_rule, causal_conv1d_fn, ...).
    extra = [pkg for pkg in ("fla", "causal_conv1d", "kernels") if importlib.util.find_spec(pkg) is not None]
    if extra:
        sys.exit("make_fixtures.py: uninstall " + ", ".join(extra) + " (the references are transformers' "
                 "torch code paths)")


_check_versions()

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.numpy import load_file as np_load_file  # noqa: E402
from safetensors.numpy import save_file as np_save_file  # noqa: E402
from safetensors.torch import load_file as st_load_file  # noqa: E402
from transformers import (  # noqa: E402
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)
from transformers import Mxfp4Config  # noqa: E402
from transformers.integrations.mxfp4 import convert_moe_packed_tensors  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3  # noqa: E402
from transformers.models.glm4_moe import modeling_glm4_moe  # noqa: E402
from transformers.models.gpt_oss import modeling_gpt_oss  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402
from transformers.models.mistral import modeling_mistral  # noqa: E402
from transformers.models.mixtral import modeling_mixtral  # noqa: E402
from transformers.models.olmoe import modeling_olmoe  # noqa: E402
from transformers.models.qwen2 import modeling_qwen2  # noqa: E402
from transformers.models.qwen2_moe import modeling_qwen2_moe  # noqa: E402
from transformers.models.qwen3_5 import modeling_qwen3_5  # noqa: E402
from transformers.models.qwen3 import modeling_qwen3  # noqa: E402
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe  # noqa: E402
from transformers.models.qwen3_moe import modeling_qwen3_moe  # noqa: E402
from transformers.models.qwen3_next import modeling_qwen3_next  # noqa: E402

assert torch.__version__.split("+")[0] == PINNED["torch"]

REPO = Path(__file__).resolve().parent.parent

PROMPT_LEN = 24
GREEDY_STEPS = 16
TOKEN_SEED = 20240917
STREAM_LEN = 384
BORDER_THRESHOLD = 1e-3  # router prob gap below which a token counts as "border"
ROUTER_STD = 0.2
EMBED_STD = 0.5
LM_HEAD_STD = 0.4
NORM_WEIGHT_STD = 0.2
BIAS_STD = 0.2
A_LOG_MEAN, A_LOG_STD = -1.0, 0.5  # Gated DeltaNet: exp(A_log) ~ 0.2..0.7, so the state decays over a few tokens
CORRECTION_BIAS_STD = 0.1  # DeepSeek-V3 / GLM-4.5 sigmoid routers: e_score_correction_bias (a buffer, zero at init)

# Every fixture. "config" goes verbatim into the transformers config class; the
# C++ test (tests/model/test_config.cpp) hand-checks the same values (the hybrids'
# C++ tests come with their forward pass).
FIXTURES = [
    dict(
        name="qwen3_moe_tiny",
        arch="qwen3_moe",
        seed=1001,
        config=dict(
            vocab_size=384, hidden_size=96, intermediate_size=192, moe_intermediate_size=64,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[2],
            rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            max_position_embeddings=1024, tie_word_embeddings=False, attention_bias=False,
        ),
        # (layer, wanted gap between the k-th and (k+1)-th router probability)
        plant=[(0, 5e-4), (1, 1e-4), (3, 2e-5)],
        bf16_variant=True,
        gguf=True,
        notes="q/k norm: RMSNorm over head_dim applied per head to q and k before rope (q_norm, k_norm). "
              "head_dim 32 is explicit and differs from hidden/heads = 24. mlp_only_layers [2]: layer 2 is a "
              "dense SwiGLU MLP (intermediate_size 192), layers 0, 1, 3 are MoE (moe_intermediate_size 64). "
              "norm_topk_prob true: combine weights are the top-2 softmax probs renormalised to sum 1. "
              "No attention biases (attention_bias false). Untied lm_head.",
    ),
    dict(
        name="mixtral_tiny",
        arch="mixtral",
        seed=1002,
        config=dict(
            vocab_size=320, hidden_size=64, intermediate_size=96,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            num_local_experts=6, num_experts_per_tok=2,
            rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
            max_position_embeddings=1024, tie_word_embeddings=False, sliding_window=None,
        ),
        plant=[(1, 3e-4)],
        notes="No q/k norm, no biases. head_dim is null in config.json: hidden/heads = 16. Every layer is MoE "
              "(block_sparse_moe, experts w1 = gate, w3 = up, w2 = down, size intermediate_size 96). The router "
              "always renormalises the top-2 probs to sum 1 (MixtralTopKRouter has no norm_topk_prob switch). "
              "rope_theta 5e5 (not the class default 1e6).",
    ),
    dict(
        name="qwen2_moe_tiny",
        arch="qwen2_moe",
        seed=1003,
        config=dict(
            vocab_size=352, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
            shared_expert_intermediate_size=96,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            num_experts=8, num_experts_per_tok=4, norm_topk_prob=False,
            decoder_sparse_step=2, mlp_only_layers=[], qkv_bias=True,
            rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            max_position_embeddings=1024, tie_word_embeddings=True, use_sliding_window=False,
        ),
        plant=[],
        notes="ATTENTION BIAS: q_proj, k_proj and v_proj have biases (config key qkv_bias: true; o_proj has none). "
              "Shared expert: every MoE layer adds sigmoid(x . shared_expert_gate^T) * SwiGLU_shared(x) "
              "(shared_expert_intermediate_size 96) to the routed experts' output. norm_topk_prob false: the "
              "combine weights are the raw top-4 softmax probabilities (they do not sum to 1). "
              "decoder_sparse_step 2: layers 1 and 3 are MoE ((l+1) % 2 == 0), layers 0 and 2 dense "
              "(intermediate_size 128). tie_word_embeddings true: model.safetensors has no lm_head.weight, "
              "lm_head is model.embed_tokens.weight.",
    ),
    # --- hybrid architectures: Gated DeltaNet (linear attention) and gated full attention in one stack ---
    dict(
        name="qwen3_5_moe_tiny",
        arch="qwen3_5_moe",
        seed=1004,
        config=dict(
            text_config=dict(
                vocab_size=320, hidden_size=64, num_hidden_layers=4, full_attention_interval=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, attention_bias=False,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                linear_value_head_dim=16, linear_conv_kernel_dim=4,
                num_experts=16, num_experts_per_tok=4, moe_intermediate_size=16, shared_expert_intermediate_size=32,
                rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True},
                max_position_embeddings=1024, tie_word_embeddings=False,
            ),
            # the smallest vision tower the class builds with one block; nothing here runs it
            vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=1, patch_size=2,
                               temporal_patch_size=1, spatial_merge_size=1, out_hidden_size=64,
                               num_position_embeddings=4),
            tie_word_embeddings=False,
        ),
        plant=[],  # 16 experts top-4: border tokens occur naturally (REFERENCE.md lists them)
        llama_cpp_gguf=[""],
        # save_pretrained(save_original_format=False): experts as transformers holds them, fused 3D
        # tensors (the official Qwen3.5-MoE checkpoints' layout); the default would write experts.N.*
        fused_experts=True,
        notes="Multimodal wrapper layout of the released Qwen3.5-MoE checkpoints: config.json has the text model "
              "under `text_config` (model_type qwen3_5_moe_text) and a tiny `vision_config`; the text weights are "
              "`model.language_model.*`, the vision tower `model.visual.*` (never run here), `lm_head.weight` at "
              "top level (untied). Experts FUSED as in the official checkpoints: `mlp.experts.gate_up_proj` "
              "[E, 2*I, H] (rows [0, I) = gate, [I, 2I) = up) and `mlp.experts.down_proj` [E, H, I], no `.weight` "
              "suffix. layer_types (full_attention_interval 2): linear_attention at 0, 2, full_attention at 1, 3. "
              "Every layer is MoE: softmax router over 16 experts, top-4, ALWAYS renormalised (Qwen3_5MoeTopKRouter "
              "has no norm_topk_prob switch), plus a shared expert (intermediate 32) scaled by "
              "sigmoid(x . shared_expert_gate^T). RMSNorm weights are zero-centred: y = x/rms(x) * (1 + w) for "
              "input/post-attention/final norms and q_norm/k_norm; the Gated DeltaNet's gated norm is NOT: "
              "y = w * x/rms(x) * silu(z). Rope: partial_rotary_factor 0.25 (the first 8 of head_dim 32, NEOX "
              "rotate_half within those 8), rope_theta 1e7, interleaved M-RoPE (mrope_section [2, 1, 1]) whose "
              "three position streams are equal for text, i.e. plain rope on those 8 dims.",
    ),
    dict(
        name="qwen3_next_tiny",
        arch="qwen3_next",
        seed=1005,
        config=dict(
            vocab_size=352, hidden_size=64, intermediate_size=96, num_hidden_layers=4, full_attention_interval=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, attention_bias=False,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            num_experts=16, num_experts_per_tok=4, norm_topk_prob=True, moe_intermediate_size=16,
            shared_expert_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[],
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
            max_position_embeddings=1024, tie_word_embeddings=False,
        ),
        plant=[(2, 3e-5)],
        llama_cpp_gguf=[""],
        notes="Text-only layout (`model.*`, Qwen3NextForCausalLM), experts one tensor per expert "
              "(`mlp.experts.N.{gate,up,down}_proj.weight`, what save_pretrained writes and the released "
              "Qwen3-Next checkpoints use). layer_types (full_attention_interval 4): linear_attention at 0, 1, 2, "
              "full_attention at 3. Every layer MoE (mlp_only_layers [], as the released model; llama.cpp's "
              "qwen3next graph requires a router in every layer): 16 experts, top-4, norm_topk_prob true, shared "
              "expert (intermediate 32) scaled by sigmoid(x . shared_expert_gate^T); intermediate_size 96 is "
              "unused. The Gated DeltaNet input projections are FUSED and grouped per "
              "key head: `in_proj_qkvz` [2*Dk + 2*Dv, H] is, for each of the 2 key heads, [q (16) | k (16) | v (2 "
              "value heads x 16) | z (2 x 16)]; `in_proj_ba` [2*Hv, H] is, per key head, [b (2) | a (2)] "
              "(Qwen3NextGatedDeltaNet.fix_query_key_value_ordering). Zero-centred RMSNorm (1 + w) and partial "
              "rope (0.25, theta 1e7) as in qwen3_5_moe_tiny; no M-RoPE.",
    ),
    dict(
        name="qwen3_5_tiny",
        arch="qwen3_5",
        seed=1006,
        config=dict(
            text_config=dict(
                vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=4, full_attention_interval=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, attention_bias=False,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                linear_value_head_dim=16, linear_conv_kernel_dim=4,
                rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True},
                max_position_embeddings=1024, tie_word_embeddings=True,
            ),
            vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=1, patch_size=2,
                               temporal_patch_size=1, spatial_merge_size=1, out_hidden_size=64,
                               num_position_embeddings=4),
            tie_word_embeddings=True,
        ),
        plant=[],
        notes="Dense hybrid, multimodal wrapper layout (Qwen3_5ForConditionalGeneration; text under "
              "`text_config`, weights `model.language_model.*`, vision tower `model.visual.*` never run). "
              "tie_word_embeddings true: no lm_head.weight, lm_head is model.language_model.embed_tokens.weight. "
              "layer_types (full_attention_interval 4): linear_attention at 0, 1, 2, full_attention at 3. Every "
              "layer has a dense SwiGLU MLP (intermediate_size 128); no MoE. Gated DeltaNet projections, norms "
              "and rope as in qwen3_5_moe_tiny.",
    ),
    dict(
        name="olmoe_tiny",
        arch="olmoe",
        seed=1005,
        config=dict(
            vocab_size=320, hidden_size=64, intermediate_size=48,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            num_experts=16, num_experts_per_tok=4, norm_topk_prob=False,
            rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            max_position_embeddings=1024, tie_word_embeddings=False, attention_bias=False, clip_qkv=None,
            eos_token_id=2,
        ),
        plant=[(1, 2e-4)],
        notes="OLMoE: q/k RMSNorm over the WHOLE projection before the split into heads (q_norm weight "
              "[hidden_size] = [nh*head_dim] = [64], k_norm [(hidden/heads)*kv] = [32]), not per head. Every layer "
              "MoE: softmax over all 16 experts, top-4, NOT renormalised (norm_topk_prob false: the combine weights "
              "are the raw top-4 softmax probabilities, summing to < 1). Experts 48 wide (intermediate_size is the "
              "expert width), no shared expert. No biases, clip_qkv null, untied lm_head, head_dim 16 = hidden/heads.",
    ),
    dict(
        name="gpt_oss_tiny",
        arch="gpt_oss",
        seed=1006,
        config=dict(
            vocab_size=320, hidden_size=64, intermediate_size=64, head_dim=16,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            num_local_experts=8, num_experts_per_tok=2, sliding_window=8,
            rms_norm_eps=1e-5, swiglu_limit=1.0,
            rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
            max_position_embeddings=131072, tie_word_embeddings=False, attention_bias=True,
            pad_token_id=0, eos_token_id=1,
        ),
        plant=[],
        mxfp4_variant=True,
        llama_cpp_gguf=["", "_mxfp4"],
        notes="gpt-oss: layer_types default [sliding, full, sliding, full] (GptOssConfig: layer i slides iff i is "
              "even) with sliding_window 8 < the 24-token prompt. ATTENTION SINKS: self_attn.sinks [4], one learned "
              "logit per head appended to every softmax row and dropped after it. q/k/v/o biases. YaRN rope "
              "(factor 32, beta_fast 32, beta_slow 1, truncate false, original context 4096, theta 1.5e5; with "
              "head_dim 16 the correction range is [2.02, 4.35]: pairs 0-2 unchanged, 3-4 blended, 5-7 divided by "
              "32) and cos/sin scaled by attention_factor 0.1 ln 32 + 1. ROUTER with bias: logits = x W^T + b, top-2 "
              "of 8, softmax over the two. EXPERTS: gate_up_proj [E, H, 2I] with gate/up INTERLEAVED along 2I "
              "(gate = columns 0, 2, ..., up = 1, 3, ...), biases, the clamped SwiGLU with alpha 1.702 and "
              "swiglu_limit 1.0 (not the default 7: with these random weights the clamps then fire — counted "
              "in REFERENCE.md), (up + 1) * glu, down_proj [E, I, H] with bias. Untied lm_head.",
    ),
    # --- dense attention-only architectures (no MoE: no router, no border tokens) ---
    dict(
        name="llama_tiny",
        arch="llama",
        seed=1101,
        llama_cpp_gguf=[""],
        config=dict(
            vocab_size=320, hidden_size=64, intermediate_size=128,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            max_position_embeddings=1024, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        ),
        plant=[],
        notes="Dense: every layer a SwiGLU MLP (intermediate_size 128), no biases (attention_bias, mlp_bias false), "
              "no q/k norm, untied lm_head. head_dim not given: LlamaConfig sets it to hidden/heads = 16 (config.json "
              "has head_dim 16). ROPE llama3 (Llama 3.1 frequency scaling): inv_freq_i = theta^(-2i/16), theta 5e5, "
              "then with wavelen = 2*pi/inv_freq, low_freq_wavelen = original_max_position_embeddings / "
              "low_freq_factor = 64, high_freq_wavelen = 64 / high_freq_factor = 16: wavelen < 16 unchanged; "
              "wavelen > 64 divided by factor 8; otherwise smoothed, s = (64/wavelen - 1)/(4 - 1), "
              "inv_freq' = (1 - s) * inv_freq/8 + s * inv_freq. With these values pair 0 is unchanged, pair 1 "
              "smoothed, pairs 2..7 divided by 8 (all three branches; asserted). attention_scaling 1 (cos/sin "
              "unscaled). NEOX rotate_half rope. Full causal attention on every layer.",
    ),
    dict(
        name="qwen3_tiny",
        arch="qwen3",
        seed=1102,
        config=dict(
            vocab_size=320, hidden_size=64, intermediate_size=128,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            max_position_embeddings=1024, tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
        ),
        plant=[],
        notes="Dense: every layer a SwiGLU MLP (intermediate_size 128). q/k norm: RMSNorm over head_dim applied per "
              "head to q and k before rope (q_norm, k_norm), as in qwen3_moe_tiny. head_dim 32 is explicit and "
              "differs from hidden/heads = 16: q_proj [128, 64], k_proj/v_proj [64, 64], o_proj [64, 128]; "
              "attention scale 1/sqrt(32). No biases. tie_word_embeddings true: model.safetensors has no "
              "lm_head.weight, lm_head is model.embed_tokens.weight. use_sliding_window false: config.json has "
              "sliding_window null and layer_types all full_attention. rope default, theta 1e6.",
    ),
    dict(
        name="qwen2_tiny",
        arch="qwen2",
        seed=1103,
        config=dict(
            vocab_size=352, hidden_size=64, intermediate_size=128,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            max_position_embeddings=1024, tie_word_embeddings=False,
            use_sliding_window=True, sliding_window=8, max_window_layers=1,
        ),
        plant=[],
        notes="Dense: every layer a SwiGLU MLP (intermediate_size 128). ATTENTION BIAS: q_proj, k_proj, v_proj have "
              "biases (always in Qwen2; o_proj none). Untied lm_head. head_dim = hidden/heads = 16 (not in "
              "config.json). SLIDING WINDOW: Qwen2Config.__post_init__ (transformers 5.24) keeps sliding_window "
              "only if use_sliding_window (else sets it to null) and, as layer_types is not given, builds "
              "layer_types[i] = \"sliding_attention\" if sliding_window is not null and i >= max_window_layers else "
              "\"full_attention\": with max_window_layers 1 that is [full_attention, sliding_attention, "
              "sliding_attention], written to config.json. Qwen2Model builds create_causal_mask for the full layer "
              "and create_sliding_window_causal_mask (window config.sliding_window = 8) for layers 1 and 2: key j is "
              "visible to query i iff i - 8 < j <= i (masking_utils sliding_window_overlay kv_idx > q_idx - "
              "sliding_window, and causal kv_idx <= q_idx), i.e. the 8 most recent positions including the query's "
              "own. The prompt is 24 tokens, so from position 8 on the window cuts. Readers must take layer_types "
              "from config.json (max_window_layers counts from the bottom: layers >= max_window_layers slide). "
              "rope default, theta 1e6.",
    ),
    dict(
        name="mistral_tiny",
        arch="mistral",
        seed=1104,
        config=dict(
            vocab_size=320, hidden_size=64, intermediate_size=128,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            max_position_embeddings=1024, tie_word_embeddings=False, sliding_window=8,
        ),
        plant=[],
        notes="Dense: every layer a SwiGLU MLP (intermediate_size 128), no biases, no q/k norm, untied lm_head, "
              "head_dim 16 (explicit, = hidden/heads). SLIDING WINDOW on EVERY layer: MistralConfig has no "
              "layer_types (config.json has none); MistralModel uses create_sliding_window_causal_mask for all "
              "layers whenever sliding_window is not null: key j is visible to query i iff i - 8 < j <= i (the 8 "
              "most recent positions including the query's own). The prompt is 24 tokens, so from position 8 on "
              "the window cuts. rope default, theta 1e6.",
    ),
    # --- DeepSeek-V3 family: MLA attention, sigmoid router with correction bias and expert groups ---
    dict(
        name="deepseek_v3_tiny",
        arch="deepseek_v3",
        seed=1201,
        llama_cpp_gguf=[""],
        config=dict(
            vocab_size=320, hidden_size=64, intermediate_size=128, moe_intermediate_size=16,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
            q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
            n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, norm_topk_prob=True,
            routed_scaling_factor=2.5, first_k_dense_replace=1, n_shared_experts=1,
            # not DeepseekV3Config fields: kept in config.json as the released checkpoints have them
            # (llama.cpp's converter writes expert_gating_func from scoring_func)
            scoring_func="sigmoid", topk_method="noaux_tc",
            rms_norm_eps=1e-6, rope_interleave=True,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                             "original_max_position_embeddings": 512, "beta_fast": 32.0, "beta_slow": 1.0,
                             "mscale": 0.707, "mscale_all_dim": 1.0},
            max_position_embeddings=20480, tie_word_embeddings=False, attention_bias=False, num_mtp_layers=0,
        ),
        plant=[(2, 1e-4)],
        notes="DeepSeek-V3 layout (DeepseekV3ForCausalLM, model_type deepseek_v3). MLA (multi-head latent attention) "
              "WITH q LoRA: q = q_b_proj(q_a_layernorm(q_a_proj(x))), per head [q_nope (qk_nope_head_dim 16) | q_rot "
              "(qk_rope_head_dim 8)]; kv_a_proj_with_mqa(x) = [c_kv (kv_lora_rank 32) | k_rot (8)]; c_kv -> "
              "kv_a_layernorm -> kv_b_proj, per head [k_nope (16) | v (v_head_dim 16)]; k_rot is ONE rope key shared "
              "by all 4 heads; key = [k_nope | rope(k_rot)], query = [q_nope | rope(q_rot)]: qk head dim 24, v head "
              "dim 16 (o_proj [64, 4*16]). q_a_layernorm and kv_a_layernorm are DeepseekV3RMSNorm with its default "
              "eps 1e-6, NOT config.rms_norm_eps (the same value here, 1e-6; a reader must not take rms_norm_eps for "
              "them). num_key_value_heads 4 = heads (no GQA grouping in MLA). ROPE, rope_interleave true: the 8 rope "
              "dims are pairs (x0, x1), (x2, x3), ... each rotated by one frequency (GPT-J style); transformers' "
              "apply_rotary_pos_emb_interleave returns them DE-INTERLEAVED, cat(x_even*cos - x_odd*sin, "
              "x_odd*cos + x_even*sin) -- the same dot products. YaRN over the 8 rope dims: factor 40, theta 1e4, "
              "original_max_position_embeddings 512, beta_fast 32, beta_slow 1, truncate (default) true: correction "
              "range floor(0.41) = 0 .. ceil(1.91) = 2, so pair 0 unchanged, pair 1 blended half/half "
              "(inv_freq*(0.5/40 + 0.5)), pairs 2-3 divided by 40. mscale 0.707 != mscale_all_dim 1.0: cos/sin scaled "
              "by attention_factor = yarn_get_mscale(40, 0.707)/yarn_get_mscale(40, 1.0) = 0.92104, and the softmax "
              "scale is 24^-0.5 * yarn_get_mscale(40, 1.0)^2 = 0.38250 (yarn_get_mscale(s, m) = 0.1*m*ln(s) + 1). "
              "ROUTER (DeepseekV3TopkRouter): z = x.W_g^T, s = sigmoid(z); selection on s + e_score_correction_bias "
              "(a NONZERO buffer, N(0, 0.1^2), saved as mlp.gate.e_score_correction_bias); 4 groups of 2 experts, "
              "group score = sum of the group's two largest s + b, the best topk_group 2 groups kept, top-2 experts "
              "among their 4; combine weights = s (WITHOUT bias) of the chosen / (sum + 1e-20) (norm_topk_prob) * "
              "routed_scaling_factor 2.5. first_k_dense_replace 1: layer 0 a dense SwiGLU (intermediate_size 128), "
              "layers 1-3 MoE: 8 routed experts 16 wide (one tensor per expert) + 1 shared expert (mlp.shared_experts, "
              "moe_intermediate_size * n_shared_experts = 16 wide) added WITHOUT a gate. config.json also carries "
              "scoring_func sigmoid and topk_method noaux_tc (not DeepseekV3Config fields; the released checkpoints "
              "have them and llama.cpp's converter writes expert_gating_func from scoring_func) and "
              "num_nextn_predict_layers 0 (no MTP layer). Untied lm_head, no attention biases, rms_norm_eps 1e-6.",
    ),
    dict(
        name="kimi_k2_tiny",
        arch="deepseek_v3",
        seed=1202,
        config=dict(
            vocab_size=352, hidden_size=64, intermediate_size=64, moe_intermediate_size=16,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
            q_lora_rank=None, kv_lora_rank=48, qk_nope_head_dim=24, qk_rope_head_dim=8, v_head_dim=16,
            n_routed_experts=16, num_experts_per_tok=4, n_group=1, topk_group=1, norm_topk_prob=True,
            routed_scaling_factor=2.827, first_k_dense_replace=1, n_shared_experts=1,
            scoring_func="sigmoid", topk_method="noaux_tc",
            rms_norm_eps=1e-6, rope_interleave=True,
            rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 32.0,
                             "original_max_position_embeddings": 256, "beta_fast": 1.0, "beta_slow": 1.0,
                             "mscale": 1.0, "mscale_all_dim": 1.0},
            max_position_embeddings=8192, tie_word_embeddings=False, attention_bias=False, num_mtp_layers=0,
        ),
        plant=[(1, 1e-4)],
        notes="Kimi-K2 style on the same class (DeepseekV3ForCausalLM, model_type deepseek_v3). q_lora_rank null: a "
              "plain self_attn.q_proj [4*(24 + 8), 64] (no q_a_proj / q_a_layernorm / q_b_proj). MLA with "
              "kv_lora_rank 48, qk_nope_head_dim 24, qk_rope_head_dim 8 (qk head dim 32), v_head_dim 16 != "
              "qk_nope_head_dim: kv_b_proj [4*(24 + 16), 48], per head [k_nope (24) | v (16)]; kv_a_layernorm eps "
              "1e-6 (its default, = rms_norm_eps here). ROUTER: 16 experts, top-4, n_group 1 / topk_group 1 (the "
              "group mask keeps every expert), sigmoid scores, selection on s + e_score_correction_bias (nonzero), "
              "weights s of the chosen (no bias) / (sum + 1e-20) * routed_scaling_factor 2.827. ROPE interleaved as "
              "in deepseek_v3_tiny; YaRN factor 32, theta 5e4, original_max_position_embeddings 256, beta_fast = "
              "beta_slow = 1, so the correction range is a single step, floor(1.37) = 1 .. ceil(1.37) = 2: pairs 0-1 "
              "unchanged, pairs 2-3 divided by 32; mscale = mscale_all_dim = 1: cos/sin factor 1 (their ratio), "
              "softmax scale 32^-0.5 * (1 + 0.1 ln 32)^2 = 0.32054. first_k_dense_replace 1: layer 0 dense SwiGLU "
              "(intermediate_size 64), layers 1-2 MoE (16 experts 16 wide + 1 shared expert 16 wide, no gate). "
              "scoring_func / topk_method / num_nextn_predict_layers 0 in config.json as in deepseek_v3_tiny. "
              "Untied lm_head, no attention biases.",
    ),
    dict(
        name="glm4_moe_tiny",
        arch="glm4_moe",
        seed=1203,
        config=dict(
            vocab_size=320, hidden_size=64, intermediate_size=128, moe_intermediate_size=16,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            attention_bias=True, use_qk_norm=True,
            n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, norm_topk_prob=True,
            routed_scaling_factor=2.5, first_k_dense_replace=1, n_shared_experts=1,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5},
            max_position_embeddings=1024, tie_word_embeddings=False, num_mtp_layers=0,
        ),
        plant=[(2, 1e-4)],
        notes="GLM-4.5 layout (Glm4MoeForCausalLM, model_type glm4_moe). Attention: GQA, 4 heads / 2 kv heads, "
              "head_dim 32 explicit (!= hidden/heads = 16): q_proj [128, 64], k_proj / v_proj [64, 64], o_proj "
              "[64, 128]. ATTENTION BIAS on q_proj, k_proj, v_proj (attention_bias true), none on o_proj. "
              "use_qk_norm true: q_norm / k_norm, RMSNorm over head_dim per head (eps rms_norm_eps 1e-5), BEFORE "
              "rope. partial_rotary_factor 0.5 (in rope_parameters): rope on the first 16 of the 32 dims of each "
              "head, NEOX rotate_half within those 16 (not interleaved), dims 16..31 pass unrotated; rope default, "
              "theta 1e6; attention scale 32^-0.5. ROUTER: Glm4MoeTopkRouter, the same code as DeepSeek-V3's: "
              "sigmoid scores, selection on s + e_score_correction_bias (nonzero), n_group 2 (two groups of 4 "
              "experts) / topk_group 1 (the released GLM-4.5 uses 1 / 1; 2 / 1 here so that the grouped path runs), "
              "top-2 of the kept group's 4, weights s of the chosen (no bias) / (sum + 1e-20) (norm_topk_prob) * "
              "routed_scaling_factor 2.5. first_k_dense_replace 1: layer 0 dense SwiGLU (intermediate_size 128), "
              "layers 1-2 MoE: 8 experts 16 wide + 1 shared expert (mlp.shared_experts, 16 wide, added without a "
              "gate). num_nextn_predict_layers 0 (no MTP layer). Untied lm_head, rms_norm_eps 1e-5.",
    ),
]

ARCH = {
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, modeling_qwen3_moe),
    "mixtral": (MixtralConfig, MixtralForCausalLM, modeling_mixtral),
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM, modeling_qwen2_moe),
    "qwen3_5_moe": (Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration, modeling_qwen3_5_moe),
    "qwen3_next": (Qwen3NextConfig, Qwen3NextForCausalLM, modeling_qwen3_next),
    "qwen3_5": (Qwen3_5Config, Qwen3_5ForConditionalGeneration, modeling_qwen3_5),
    "olmoe": (OlmoeConfig, OlmoeForCausalLM, modeling_olmoe),
    "gpt_oss": (GptOssConfig, GptOssForCausalLM, modeling_gpt_oss),
    "llama": (LlamaConfig, LlamaForCausalLM, modeling_llama),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, modeling_qwen3),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, modeling_qwen2),
    "mistral": (MistralConfig, MistralForCausalLM, modeling_mistral),
    "deepseek_v3": (DeepseekV3Config, DeepseekV3ForCausalLM, modeling_deepseek_v3),
    "glm4_moe": (Glm4MoeConfig, Glm4MoeForCausalLM, modeling_glm4_moe),
}
# RMSNorms of the (1 + w) convention: weight stored zero-centred, y = x / rms(x) * (1 + w) (see their forward).
ZERO_CENTRED_NORMS = (modeling_qwen3_5_moe.Qwen3_5MoeRMSNorm, modeling_qwen3_5.Qwen3_5RMSNorm,
                      modeling_qwen3_next.Qwen3NextRMSNorm)
IMPL = dict(attn_implementation="eager", experts_implementation="eager")
# DeepSeek-V3-style routers (DeepSeek-V3, Kimi-K2, GLM-4.5): sigmoid scores, e_score_correction_bias for the
# selection only, expert groups (n_group / topk_group), top-k renormalised and scaled by routed_scaling_factor.
SIGMOID_ROUTERS = (modeling_deepseek_v3.DeepseekV3TopkRouter, modeling_glm4_moe.Glm4MoeTopkRouter)
SIGMOID_ROUTED = ("deepseek_v3", "glm4_moe")  # their model_type


def setup_torch() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)


# ---------------------------------------------------------------------------
# Model structure helpers (transformers 5.24 module layout)
# ---------------------------------------------------------------------------
def text_model(model):
    """The decoder stack (embed_tokens, layers, norm): model.model, or model.model.language_model
    in the multimodal wrappers (Qwen3_5*ForConditionalGeneration)."""
    return getattr(model.model, "language_model", model.model)


def text_config(cfg: dict) -> dict:
    """config.json of a causal LM, or its text_config in a multimodal wrapper."""
    return cfg.get("text_config", cfg)


def attention_windows(cfg: dict) -> list[int | None]:
    """Per layer: the sliding window of its attention (keys i - w < j <= i visible), None for full causal
    attention (and for linear-attention layers). From config.json as transformers 5.24 reads it: with
    layer_types (Qwen2/Qwen3 and the hybrids) a layer slides iff its type is "sliding_attention", with the
    window sliding_window; without layer_types (Mistral, Mixtral, Qwen3-MoE) every layer slides iff
    sliding_window is not null (their models pick create_sliding_window_causal_mask for all layers then)."""
    cfg = text_config(cfg)
    L, sw = cfg["num_hidden_layers"], cfg.get("sliding_window")
    if cfg.get("layer_types") is not None:
        assert len(cfg["layer_types"]) == L
        return [int(sw) if t == "sliding_attention" else None for t in cfg["layer_types"]]
    return [None if sw is None else int(sw)] * L


def moe_block(layer):
    """The sparse MoE block of a decoder layer, or None for a dense layer."""
    mlp = layer.mlp
    return mlp if hasattr(mlp, "experts") else None


def router_of(blk):
    """The router module of a MoE block: mlp.gate, or mlp.router (gpt-oss)."""
    return blk.router if hasattr(blk, "router") else blk.gate


def moe_layer_ids(model) -> list[int]:
    return [i for i, layer in enumerate(text_model(model).layers) if moe_block(layer) is not None]


def token_mixer(layer):
    """Gated DeltaNet (linear_attn) or attention (self_attn) of a decoder layer."""
    return layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn


def linear_attention_layer_ids(model) -> list[int]:
    return [i for i, layer in enumerate(text_model(model).layers) if hasattr(layer, "linear_attn")]


def router_renormalises(router) -> bool:
    # Mixtral's and Qwen3.5-MoE's routers divide by the top-k sum unconditionally
    # (MixtralTopKRouter, Qwen3_5MoeTopKRouter have no norm_topk_prob switch).
    if isinstance(router, (modeling_mixtral.MixtralTopKRouter, modeling_qwen3_5_moe.Qwen3_5MoeTopKRouter)):
        return True
    if isinstance(router, modeling_gpt_oss.GptOssTopKRouter):  # softmax over the top-k logits: sums to 1
        return True
    return bool(router.norm_topk_prob)


# ---------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------
def init_weights(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    zero_centred = {n + ".weight" for n, m in model.named_modules() if isinstance(m, ZERO_CENTRED_NORMS)}
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name in zero_centred:  # (1 + w) RMSNorm: the same effective scale 1 + N(0, 0.2^2)
                p.copy_(NORM_WEIGHT_STD * z)
            elif name.endswith("linear_attn.A_log"):  # Gated DeltaNet decay: g = -exp(A_log) * softplus(a + dt_bias)
                p.copy_(A_LOG_MEAN + A_LOG_STD * z)
            elif name.endswith("linear_attn.dt_bias"):
                p.copy_(BIAS_STD * z)
            elif name.endswith("norm.weight"):  # input/post-attention/final/q/k RMSNorm weights, gated RMSNorm
                p.copy_(1.0 + NORM_WEIGHT_STD * z)
            elif name.endswith(".bias") or name.endswith("_proj_bias"):  # (gpt-oss experts: gate_up_proj_bias)
                p.copy_(BIAS_STD * z)
            elif name.endswith("self_attn.sinks"):  # gpt-oss: one sink logit per head, O(1) like a score
                p.copy_(z)
            elif name.endswith("mlp.experts.gate_up_proj") and p.dim() == 3 and model.config.model_type == "gpt_oss":
                p.copy_(z / np.sqrt(p.shape[1]))  # [E, H, 2I], x @ W: variance preserving over H
            elif name.endswith("mlp.experts.down_proj") and p.dim() == 3 and model.config.model_type == "gpt_oss":
                p.copy_(z / np.sqrt(p.shape[1]))  # [E, I, H], over I
            elif name.endswith("embed_tokens.weight"):
                p.copy_(EMBED_STD * z)
            elif name == "lm_head.weight":
                p.copy_(LM_HEAD_STD * z)
            elif (name.endswith("mlp.gate.weight") or name.endswith("shared_expert_gate.weight")
                  or name.endswith("mlp.router.weight")):
                p.copy_(ROUTER_STD * z)  # router [E, H] / shared-expert sigmoid gate [1, H]
            else:  # every other matrix: [.., out, in] -> variance preserving
                p.copy_(z / np.sqrt(p.shape[-1]))
        for name, b in model.named_buffers():  # sigmoid routers: a NONZERO correction bias (zero would hide bugs)
            if name.endswith("mlp.gate.e_score_correction_bias"):
                b.copy_(CORRECTION_BIAS_STD * torch.randn(b.shape, generator=gen, dtype=torch.float32))
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == text_model(model).embed_tokens.weight.data_ptr()


# ---------------------------------------------------------------------------
# A float64 forward: the places where transformers computes in float32 even after
# model.double(), replaced by float64 versions of the same formula. Four in the
# attention-only MoE models (RMSNorm, rotary cos/sin, router softmax, eager
# attention softmax); in the hybrids also the (1 + w) RMSNorm, the gated RMSNorm,
# the Gated DeltaNet's decay g (it rounds a and exp(A_log) to float32) and the
# gated delta rule itself (both of transformers' torch forms cast q, k, v, g,
# beta to float32 and L2-normalise q, k there).
# ---------------------------------------------------------------------------
def _rmsnorm_f64(self, hidden_states):
    if hidden_states.dtype != torch.float64:
        raise RuntimeError("pure_float64 used on a non-float64 model")
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _rmsnorm_zero_centred_f64(self, x):
    if x.dtype != torch.float64:
        raise RuntimeError("pure_float64 used on a non-float64 model")
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)) * (1.0 + self.weight)


def _rmsnorm_gated_f64(self, hidden_states, gate):
    if hidden_states.dtype != torch.float64:
        raise RuntimeError("pure_float64 used on a non-float64 model")
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon)) * F.silu(gate)


def llama3_inv_freq_f64(inv_freq: torch.Tensor, rp: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers 5.24 modeling_rope_utils._compute_llama3_parameters on a float64 inv_freq: the same
    operations in the same order and the same branch structure (transformers runs them in float32).
    Returns the scaled inv_freq and per frequency its branch: 0 = unchanged (wavelen < high_freq_wavelen),
    1 = smoothed, 2 = divided by factor (wavelen > low_freq_wavelen)."""
    assert inv_freq.dtype == torch.float64
    factor = rp["factor"]
    low_freq_factor = rp["low_freq_factor"]
    high_freq_factor = rp["high_freq_factor"]
    old_context_len = rp["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    inv_freq_llama = torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
    branch = torch.where(wavelen < high_freq_wavelen, 0, torch.where(wavelen > low_freq_wavelen, 2, 1))
    assert inv_freq_llama.dtype == torch.float64
    return inv_freq_llama, branch


def rope_inv_freq_f64(cfg) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float64 inv_freq of a (text) config object for rope_type default or llama3 (+ llama3 branches)."""
    rp = cfg.rope_parameters
    assert rp["rope_type"] in ("default", "llama3", "yarn"), rp["rope_type"]
    base = float(rp["rope_theta"])
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dim = int(head_dim * rp.get("partial_rotary_factor", 1.0))  # partial rotary: first dim dims
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if rp["rope_type"] == "llama3":
        return llama3_inv_freq_f64(inv_freq, rp)
    if rp["rope_type"] == "yarn":
        return yarn_inv_freq_f64(rp, base, dim), None
    return inv_freq, None


def yarn_inv_freq_f64(rp: dict, base: float, dim: int) -> torch.Tensor:
    """transformers 5.24 _compute_yarn_parameters' inv_freq with every step in float64 (transformers builds
    pos_freqs and the ramp in float32); the same operations in the same order."""
    factor, orig = rp["factor"], rp["original_max_position_embeddings"]
    beta_fast, beta_slow = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1

    def correction_dim(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rp.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    extrapolation_factor = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation_factor) + (1.0 / pos_freqs) * extrapolation_factor


def _rotary_f64(self, x, position_ids):
    if x.dtype != torch.float64:
        raise RuntimeError("pure_float64 used on a non-float64 model")
    # default and llama3: cos/sin unscaled; yarn: attention_factor (a Python float: already float64)
    assert self.attention_scaling == 1.0 or self.config.rope_parameters["rope_type"] == "yarn"
    inv_freq, _ = rope_inv_freq_f64(self.config)
    if hasattr(self, "recomposition_frequencies"):
        # Qwen3.5 text M-RoPE: (3, batch, T) position streams, frequencies interleaved by
        # the module's own recomposition (it returns cat(freqs, freqs)).
        freqs = position_ids.expand(3, -1, -1)[..., None].to(torch.float64) * inv_freq
        emb = self.recomposition_frequencies(freqs)
    elif isinstance(self, modeling_gpt_oss.GptOssRotaryEmbedding):
        emb = position_ids[..., None].to(torch.float64) * inv_freq  # half width: its _apply_rotary_emb chunks halves
    else:
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


def _router_f64(self, hidden_states):
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    router_probs = torch.softmax(router_logits, dim=-1)
    top_value, top_index = torch.topk(router_probs, self.top_k, dim=-1)
    if router_renormalises(self):
        top_value = top_value / top_value.sum(dim=-1, keepdim=True)
    return router_logits, top_value, top_index


def _eager_attention_f64(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    if query.dtype != torch.float64 or key.dtype != torch.float64 or value.dtype != torch.float64:
        raise RuntimeError("pure_float64 used on a non-float64 model")
    # transformers' own mask (full causal or sliding window), built in the model's dtype: must be float64 here
    assert attention_mask is None or attention_mask.dtype == torch.float64, attention_mask.dtype
    mod = sys.modules[type(module).__module__]
    key_states = mod.repeat_kv(key, module.num_key_value_groups)
    value_states = mod.repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    sinks = getattr(module, "sinks", None)
    if sinks is not None:  # gpt-oss: the head's sink logit as one more column, dropped after the softmax
        assert sinks.dtype == torch.float64
        col = sinks.reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[-2], -1)
        attn_weights = torch.softmax(torch.cat([attn_weights, col], dim=-1), dim=-1)[..., :-1]
    else:
        attn_weights = torch.softmax(attn_weights, dim=-1)
    attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
    return attn_output, attn_weights


class _TorchFloat32IsFloat64:
    """The `torch` module as a copied function sees it: everything is torch, except that
    torch.float32 (and its alias torch.float) is torch.float64."""
    float32 = torch.float64
    float = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def float64_copy(fn):
    """transformers' own function (unwrapped from its kernel-hub decorator) with its explicit
    float32 casts made float64 casts. Refused if the source holds any other float32 route."""
    fn = inspect.unwrap(fn)
    src = inspect.getsource(fn)
    assert set(re.findall(r"torch\.float\w*", src)) <= {"torch.float32"}, fn.__name__
    assert not re.search(r"\.(float|half|bfloat16)\(|dtype=torch\.float\b", src), fn.__name__
    g = dict(fn.__globals__, torch=_TorchFloat32IsFloat64())
    out = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__kwdefaults__ = fn.__kwdefaults__
    return out


# The two torch forms of the gated delta rule in transformers: the token-by-token recurrence
# (its cached-decoding path) and the chunked UT-transform form (its prompt path). The float64
# reference uses the recurrent form; the chunked one is run in float64 only as a sanity figure.
DELTA_RULES = {"recurrent": "torch_recurrent_gated_delta_rule", "chunked": "torch_chunk_gated_delta_rule"}


def _gated_deltanet_f64(self, rule, hidden_states, cache=None, attention_mask=None, **kwargs):
    """Qwen3NextGatedDeltaNet / Qwen3_5(Moe)GatedDeltaNet.forward, step by step as transformers 5.24
    writes it, with g = -exp(A_log) * softplus(a + dt_bias) in float64 (transformers rounds a and
    exp(A_log) to float32) and `rule` -- a float64 copy of one of its delta-rule functions -- for
    every call (transformers: chunked over a prompt, recurrent for one cached token)."""
    mod = sys.modules[type(self).__module__]
    if hidden_states.dtype != torch.float64:
        raise RuntimeError("pure_float64 used on a non-float64 model")
    hidden_states = mod.apply_mask_to_padding_states(hidden_states, attention_mask)
    batch_size, seq_len, _ = hidden_states.shape
    if cache is not None:
        conv_state = cache.get_conv_state(self.layer_idx, state_idx=0)
        recurrent_state = cache.get_recurrent_state(self.layer_idx, state_idx=0)
    else:
        conv_state, recurrent_state = None, None

    if hasattr(self, "in_proj_qkvz"):  # Qwen3-Next: fused projections grouped per key head
        q, k, v, z, b, a = self.fix_query_key_value_ordering(self.in_proj_qkvz(hidden_states),
                                                            self.in_proj_ba(hidden_states))
        mixed_qkv = torch.cat([x.reshape(batch_size, seq_len, -1) for x in (q, k, v)], dim=-1)
    else:  # Qwen3.5: one projection each
        mixed_qkv = self.in_proj_qkv(hidden_states)
        z = self.in_proj_z(hidden_states).reshape(batch_size, seq_len, -1, self.head_v_dim)
        b = self.in_proj_b(hidden_states)
        a = self.in_proj_a(hidden_states)
    mixed_qkv = mixed_qkv.transpose(1, 2)
    # causal depthwise conv1d + SiLU: transformers' own torch functions (float64 as given)
    if conv_state is not None and seq_len == 1 and not cache.is_recording_past(self.layer_idx):
        mixed_qkv = mod.causal_conv1d_update(mixed_qkv, conv_state, self.conv1d.weight.squeeze(1),
                                             self.conv1d.bias, self.activation)
    else:
        if cache is not None:
            mixed_qkv = cache.update_conv_state(mixed_qkv, self.layer_idx, conv_kernel_size=self.conv_kernel_size)
        mixed_qkv = mod.causal_conv1d_fn(mixed_qkv, self.conv1d.weight.squeeze(1), self.conv1d.bias,
                                         activation=self.activation)
        if cache is not None:
            mixed_qkv = mixed_qkv[:, :, -seq_len:]
    mixed_qkv = mixed_qkv.transpose(1, 2)
    query, key, value = torch.split(mixed_qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    query = query.reshape(batch_size, seq_len, -1, self.head_k_dim)
    key = key.reshape(batch_size, seq_len, -1, self.head_k_dim)
    value = value.reshape(batch_size, seq_len, -1, self.head_v_dim)

    beta = b.sigmoid()
    g = -self.A_log.exp() * F.softplus(a + self.dt_bias)
    core_attn_out, last_recurrent_state = rule(query, key, value, g=g, beta=beta, initial_state=recurrent_state,
                                               output_final_state=cache is not None, use_qk_l2norm_in_kernel=True)
    assert core_attn_out.dtype == torch.float64
    if cache is not None:
        cache.update_recurrent_state(last_recurrent_state, self.layer_idx)
    core_attn_out = self.norm(core_attn_out.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(core_attn_out.reshape(batch_size, seq_len, -1))


@contextlib.contextmanager
def pure_float64(module, delta_rule: str = "recurrent"):
    saved = []

    def patch(obj, attr, new):
        saved.append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, new)

    rule = float64_copy(getattr(module, DELTA_RULES[delta_rule])) if hasattr(module, "l2norm") else None

    def deltanet_forward(self, *args, **kwargs):
        return _gated_deltanet_f64(self, rule, *args, **kwargs)

    for cname in dir(module):
        cls = getattr(module, cname)
        if not isinstance(cls, type) or cls.__module__ != module.__name__ or "Vision" in cname:
            continue  # (the vision tower of the multimodal wrappers never runs here)
        if cname.endswith("RMSNormGated"):
            patch(cls, "forward", _rmsnorm_gated_f64)
        elif cname.endswith("RMSNorm"):
            patch(cls, "forward", _rmsnorm_zero_centred_f64 if issubclass(cls, ZERO_CENTRED_NORMS) else _rmsnorm_f64)
        elif cname.endswith("RotaryEmbedding"):
            patch(cls, "forward", _rotary_f64)
        elif cname.endswith("TopKRouter") and cname != "GptOssTopKRouter":  # (gpt-oss's has no float32 step)
            patch(cls, "forward", _router_f64)
        elif cname.endswith("TopkRouter"):  # DeepSeek-V3 / GLM-4.5 sigmoid router: logits and sigmoid in float32
            patch(cls, "forward", float64_copy(cls.forward))
        elif cname.endswith("GatedDeltaNet"):
            patch(cls, "forward", deltanet_forward)
    patch(module, "eager_attention_forward", _eager_attention_f64)
    # exactly one of each: RMSNorm, rotary, eager attention (+ router in MoE models, + gated RMSNorm
    # and Gated DeltaNet in the hybrids)
    patched = sorted(obj.__name__ if isinstance(obj, type) else attr for obj, attr, _ in saved)
    want = ["RMSNorm", "RotaryEmbedding", "eager_attention_forward"]
    want += ["TopKRouter"] if any(n.endswith("TopKRouter") and n != "GptOssTopKRouter" for n in dir(module)) else []
    want += ["TopkRouter"] if any(n.endswith("TopkRouter") for n in dir(module)) else []
    want += ["RMSNormGated", "GatedDeltaNet"] if rule is not None else []
    assert len(patched) == len(want) and all(sum(n.endswith(w) for n in patched) == 1 for w in want), patched
    try:
        yield
    finally:
        for obj, attr, old in reversed(saved):
            setattr(obj, attr, old)


# ---------------------------------------------------------------------------
# Reference computation
# ---------------------------------------------------------------------------
def forward_capture(model, ids: torch.Tensor) -> dict:
    """One forward over the prompt, capturing what every layer computed.

    hidden_states[0]   = output of embed_tokens (the input of layer 0)
    hidden_states[l+1] = output of decoder layer l: the residual stream after layer l,
                         BEFORE the final norm (also for the last layer)
    final_hidden       = model.norm(hidden_states[L]); this is what transformers returns
                         as output_hidden_states[-1] (it replaces the last layer's output
                         by the normed last_hidden_state) and what lm_head multiplies.
    """
    tm = text_model(model)
    layers = tm.layers
    hybrid = bool(linear_attention_layer_ids(model))
    moe = moe_layer_ids(model)
    cap = {"layer_out": {}, "mlp_in": {}, "mlp_out": {}, "router": {}, "mixer_out": {}}
    hooks = []
    hooks.append(tm.embed_tokens.register_forward_hook(
        lambda m, a, o: cap.__setitem__("embed", o.detach().clone())))
    hooks.append(tm.norm.register_forward_hook(
        lambda m, a, o: cap.__setitem__("final", o.detach().clone())))
    for i, layer in enumerate(layers):
        hooks.append(layer.register_forward_hook(
            lambda m, a, o, i=i: cap["layer_out"].__setitem__(i, (o[0] if isinstance(o, tuple) else o).detach().clone())))
        def mlp_hook(m, a, o, i=i):  # a forward hook must return None (else it replaces the output)
            cap["mlp_in"][i] = a[0].detach().clone()
            cap["mlp_out"][i] = (o[0] if isinstance(o, tuple) else o).detach().clone()  # gpt-oss: (out, scores)

        hooks.append(layer.mlp.register_forward_hook(mlp_hook))
        if hybrid:  # Gated DeltaNet / gated attention output, before the residual add
            hooks.append(token_mixer(layer).register_forward_hook(
                lambda m, a, o, i=i: cap["mixer_out"].__setitem__(i, (o[0] if isinstance(o, tuple) else o).detach().clone())))
        blk = moe_block(layer)
        if blk is not None:
            hooks.append(router_of(blk).register_forward_hook(
                lambda m, a, o, i=i: cap["router"].__setitem__(i, tuple(t.detach().clone() for t in o))))
    try:
        with torch.no_grad():
            out = model(input_ids=ids[None], output_hidden_states=True, use_cache=False,
                        **({"output_router_logits": True} if moe else {}))
    finally:
        for h in hooks:
            h.remove()

    L = len(layers)
    T = ids.shape[0]
    res = {
        "hidden_states": torch.stack([cap["embed"][0]] + [cap["layer_out"][i][0] for i in range(L)]),
        "final_hidden": cap["final"][0],
        "logits": out.logits[0].detach().clone(),
        "mlp_in": {i: cap["mlp_in"][i][0] for i in range(L)},
        "mlp_out": {i: cap["mlp_out"][i].reshape(T, -1) for i in range(L)},
        "router": cap["router"],
        "mixer_out": {i: o[0] for i, o in cap["mixer_out"].items()},
    }
    # Cross-check the hooks against what transformers itself returns.
    hs = out.hidden_states
    assert len(hs) == L + 1
    for i in range(L):
        assert torch.equal(hs[i][0], res["hidden_states"][i]), f"hidden_states[{i}]"
    assert torch.equal(hs[L][0], res["final_hidden"]), "HF hidden_states[-1] is not the final-normed state"
    assert len(getattr(out, "router_logits", None) or ()) == len(moe)
    for j, i in enumerate(moe):
        assert torch.equal(out.router_logits[j].reshape(T, -1), res["router"][i][0]), f"router logits {i}"
    # The sigmoid routers return their top-k in torch.topk(sorted=False) order (unspecified); the references
    # hold ids and weights reordered together by descending selection score sigmoid(logit) + bias, computed as
    # the router computed it (in its own precision).
    res["router"] = dict(res["router"])
    for i in moe:
        g = router_of(moe_block(layers[i]))
        if isinstance(g, SIGMOID_ROUTERS):
            logits_, w_, ids_ = res["router"][i]
            sel = (logits_.sigmoid() + g.e_score_correction_bias).gather(1, ids_)
            o = torch.sort(sel, dim=-1, descending=True, stable=True).indices
            res["router"][i] = (logits_, w_.gather(1, o), ids_.gather(1, o))
    return res


def greedy(model, ids: torch.Tensor, steps: int):
    """Pure greedy decoding with the KV cache: argmax of the last logits, no sampling,
    no penalties, no EOS stop. Returns tokens [steps], margins (top1 - top2 of the logits
    that chose each token) [steps] and those logits [steps, V]."""
    toks, margins, logits = [], [], []
    with torch.no_grad():
        out = model(input_ids=ids[None], use_cache=True)
        for s in range(steps):
            lg = out.logits[0, -1].detach().clone()
            top = torch.topk(lg, 2)
            t = int(top.indices[0])
            toks.append(t)
            margins.append(float(top.values[0] - top.values[1]))
            logits.append(lg)
            if s + 1 < steps:
                out = model(input_ids=torch.tensor([[t]]), cache=out.cache, use_cache=True)
    return torch.tensor(toks, dtype=torch.int64), torch.tensor(margins, dtype=torch.float64), torch.stack(logits)


def check_greedy(model, ids, toks, step_logits, tol: float) -> None:
    # 1. transformers' own greedy generate must agree.
    with torch.no_grad():
        gen = model.generate(ids[None], max_new_tokens=len(toks), min_new_tokens=len(toks), do_sample=False,
                             num_beams=1, eos_token_id=None, pad_token_id=0,
                             repetition_penalty=None, temperature=None, top_k=None, top_p=None)
    assert torch.equal(gen[0, len(ids):], toks), (gen[0, len(ids):], toks)
    # 2. a full no-cache recompute over prompt + continuation gives the same argmaxes and logits.
    full = torch.cat([ids, toks[:-1]])
    with torch.no_grad():
        lg = model(input_ids=full[None], use_cache=False).logits[0, len(ids) - 1:]
    assert torch.equal(lg.argmax(-1), toks)
    d = float((lg - step_logits).abs().max())
    assert d < tol, f"cached vs uncached greedy logits differ by {d}"


@contextlib.contextmanager
def record_attention_masks(module, rec: list):
    """Wraps module.eager_attention_forward (transformers' own, or the float64 one inside pure_float64) and
    records per call: the layer, the sliding_window transformers passes to the attention interface, the query
    and key lengths and the mask the layer received."""
    inner = module.eager_attention_forward

    def recording(m, query, key, value, attention_mask, *args, **kwargs):
        rec.append(dict(layer=m.layer_idx, window=kwargs.get("sliding_window"), q_len=query.shape[2],
                        kv_len=key.shape[2], mask=None if attention_mask is None else attention_mask.detach().clone()))
        return inner(m, query, key, value, attention_mask, *args, **kwargs)

    module.eager_attention_forward = recording
    try:
        yield
    finally:
        module.eager_attention_forward = inner


def check_attention_masks(rec: list, windows: list, linear: list, T: int, dtype: torch.dtype) -> None:
    """The masks of one prompt forward (no cache): every attention layer got exactly transformers' causal
    mask, restricted for a sliding layer with window w to keys j with i - w < j <= i (masking_utils
    sliding_window_overlay: kv_idx > q_idx - sliding_window), 0 where visible and finfo(dtype).min where not
    (masking_utils.eager_mask), in the model's dtype; and transformers passed that layer's window (or None)."""
    got = {}
    for r in rec:
        assert r["layer"] not in got, f"layer {r['layer']}: attention called twice"
        got[r["layer"]] = r
    assert sorted(got) == [i for i in range(len(windows)) if i not in linear], sorted(got)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    for layer, r in got.items():
        w = windows[layer]
        assert r["q_len"] == r["kv_len"] == T, r
        assert r["window"] == w, f"layer {layer}: transformers passed sliding_window {r['window']}, config says {w}"
        ok = j <= i
        if w is not None:
            ok = ok & (j > i - w)
        want = torch.where(ok, torch.zeros((), dtype=dtype), torch.finfo(dtype).min)
        mask = r["mask"]
        assert mask is not None and mask.dtype == dtype and tuple(mask.shape) == (1, 1, T, T), (layer, mask)
        assert torch.equal(mask[0, 0], want), f"layer {layer}: attention mask is not the expected window {w}"


def check_rope(model) -> dict:
    """transformers' float32 inv_freq buffer vs the float64 one of _rotary_f64 (rope_inv_freq_f64); for
    rope_type llama3 also: all three branches of _compute_llama3_parameters occur, and no wavelength lies
    within 1% of a branch boundary (the smoothing is continuous there, so a branch flip between float32
    and float64 would not show in the values)."""
    tc = model.config.get_text_config()
    inv64, branch = rope_inv_freq_f64(tc)
    hf = text_model(model).rotary_emb.inv_freq
    assert hf.dtype == torch.float32 and hf.shape == inv64.shape, (hf.dtype, hf.shape, inv64.shape)
    rel = float(((hf.double() - inv64).abs() / inv64).max())
    assert rel < 1e-6, f"rope inv_freq: float32 buffer vs float64 differ by {rel} (relative)"
    out = dict(rope_type=tc.rope_parameters["rope_type"], inv_freq_f64=[float(v) for v in inv64],
               inv_freq_f32=[float(v) for v in hf], rel_f32_vs_f64_inv_freq=rel, branch=None)
    if branch is not None:
        rp = tc.rope_parameters
        assert set(branch.tolist()) == {0, 1, 2}, f"llama3 rope: not all three branches exercised: {branch.tolist()}"
        head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        dim = int(head_dim * rp.get("partial_rotary_factor", 1.0))
        wavelen = 2 * math.pi * float(rp["rope_theta"]) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        for edge in (rp["original_max_position_embeddings"] / rp["low_freq_factor"],
                     rp["original_max_position_embeddings"] / rp["high_freq_factor"]):
            assert float(((wavelen - edge).abs() / edge).min()) > 0.01, "llama3 rope: a wavelength is on a boundary"
        out.update(branch=branch.tolist(), wavelen=[float(v) for v in wavelen])
    return out


def router_spec(model, layer: int) -> dict | None:
    """Selection parameters of layer's sigmoid router (DeepSeek-V3 / GLM-4.5), None for a softmax router."""
    g = router_of(moe_block(text_model(model).layers[layer]))
    if not isinstance(g, SIGMOID_ROUTERS):
        return None
    return dict(bias=g.e_score_correction_bias.detach().to(torch.float64).clone(), n_group=g.num_group,
                topk_group=g.topk_group, norm=bool(g.norm_topk_prob), scale=float(g.routed_scaling_factor))


def sigmoid_selection(router_logits: torch.Tensor, spec: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The selection of a DeepSeek-V3 router, in float64 from its logits: s = sigmoid(logit) + bias; group score =
    sum of the group's two largest s; the topk_group best groups are kept, every other expert's s is -inf.
    Returns (masked s [T, E], group scores [T, G])."""
    z = router_logits.to(torch.float64)
    s = torch.sigmoid(z) + spec["bias"]
    T, E = s.shape
    G = spec["n_group"]
    gs = s.view(T, G, E // G).topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, torch.topk(gs, spec["topk_group"], dim=-1).indices, True)
    return s.masked_fill(~keep.repeat_interleave(E // G, dim=1), float("-inf")), gs


def router_stats(router_logits: torch.Tensor, k: int, spec: dict | None = None):
    """gap[t] = p_(k) - p_(k+1): k-th minus (k+1)-th largest softmax probability (f64). Sigmoid routers (spec):
    the same on the SELECTION score s = sigmoid(logit) + bias after the group mask (what top-k is taken on)."""
    if spec is not None:
        s = torch.sort(sigmoid_selection(router_logits, spec)[0], dim=-1, descending=True).values
        return s[:, k - 1] - s[:, k]
    p = torch.softmax(router_logits.to(torch.float64), dim=-1)
    s = torch.sort(p, dim=-1, descending=True).values
    return s[:, k - 1] - s[:, k]


def router_group_gap(router_logits: torch.Tensor, spec: dict) -> torch.Tensor:
    """Sigmoid routers with groups: the topk_group-th minus the (topk_group+1)-th largest group score (f64)."""
    gs = torch.sort(sigmoid_selection(router_logits, spec)[1], dim=-1, descending=True).values
    return gs[:, spec["topk_group"] - 1] - gs[:, spec["topk_group"]]


def compute_reference(model, ids: torch.Tensor, module, greedy_tol: float = 1e-4,
                      f64_state: dict | None = None) -> tuple[dict, dict, dict]:
    """Returns (tensors to save, per-token stats, numbers for the report). greedy_tol: the float32 cached vs
    uncached greedy logits tolerance (check_greedy). f64_state: parameters of the float64 model that are not the
    float32 model's upcast (a GGUF that stores f32(1 + w) / f32(-exp(A_log)) describes, in float64, w and A_log
    that no float32 weight holds)."""
    L = len(text_model(model).layers)
    moe = moe_layer_ids(model)
    linear = linear_attention_layer_ids(model)
    k = getattr(model.config.get_text_config(), "num_experts_per_tok", None)
    model = model.float().eval()
    specs = {i: router_spec(model, i) for i in moe}  # sigmoid routers' selection parameters (None: softmax)
    windows = attention_windows(model.config.to_dict())
    rope = check_rope(model)

    rec: list = []
    with record_attention_masks(module, rec):
        r32 = forward_capture(model, ids)
    check_attention_masks(rec, windows, linear, len(ids), torch.float32)
    g_tok, g_margin, g_logits = greedy(model, ids, GREEDY_STEPS)
    check_greedy(model, ids, g_tok, g_logits, tol=greedy_tol)

    m64 = copy.deepcopy(model).double().eval()
    if f64_state:
        sd64 = m64.state_dict()
        assert set(f64_state) <= set(sd64), sorted(set(f64_state) - set(sd64))
        with torch.no_grad():
            for n, t in f64_state.items():
                assert t.dtype == torch.float64 and t.shape == sd64[n].shape, n
                sd64[n].copy_(t)
    r64_plain = forward_capture(m64, ids)  # plain model.double(): partly float32 inside
    with pure_float64(module):
        rec = []
        with record_attention_masks(module, rec):
            r64 = forward_capture(m64, ids)
        check_attention_masks(rec, windows, linear, len(ids), torch.float64)
        g64_tok, g64_margin, g64_logits = greedy(m64, ids, GREEDY_STEPS)
        check_greedy(m64, ids, g64_tok, g64_logits, tol=1e-10)
    if linear:  # sanity figure: transformers' chunked delta rule, also run in float64
        with pure_float64(module, delta_rule="chunked"):
            r64_chunked = forward_capture(m64, ids)

    out: dict[str, np.ndarray] = {}
    f32 = lambda t: t.detach().to(torch.float32).contiguous().numpy()  # noqa: E731
    f64 = lambda t: t.detach().to(torch.float64).contiguous().numpy()  # noqa: E731
    i32 = lambda t: t.detach().to(torch.int32).contiguous().numpy()  # noqa: E731

    out["input_ids"] = i32(ids)
    out["moe_layers"] = np.asarray(moe, dtype=np.int32)
    if linear:
        out["linear_attention_layers"] = np.asarray(linear, dtype=np.int32)
    for prefix, r, cv in (("", r32, f32), ("f64.", r64, f64)):
        out[prefix + "hidden_states"] = cv(r["hidden_states"])
        out[prefix + "final_hidden"] = cv(r["final_hidden"])
        out[prefix + "logits"] = cv(r["logits"])
        for i in range(L):
            out[f"{prefix}layer.{i}.mlp_input"] = cv(r["mlp_in"][i])
            out[f"{prefix}layer.{i}.mlp_output"] = cv(r["mlp_out"][i])
        for i, o in r["mixer_out"].items():
            out[f"{prefix}layer.{i}.mixer_output"] = cv(o)
        for i in moe:
            logits_, weights_, ids_ = r["router"][i]
            out[f"{prefix}layer.{i}.router_logits"] = cv(logits_)
            out[f"{prefix}layer.{i}.topk_ids"] = i32(ids_)
            out[f"{prefix}layer.{i}.topk_weights"] = cv(weights_)
            out[f"{prefix}layer.{i}.router_gap"] = cv(router_stats(logits_, k, specs[i]))
            if specs[i] is not None and specs[i]["topk_group"] < specs[i]["n_group"]:
                out[f"{prefix}layer.{i}.router_group_gap"] = cv(router_group_gap(logits_, specs[i]))
    out["greedy.tokens"] = i32(g_tok)
    out["greedy.margin"] = f32(g_margin)
    out["greedy.logits"] = f32(g_logits)
    out["f64.greedy.tokens"] = i32(g64_tok)
    out["f64.greedy.margin"] = f64(g64_margin)

    # --- consistency checks ---------------------------------------------------------
    for i in moe:
        # topk ids/weights equal our own softmax/top-k of the router logits (tie-free).
        for r, tol in ((r32, 1e-6), (r64, 1e-13)):
            logits_, weights_, ids_ = r["router"][i]
            if specs[i] is None:
                p = torch.softmax(logits_.double(), -1)
                v, ix = torch.topk(p, k, -1)
                assert torch.equal(ix, ids_), f"layer {i}: top-k ids differ from softmax top-k"
                continue
            # sigmoid router: top-k of the group-masked selection score sigmoid(logit) + bias; weights from the
            # sigmoid WITHOUT the bias, renormalised (+ 1e-20) and scaled by routed_scaling_factor
            sp = specs[i]
            v, ix = torch.topk(sigmoid_selection(logits_, sp)[0], k, -1)
            assert torch.equal(ix, ids_), f"layer {i}: top-k ids differ from the DeepSeek selection"
            w = torch.sigmoid(logits_.double()).gather(1, ix)
            if sp["norm"]:
                w = w / (w.sum(-1, keepdim=True) + 1e-20)
            d = float((w * sp["scale"] - weights_.double()).abs().max())
            assert d < tol * sp["scale"], f"layer {i}: top-k weights differ from the DeepSeek formula by {d}"
        # f32 and f64 references must route every token identically.
        assert torch.equal(r32["router"][i][2], r64["router"][i][2]), f"layer {i}: f32 and f64 routing differ"
    assert torch.equal(g_tok, g64_tok), "f32 and f64 greedy continuations differ"
    for name, arr in out.items():
        if arr.dtype.kind == "f":
            assert np.isfinite(arr).all(), name

    gaps = (torch.cat([router_stats(r64["router"][i][0], k, specs[i]) for i in moe]) if moe
            else torch.full((1,), float("nan")))
    stats = {}
    for i in moe:
        stats[i] = router_stats(r64["router"][i][0], k, specs[i])
    ggaps = [router_group_gap(r64["router"][i][0], specs[i]) for i in moe
             if specs[i] is not None and specs[i]["topk_group"] < specs[i]["n_group"]]
    p_top = torch.softmax(r32["logits"].double(), -1).max(-1).values
    nums = dict(
        n_moe_layers=len(moe),
        gap_min=float(gaps.min()), gap_median=float(gaps.median()), gap_max=float(gaps.max()),
        n_border=int((gaps < BORDER_THRESHOLD).sum()), n_router_tokens=int(gaps.numel()) if moe else 0,
        border=[(i, t, float(stats[i][t])) for i in moe for t in range(len(ids)) if stats[i][t] < BORDER_THRESHOLD],
        greedy_margin_min=float(g_margin.min()), greedy_margin_median=float(g_margin.median()),
        mean_top1_prob=float(p_top.mean()),
        hidden_absmax=float(r32["hidden_states"].abs().max()),
        d_f32_vs_f64_logits=float((r32["logits"].double() - r64["logits"]).abs().max()),
        d_f32_vs_f64_hidden=float((r32["hidden_states"].double() - r64["hidden_states"]).abs().max()),
        d_plain_double_vs_f64_logits=float((r64_plain["logits"] - r64["logits"]).abs().max()),
        logits_absmax=float(r64["logits"].abs().max()),
        windows=windows, rope=rope,
    )
    if ggaps:
        gg = torch.cat(ggaps)
        nums.update(group_gap_min=float(gg.min()), group_gap_median=float(gg.median()),
                    n_group_border=int((gg < BORDER_THRESHOLD).sum()))
    if any(sp is not None for sp in specs.values()):
        nums["sigmoid_router"] = True
        nums["cos_sin_scale"] = float(text_model(model).rotary_emb.attention_scaling)
        nums["softmax_scale"] = float(text_model(model).layers[0].self_attn.scaling)
    if linear:
        rel = lambda a, b: float((a - b).abs().max() / b.abs().max())  # noqa: E731
        nums.update(
            d_plain_double_vs_f64_hidden=float((r64_plain["hidden_states"] - r64["hidden_states"]).abs().max()),
            d_chunked_vs_recurrent_logits=float((r64_chunked["logits"] - r64["logits"]).abs().max()),
            d_chunked_vs_recurrent_hidden=float((r64_chunked["hidden_states"] - r64["hidden_states"]).abs().max()),
            d_chunked_vs_recurrent_mixer=max(rel(r64_chunked["mixer_out"][i], r64["mixer_out"][i]) for i in linear),
            rel_f32_vs_f64_mixer=max(rel(r32["mixer_out"][i].double(), r64["mixer_out"][i]) for i in linear),
        )
    return out, stats, nums


# ---------------------------------------------------------------------------
# Planting border tokens
# ---------------------------------------------------------------------------
def plant_border_tokens(model, ids: torch.Tensor, module, targets) -> list[dict]:
    planted = []
    k = model.config.get_text_config().num_experts_per_tok if targets else None
    used: set[int] = set()
    for layer, want in sorted(targets):
        m64 = copy.deepcopy(model).double().eval()
        with pure_float64(module):
            r = forward_capture(m64, ids)
        x = r["mlp_in"][layer]  # router input [T, H] (f64)
        logits = r["router"][layer][0]  # [T, E] (f64)
        spec = router_spec(model, layer)
        if spec is not None:
            planted.append(_plant_sigmoid(model, layer, want, x, logits, spec, k, used))
            continue
        gap = router_stats(logits, k)
        order = [int(t) for t in torch.argsort(gap) if int(t) not in used and int(t) > 0]
        t = order[0]
        used.add(t)
        lt = logits[t].clone()
        srt = torch.argsort(lt, descending=True)
        e_k, e_k1 = int(srt[k - 1]), int(srt[k])

        def gap_after(delta: float) -> float:
            z = lt.clone()
            z[e_k1] += delta
            p = torch.softmax(z, -1)
            return float(p[e_k] - p[e_k1])

        lo, hi = 0.0, float(lt[e_k] - lt[e_k1])
        assert gap_after(lo) > want, f"layer {layer}: natural gap already below {want}"
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if gap_after(mid) > want:
                lo = mid
            else:
                hi = mid
        delta = 0.5 * (lo + hi)
        xv = x[t]
        router = text_model(model).layers[layer].mlp.gate
        with torch.no_grad():
            router.weight[e_k1] += (delta * xv / xv.dot(xv)).to(torch.float32)
        planted.append(dict(layer=layer, token=t, expert_k=e_k, expert_k1=e_k1, natural_gap=float(gap[t]),
                            wanted_gap=want, logit_shift=delta))
    return planted


def _plant_sigmoid(model, layer: int, want: float, x: torch.Tensor, logits: torch.Tensor, spec: dict, k: int,
                   used: set) -> dict:
    """plant_border_tokens for a sigmoid router (DeepSeek-V3 / GLM-4.5): the same nudge of expert e_(k+1)'s router
    row along the token's router input, solved in closed form on the SELECTION score s = sigmoid(logit) + bias:
    sigmoid(z_(k+1) + delta) + b_(k+1) = s_(k) - want. Raising e_(k+1)'s score only raises the score of its own
    group, which is selected already, so the group selection and the selected experts stay as they were
    (asserted); the combine weights of the token do not change (e_(k+1) is not selected)."""
    gap = router_stats(logits, k, spec)
    for t in [int(t) for t in torch.argsort(gap) if int(t) not in used and int(t) > 0]:
        masked = sigmoid_selection(logits[t:t + 1], spec)[0][0]
        srt = torch.argsort(masked, descending=True)
        e_k, e_k1 = int(srt[k - 1]), int(srt[k])
        assert math.isfinite(float(masked[e_k1])), "fewer candidate experts than k + 1"
        target = float(masked[e_k]) - want - float(spec["bias"][e_k1])  # the wanted sigmoid(z') of e_(k+1)
        if float(gap[t]) > want and 0.0 < target < 1.0:
            break
    else:
        raise AssertionError(f"layer {layer}: no token can be planted with gap {want}")
    delta = math.log(target / (1.0 - target)) - float(logits[t, e_k1])
    z = logits[t:t + 1].clone()
    z[0, e_k1] += delta
    after = sigmoid_selection(z, spec)[0]
    assert torch.equal(torch.topk(after, k).indices, torch.topk(masked[None], k).indices), "selection changed"
    assert abs(float(after[0, e_k] - after[0, e_k1]) - want) < 1e-12 * max(1.0, want)
    used.add(t)
    xv = x[t]
    router = text_model(model).layers[layer].mlp.gate
    with torch.no_grad():
        router.weight[e_k1] += (delta * xv / xv.dot(xv)).to(torch.float32)
    return dict(layer=layer, token=t, expert_k=e_k, expert_k1=e_k1, natural_gap=float(gap[t]), wanted_gap=want,
                logit_shift=delta)


# ---------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------
def n_experts(cfg: dict) -> int:
    # Qwen3MoeConfig maps num_experts -> num_local_experts (attribute_map), so its config.json
    # says "num_local_experts"; Qwen2MoeConfig writes "num_experts". 0: a dense model.
    # DeepSeek-V3 / GLM-4.5 write "n_routed_experts".
    cfg = text_config(cfg)
    return int(cfg.get("num_experts", cfg.get("num_local_experts", cfg.get("n_routed_experts", 0))))


def gguf_tensors(sd: dict, cfg: dict, moe: list[int]) -> list[tuple[str, np.ndarray]]:
    """HF state dict (numpy, as saved) -> llama.cpp names, in llama.cpp order."""
    out = [("token_embd.weight", sd["model.embed_tokens.weight"])]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", sd[p + "input_layernorm.weight"]),
            (b + "attn_q.weight", sd[p + "self_attn.q_proj.weight"]),  # not permuted (NEOX rope)
            (b + "attn_k.weight", sd[p + "self_attn.k_proj.weight"]),  # not permuted (NEOX rope)
            (b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"]),
            (b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"]),
            (b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"]),
            (b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"]),
            (b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"]),
        ]
        if i in moe:
            E = n_experts(cfg)
            out.append((b + "ffn_gate_inp.weight", sd[p + "mlp.gate.weight"]))
            for hf, gg in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
                out.append((b + gg + ".weight",
                            np.stack([sd[p + f"mlp.experts.{e}.{hf}.weight"] for e in range(E)], axis=0)))
        else:
            for hf, gg in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
                out.append((b + gg + ".weight", sd[p + f"mlp.{hf}.weight"]))
    out += [("output_norm.weight", sd["model.norm.weight"]), ("output.weight", sd["lm_head.weight"])]
    assert len(out) == len({n for n, _ in out})
    return out


def is_quantised_in_q8_0(name: str, arr: np.ndarray) -> bool:
    # As llama.cpp's convert_hf_to_gguf: 1-D tensors, *_norm and the router (ffn_gate_inp) stay F32.
    return arr.ndim >= 2 and not name.endswith("_norm.weight") and "ffn_gate_inp" not in name


def write_gguf(path: Path, name: str, cfg: dict, tensors, q8: bool) -> dict:
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.ALL_F32)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(n_experts(cfg))
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_weights_norm(bool(cfg["norm_topk_prob"]))
    w.add_vocab_size(cfg["vocab_size"])
    types = {}
    for tname, arr in tensors:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if q8 and is_quantised_in_q8_0(tname, arr):
            data = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(tname, data, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            types[tname] = "Q8_0"
        else:
            w.add_tensor(tname, arr)
            types[tname] = "F32"
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return types


def verify_gguf(path: Path, tensors, q8: bool) -> tuple[float, dict]:
    """Read back with gguf.GGUFReader; F32 must be bit-exact, Q8_0 within its step."""
    rd = gguf.GGUFReader(str(path))
    got = {t.name: t for t in rd.tensors}
    assert set(got) == {n for n, _ in tensors}
    worst = 0.0
    deq = {}
    for tname, src in tensors:
        t = got[tname]
        arr = gguf.quants.dequantize(t.data, t.tensor_type).reshape(src.shape)
        # GGML ne is the numpy shape reversed.
        assert list(t.shape) == list(reversed(src.shape)), (tname, t.shape, src.shape)
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            assert np.array_equal(arr, src), tname
        else:
            assert q8 and t.tensor_type == gguf.GGMLQuantizationType.Q8_0
            rel = float(np.abs(arr - src).max() / np.abs(src).max())
            assert rel < 1.0 / 127, (tname, rel)
            worst = max(worst, rel)
        deq[tname] = arr
    kv = {f.name: f for f in rd.fields.values()}
    assert "qwen3moe.expert_count" in kv and "general.architecture" in kv
    return worst, deq


def hf_state_from_gguf(deq: dict, cfg: dict, moe: list[int]) -> dict:
    sd = {"model.embed_tokens.weight": deq["token_embd.weight"], "model.norm.weight": deq["output_norm.weight"],
          "lm_head.weight": deq["output.weight"]}
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        sd[p + "input_layernorm.weight"] = deq[b + "attn_norm.weight"]
        sd[p + "post_attention_layernorm.weight"] = deq[b + "ffn_norm.weight"]
        for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output"),
                       ("q_norm", "attn_q_norm"), ("k_norm", "attn_k_norm")):
            sd[p + f"self_attn.{hf}.weight"] = deq[b + gg + ".weight"]
        if i in moe:
            sd[p + "mlp.gate.weight"] = deq[b + "ffn_gate_inp.weight"]
            for hf, gg in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
                for e in range(n_experts(cfg)):
                    sd[p + f"mlp.experts.{e}.{hf}.weight"] = deq[b + gg + ".weight"][e]
        else:
            for hf, gg in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
                sd[p + f"mlp.{hf}.weight"] = deq[b + gg + ".weight"]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


# ---------------------------------------------------------------------------
# An independent plain-numpy float64 forward, used only to prove that the f64
# references really are float64 throughout (no float32 step left inside
# transformers): it must agree with them to ~1e-13.
# ---------------------------------------------------------------------------
def numpy_f64_forward(cfg: dict, W: dict, ids: np.ndarray) -> dict:
    cfg = text_config(cfg)
    mt = cfg["model_type"]
    # the multimodal wrappers hold the text model under model.language_model (the vision tower is not used)
    W = {n.replace("model.language_model.", "model."): w for n, w in W.items() if not n.startswith("model.visual.")}
    hybrid = mt in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")  # (1 + w) norms, gated attention, DeltaNet
    T, H = len(ids), cfg["hidden_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    eps, theta = cfg["rms_norm_eps"], cfg["rope_parameters"]["rope_theta"]
    rd = int(hd * cfg["rope_parameters"].get("partial_rotary_factor", 1.0))  # rotary dims (the first rd of hd)
    mla = mt == "deepseek_v3"  # multi-head latent attention: rope on a separate qk_rope_head_dim part
    if mla:
        rd = cfg["qk_rope_head_dim"]
    k = cfg.get("num_experts_per_tok")
    renorm = mt in ("mixtral", "qwen3_5_moe_text") or bool(cfg.get("norm_topk_prob"))

    def rms(x, w, eps=eps):
        if hybrid:  # zero-centred weight
            return (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)) * (1.0 + w)
        return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))

    def silu(x):
        return x / (1.0 + np.exp(-x))

    def sigmoid(x):
        return 1.0 / (1.0 + np.exp(-x))

    def lin(name, x):
        y = x @ W[name + ".weight"].T
        return y + W[name + ".bias"] if name + ".bias" in W else y

    def swiglu(prefix, names, x):
        g, u, d = (prefix + n for n in names)
        return lin(d, silu(lin(g, x)) * lin(u, x))

    def expert(m, e, names, x):
        if m + "experts.gate_up_proj" in W:  # fused [E, 2I, H] / [E, H, I]
            gu = x @ W[m + "experts.gate_up_proj"][e].T
            g, u = np.split(gu, 2, axis=-1)
            return (silu(g) * u) @ W[m + "experts.down_proj"][e].T
        return swiglu(f"{m}experts.{e}.", names, x)

    inv_freq = 1.0 / theta ** (np.arange(0, rd, 2) / rd)
    rp = cfg["rope_parameters"]
    if "_inv_freq" in rp:  # a GGUF's rope (rope_freqs factors): the table itself
        inv_freq = np.asarray(rp["_inv_freq"], dtype=np.float64)
    elif rp.get("rope_type", "default") == "llama3":  # Llama 3.1 frequency scaling, per wavelength band
        f, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
        n_ctx = rp["original_max_position_embeddings"]
        wl = 2.0 * np.pi / inv_freq
        s = (n_ctx / wl - lo) / (hi - lo)
        inv_freq = np.where(wl < n_ctx / hi, inv_freq,
                            np.where(wl > n_ctx / lo, inv_freq / f, (1.0 - s) * inv_freq / f + s * inv_freq))
    elif rp.get("rope_type") == "yarn":  # YaRN: ramp between interpolation (÷ factor) and extrapolation
        f, orig = rp["factor"], rp["original_max_position_embeddings"]
        cdim = [rd * np.log(orig / (r * 2 * np.pi)) / (2 * np.log(theta))
                for r in (rp.get("beta_fast") or 32, rp.get("beta_slow") or 1)]
        if rp.get("truncate", True):
            cdim = [np.floor(cdim[0]), np.ceil(cdim[1])]
        lo, hi = max(cdim[0], 0), min(cdim[1], rd - 1)
        ramp = np.clip((np.arange(rd // 2) - lo) / ((hi + 0.001 if hi == lo else hi) - lo), 0, 1)
        inv_freq = inv_freq * (ramp / f + (1 - ramp))
    else:
        assert rp.get("rope_type", "default") == "default", rp
    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * np.log(scale) + 1.0

    mscale = 1.0
    if rp.get("rope_type") == "yarn":  # cos and sin scaled by the attention factor
        if rp.get("attention_factor"):
            mscale = rp["attention_factor"]
        elif rp.get("mscale") and rp.get("mscale_all_dim"):  # DeepSeek: the ratio of the two
            mscale = get_mscale(rp["factor"], rp["mscale"]) / get_mscale(rp["factor"], rp["mscale_all_dim"])
        else:
            mscale = get_mscale(rp["factor"])
    ang = np.arange(T)[:, None] * inv_freq[None]
    cos = mscale * np.cos(np.concatenate([ang, ang], -1))[:, None]
    sin = mscale * np.sin(np.concatenate([ang, ang], -1))[:, None]

    def rope(x):  # [T, heads, hd], rotate_half (NEOX) layout on the first rd dims
        if x.shape[-1] > rd:
            return np.concatenate([rope(x[..., :rd]), x[..., rd:]], -1)
        return x * cos + np.concatenate([-x[..., rd // 2:], x[..., :rd // 2]], -1) * sin

    def rope_interleaved(x):  # [T, heads, rd]: pairs (x0, x1), (x2, x3), ...; output cat(even', odd') as transformers
        c, s_ = cos[..., :rd // 2], sin[..., :rd // 2]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return np.concatenate([x1 * c - x2 * s_, x2 * c + x1 * s_], -1)

    def mla_attention(p, x, mask):
        """DeepSeek-V2/V3 multi-head latent attention, the uncompressed (MHA) form."""
        a = p + "self_attn."
        dn, dr, dv, r = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
        if a + "q_proj.weight" in W:  # Kimi-K2 / DeepSeek-V2-Lite: no q LoRA
            q = lin(a + "q_proj", x)
        else:  # q_a_layernorm: DeepseekV3RMSNorm with its default eps 1e-6 (not rms_norm_eps)
            q = lin(a + "q_b_proj", rms(lin(a + "q_a_proj", x), W[a + "q_a_layernorm.weight"], 1e-6))
        q = q.reshape(T, nh, dn + dr)
        ckv = lin(a + "kv_a_proj_with_mqa", x)  # [T, r + dr]: the latent, then ONE rope key shared by all heads
        c_kv = rms(ckv[:, :r], W[a + "kv_a_layernorm.weight"], 1e-6)
        k_rot = ckv[:, None, r:]
        rot = rope_interleaved if cfg.get("rope_interleave", True) else rope
        q_rot, k_rot = rot(q[..., dn:]), rot(k_rot)
        kv = lin(a + "kv_b_proj", c_kv).reshape(T, nh, dn + dv)  # per head [k_nope (dn) | v (dv)]
        qq = np.concatenate([q[..., :dn], q_rot], -1)
        kk = np.concatenate([kv[..., :dn], np.broadcast_to(k_rot, (T, nh, dr))], -1)
        v = kv[..., dn:]
        scale = (dn + dr) ** -0.5
        if rp.get("rope_type", "default") != "default" and rp.get("mscale_all_dim"):  # yarn_apply_mscale
            scale *= get_mscale(rp["factor"], rp["mscale_all_dim"]) ** 2
        att = np.zeros((T, nh, dv))
        for h_ in range(nh):
            sc = qq[:, h_] @ kk[:, h_].T * scale + mask
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            att[:, h_] = (sc / sc.sum(-1, keepdims=True)) @ v[:, h_]
        return lin(a + "o_proj", att.reshape(T, nh * dv))

    def attention(p, x, mask):
        if mla:
            return mla_attention(p, x, mask)
        if hybrid:  # q_proj gives [q | gate] per head; output gated by sigmoid(gate)
            qg = lin(p + "self_attn.q_proj", x).reshape(T, nh, 2 * hd)
            q, gate = qg[..., :hd], qg[..., hd:].reshape(T, nh * hd)
        else:
            q = lin(p + "self_attn.q_proj", x).reshape(T, nh, hd)
        kk = lin(p + "self_attn.k_proj", x).reshape(T, nkv, hd)
        v = lin(p + "self_attn.v_proj", x).reshape(T, nkv, hd)
        if p + "self_attn.q_norm.weight" in W and mt == "olmoe":  # over the whole projection, then split
            q = rms(q.reshape(T, nh * hd), W[p + "self_attn.q_norm.weight"]).reshape(T, nh, hd)
            kk = rms(kk.reshape(T, nkv * hd), W[p + "self_attn.k_norm.weight"]).reshape(T, nkv, hd)
        elif p + "self_attn.q_norm.weight" in W:
            q, kk = rms(q, W[p + "self_attn.q_norm.weight"]), rms(kk, W[p + "self_attn.k_norm.weight"])
        q, kk = rope(q), rope(kk)
        att = np.zeros((T, nh, hd))
        for a in range(nh):
            s = q[:, a] @ kk[:, a // (nh // nkv)].T / np.sqrt(hd) + mask
            if p + "self_attn.sinks" in W:  # gpt-oss: the sink joins the normaliser, its probability dropped
                s = np.concatenate([s, np.full((T, 1), W[p + "self_attn.sinks"][a])], -1)
            s = np.exp(s - s.max(-1, keepdims=True))
            pr = s / s.sum(-1, keepdims=True)
            att[:, a] = pr[:, :T] @ v[:, a // (nh // nkv)]
        att = att.reshape(T, nh * hd)
        if hybrid:
            att = att * sigmoid(gate)
        return lin(p + "self_attn.o_proj", att)

    def gated_deltanet(p, x):
        """Gated DeltaNet, token by token: the recurrent form of the gated delta rule."""
        nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        dk, dv, r = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], nv // nk
        la = p + "linear_attn."
        if la + "in_proj_qkvz.weight" in W:  # Qwen3-Next: per key head [q | k | v (r heads) | z (r heads)], [b | a]
            qkvz = lin(la + "in_proj_qkvz", x).reshape(T, nk, 2 * dk + 2 * r * dv)
            ba = lin(la + "in_proj_ba", x).reshape(T, nk, 2 * r)
            q, kk = qkvz[..., :dk], qkvz[..., dk:2 * dk]
            v, z = qkvz[..., 2 * dk:2 * dk + r * dv], qkvz[..., 2 * dk + r * dv:]
            mixed = np.concatenate([q.reshape(T, -1), kk.reshape(T, -1), v.reshape(T, -1)], -1)
            z, b, a = z.reshape(T, nv, dv), ba[..., :r].reshape(T, nv), ba[..., r:].reshape(T, nv)
        else:
            mixed = lin(la + "in_proj_qkv", x)
            z = lin(la + "in_proj_z", x).reshape(T, nv, dv)
            b, a = lin(la + "in_proj_b", x), lin(la + "in_proj_a", x)
        cw = W[la + "conv1d.weight"][:, 0, :]  # [channels, K]: causal depthwise conv, then SiLU
        K = cw.shape[1]
        xp = np.concatenate([np.zeros((K - 1, mixed.shape[1])), mixed], 0)
        mixed = silu(sum(cw[:, j] * xp[j:j + T] for j in range(K)))
        q = mixed[:, :nk * dk].reshape(T, nk, dk)
        kk = mixed[:, nk * dk:2 * nk * dk].reshape(T, nk, dk)
        v = mixed[:, 2 * nk * dk:].reshape(T, nv, dv)
        q, kk = np.repeat(q, r, axis=1), np.repeat(kk, r, axis=1)  # value head h reads key head h // r
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(dk)
        kk = kk / np.sqrt((kk * kk).sum(-1, keepdims=True) + 1e-6)
        beta = sigmoid(b)
        u = a + W[la + "dt_bias"]
        g = -np.exp(W[la + "A_log"]) * np.where(u > 20.0, u, np.log1p(np.exp(np.minimum(u, 20.0))))  # softplus
        S = np.zeros((nv, dk, dv))
        o = np.zeros((T, nv, dv))
        for t in range(T):
            S = S * np.exp(g[t])[:, None, None]
            delta = (v[t] - np.einsum("hkv,hk->hv", S, kk[t])) * beta[t][:, None]
            S = S + kk[t][:, :, None] * delta[:, None, :]
            o[t] = np.einsum("hkv,hk->hv", S, q[t])
        nw = W[la + "norm.weight"]  # gated RMSNorm (weight NOT zero-centred)
        o = nw * (o / np.sqrt((o * o).mean(-1, keepdims=True) + eps)) * silu(z)
        return lin(la + "out_proj", o.reshape(T, nv * dv))

    def causal_mask(window):  # key j visible to query i iff j <= i (and i - window < j for a sliding layer)
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        ok = (j <= i) & ((j > i - window) if window is not None else True)
        return np.where(ok, 0.0, -np.inf)

    windows = attention_windows(cfg)
    h = W["model.embed_tokens.weight"][ids]
    hs, topk = [h], {}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        x = rms(h, W[p + "input_layernorm.weight"])
        h = h + (gated_deltanet(p, x) if p + "linear_attn.A_log" in W else attention(p, x, causal_mask(windows[layer])))
        x = rms(h, W[p + "post_attention_layernorm.weight"])
        m = p + ("block_sparse_moe." if mt == "mixtral" else "mlp.")
        names = ("w1", "w3", "w2") if mt == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        if m + "router.weight" in W:  # gpt-oss: biased logits, softmax over the top-k, clamped SwiGLU experts
            z = lin(m + "router", x)
            idx = np.argsort(-z, -1, kind="stable")[:, :k]
            zk = np.take_along_axis(z, idx, -1)
            w = np.exp(zk - zk.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            lim, alpha = cfg.get("swiglu_limit", 7.0), cfg.get("swiglu_alpha", 1.702)
            y = np.zeros_like(x)
            for t in range(T):
                for j in range(k):
                    e = idx[t, j]
                    gu = x[t] @ W[m + "experts.gate_up_proj"][e] + W[m + "experts.gate_up_proj_bias"][e]
                    g, u = np.minimum(gu[0::2], lim), np.clip(gu[1::2], -lim, lim)
                    o = ((u + 1) * g / (1 + np.exp(-g * alpha))) @ W[m + "experts.down_proj"][e]
                    y[t] += w[t, j] * (o + W[m + "experts.down_proj_bias"][e])
            topk[layer] = idx
        elif m + "gate.e_score_correction_bias" in W:  # DeepSeek-V3 / GLM-4.5: sigmoid, bias, groups, shared experts
            z = x @ W[m + "gate.weight"].T
            sc = 1.0 / (1.0 + np.exp(-z))
            sel = sc + W[m + "gate.e_score_correction_bias"]  # for the selection only
            G, E = cfg["n_group"], sel.shape[-1]
            grp = np.sort(sel.reshape(T, G, E // G), -1)[..., ::-1][..., :2].sum(-1)  # group score: its top-2 sum
            keep = np.zeros((T, G), dtype=bool)
            np.put_along_axis(keep, np.argsort(-grp, -1, kind="stable")[:, :cfg["topk_group"]], True, -1)
            sel = np.where(np.repeat(keep, E // G, -1), sel, -np.inf)
            idx = np.argsort(-sel, -1, kind="stable")[:, :k]
            w = np.take_along_axis(sc, idx, -1)  # weights from the sigmoid WITHOUT the bias
            if cfg.get("norm_topk_prob"):
                w = w / (w.sum(-1, keepdims=True) + 1e-20)
            w = w * cfg["routed_scaling_factor"]
            y = np.zeros_like(x)
            for t in range(T):
                for j in range(k):
                    y[t] += w[t, j] * expert(m, idx[t, j], names, x[t:t + 1])[0]
            y += swiglu(m + "shared_experts.", names, x)  # shared experts: plain add, no gate
            topk[layer] = idx
        elif m + "gate.weight" in W:
            z = x @ W[m + "gate.weight"].T
            pr = np.exp(z - z.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            idx = np.argsort(-pr, -1, kind="stable")[:, :k]
            w = np.take_along_axis(pr, idx, -1)
            if renorm:
                w = w / w.sum(-1, keepdims=True)
            y = np.zeros_like(x)
            for t in range(T):
                for j in range(k):
                    y[t] += w[t, j] * expert(m, idx[t, j], names, x[t:t + 1])[0]
            if m + "shared_expert_gate.weight" in W:
                gate = 1.0 / (1.0 + np.exp(-(x @ W[m + "shared_expert_gate.weight"].T)))
                y += gate * swiglu(m + "shared_expert.", names, x)
            topk[layer] = idx
        else:
            y = swiglu(m, names, x)
        h = h + y
        hs.append(h)
    lm = W["lm_head.weight"] if "lm_head.weight" in W else W["model.embed_tokens.weight"]
    return {"hidden_states": np.stack(hs), "logits": rms(h, W["model.norm.weight"]) @ lm.T, "topk": topk}


def numpy_check(cfg: dict, weights: dict, ref: dict) -> float:
    W = {n: t.to(torch.float64).numpy() for n, t in weights.items()}
    r = numpy_f64_forward(cfg, W, ref["input_ids"].astype(np.int64))
    for layer, idx in r["topk"].items():
        assert np.array_equal(idx, ref[f"f64.layer.{layer}.topk_ids"]), f"numpy routing differs at layer {layer}"
    d = max(float(np.abs(r["hidden_states"] - ref["f64.hidden_states"]).max()),
            float(np.abs(r["logits"] - ref["f64.logits"]).max()))
    assert d < 1e-10, f"f64 reference is not float64 throughout: numpy differs by {d}"
    return d


# ---------------------------------------------------------------------------
# Documentation
# ---------------------------------------------------------------------------
DESCRIPTIONS = [
    ("input_ids", "the prompt: PROMPT_LEN ids, uniform from numpy PCG64(TOKEN_SEED) in [0, min vocab of all fixtures)"),
    ("moe_layers", "indices of the layers whose MLP is the sparse MoE block (others are dense MLPs)"),
    ("linear_attention_layers", "indices of the layers whose token mixer is the Gated DeltaNet (layer_types "
                                "\"linear_attention\"; the others are gated full attention)"),
    ("hidden_states", "[0] = embed_tokens output (input of layer 0); [l+1] = output of decoder layer l, i.e. "
                      "the residual stream after layer l, BEFORE the final norm -- also for the last layer. "
                      "(transformers' output_hidden_states instead puts model.norm(...) in its last slot; "
                      "that tensor is final_hidden)"),
    ("final_hidden", "model.norm(hidden_states[L]): the final RMSNorm output that lm_head multiplies "
                     "(= transformers' output_hidden_states[-1] and last_hidden_state)"),
    ("logits", "lm_head(final_hidden): next-token logits at every prompt position"),
    ("layer.{l}.mlp_input", "input of layer l's MLP / MoE block = post_attention_layernorm output (also the router input)"),
    ("layer.{l}.mlp_output", "output of layer l's MLP / MoE block (experts combined, + gated shared expert where "
                             "the architecture has one), before the residual add"),
    ("layer.{l}.mixer_output", "output of layer l's token mixer before the residual add: the Gated DeltaNet "
                               "(linear_attn, after out_proj) or the gated full attention (self_attn, after "
                               "o_proj); its input is input_layernorm(hidden_states[l])"),
    ("layer.{l}.router_logits", "MoE layers only: router gate linear output x.W_g^T (output_router_logits)"),
    ("layer.{l}.topk_ids", "MoE layers only: the k chosen experts per token, as transformers' router returned them "
                           "(torch.topk of the softmax, descending probability)"),
    ("layer.{l}.topk_weights", "MoE layers only: their combine weights as transformers used them (softmax probs, "
                               "renormalised to sum 1 when the architecture does: norm_topk_prob / always for Mixtral)"),
    ("layer.{l}.router_gap", "MoE layers only: p_(k) - p_(k+1), the k-th minus (k+1)-th largest softmax probability "
                             "(computed in f64 from the stored router logits); < 1e-3 = border token"),
    ("layer.{l}.router_group_gap", "MoE layers of a sigmoid router with expert groups only: g_(topk_group) - "
                                   "g_(topk_group+1), the topk_group-th minus the next largest group score (group "
                                   "score = sum of the group's two largest selection scores sigmoid(logit) + bias; "
                                   "computed in f64 from the stored router logits); a near-tie here flips a whole "
                                   "group"),
    ("greedy.tokens", "greedy continuation of the prompt: GREEDY_STEPS tokens, argmax of the last logits with the "
                      "KV cache, no sampling/penalties/EOS (checked equal to model.generate(do_sample=False) and to "
                      "a no-cache recompute)"),
    ("greedy.margin", "top1 - top2 of the logits that chose each greedy token"),
    ("greedy.logits", "the full logits that chose each greedy token (step i predicts greedy.tokens[i])"),
]


# The router tensors of the sigmoid routers (DeepSeek-V3, Kimi-K2, GLM-4.5) mean something else.
SIGMOID_DESCRIPTIONS = {
    "layer.{l}.router_logits": "MoE layers only: router gate linear output z = x.W_g^T (output_router_logits), "
                               "before the sigmoid; x = layer.{l}.mlp_input",
    "layer.{l}.topk_ids": "MoE layers only: the k chosen experts per token: s = sigmoid(z) + "
                          "mlp.gate.e_score_correction_bias; the topk_group groups with the largest group score (sum "
                          "of the group's two largest s) are kept, top-k of s among their experts. ORDER: descending "
                          "s (transformers' router returns them in torch.topk(sorted=False) order, which is "
                          "unspecified; make_fixtures.py reorders ids and weights together)",
    "layer.{l}.topk_weights": "MoE layers only: their combine weights as transformers used them: sigmoid(z) of the "
                              "chosen experts WITHOUT the bias, divided by (their sum + 1e-20) when norm_topk_prob, "
                              "times routed_scaling_factor (so they sum to routed_scaling_factor, not 1)",
    "layer.{l}.mlp_output": "output of layer l's MLP / MoE block before the residual add; in a MoE layer the routed "
                            "experts combined with topk_weights PLUS the shared experts' SwiGLU (mlp.shared_experts, "
                            "width moe_intermediate_size * n_shared_experts, no gate)",
    "layer.{l}.router_gap": "MoE layers only: s_(k) - s_(k+1), the k-th minus the (k+1)-th largest SELECTION score "
                            "s = sigmoid(z) + bias after the group mask (computed in f64 from the stored router "
                            "logits); < 1e-3 = border token",
}


def shape_str(a: np.ndarray) -> str:
    return "[" + ", ".join(str(d) for d in a.shape) + "]"


def reference_md(fx: dict, cfg_json: dict, ref: dict, nums: dict, planted: list, extra: str,
                 planted_note: str = "") -> str:
    dt = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.int32): "I32"}
    lines = [f"# {fx['name']} — reference data", "",
             f"Produced by `scripts/make_fixtures.py` with transformers {PINNED['transformers']}, "
             f"torch {PINNED['torch']} (CPU, 1 thread, float32, eager attention, eager experts), "
             f"architecture `{cfg_json['architectures'][0]}`, seed {fx['seed']}.", ""]
    if extra:
        lines += [extra, ""]
    lines += ["Architecture notes: " + fx["notes"], ""]
    hybrid = "linear_attention_layers" in ref
    dense = not hybrid and not ref["moe_layers"].size
    if dense:
        f64_what = ("(model.double() with RMSNorm, eager-attention softmax and rotary cos/sin (inv_freq "
                    + ("with the llama3 scaling " if nums["rope"]["rope_type"] == "llama3" else "")
                    + "recomputed in float64) also computed in float64 — plain model.double() keeps those three in "
                    "float32; the attention masks are transformers' own, built in float64; see below).")
    elif not hybrid and nums.get("sigmoid_router"):
        f64_what = ("(model.double() with RMSNorm (also q_a_layernorm / kv_a_layernorm in MLA), eager-attention "
                    "softmax, the router's logits and sigmoid (transformers' router forward with its float32 casts "
                    "made float64) and rotary cos/sin (inv_freq, yarn included, recomputed in float64) also computed "
                    "in float64 — plain model.double() keeps those four in float32; see below).")
    elif not hybrid:
        f64_what = ("(model.double() with RMSNorm, eager-attention softmax, router softmax and rotary cos/sin also "
                    "computed in float64 — plain model.double() keeps those four in float32; see below).")
    else:
        f64_what = (
            "(model.double() with every float32 step of transformers' double mode replaced by a float64 version "
            "of the same formula, make_fixtures.py pure_float64: the (1 + w) RMSNorm, "
            "the Gated DeltaNet's gated RMSNorm, the rotary cos/sin, the eager-attention softmax"
            + (", the router softmax" if ref["moe_layers"].size else "")
            + ", the decay g = −exp(A_log)·softplus(a + dt_bias) (transformers rounds a and exp(A_log) to float32) "
            "and the gated delta rule with its L2 norm of q and k (transformers casts q, k, v, g, β to float32). "
            "The gated delta rule of the float64 forward is the RECURRENT form, token by token, for the prompt "
            "as for cached decoding: transformers' own torch_recurrent_gated_delta_rule with its float32 casts "
            "made float64. transformers itself runs the chunked form (torch_chunk_gated_delta_rule, chunks of "
            "64, UT transform) over a prompt and the recurrent form for one cached token, so the float32 "
            "tensors come from the chunked form, except the greedy steps after the first; see below).")
    lines += ["`reference.safetensors` (written with the safetensors package). Every tensor is computed on the "
              "weights in this folder's `model.safetensors` as reloaded by `from_pretrained` (float32). "
              "Names without prefix: the float32 forward. Names with prefix `f64.`: a float64 forward "
              + f64_what, "",
              "| tensor | dtype | shape | what |", "|---|---|---|---|"]
    tc = text_config(cfg_json)
    T, L = PROMPT_LEN, tc["num_hidden_layers"]
    for key, what in DESCRIPTIONS:
        if nums.get("sigmoid_router"):
            what = SIGMOID_DESCRIPTIONS.get(key, what)
        names = [n for n in ref if n == key or (("{l}" in key) and n.startswith("layer.")
                                                 and n.split(".", 2)[2] == key.split(".", 2)[2])]
        if not names:
            continue
        a = ref[names[0]]
        layers = ""
        if "{l}" in key:
            layers = " (l = " + ", ".join(n.split(".")[1] for n in names) + ")"
        lines.append(f"| `{key}`{layers} | {dt[a.dtype]} | {shape_str(a)} | {what} |")
    no_twin = sorted(n for n in ref if not n.startswith("f64.") and "f64." + n not in ref)
    assert all(("f64." + n[4:]) in ref or n[4:] in ref for n in ref if n.startswith("f64."))
    lines += ["", "Every tensor above also exists in float64 with the prefix `f64.` (same shape; F64, ids I32), "
              "computed by the float64 forward, except " + ", ".join(f"`{n}`" for n in no_twin) + ". "
              "`f64.greedy.tokens` / `f64.greedy.margin` are the float64 model's own greedy continuation "
              "(equal to `greedy.tokens`).", ""]
    shapes = f"Shapes: T = {T} prompt tokens, L = {L} layers, H = {tc['hidden_size']}, V = {tc['vocab_size']}"
    if nums["E"]:
        shapes += f", E = {nums['E']} experts, k = {tc['num_experts_per_tok']}"
    if hybrid:
        shapes += (f"; layer_types {['linear' if t == 'linear_attention' else 'full' for t in tc['layer_types']]}; "
                   f"Gated DeltaNet: {tc['linear_num_key_heads']} q/k heads of {tc['linear_key_head_dim']}, "
                   f"{tc['linear_num_value_heads']} v heads of {tc['linear_value_head_dim']}, conv kernel "
                   f"{tc['linear_conv_kernel_dim']}; attention: {tc['num_attention_heads']} heads, "
                   f"{tc['num_key_value_heads']} kv heads, head_dim {tc['head_dim']}, rotary dims "
                   f"{int(tc['head_dim'] * tc['rope_parameters']['partial_rotary_factor'])}")
    if dense:
        hd = tc.get("head_dim") or tc["hidden_size"] // tc["num_attention_heads"]
        shapes += (f"; attention: {tc['num_attention_heads']} heads, {tc['num_key_value_heads']} kv heads, head_dim "
                   f"{hd}" + ("" if tc.get("head_dim") else " (hidden/heads, not in config.json)"))
    if nums.get("sigmoid_router"):
        if tc["model_type"] == "deepseek_v3":
            shapes += (f"; MLA: {tc['num_attention_heads']} heads, q_lora_rank "
                       + ("null (plain q_proj)" if tc["q_lora_rank"] is None else str(tc["q_lora_rank"]))
                       + f", kv_lora_rank "
                       f"{tc['kv_lora_rank']}, qk_nope_head_dim {tc['qk_nope_head_dim']}, qk_rope_head_dim "
                       f"{tc['qk_rope_head_dim']}, v_head_dim {tc['v_head_dim']}")
        else:
            shapes += (f"; attention: {tc['num_attention_heads']} heads, {tc['num_key_value_heads']} kv heads, "
                       f"head_dim {tc['head_dim']}, rotary dims "
                       f"{int(tc['head_dim'] * tc['rope_parameters']['partial_rotary_factor'])}")
        shapes += (f"; router: n_group {tc['n_group']}, topk_group {tc['topk_group']}, norm_topk_prob "
                   f"{str(tc['norm_topk_prob']).lower()}, routed_scaling_factor {tc['routed_scaling_factor']:g}, "
                   f"{tc['n_shared_experts']} shared expert(s) of width "
                   f"{tc['moe_intermediate_size'] * tc['n_shared_experts']}; experts {tc['moe_intermediate_size']} "
                   f"wide; dense layers {list(range(tc['first_k_dense_replace']))} ({tc['intermediate_size']} wide)")
    lines += [shapes + ".", ""]
    lines += ["## Measured", "",
              f"* max |logits f32 − f64| = {nums['d_f32_vs_f64_logits']:.3e} (max |logit| {nums['logits_absmax']:.2f}); "
              f"max |hidden_states f32 − f64| = {nums['d_f32_vs_f64_hidden']:.3e}"]
    if not hybrid:
        lines += [f"* plain `model.double()` vs the float64 forward: max |Δ logits| = "
                  f"{nums['d_plain_double_vs_f64_logits']:.3e} (why the f64 reference patches the "
                  f"{'three' if dense else 'four'} float32 spots)"]
    else:
        lines += [f"* plain `model.double()` vs the float64 forward: max |Δ logits| = "
                  f"{nums['d_plain_double_vs_f64_logits']:.3e}, max |Δ hidden_states| = "
                  f"{nums['d_plain_double_vs_f64_hidden']:.3e} (why the f64 reference replaces the float32 steps "
                  f"listed above)",
                  f"* Gated DeltaNet outputs (`layer.{{l}}.mixer_output` of the linear-attention layers), float32 "
                  f"(transformers' chunked form) vs float64: max relative difference "
                  f"{nums['rel_f32_vs_f64_mixer']:.3e} (max |Δ| / max |value|, per layer)",
                  f"* sanity: the whole float64 forward with the CHUNKED form of the gated delta rule (transformers' "
                  f"torch_chunk_gated_delta_rule, its float32 casts made float64) instead of the recurrent one: max "
                  f"|Δ logits| = {nums['d_chunked_vs_recurrent_logits']:.3e}, max |Δ hidden_states| = "
                  f"{nums['d_chunked_vs_recurrent_hidden']:.3e}, Gated DeltaNet outputs max relative difference "
                  f"{nums['d_chunked_vs_recurrent_mixer']:.3e} — the two forms are the same function to float64 "
                  f"rounding"]
    if nums["n_moe_layers"] and nums.get("sigmoid_router"):
        lines += [f"* router gap s_(k) − s_(k+1) on the selection score s = sigmoid(z) + bias after the group mask, "
                  f"over {nums['n_router_tokens']} (token, MoE layer) pairs: min "
                  f"{nums['gap_min']:.3e}, median {nums['gap_median']:.3e}, max {nums['gap_max']:.3e}; "
                  f"border tokens (gap < {BORDER_THRESHOLD:g}): {nums['n_border']}"
                  + ("" if not nums["border"] else " — (layer, token, gap): "
                     + ", ".join(f"({i}, {t}, {g:.2e})" for i, t, g in nums["border"]))]
        if "group_gap_min" in nums:
            lines += [f"* group gap (`layer.{{l}}.router_group_gap`): min {nums['group_gap_min']:.3e}, median "
                      f"{nums['group_gap_median']:.3e}; tokens with a group gap < {BORDER_THRESHOLD:g}: "
                      f"{nums['n_group_border']}"]
    elif nums["n_moe_layers"]:
        lines += [f"* router gap p_(k) − p_(k+1) over {nums['n_router_tokens']} (token, MoE layer) pairs: min "
                  f"{nums['gap_min']:.3e}, median {nums['gap_median']:.3e}, max {nums['gap_max']:.3e}; "
                  f"border tokens (gap < {BORDER_THRESHOLD:g}): {nums['n_border']}"
                  + ("" if not nums["border"] else " — (layer, token, gap): "
                     + ", ".join(f"({i}, {t}, {g:.2e})" for i, t, g in nums["border"]))]
    if dense:
        w = nums["windows"]
        lines += ["* attention masks, as transformers built them and checked in the float32 and float64 prompt "
                  "forwards (make_fixtures.py check_attention_masks): "
                  + ", ".join(f"layer {i}: " + ("full causal (j ≤ i)" if v is None else
                                                 f"sliding window {v} (i − {v} < j ≤ i)") for i, v in enumerate(w))
                  + "; value 0 where visible, finfo(dtype).min (float32 / float64) where not"]
        rp = nums["rope"]
        if rp["branch"] is not None:
            names = {0: "unchanged", 1: "smoothed", 2: "divided by factor"}
            lines += ["* rope llama3: inv_freq per rotary pair i (float64, as the float64 forward uses it; "
                      "transformers' float32 buffer agrees to a relative " + f"{rp['rel_f32_vs_f64_inv_freq']:.1e}): "
                      + ", ".join(f"{i}: {v!r} ({names[b]}, wavelen {wl:.3f})"
                                  for i, (v, b, wl) in enumerate(zip(rp["inv_freq_f64"], rp["branch"], rp["wavelen"])))]
    if nums.get("sigmoid_router"):
        rp = nums["rope"]
        lines += [f"* rope {rp['rope_type']}: inv_freq per rotary pair (float64, as the float64 forward uses it; "
                  f"transformers' float32 buffer agrees to a relative {rp['rel_f32_vs_f64_inv_freq']:.1e}): "
                  + ", ".join(f"{i}: {v!r}" for i, v in enumerate(rp["inv_freq_f64"]))
                  + f"; cos/sin scaled by {nums['cos_sin_scale']!r}; attention softmax scale "
                  f"{nums['softmax_scale']!r}"]
    lines += [f"* greedy margins: min {nums['greedy_margin_min']:.3f}, median {nums['greedy_margin_median']:.3f}; "
              f"mean top-1 probability of the prompt logits {nums['mean_top1_prob']:.3f}",
              f"* max |hidden state| {nums['hidden_absmax']:.2f}",
              f"* the f64 reference agrees with an independent plain-numpy float64 forward (make_fixtures.py, "
              f"numpy_f64_forward) to {nums['d_numpy_f64']:.1e} (max |Δ| over hidden_states and logits), with "
              f"identical routing", ""]
    if planted and not planted_note:
        lines += ["## Planted border tokens", "",
                  ("The router row of expert e_(k+1) was nudged along the token's router input so that the "
                   "selection scores s = sigmoid(z) + bias satisfy s(e_k) − s(e_(k+1)) = wanted gap (see "
                   "make_fixtures.py, _plant_sigmoid; the group selection and the chosen experts are unchanged). "
                   if nums.get("sigmoid_router") else
                   "The router row of expert e_(k+1) was nudged along the token's router input so that "
                   "p(e_k) − p(e_(k+1)) = wanted gap (see make_fixtures.py, plant_border_tokens). ")
                  + "Measured gaps are in `layer.{l}.router_gap`.", "",
                  "| layer | token | e_k | e_(k+1) | natural gap | wanted gap | measured gap (f64) |", "|---|---|---|---|---|---|---|"]
        for p in planted:
            lines.append(f"| {p['layer']} | {p['token']} | {p['expert_k']} | {p['expert_k1']} | {p['natural_gap']:.3e} "
                         f"| {p['wanted_gap']:.1e} | {p['measured_gap']:.3e} |")
        lines.append("")
    if planted and planted_note:
        lines += ["## Border tokens planted in the float32 weights", "", planted_note, "",
                  "| layer | token | gap in the float32 weights | gap here (f64) |", "|---|---|---|---|"]
        for p in planted:
            lines.append(f"| {p['layer']} | {p['token']} | {p['wanted_gap']:.1e} | {p['measured_gap']:.3e} |")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------
def build_model(fx: dict):
    cfg_cls, model_cls, module = ARCH[fx["arch"]]
    torch.manual_seed(fx["seed"])
    config = cfg_cls(**fx["config"], **IMPL)
    model = model_cls(config).eval()
    init_weights(model, fx["seed"])
    return model, module


TOKENIZER_WORDS = ["the", "of", "and", "model", "node", "audit", "tensor", "expert", "router", "layer", "rope", "cache"]


def tokenizer_corpus() -> list[str]:
    """The text the converter's tiny tokenizers are trained on (the audit never tokenises these fixtures)."""
    rnd = np.random.Generator(np.random.PCG64(20261201))
    return [" ".join(TOKENIZER_WORDS[i] for i in rnd.integers(0, len(TOKENIZER_WORDS), 12)) for _ in range(2000)]


def write_converter_tokenizer(src: Path, arch: str, vocab_size: int) -> None:
    """The tokenizer convert_hf_to_gguf.py needs beside the weights. llama: a SentencePiece BPE model (320 pieces,
    byte fallback; LlamaModel's _set_vocab_sentencepiece). gpt_oss and deepseek_v3: a byte-level BPE tokenizer.json
    trained by HF tokenizers (GptOssModel's / DeepseekV2Model's _set_vocab_gpt2), as small as the corpus allows
    (the converter pads it to vocab_size with [PAD] tokens)."""
    if arch in ("gpt_oss", "deepseek_v3", "qwen3_next", "qwen3_5_moe"):
        from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, trainers
        tok = Tokenizer(tok_models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(tokenizer_corpus(), trainers.BpeTrainer(
            vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=["<|endoftext|>"], show_progress=False))
        tok.save(str(src / "tokenizer.json"))
        (src / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}))
        return
    import sentencepiece as spm
    (src.parent / "corpus.txt").write_text("\n".join(tokenizer_corpus()))
    spm.SentencePieceTrainer.train(input=str(src.parent / "corpus.txt"), model_prefix=str(src / "tokenizer"),
                                   vocab_size=vocab_size, model_type="bpe", byte_fallback=True,
                                   character_coverage=1.0, bos_id=1, eos_id=2, unk_id=0, pad_id=-1,
                                   num_threads=1, minloglevel=2)


# convert_hf_to_gguf.py run in this process's interpreter. The converter names a byte-level BPE tokenizer's
# pre-tokenizer by hashing how it splits a test text, and stops on a hash it does not list — every tokenizer
# trained here is such a one. For gpt_oss the run sets the name to "gpt-4o" (what the converter writes for
# gpt-oss's own o200k tokenizer), for deepseek_v3 "deepseek-v3" (DeepSeek-V3's own); nothing else of the
# converter is touched.
CONVERTER_PRE = {"gpt_oss": "gpt-4o", "deepseek_v3": "deepseek-v3", "qwen3_next": "qwen2", "qwen3_5_moe": "qwen35"}
# The Qwen3-Next / Qwen3.5 converter classes count multi-token-prediction layers: a checkpoint without `mtp.*`
# tensors and without mtp_num_hidden_layers (ours) stops on an assertion unless --no-mtp is given.
CONVERTER_ARGS = {"qwen3_next": ["--no-mtp"], "qwen3_5_moe": ["--no-mtp"]}
CONVERTER_RUN = """
import runpy, sys
root = sys.argv[1]
sys.path[:0] = [root, root + "/gguf-py"]
pre = sys.argv[2]
if pre:
    import conversion.base
    conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = [root + "/convert_hf_to_gguf.py"] + sys.argv[3:]
runpy.run_path(root + "/convert_hf_to_gguf.py", run_name="__main__")
"""


# The hybrids' float32 cached-vs-uncached greedy check (check_greedy) compares transformers' chunked delta rule
# (prompt) with its recurrent one (cached steps): float32 rounding that depends on the CPU's kernels — 6.6e-5
# (qwen3_next_tiny) and 1.84e-4 (qwen3_5_moe_tiny, over the 1e-4 of the other fixtures) on a machine where the
# folders were not built, logits |max| ~14. The hybrids (folders and GGUF references) use 5e-4; the float64
# check (1e-10) is unchanged.
HYBRID_GREEDY_TOL = 5e-4


def greedy_tol_of(arch: str) -> float:
    return HYBRID_GREEDY_TOL if arch in ("qwen3_5_moe", "qwen3_next", "qwen3_5") else 1e-4


def llama_cpp_gguf(fx: dict, fdir: Path, models_dir: Path, llama_cpp: Path, model_cls, ids, module):
    """models/<folder>.gguf written by llama.cpp's own converter (convert_hf_to_gguf.py --outtype f32) from the
    fixture folder `fdir` (llama_tiny, or gpt_oss_tiny_mxfp4 whose MXFP4 experts it repacks into ggml MXFP4
    blocks), with a tiny tokenizer (the converter needs one, the audit never tokenises), and
    models/<folder>.gguf.reference.safetensors: transformers on the same weights computing what the GGUF means as
    llama.cpp runs it.
    * llama: llama.cpp's converter turns llama3 scaling into rope_freqs factors (f32), inv_freq_i =
      theta^(-2i/d) / factor_i, which the float64 forward then uses exactly (the float32 one keeps transformers'
      own llama3 table: within float32 rounding of it).
    * deepseek_v3 (arch deepseek2): the converter splits kv_b_proj into attn_k_b / attn_v_b, stacks the experts and
      keeps everything F32 (check_deepseek2_gguf). A GGUF carries no yarn mscale (only yarn_log_multiplier =
      0.1 * mscale_all_dim) and llama.cpp computes with mscale = mscale_all_dim (llama_context: "here we assume
      mscale == 1.0f" unless mscale_all_dim != 1): the reference is transformers with that mscale.
    * gpt_oss: a GGUF carries neither swiglu_limit nor yarn's truncate flag; llama.cpp's openai-moe graph uses
      ggml_swiglu_oai with limit 7 and alpha 1.702 and ggml's yarn floors / ceils the correction range
      (ggml_rope_yarn_corr_dims: truncate true). The reference is transformers with those two settings (the
      fixture's own config has swiglu_limit 1.0 and truncate false).
    * qwen3_next (arch qwen3next) and qwen3_5_moe (arch qwen35moe, text model only): converted with --no-mtp (the
      checkpoints have no multi-token-prediction layers); every tensor is the checkpoint's as the converter
      transforms it (qwen_hybrid_gguf_expected, asserted bit for bit). The zero-centred norm weights are stored
      as f32(1 + w) and A_log as ssm_a = f32(-exp(A_log)): exactly what transformers computes from them in
      float32, so the float32 reference is transformers on the folder; the float64 one is transformers with
      w = GGUF - 1 and A_log = log(-ssm_a) in float64 (qwen_hybrid_gguf_f64_state), i.e. on the GGUF's values.
      llama.cpp's graphs compute what transformers does (softmax router, top-k renormalised, sigmoid-gated shared
      expert, NEOX rope on the first rope.dimension_count dims — qwen35moe's interleaved M-RoPE with equal text
      positions is that rope), so no setting differs."""
    name = fdir.name
    arch = fx["arch"]
    out = models_dir / f"{name}.gguf"
    cfg = json.loads((fdir / "config.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / name
        src.mkdir()
        for f in ("config.json", "generation_config.json", "model.safetensors"):
            shutil.copy(fdir / f, src / f)
        write_converter_tokenizer(src, arch, text_config(cfg)["vocab_size"])
        subprocess.run([sys.executable, "-c", CONVERTER_RUN, str(llama_cpp), CONVERTER_PRE.get(arch, ""),
                        str(src), "--outtype", "f32", "--outfile", str(out), *CONVERTER_ARGS.get(arch, [])],
                       check=True, capture_output=True)
    rd = gguf.GGUFReader(str(out))
    if arch == "gpt_oss":
        types = {t.name: t.tensor_type.name for t in rd.tensors}
        want = "MXFP4" if "quantization_config" in cfg else "F32"  # the converter keeps MXFP4; plain experts stay F32
        assert all(types[n] == want for n in types if n.endswith("_exps.weight")), types
        gcfg = json.loads(json.dumps(cfg))
        gcfg["swiglu_limit"] = 7.0
        gcfg["rope_parameters"]["truncate"] = True
        with tempfile.TemporaryDirectory() as tmp:
            for f in ("generation_config.json", "model.safetensors"):
                shutil.copy(fdir / f, Path(tmp) / f)
            (Path(tmp) / "config.json").write_text(json.dumps(gcfg, indent=2))
            m = reload(model_cls, Path(tmp))
        # The GGUF's experts, expanded by the gguf package, are transformers' dequantised ones bit for bit.
        deq = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in rd.tensors if t.name.endswith("_exps.weight")}
        sd = m.state_dict()
        for l in range(cfg["num_hidden_layers"]):
            gu = sd[f"model.layers.{l}.mlp.experts.gate_up_proj"].numpy()  # [E, H, 2I], gate/up interleaved
            dn = sd[f"model.layers.{l}.mlp.experts.down_proj"].numpy()     # [E, I, H]
            assert np.array_equal(deq[f"blk.{l}.ffn_gate_exps.weight"], gu[:, :, 0::2].transpose(0, 2, 1))
            assert np.array_equal(deq[f"blk.{l}.ffn_up_exps.weight"], gu[:, :, 1::2].transpose(0, 2, 1))
            assert np.array_equal(deq[f"blk.{l}.ffn_down_exps.weight"], dn.transpose(0, 2, 1))
        ref, _, nums = compute_reference(m, ids, module)
        weights = {n: t for n, t in sd.items()}
        print(f"   {name}.gguf by llama.cpp's converter: experts {want} (equal to transformers' weights), "
              "swiglu_limit 7 and yarn truncate as llama.cpp runs it")
    elif arch in ("qwen3_next", "qwen3_5_moe"):
        sd = np_load_file(str(fdir / "model.safetensors"))
        check_qwen_hybrid_gguf(rd, sd, cfg, arch)
        st64 = qwen_hybrid_gguf_f64_state(rd, sd, cfg, arch)
        m = reload(model_cls, fdir)
        ref, _, nums = compute_reference(m, ids, module, greedy_tol=HYBRID_GREEDY_TOL, f64_state=st64)
        weights = st_load_file(str(fdir / "model.safetensors"))
        weights.update(st64)
        gcfg = cfg
        print(f"   {name}.gguf by llama.cpp's converter (arch {rd.fields['general.architecture'].contents()}): every "
              "tensor equal to the checkpoint's as the converter transforms it (norms + 1, ssm_a = -exp(A_log), "
              + ("in_proj_qkvz split into attn_qkv / attn_gate" if arch == "qwen3_next" else "v heads tiled")
              + "); float64 reference on the GGUF's f32(1 + w) and f32(-exp(A_log))")
    elif arch == "deepseek_v3":
        check_deepseek2_gguf(rd, np_load_file(str(fdir / "model.safetensors")), cfg)
        gcfg = json.loads(json.dumps(cfg))
        gcfg["rope_parameters"]["mscale"] = gcfg["rope_parameters"]["mscale_all_dim"]
        with tempfile.TemporaryDirectory() as tmp:
            for f in ("generation_config.json", "model.safetensors"):
                shutil.copy(fdir / f, Path(tmp) / f)
            (Path(tmp) / "config.json").write_text(json.dumps(gcfg, indent=2))
            m = reload(model_cls, Path(tmp))
        ref, _, nums = compute_reference(m, ids, module)
        weights = st_load_file(str(fdir / "model.safetensors"))
        print(f"   {name}.gguf by llama.cpp's converter (arch deepseek2): every tensor equal to transformers' "
              f"(kv_b_proj split into attn_k_b / attn_v_b); reference with mscale = mscale_all_dim "
              f"{gcfg['rope_parameters']['mscale']} as llama.cpp runs it")
    else:
        factors = next(np.asarray(t.data, dtype=np.float64) for t in rd.tensors if t.name == "rope_freqs.weight")
        rp = cfg["rope_parameters"]
        hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        inv = 1.0 / (float(rp["rope_theta"]) ** (np.arange(0, hd, 2, dtype=np.float64) / hd)) / factors
        m = reload(model_cls, fdir)
        global rope_inv_freq_f64
        own = rope_inv_freq_f64
        rope_inv_freq_f64 = lambda c: (torch.from_numpy(inv.copy()), None)  # noqa: E731  (the GGUF's rope, f64)
        try:
            ref, _, nums = compute_reference(m, ids, module)
        finally:
            rope_inv_freq_f64 = own
        gcfg = json.loads(json.dumps(cfg))
        gcfg["rope_parameters"] = {"rope_type": "default", "rope_theta": rp["rope_theta"], "_inv_freq": inv.tolist()}
        weights = st_load_file(str(fdir / "model.safetensors"))
        print(f"   {name}.gguf by llama.cpp's converter: rope_freqs {factors.tolist()}")
    nums["d_numpy_f64"] = numpy_check(gcfg, weights, ref)
    nums["E"] = n_experts(cfg)
    save_reference(models_dir / f"{name}.gguf.reference.safetensors", ref, name + ".gguf")
    return (name + ".gguf", nums)


def check_deepseek2_gguf(rd, sd: dict, cfg: dict) -> None:
    """llama.cpp's converter output for a DeepseekV3ForCausalLM checkpoint (arch deepseek2): every tensor is the
    HF one renamed, the experts stacked, kv_b_proj split per head into attn_k_b [n_head, kv_lora_rank,
    qk_nope_head_dim] (the k part TRANSPOSED) and attn_v_b [n_head, v_head_dim, kv_lora_rank] (numpy shapes; GGML ne
    reversed), bit for bit (asserted); and the keys llama.cpp's deepseek2 graph reads."""
    got = {t.name: np.asarray(t.data) for t in rd.tensors}
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in rd.tensors)
    nh, dn, dv, r = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    want = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"],
            "output.weight": sd["lm_head.weight"]}
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        names = [("input_layernorm.weight", "attn_norm.weight"), ("post_attention_layernorm.weight", "ffn_norm.weight"),
                 ("self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"),
                 ("self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"),
                 ("self_attn.o_proj.weight", "attn_output.weight")]
        if cfg.get("q_lora_rank") is None:
            names += [("self_attn.q_proj.weight", "attn_q.weight")]
        else:
            names += [("self_attn.q_a_proj.weight", "attn_q_a.weight"), ("self_attn.q_a_layernorm.weight",
                      "attn_q_a_norm.weight"), ("self_attn.q_b_proj.weight", "attn_q_b.weight")]
        kv_b = sd[p + "self_attn.kv_b_proj.weight"].reshape(nh, dn + dv, r)
        want[b + "attn_k_b.weight"] = kv_b[:, :dn].transpose(0, 2, 1)
        want[b + "attn_v_b.weight"] = kv_b[:, dn:]
        if i < cfg["first_k_dense_replace"]:
            names += [(f"mlp.{w}_proj.weight", f"ffn_{w}.weight") for w in ("gate", "up", "down")]
        else:
            names += [("mlp.gate.weight", "ffn_gate_inp.weight"), ("mlp.gate.e_score_correction_bias", "exp_probs_b.bias")]
            names += [(f"mlp.shared_experts.{w}_proj.weight", f"ffn_{w}_shexp.weight") for w in ("gate", "up", "down")]
            for w in ("gate", "up", "down"):
                want[b + f"ffn_{w}_exps.weight"] = np.stack(
                    [sd[p + f"mlp.experts.{e}.{w}_proj.weight"] for e in range(cfg["n_routed_experts"])])
        want.update({b + g: sd[p + h] for h, g in names})
    assert set(got) == set(want), (sorted(set(got) ^ set(want)))
    for n, a in want.items():
        assert got[n].shape == a.shape and np.array_equal(got[n], a), n
    kv = {f.name: f.contents() for f in rd.fields.values() if f.name.startswith("deepseek2.")}
    rp = cfg["rope_parameters"]
    expect = {"deepseek2.expert_gating_func": 2, "deepseek2.expert_group_count": cfg["n_group"],
              "deepseek2.expert_group_used_count": cfg["topk_group"],
              "deepseek2.leading_dense_block_count": cfg["first_k_dense_replace"],
              "deepseek2.attention.kv_lora_rank": r, "deepseek2.attention.key_length_mla": dn + cfg["qk_rope_head_dim"],
              "deepseek2.attention.value_length_mla": dv, "deepseek2.rope.dimension_count": cfg["qk_rope_head_dim"],
              "deepseek2.attention.head_count_kv": 1}
    for key, v in expect.items():
        assert kv.get(key) == v, (key, kv.get(key), v)
    assert math.isclose(kv["deepseek2.rope.scaling.yarn_log_multiplier"], 0.1 * rp["mscale_all_dim"], rel_tol=1e-6)
    assert "deepseek2.rope.scaling.yarn_attn_factor" not in kv  # llama.cpp derives the factors itself


def qwen_hybrid_gguf_expected(sd: dict, cfg: dict, arch: str) -> dict[str, np.ndarray]:
    """Every tensor llama.cpp's converter (Qwen3NextModel; Qwen3_5MoeTextModel = its _LinearAttentionVReorderBase
    subclass) writes for a Qwen3-Next / Qwen3.5-MoE checkpoint, rebuilt here from the HF tensors in numpy (shapes
    numpy's, GGML ne reversed), independently of the converter's torch code:
    * every RMSNorm weight ending in `norm.weight` except the DeltaNet's gated `linear_attn.norm.weight` gets +1
      (the zero-centred (1 + w) norms become plain ones: attn_norm, post_attention_norm, attn_q_norm,
      attn_k_norm, output_norm); ssm_norm is the gated norm's weight as it is;
    * A_log -> ssm_a = -exp(A_log) (float32, torch.exp as the converter computes it); dt_bias -> ssm_dt.bias;
      conv1d.weight [C, 1, K] -> ssm_conv1d.weight [C, K] (squeezed);
    * qwen3next: in_proj_qkvz [nk * (2 dk + 2 r dv), H] (per key head [q | k | v (r heads) | z (r heads)], r =
      nv / nk) is split into attn_qkv [2 nk dk + nv dv, H] = [q of all key heads | k of all | v of all] (v heads
      stay grouped by key head: v head h belongs to key head h // r) and attn_gate [nv dv, H] = z of all;
      in_proj_ba is ssm_ba as it is (per key head [b (r) | a (r)]);
    * qwen35moe: the v heads are reordered from grouped (h = g r + j) to tiled (h' = j nk + g, key head h' % nk)
      in the v rows of in_proj_qkv (-> attn_qkv; q and k rows unchanged), the rows of in_proj_z (-> attn_gate),
      in_proj_b (-> ssm_beta), in_proj_a (-> ssm_alpha), A_log (before -exp), dt_bias, the v channels of conv1d
      and the columns of out_proj (-> ssm_out);
    * q_proj (query and output gate per head: [nh, 2 hd] rows, q first) is attn_q unchanged; k/v/o_proj ->
      attn_k / attn_v / attn_output;
    * experts stacked (qwen3next: per-expert tensors, torch.stack over e) or split (qwen35moe: gate_up_proj
      [E, 2I, H] -> ffn_gate_exps = [:, :I], ffn_up_exps = [:, I:]); down_proj -> ffn_down_exps [E, H, I];
      mlp.gate -> ffn_gate_inp; shared_expert.{gate,up,down}_proj -> ffn_{gate,up,down}_shexp;
      shared_expert_gate [1, H] -> ffn_gate_inp_shexp (numpy [1, H], ne {H, 1});
    * the vision tower (model.visual.*) is dropped."""
    tc = text_config(cfg)
    pre = "model.language_model." if arch == "qwen3_5_moe" else "model."
    nk, nv = tc["linear_num_key_heads"], tc["linear_num_value_heads"]
    dk, dv, r = tc["linear_key_head_dim"], tc["linear_value_head_dim"], nv // nk
    E = tc["num_experts"]
    one = np.float32(1)

    def tiled(a: np.ndarray, axis: int, hd: int) -> np.ndarray:  # grouped v heads [nk, r, hd] -> tiled [r, nk, hd]
        a = np.moveaxis(a, axis, 0)
        b = a.reshape(nk, r, hd, *a.shape[1:]).swapaxes(0, 1).reshape(a.shape)
        return np.ascontiguousarray(np.moveaxis(b, 0, axis))

    reorder = arch == "qwen3_5_moe"
    want = {"token_embd.weight": sd[pre + "embed_tokens.weight"], "output_norm.weight": sd[pre + "norm.weight"] + one,
            "output.weight": sd["lm_head.weight"]}
    for i, lt in enumerate(tc["layer_types"]):
        p, b = f"{pre}layers.{i}.", f"blk.{i}."
        want[b + "attn_norm.weight"] = sd[p + "input_layernorm.weight"] + one
        want[b + "post_attention_norm.weight"] = sd[p + "post_attention_layernorm.weight"] + one
        if lt == "full_attention":
            for h, g in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
                want[b + g + ".weight"] = sd[p + f"self_attn.{h}.weight"]
            want[b + "attn_q_norm.weight"] = sd[p + "self_attn.q_norm.weight"] + one
            want[b + "attn_k_norm.weight"] = sd[p + "self_attn.k_norm.weight"] + one
        else:
            la = p + "linear_attn."
            a_log, dt_bias = sd[la + "A_log"], sd[la + "dt_bias"]
            conv = sd[la + "conv1d.weight"][:, 0, :]
            out_proj = sd[la + "out_proj.weight"]
            if reorder:
                qkv = sd[la + "in_proj_qkv.weight"]
                want[b + "attn_qkv.weight"] = np.concatenate([qkv[:2 * nk * dk], tiled(qkv[2 * nk * dk:], 0, dv)])
                want[b + "attn_gate.weight"] = tiled(sd[la + "in_proj_z.weight"], 0, dv)
                want[b + "ssm_beta.weight"] = tiled(sd[la + "in_proj_b.weight"], 0, 1)
                want[b + "ssm_alpha.weight"] = tiled(sd[la + "in_proj_a.weight"], 0, 1)
                a_log, dt_bias = tiled(a_log, 0, 1), tiled(dt_bias, 0, 1)
                conv = np.concatenate([conv[:2 * nk * dk], tiled(conv[2 * nk * dk:], 0, dv)])
                out_proj = tiled(out_proj, 1, dv)
            else:
                qkvz = sd[la + "in_proj_qkvz.weight"].reshape(nk, 2 * dk + 2 * r * dv, -1)
                q, k, v, z = np.split(qkvz, [dk, 2 * dk, 2 * dk + r * dv], axis=1)
                H = qkvz.shape[-1]
                want[b + "attn_qkv.weight"] = np.concatenate([q.reshape(-1, H), k.reshape(-1, H), v.reshape(-1, H)])
                want[b + "attn_gate.weight"] = np.ascontiguousarray(z.reshape(-1, H))
                want[b + "ssm_ba.weight"] = sd[la + "in_proj_ba.weight"]
            want[b + "ssm_a"] = (-torch.exp(torch.from_numpy(a_log))).numpy()
            want[b + "ssm_dt.bias"] = dt_bias
            want[b + "ssm_conv1d.weight"] = np.ascontiguousarray(conv)
            want[b + "ssm_norm.weight"] = sd[la + "norm.weight"]
            want[b + "ssm_out.weight"] = out_proj
        want[b + "ffn_gate_inp.weight"] = sd[p + "mlp.gate.weight"]
        if p + "mlp.experts.gate_up_proj" in sd:
            gu = sd[p + "mlp.experts.gate_up_proj"]
            I = gu.shape[1] // 2
            want[b + "ffn_gate_exps.weight"], want[b + "ffn_up_exps.weight"] = gu[:, :I], gu[:, I:]
            want[b + "ffn_down_exps.weight"] = sd[p + "mlp.experts.down_proj"]
        else:
            for w in ("gate", "up", "down"):
                want[b + f"ffn_{w}_exps.weight"] = np.stack([sd[p + f"mlp.experts.{e}.{w}_proj.weight"] for e in range(E)])
        for w in ("gate", "up", "down"):
            want[b + f"ffn_{w}_shexp.weight"] = sd[p + f"mlp.shared_expert.{w}_proj.weight"]
        want[b + "ffn_gate_inp_shexp.weight"] = sd[p + "mlp.shared_expert_gate.weight"]
    return want


def check_qwen_hybrid_gguf(rd, sd: dict, cfg: dict, arch: str) -> dict:
    """llama.cpp's converter output for qwen3_next_tiny (arch qwen3next) / qwen3_5_moe_tiny (arch qwen35moe): the
    tensor set is exactly qwen_hybrid_gguf_expected's, every tensor F32 and bit for bit equal to it, and the keys
    llama.cpp's loader reads have the checkpoint's values. Returns the arch-prefixed keys."""
    tc = text_config(cfg)
    got = {t.name: np.asarray(t.data) for t in rd.tensors}
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in rd.tensors)
    want = qwen_hybrid_gguf_expected(sd, cfg, arch)
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    for n, a in want.items():
        assert got[n].shape == a.shape and np.array_equal(got[n], a), n
    ga = "qwen35moe" if arch == "qwen3_5_moe" else "qwen3next"
    kv = {f.name: f.contents() for f in rd.fields.values() if f.name.startswith(ga + ".")}
    assert rd.fields["general.architecture"].contents() == ga
    rp = tc["rope_parameters"]
    expect = {"block_count": tc["num_hidden_layers"], "embedding_length": tc["hidden_size"],
              "attention.head_count": tc["num_attention_heads"], "attention.head_count_kv": tc["num_key_value_heads"],
              "attention.key_length": tc["head_dim"], "attention.value_length": tc["head_dim"],
              "expert_count": tc["num_experts"], "expert_used_count": tc["num_experts_per_tok"],
              "expert_feed_forward_length": tc["moe_intermediate_size"],
              "expert_shared_feed_forward_length": tc["shared_expert_intermediate_size"],
              "ssm.conv_kernel": tc["linear_conv_kernel_dim"], "ssm.state_size": tc["linear_key_head_dim"],
              "ssm.group_count": tc["linear_num_key_heads"], "ssm.time_step_rank": tc["linear_num_value_heads"],
              "ssm.inner_size": tc["linear_num_value_heads"] * tc["linear_value_head_dim"],
              "attention.recurrent_layers": [t == "linear_attention" for t in tc["layer_types"]],
              "rope.dimension_count": int(tc["head_dim"] * rp["partial_rotary_factor"])}
    if "mrope_section" in rp:
        expect["rope.dimension_sections"] = list(rp["mrope_section"]) + [0] * (4 - len(rp["mrope_section"]))
    for key, v in expect.items():
        assert kv.get(f"{ga}.{key}") == v, (key, kv.get(f"{ga}.{key}"), v)
    assert kv[f"{ga}.rope.freq_base"] == np.float32(rp["rope_theta"])
    assert kv[f"{ga}.attention.layer_norm_rms_epsilon"] == np.float32(tc["rms_norm_eps"])
    # llama.cpp's head_v_dim is ssm.state_size (= linear_key_head_dim): the fixtures have dk = dv
    assert tc["linear_key_head_dim"] == tc["linear_value_head_dim"]
    return kv


def qwen_hybrid_gguf_f64_state(rd, sd: dict, cfg: dict, arch: str) -> dict[str, torch.Tensor]:
    """The float64 HF parameters that the hybrid GGUF describes where its values are not the checkpoint's: the
    zero-centred norm weights w = (GGUF weight) - 1 and A_log = log(-ssm_a), in float64 (ssm_a back in the
    grouped v-head order for qwen35moe). In float32 transformers computes f32(1 + w) and f32(-exp(A_log)) from
    the checkpoint's w and A_log — the GGUF's values bit for bit (check_qwen_hybrid_gguf) — but in float64 it
    would use 1 + w and -exp(A_log) unrounded, which differ from the GGUF's values by up to half a float32 ulp."""
    tc = text_config(cfg)
    pre = "model.language_model." if arch == "qwen3_5_moe" else "model."
    nk, nv = tc["linear_num_key_heads"], tc["linear_num_value_heads"]
    got = {t.name: np.asarray(t.data).astype(np.float64) for t in rd.tensors}
    st = {pre + "norm.weight": got["output_norm.weight"] - 1.0}
    for i, lt in enumerate(tc["layer_types"]):
        p, b = f"{pre}layers.{i}.", f"blk.{i}."
        st[p + "input_layernorm.weight"] = got[b + "attn_norm.weight"] - 1.0
        st[p + "post_attention_layernorm.weight"] = got[b + "post_attention_norm.weight"] - 1.0
        if lt == "full_attention":
            st[p + "self_attn.q_norm.weight"] = got[b + "attn_q_norm.weight"] - 1.0
            st[p + "self_attn.k_norm.weight"] = got[b + "attn_k_norm.weight"] - 1.0
        else:
            ssm_a = got[b + "ssm_a"]
            if arch == "qwen3_5_moe":  # tiled h' = j nk + g back to grouped h = g r + j
                ssm_a = ssm_a.reshape(nv // nk, nk).T.reshape(-1)
            st[p + "linear_attn.A_log"] = np.log(-ssm_a)
    for n, a in st.items():  # the float32 checkpoint value is these rounded (norms) / within a float32 ulp (A_log)
        w = sd[n].astype(np.float64)
        assert np.abs(a - w).max() <= (2.0 ** -23 if n.endswith("A_log") else 2.0 ** -24) * np.maximum(1, np.abs(w)).max(), n
    return {n: torch.from_numpy(np.ascontiguousarray(a)) for n, a in st.items()}


def reload(model_cls, path: Path, dtype=torch.float32):
    extra = {}
    if "quantization_config" in json.loads((path / "config.json").read_text()):  # MXFP4: transformers dequantises
        extra["quantization_config"] = Mxfp4Config(dequantize=True)
    return model_cls.from_pretrained(str(path), dtype=dtype, **IMPL, **extra).eval()


# ---------------------------------------------------------------------------
# MXFP4 (gpt-oss expert weights)
# ---------------------------------------------------------------------------
FP4_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
MXFP4_MODULES_NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def mxfp4_quantise(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Our own quantiser (transformers has no CPU one): w [..., R, C] with rows = output features, C a multiple of
    32 -> blocks U8 [..., R, C/32, 16] (value 2j in the low nibble of byte j, 2j+1 in the high one) and e8m0 scales
    U8 [..., R, C/32] = floor(log2(max|block|)) - 2 + 127 (as gguf.quants.MXFP4 picks it), each value the nearest
    e2m1 (first of ties). Checked against transformers' dequantiser by the caller."""
    *pre, R, C = w.shape
    g = w.reshape(*pre, R, C // 32, 32).astype(np.float32)
    amax = np.abs(g).max(-1)
    e = np.clip(np.where(amax > 0, np.floor(np.log2(np.maximum(amax, 1e-30))) - 2 + 127, 0), 0, 254).astype(np.int32)
    s = np.ldexp(np.float32(1.0), e - 127)[..., None, None]
    idx = np.abs(g[..., None] / s - FP4_E2M1).argmin(-1).astype(np.uint8)
    return (idx[..., 0::2] | (idx[..., 1::2] << 4)).astype(np.uint8), e.astype(np.uint8)


def mxfp4_dequantise_np(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Independent numpy MXFP4 expansion, HF layout: [..., R, G, 16] + [..., R, G] -> float32 [..., R, G*32]."""
    lo, hi = FP4_E2M1[blocks & 15], FP4_E2M1[blocks >> 4]
    v = np.stack([lo, hi], -1).reshape(*blocks.shape[:-1], 32)
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ldexp(v, (scales.astype(np.int32) - 127)[..., None])  # exact; ±inf only on overflow
    return out.reshape(*blocks.shape[:-2], -1).astype(np.float32)


def write_mxfp4_variant(fdir: Path, mdir: Path) -> dict:
    """gpt-oss checkpoint with MXFP4 experts, as the published ones store them: experts.{gate_up,down}_proj
    replaced by *_blocks / *_scales of their [E, out, in] transposes, config.json's quantization_config
    naming mxfp4. Returns the numpy-dequantised plain state dict (for the numpy cross-check)."""
    sd = np_load_file(str(fdir / "model.safetensors"))
    out, plain = {}, {}
    for n, a in sd.items():
        if n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj"):
            blocks, scales = mxfp4_quantise(np.ascontiguousarray(np.swapaxes(a, 1, 2)))
            out[n + "_blocks"], out[n + "_scales"] = blocks, scales
            deq = mxfp4_dequantise_np(blocks, scales)
            ref = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
            assert torch.equal(ref, torch.from_numpy(np.ascontiguousarray(np.swapaxes(deq, 1, 2)))), n
            plain[n] = np.ascontiguousarray(np.swapaxes(deq, 1, 2))
        else:
            out[n] = plain[n] = a
    if mdir.exists():
        shutil.rmtree(mdir)
    mdir.mkdir(parents=True)
    for f in ("generation_config.json",):
        if (fdir / f).exists():
            shutil.copy(fdir / f, mdir / f)
    cfg = json.loads((fdir / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": MXFP4_MODULES_NOT_CONVERTED}
    (mdir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    np_save_file(out, str(mdir / "model.safetensors"), metadata={"format": "pt"})
    return plain


def write_mxfp4_vectors(out_dir: Path) -> None:
    """Test vectors for both MXFP4 layouts: every e8m0 scale 0..255 and every nibble.
    vectors.safetensors: hf.blocks U8 [2, 256, 2, 16] / hf.scales U8 [2, 256, 2] with hf.transformers F32 = transformers'
    _convert_moe_packed_tensors(..., dtype=float32) (its [.., G*32, R] transpose included), and gguf.values F32 =
    gguf.quants.dequantize of vectors.gguf's tensor `mxfp4` (ggml block_mxfp4, 256 rows of 64 values)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.Generator(np.random.PCG64(20261201))
    blocks = rng.integers(0, 256, (2, 256, 2, 16), dtype=np.uint8)
    scales = np.stack([np.arange(256, dtype=np.uint8)] * 2).reshape(2, 256, 1).repeat(2, -1)
    scales[1] = rng.integers(0, 256, (256, 2), dtype=np.uint8)
    blocks[0, :, 0, :8] = np.arange(256, dtype=np.uint8)[:, None] // 16 * 16 + np.arange(8, dtype=np.uint8)  # nibbles
    ref = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32).numpy()
    deq = np.swapaxes(mxfp4_dequantise_np(blocks, scales), 1, 2)
    assert np.array_equal(np.isnan(ref), np.isnan(deq)) and np.array_equal(np.nan_to_num(ref), np.nan_to_num(deq))
    # GGUF: 256 rows x 2 blocks, block = e then 16 bytes; row r's scales are r and a random one.
    raw = np.zeros((256, 2, 17), np.uint8)
    raw[:, 0, 0] = np.arange(256)
    raw[:, 1, 0] = rng.integers(0, 256, 256)
    raw[:, :, 1:] = rng.integers(0, 256, (256, 2, 16))
    w = gguf.GGUFWriter(str(out_dir / "vectors.gguf"), "mxfp4-vectors")
    w.add_tensor("mxfp4", raw.reshape(256, 34), raw_dtype=gguf.GGMLQuantizationType.MXFP4)  # bytes → 256 × 64
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    rd = gguf.GGUFReader(str(out_dir / "vectors.gguf"))
    t = next(t for t in rd.tensors if t.name == "mxfp4")
    with np.errstate(over="ignore", invalid="ignore"):
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    np_save_file({"hf.blocks": blocks, "hf.scales": scales, "hf.transformers": np.ascontiguousarray(ref),
                  "gguf.values": np.ascontiguousarray(values.reshape(256, 64))},
                 str(out_dir / "vectors.safetensors"), metadata={"producer": "scripts/make_fixtures.py"})


def save_reference(path: Path, ref: dict, fx_name: str) -> None:
    meta = {"fixture": fx_name, "producer": "scripts/make_fixtures.py",
            "transformers": PINNED["transformers"], "torch": PINNED["torch"],
            "hidden_states": "[0]=embedding output, [l+1]=output of layer l before the final norm",
            "f64": "float64 forward incl. RMSNorm, softmaxes and rope in float64"}
    if "linear_attention_layers" in ref:
        meta["f64"] = ("float64 forward incl. (1 + w) and gated RMSNorm, softmaxes, rope, the DeltaNet decay and "
                       "the gated delta rule (recurrent form) in float64")
    # One metadata key: safetensors serialises a multi-key metadata map in hash order, which
    # would make re-runs differ byte-wise.
    np_save_file({k: np.ascontiguousarray(v) for k, v in sorted(ref.items())}, str(path),
                 metadata={"kvasir_reference": json.dumps(meta, sort_keys=True)})


def file_sizes(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*") if p.is_file())


def index_lines(fx: dict, models_dir: Path) -> list[str]:
    """models/README.md lines of one fixture (and its variants), from the files on disk, so that a
    run that builds only some fixtures (--only) still writes the full index."""
    name = fx["name"]
    lines = []
    for vname in ([name] + ([name + "_bf16"] if fx.get("bf16_variant") else [])
                  + ([name + "_mxfp4"] if fx.get("mxfp4_variant") else [])):
        vdir = models_dir / vname
        cfg_json = json.loads((vdir / "config.json").read_text())
        tc = text_config(cfg_json)
        ref = np_load_file(str(vdir / "reference.safetensors"))
        moe = [int(x) for x in ref["moe_layers"]]
        E = n_experts(cfg_json)
        weights = (", BF16 weights" if vname.endswith("_bf16")
                   else ", MXFP4 experts (*_blocks / *_scales), F32 elsewhere" if vname.endswith("_mxfp4")
                   else ", F32 weights")
        if "linear_attention_layers" not in ref and not moe:  # dense, attention only
            rp = tc["rope_parameters"]
            hd = tc.get("head_dim") or tc["hidden_size"] // tc["num_attention_heads"]
            win = attention_windows(cfg_json)
            slid = [i for i, w in enumerate(win) if w is not None]
            line = (f"* `{vname}/` — {cfg_json['architectures'][0]}, {tc['num_hidden_layers']} layers, dense MLPs, "
                    f"{tc['num_attention_heads']} heads / {tc['num_key_value_heads']} kv heads, head_dim {hd}, rope "
                    + (f"llama3 (theta {rp['rope_theta']:g}, factor {rp['factor']:g}, low/high_freq_factor "
                       f"{rp['low_freq_factor']:g}/{rp['high_freq_factor']:g}, original_max_position_embeddings "
                       f"{rp['original_max_position_embeddings']})" if rp["rope_type"] == "llama3"
                       else f"theta {rp['rope_theta']:g}")
                    + (", q/k norm" if any(n.endswith("self_attn.q_norm.weight")
                                           for n in np_load_file(str(vdir / "model.safetensors"))) else "")
                    + (", q/k/v bias" if any(n.endswith("self_attn.q_proj.bias")
                                             for n in np_load_file(str(vdir / "model.safetensors"))) else "")
                    + (f", sliding window {win[slid[0]]} on layers {slid} (full: "
                       f"{[i for i in range(len(win)) if i not in slid]})" if slid else ", full causal attention")
                    + (", tied embeddings" if cfg_json.get("tie_word_embeddings") else ""))
            lines.append(line + f", hidden {tc['hidden_size']}, vocab {tc['vocab_size']}" + weights)
            continue
        if "linear_attention_layers" not in ref:
            extra = ""
            if tc.get("model_type") in SIGMOID_ROUTED:  # DeepSeek-V3 / Kimi-K2 / GLM-4.5
                rp = tc["rope_parameters"]
                extra = (f", sigmoid router with e_score_correction_bias, n_group {tc['n_group']} / topk_group "
                         f"{tc['topk_group']}, routed_scaling_factor {tc['routed_scaling_factor']:g}, "
                         f"{tc['n_shared_experts']} shared expert, ")
                if tc["model_type"] == "deepseek_v3":
                    extra += ("MLA (" + ("no q LoRA" if tc["q_lora_rank"] is None else f"q_lora_rank {tc['q_lora_rank']}")
                              + f", kv_lora_rank {tc['kv_lora_rank']}, qk_nope/qk_rope/v head dims "
                              f"{tc['qk_nope_head_dim']}/{tc['qk_rope_head_dim']}/{tc['v_head_dim']}, interleaved rope), "
                              f"rope yarn (factor {rp['factor']:g}, mscale {rp['mscale']:g}, mscale_all_dim "
                              f"{rp['mscale_all_dim']:g})")
                else:
                    extra += (f"{tc['num_attention_heads']} heads / {tc['num_key_value_heads']} kv heads, head_dim "
                              f"{tc['head_dim']}, partial rotary {rp['partial_rotary_factor']:g}, q/k norm, q/k/v bias")
            lines.append(f"* `{vname}/` — {cfg_json['architectures'][0]}, {tc['num_hidden_layers']} layers "
                         f"(MoE: {moe}), {E} experts, top-{tc['num_experts_per_tok']}{extra}, "
                         f"hidden {tc['hidden_size']}, vocab {tc['vocab_size']}" + weights)
            continue
        lin = [int(x) for x in ref["linear_attention_layers"]]
        full = [i for i in range(tc["num_hidden_layers"]) if i not in lin]
        line = (f"* `{vname}/` — {cfg_json['architectures'][0]}"
                + (" (multimodal wrapper: `text_config`, `model.language_model.*`)" if "text_config" in cfg_json
                   else "")
                + f", {tc['num_hidden_layers']} layers (Gated DeltaNet: {lin}, gated attention: {full}; ")
        if E:
            sd_names = np_load_file(str(vdir / "model.safetensors")).keys()
            fused = any(n.endswith("mlp.experts.gate_up_proj") for n in sd_names)
            line += (f"MoE: {moe}), {E} experts, top-{tc['num_experts_per_tok']}, shared expert, "
                     + ("fused 3D expert tensors" if fused else "one tensor per expert"))
        else:
            line += "dense MLPs)"
        if cfg_json.get("tie_word_embeddings"):
            line += ", tied embeddings"
        lines.append(line + f", hidden {tc['hidden_size']}, vocab {tc['vocab_size']}" + weights)
    if fx.get("gguf"):
        cfg_json = json.loads((models_dir / name / "config.json").read_text())
        moe = [int(x) for x in np_load_file(str(models_dir / name / "reference.safetensors"))["moe_layers"]]
        tensors = gguf_tensors(np_load_file(str(models_dir / name / "model.safetensors")), cfg_json, moe)
        worst, _ = verify_gguf(models_dir / f"{name}.q8_0.gguf", tensors, q8=True)
        n_q8 = sum(1 for tname, arr in tensors if is_quantised_in_q8_0(tname, arr))
        lines.append(
            f"* `{name}.gguf` — `{name}` converted to GGUF (arch `qwen3moe`, llama.cpp tensor names, all F32: "
            f"bit-identical values). Reference: `{name}/reference.safetensors`.")
        lines.append(
            f"* `{name}.q8_0.gguf` — the same with {n_q8} matrices in Q8_0 (gguf.quants.quantize); norms and the "
            f"router `ffn_gate_inp` stay F32 as in llama.cpp's converter. Reference: "
            f"`{name}.q8_0.reference.safetensors` (same tensor names as the folders' reference.safetensors), "
            f"computed by transformers on the gguf package's dequantisation of this file (max relative weight "
            f"error {worst:.2e}).")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "fixtures"), help="fixtures folder (default: repo fixtures/)")
    ap.add_argument("--llama-cpp", metavar="DIR",
                    help="llama.cpp's source tree (vendored in the llama-cpp-python sdist: pip download --no-deps "
                         "--no-binary :all: llama-cpp-python) to also write the GGUF that its converter makes of the "
                         "fixtures marked llama_cpp_gguf, with its reference")
    ap.add_argument("--gguf-only", action="store_true",
                    help="with --llama-cpp: do not rebuild the fixture folders; write only the GGUFs llama.cpp's "
                         "converter makes of the folders as they are on disk (fixtures marked llama_cpp_gguf), with "
                         "their references (a folder rebuilt on another CPU may differ by float32 rounding)")
    ap.add_argument("--only", nargs="+", metavar="NAME", choices=[fx["name"] for fx in FIXTURES],
                    help="build only these fixtures (with their _bf16 / .gguf variants) and leave every other "
                         "fixture's files as they are; models/README.md is rebuilt from the files on disk")
    args = ap.parse_args()
    if args.gguf_only and not args.llama_cpp:
        ap.error("--gguf-only needs --llama-cpp DIR")
    setup_torch()
    out_root = Path(args.out)
    models_dir = out_root / "models"
    models_dir.mkdir(parents=True, exist_ok=True)

    # Over ALL fixtures, also with --only: the prompt and the stream must not depend on what is built.
    min_vocab = min(text_config(fx["config"])["vocab_size"] for fx in FIXTURES)
    prompt = np.random.Generator(np.random.PCG64(TOKEN_SEED)).integers(0, min_vocab, PROMPT_LEN)
    ids = torch.tensor(prompt, dtype=torch.int64)
    stream = np.random.Generator(np.random.PCG64(TOKEN_SEED + 1)).integers(0, min_vocab, STREAM_LEN)
    (out_root / "tokens").mkdir(parents=True, exist_ok=True)
    with open(out_root / "tokens" / "default.txt", "w") as f:
        for i in range(0, STREAM_LEN, 16):
            f.write(" ".join(str(int(t)) for t in stream[i:i + 16]) + "\n")

    summary = []
    built = [fx for fx in FIXTURES if not args.only or fx["name"] in args.only]
    for fx in built:
        name = fx["name"]
        print(f"== {name}", flush=True)
        if args.gguf_only:
            _, model_cls, module = ARCH[fx["arch"]]
            for variant in fx.get("llama_cpp_gguf", []):
                summary.append(llama_cpp_gguf(fx, models_dir / (name + variant), models_dir, Path(args.llama_cpp),
                                              model_cls, ids, module))
            continue
        model, module = build_model(fx)
        model_cls = ARCH[fx["arch"]][1]
        planted = plant_border_tokens(model, ids, module, fx.get("plant", []))
        fdir = models_dir / name
        if fdir.exists():
            shutil.rmtree(fdir)
        model.save_pretrained(str(fdir), save_original_format=not fx.get("fused_experts", False))
        cfg_json = json.loads((fdir / "config.json").read_text())
        E = n_experts(cfg_json)

        variants = [(name, fdir, torch.float32, "")]
        plain_weights = {}
        if fx.get("mxfp4_variant"):
            mdir = models_dir / (name + "_mxfp4")
            plain_weights[name + "_mxfp4"] = write_mxfp4_variant(fdir, mdir)
            variants.append((name + "_mxfp4", mdir, torch.float32,
                             f"Weights: `{name}`'s experts quantised to MXFP4 by make_fixtures.py (mxfp4_quantise: "
                             "e8m0 scale floor(log2 max|block|) - 2 + 127 per 32 values, nearest e2m1; transformers has "
                             "no CPU quantiser) and stored as the published gpt-oss checkpoints store them "
                             "(`*_blocks` / `*_scales`, quantization_config mxfp4); every other tensor as in "
                             f"`{name}`. transformers loads it with Mxfp4Config(dequantize=True); its dequantised "
                             "experts equal make_fixtures.py's own numpy expansion bit for bit (asserted), and the "
                             "reference data is transformers on them."))
            write_mxfp4_vectors(out_root / "mxfp4")
        if fx.get("bf16_variant"):
            bdir = models_dir / (name + "_bf16")
            if bdir.exists():
                shutil.rmtree(bdir)
            mb = reload(model_cls, fdir).to(torch.bfloat16)
            mb.save_pretrained(str(bdir))
            variants.append((name + "_bf16", bdir, torch.float32,
                             f"Weights: the float32 weights of `{name}` rounded to BF16 (round-to-nearest-even, "
                             "`model.to(torch.bfloat16)`), saved as BF16. The reference data is computed by "
                             "transformers in float32 (and float64) from these BF16 weights upcast exactly."))

        for vname, vdir, dtype, extra in variants:
            m = reload(model_cls, vdir, dtype)
            # the reloaded model must be the model we saved (bf16: its rounding)
            if vname == name:
                for (n1, p1), (n2, p2) in zip(model.state_dict().items(), m.state_dict().items()):
                    assert n1 == n2 and torch.equal(p1, p2), n1
            ref, stats, nums = compute_reference(m, ids, module, greedy_tol=greedy_tol_of(fx["arch"]))
            weights = ({n: torch.from_numpy(a) for n, a in plain_weights[vname].items()} if vname in plain_weights
                       else st_load_file(str(vdir / "model.safetensors")))
            if vname in plain_weights:  # what transformers holds after loading = our numpy expansion, bit for bit
                for n, t in m.state_dict().items():
                    if n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj"):
                        assert torch.equal(t, weights[n]), n
                ref.update({f"mxfp4.{n}": weights[n].numpy() for n in weights if n.startswith("model.layers.0.mlp.experts.")
                            and not n.endswith("_bias")})
            nums["d_numpy_f64"] = numpy_check(json.loads((vdir / "config.json").read_text()), weights, ref)
            nums["E"] = E
            vplanted = []
            for p in planted:
                q = dict(p)
                q["measured_gap"] = float(stats[p["layer"]][p["token"]])
                if vname == name:
                    assert 0.5 * p["wanted_gap"] < q["measured_gap"] < 2 * p["wanted_gap"], q
                vplanted.append(q)
            save_reference(vdir / "reference.safetensors", ref, vname)
            note = "" if vname == name else (
                f"`{name}` has planted border tokens (see its REFERENCE.md); BF16 rounding of the weights moves "
                "their gaps:")
            (vdir / "REFERENCE.md").write_text(reference_md(fx, json.loads((vdir / "config.json").read_text()),
                                                            ref, nums, vplanted, extra, note))
            summary.append((vname, nums))

        for variant in fx.get("llama_cpp_gguf", []):  # "": the fixture itself; "_mxfp4": its MXFP4 variant
            cdir = models_dir / (name + variant)
            if args.llama_cpp:
                summary.append(llama_cpp_gguf(fx, cdir, models_dir, Path(args.llama_cpp), model_cls, ids, module))
            else:
                print(f"   {cdir.name}.gguf (llama.cpp's converter) kept as it is: no --llama-cpp given")

        if fx.get("gguf"):
            sd = np_load_file(str(fdir / "model.safetensors"))
            moe = moe_layer_ids(model)
            tensors = gguf_tensors(sd, cfg_json, moe)
            write_gguf(models_dir / f"{name}.gguf", name, cfg_json, tensors, q8=False)
            verify_gguf(models_dir / f"{name}.gguf", tensors, q8=False)
            types = write_gguf(models_dir / f"{name}.q8_0.gguf", name, cfg_json, tensors, q8=True)
            worst, deq = verify_gguf(models_dir / f"{name}.q8_0.gguf", tensors, q8=True)
            print(f"   gguf: F32 round trip exact; Q8_0 worst relative error {worst:.3e}")
            # Reference of the Q8_0 file: transformers on its dequantised weights.
            # Written as an HF checkpoint (per-expert names, as save_pretrained writes them) in a
            # temporary folder and loaded with from_pretrained, like any checkpoint.
            hf_sd = hf_state_from_gguf(deq, cfg_json, moe)
            assert set(hf_sd) == set(sd)
            with tempfile.TemporaryDirectory() as tmp:
                shutil.copy(fdir / "config.json", Path(tmp) / "config.json")
                np_save_file(hf_sd, str(Path(tmp) / "model.safetensors"), metadata={"format": "pt"})
                mq = reload(model_cls, Path(tmp))
            refq, statsq, numsq = compute_reference(mq, ids, module)
            numsq["d_numpy_f64"] = numpy_check(cfg_json, {n: torch.from_numpy(a) for n, a in hf_sd.items()}, refq)
            save_reference(models_dir / f"{name}.q8_0.reference.safetensors", refq, name + ".q8_0")
            numsq["E"] = E
            summary.append((name + ".q8_0.gguf", numsq))
            assert sum(1 for t in types.values() if t == "Q8_0") == sum(
                1 for tname, arr in tensors if is_quantised_in_q8_0(tname, arr))

    # ---- index ------------------------------------------------------------------------
    on_disk = [fx for fx in FIXTURES if (models_dir / fx["name"] / "reference.safetensors").exists()]
    if len(on_disk) < len(FIXTURES):
        print("NOTE: models/README.md lists only the fixtures on disk; missing: "
              + ", ".join(fx["name"] for fx in FIXTURES if fx not in on_disk))
    # Bullets of fixtures scripts/train_fixture.py made (their folder holds TRAINING.md) stay as they are.
    old = (models_dir / "README.md").read_text().split("\n") if (models_dir / "README.md").exists() else []
    kept = [ln for ln in old if ln.startswith("* `") and "/`" in ln
            and (models_dir / ln[3:ln.index("/`")] / "TRAINING.md").exists()]
    readme = ["# Fixture models", "",
              "Tiny random models built with Hugging Face transformers by `scripts/make_fixtures.py` "
              "(pinned versions in `scripts/requirements-fixtures.txt`; re-runnable, byte-identical output on "
              "the same machine: the float32 references depend on the CPU's BLAS kernels, ~1e-6). "
              "Each folder holds `config.json`, `model.safetensors` (save_pretrained), `reference.safetensors` "
              "(what transformers computed on a fixed 24-token prompt, float32 and float64) and `REFERENCE.md` "
              "(every reference tensor explained). `--only NAME...` rebuilds some fixtures and leaves the others "
              "untouched.", ""] + [line for fx in on_disk for line in index_lines(fx, models_dir)] + kept + [
              "", "GGUF notes: experts stacked as llama.cpp's converter does (numpy [n_expert, n_ff, n_embd] for "
              "ffn_gate_exps/ffn_up_exps, [n_expert, n_embd, n_ff] for ffn_down_exps); attn_q/attn_k NOT permuted "
              "(qwen3moe uses NEOX rope, llama.cpp permutes only for llama-style rope); the dense layer "
              "(mlp_only_layers) is blk.N.ffn_gate/ffn_up/ffn_down, which stock llama.cpp's qwen3moe graph does "
              "not expect; no tokenizer metadata. `llama_tiny.gguf` is different: written by llama.cpp's own "
              "converter (`--llama-cpp DIR`: convert_hf_to_gguf.py --outtype f32, from the llama-cpp-python sdist) "
              "with a 320-piece SentencePiece tokenizer made for it; attn_q/attn_k permuted for llama.cpp's rope "
              "layout, llama3 scaling as `rope_freqs.weight` factors; its reference "
              "(`llama_tiny.gguf.reference.safetensors`) is transformers with that rope. `gpt_oss_tiny_mxfp4.gguf` "
              "is the same converter's output for gpt_oss_tiny_mxfp4 (arch `gpt-oss`, a byte-level BPE tokenizer "
              "trained for it with HF tokenizers, its pre-tokenizer named `gpt-4o` for the converter), "
              "`gpt_oss_tiny.gguf` for gpt_oss_tiny (F32 experts, split from gate_up_proj and transposed): the MXFP4 "
              "experts repacked into ggml MXFP4 blocks (split into ffn_gate_exps / ffn_up_exps, expanded by the gguf "
              "package to transformers' dequantised experts bit for bit, asserted), attn_sinks, expert biases. A "
              "GGUF carries no swiglu_limit and no yarn truncate flag; llama.cpp computes gpt-oss with limit 7 "
              "(ggml_swiglu_oai) and a floored/ceiled yarn correction range (ggml_rope_yarn_corr_dims), so their "
              "references (`gpt_oss_tiny*.gguf.reference.safetensors`) are transformers with swiglu_limit 7 "
              "and truncate true — not the folder's own settings (1 and false). `deepseek_v3_tiny.gguf`: the same "
              "converter's output for deepseek_v3_tiny (arch `deepseek2`, a byte-level BPE tokenizer trained for it, "
              "pre-tokenizer named `deepseek-v3`; every tensor F32 and equal to the checkpoint's, asserted): MLA as "
              "llama.cpp holds it, kv_b_proj split per head into `attn_k_b` (numpy [n_head, kv_lora_rank, "
              "qk_nope_head_dim], the k part transposed) and `attn_v_b` ([n_head, v_head_dim, kv_lora_rank]), "
              "`attention.head_count_kv` 1, `attention.key_length` / `value_length` the latent sizes (kv_lora_rank + "
              "qk_rope_head_dim / kv_lora_rank), `key_length_mla` / `value_length_mla` the per-head sizes; the "
              "correction bias as `exp_probs_b.bias`, the shared expert as `ffn_*_shexp`. A GGUF carries no yarn "
              "mscale, only `rope.scaling.yarn_log_multiplier` = 0.1 · mscale_all_dim; llama.cpp then computes as if "
              "mscale = mscale_all_dim (cos/sin factor 1, softmax scale still yarn_get_mscale(factor, "
              "mscale_all_dim)² / sqrt(qk head dim)), so `deepseek_v3_tiny.gguf.reference.safetensors` is "
              "transformers with mscale 1.0 — not the folder's 0.707. `qwen3_next_tiny.gguf` (arch `qwen3next`) and "
              "`qwen3_5_moe_tiny.gguf` (arch `qwen35moe`, the text model of the wrapper; vision tower dropped): the "
              "same converter's output (`--no-mtp`, byte-level BPE tokenizers trained for them, pre-tokenizers "
              "named `qwen2` / `qwen35`), every tensor F32 and equal to the checkpoint's as the converter transforms "
              "it (asserted): zero-centred norm weights stored as f32(1 + w) (attn_norm, post_attention_norm, "
              "attn_q_norm, attn_k_norm, output_norm; the gated `ssm_norm` as it is), `ssm_a` = f32(-exp(A_log)), "
              "`ssm_dt.bias` = dt_bias, `ssm_conv1d` squeezed to [channels, K], `attn_q` = q_proj with its "
              "per-head output gate, experts stacked / split into `ffn_{gate,up,down}_exps`, the shared expert "
              "`ffn_*_shexp` with `ffn_gate_inp_shexp`. qwen3next: in_proj_qkvz split into `attn_qkv` ([q of all "
              "key heads | k | v], v heads grouped by key head) and `attn_gate` (z), `ssm_ba` = in_proj_ba as it is "
              "(per key head [b | a]). qwen35moe: v heads reordered from grouped (h = g·r + j) to tiled (j·n_k + g) "
              "in attn_qkv's v rows, attn_gate, `ssm_beta`, `ssm_alpha`, ssm_a, ssm_dt, conv1d's v channels and "
              "ssm_out's columns. Layer kinds: `attention.recurrent_layers` (qwen35moe's `full_attention_interval` "
              "is the converter's default 4, wrong for this fixture; llama.cpp reads recurrent_layers first). "
              "Their references (`*.gguf.reference.safetensors`): float32 = transformers on the folder (which "
              "computes exactly the GGUF's f32(1 + w) and f32(-exp(A_log))); float64 = transformers with w = GGUF − 1 "
              "and A_log = log(−ssm_a) in float64 — the folders' f64 references use the unrounded 1 + w and "
              "differ from these by up to 1.8e-5 in the logits.", "",
              "DeepSeek-V3 family notes (deepseek_v3_tiny, kimi_k2_tiny, glm4_moe_tiny): sigmoid routers with a "
              "nonzero `mlp.gate.e_score_correction_bias` used for the expert SELECTION only (groups: n_group / "
              "topk_group, group score = sum of a group's two largest sigmoid(z) + b), combine weights = sigmoid(z) of "
              "the chosen renormalised (+ 1e-20) and multiplied by routed_scaling_factor; `topk_ids` / "
              "`topk_weights` sorted by descending selection score; `router_gap` measured on the selection score, "
              "`router_group_gap` on the group scores (groups > 1); a shared expert added without a gate; "
              "first_k_dense_replace 1 (layer 0 dense). deepseek_v3_tiny / kimi_k2_tiny: MLA (with / without q "
              "LoRA), interleaved rope on qk_rope_head_dim, yarn with the DeepSeek softmax-scale correction. "
              "glm4_moe_tiny: GQA with q/k/v biases, per-head q/k norm, partial rotary 0.5.", "",
              "Hybrid notes (qwen3_5_moe_tiny, qwen3_next_tiny, qwen3_5_tiny): Gated DeltaNet (linear attention) "
              "and gated full attention in one stack (`layer_types`); RMSNorm weights zero-centred, y = x/rms(x) · "
              "(1 + w), except the DeltaNet's gated norm (w · x/rms(x) · silu(z)); partial rotary (the first "
              "quarter of head_dim). Their `f64.*` references run the gated delta rule in its recurrent form; "
              "`reference.safetensors` adds `linear_attention_layers` and `layer.{l}.mixer_output` (see each "
              "REFERENCE.md). The vision towers of the multimodal wrappers (`model.visual.*`) are never run.", "",
              "Dense notes (llama_tiny, qwen3_tiny, qwen2_tiny, mistral_tiny): attention-only, a SwiGLU MLP in every "
              "layer, no router (`moe_layers` is empty, no router tensors in `reference.safetensors`). Rope llama3 "
              "(llama_tiny): inv_freq_i = theta^(−2i/d) rescaled per wavelength 2π/inv_freq_i: below "
              "original_max_position_embeddings / high_freq_factor unchanged, above original_max_position_embeddings "
              "/ low_freq_factor divided by factor, in between (1 − s)·inv_freq/factor + s·inv_freq with "
              "s = (original_max_position_embeddings / wavelen − low_freq_factor) / (high_freq_factor − "
              "low_freq_factor); cos/sin unscaled. Sliding windows: a sliding layer with window w lets query i see "
              "keys i − w < j ≤ i (the w most recent positions, its own included); which layers slide is "
              "`layer_types` in config.json when present (qwen2_tiny: `use_sliding_window` + `max_window_layers` 1 "
              "give [full, sliding, sliding]), else every layer when `sliding_window` is not null (mistral_tiny). "
              "Tied embeddings (qwen3_tiny): no `lm_head.weight`, the logits use `model.embed_tokens.weight`.", "",
              "gpt-oss notes (gpt_oss_tiny, gpt_oss_tiny_mxfp4): attention sinks, alternating sliding/full layers, "
              "yarn rope, a biased router (softmax over the top-k logits), experts with biases and the clamped "
              "SwiGLU (swiglu_limit 1.0 so the clamps fire), gate_up_proj interleaved as GptOssExperts holds it. "
              "gpt_oss_tiny_mxfp4 stores the experts as MXFP4 (`*_blocks` / `*_scales`, quantised by "
              "make_fixtures.py, dequantised by transformers: its reference.safetensors adds `mxfp4.*`, transformers' "
              "dequantised layer-0 experts). `../mxfp4/vectors.*`: MXFP4 test vectors, every scale and nibble, in "
              "the Hugging Face layout (expanded by transformers) and ggml's block_mxfp4 (expanded by the gguf "
              "package).", "",
              f"`../tokens/default.txt`: the default perplexity stream, {STREAM_LEN} ids uniform from numpy "
              f"PCG64({TOKEN_SEED + 1}) in [0, {min_vocab}) (valid for every fixture).", ""]
    (models_dir / "README.md").write_text("\n".join(readme))

    # ---- summary ----------------------------------------------------------------------
    print()
    print(f"{'fixture':28s} {'moe':>3s} {'gap min':>9s} {'gap med':>9s} {'gap max':>9s} {'border':>7s} "
          f"{'margin min':>10s} {'top1 p':>6s} {'|Δ| f32-f64':>11s} {'|Δ| dbl-f64':>11s} {'|Δ| np-f64':>10s}")
    for vname, n in summary:
        print(f"{vname:28s} {n['n_moe_layers']:3d} {n['gap_min']:9.2e} {n['gap_median']:9.2e} {n['gap_max']:9.2e} "
              f"{n['n_border']:3d}/{n['n_router_tokens']:<3d} {n['greedy_margin_min']:10.3f} "
              f"{n['mean_top1_prob']:6.3f} {n['d_f32_vs_f64_logits']:11.2e} {n['d_plain_double_vs_f64_logits']:11.2e} "
              f"{n['d_numpy_f64']:10.1e}")
    for vname, n in summary:
        if "d_chunked_vs_recurrent_logits" in n:
            print(f"{vname}: f64 chunked vs recurrent delta rule: |Δ logits| {n['d_chunked_vs_recurrent_logits']:.2e}, "
                  f"|Δ hidden| {n['d_chunked_vs_recurrent_hidden']:.2e}, DeltaNet out rel "
                  f"{n['d_chunked_vs_recurrent_mixer']:.2e}; f32 vs f64 DeltaNet out rel {n['rel_f32_vs_f64_mixer']:.2e}")
    print()
    total = 0
    for rel, size in file_sizes(models_dir):
        total += size
        sha = hashlib.sha256((models_dir / rel).read_bytes()).hexdigest()[:12]
        print(f"  {size:10d}  {sha}  models/{rel}")
        assert size < 5 * 1024 * 1024, f"{rel} is over 5 MB"
    print(f"  {total:10d}  total fixtures/models")
    if not any(n["n_border"] for _, n in summary):
        print("NOTE: no border tokens (gap < 1e-3) in any fixture")


if __name__ == "__main__":
    main()
