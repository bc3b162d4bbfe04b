#!/usr/bin/env python3
"""Build the tiny MoE fixtures of kvasir-equiv with Hugging Face transformers.

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
      each: config.json, generation_config.json, model.safetensors (save_pretrained),
            reference.safetensors (below), REFERENCE.md (what every reference tensor is)
  models/qwen3_moe_tiny.gguf            qwen3_moe_tiny converted with gguf.GGUFWriter, all F32
  models/qwen3_moe_tiny.q8_0.gguf       the same with every matrix Q8_0 except the router (F32, as llama.cpp)
  models/qwen3_moe_tiny.q8_0.reference.safetensors
                                        reference data of the Q8_0 file: transformers run on its
                                        dequantised weights (the F32 .gguf holds the very same values
                                        as qwen3_moe_tiny, so qwen3_moe_tiny/reference.safetensors is its reference)
  models/README.md                      index of the above
  tokens/default.txt                    default perplexity stream: STREAM_LEN token ids, whitespace
                                        separated, uniform from numpy PCG64(TOKEN_SEED + 1) in
                                        [0, min vocab of all fixtures), so it is valid for every fixture

The prompt of every fixture is the same PROMPT_LEN ids, uniform from numpy
PCG64(TOKEN_SEED) in [0, min vocab); it is saved as ``input_ids``.

Determinism: torch.manual_seed + a torch.Generator per fixture, numpy PCG64 for
token ids, one CPU thread, torch deterministic algorithms, float32 on CPU,
``attn_implementation="eager"`` and ``experts_implementation="eager"`` (the plain
per-expert loop of transformers). Running it twice gives byte-identical files.

Weights are NOT the std-0.02 transformers init (that gives near-uniform routing
and near-identical logits): matrices are N(0, 1/fan_in) (variance preserving),
the router is N(0, ROUTER_STD^2) so router logits have real gaps, embeddings and
lm_head are large enough that the logits are peaked (greedy decoding is
meaningful), RMSNorm weights are 1 + N(0, 0.2^2) and biases N(0, 0.2^2), so a
forward pass that forgets a norm weight or a bias does not match by accident.

Border tokens: for the audit of "router authority" some tokens must have a
router gap (k-th minus (k+1)-th softmax probability) below 1e-3, so that
backends which run their own router flip them. Random routers rarely produce
one in 24 tokens, so a few are *planted*: on a given layer the router row of
the (k+1)-th expert of the token with the smallest natural gap is nudged along
that token's router input, which moves exactly that expert's logit for that
token by the amount that leaves the wanted gap (solved in float64). The gaps
stay far above float32 noise (~1e-7), so the f32 and f64 references still
route every token identically (asserted). Which ones were planted is written
to REFERENCE.md.

The float64 reference: ``model.double()`` alone is NOT a float64 computation in
transformers 5.24 -- RMSNorm casts to float32, eager attention and the MoE
routers take their softmax in float32 and the rotary embedding computes cos/sin
in float32. The f64 references here are computed with those four functions
replaced by float64 versions of the same formula (``pure_float64`` below);
the difference to plain ``model.double()`` is printed and written to
REFERENCE.md. Every f64 reference is then checked against an independent
plain-numpy float64 forward (``numpy_f64_forward``): they agree to ~1e-14.

Summary table printed at the end, per fixture: number of MoE layers; router
gap p_(k) - p_(k+1) (min / median / max over prompt tokens x MoE layers);
border tokens (gap < 1e-3) / all; smallest greedy margin; mean top-1
probability of the prompt logits; max |logits f32 - f64|; max |logits plain
model.double() - f64|; max |numpy f64 - f64 reference|. Then every file with
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

Usage:  python3 scripts/make_fixtures.py [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import shutil
import sys
import tempfile
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


_check_versions()

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.numpy import load_file as np_load_file  # noqa: E402
from safetensors.numpy import save_file as np_save_file  # noqa: E402
from safetensors.torch import load_file as st_load_file  # noqa: E402
from transformers import (  # noqa: E402
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from transformers.models.mixtral import modeling_mixtral  # noqa: E402
from transformers.models.qwen2_moe import modeling_qwen2_moe  # noqa: E402
from transformers.models.qwen3_moe import modeling_qwen3_moe  # noqa: E402

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

# Every fixture. "config" goes verbatim into the transformers config class; the
# C++ test (tests/model/test_config.cpp) hand-checks the same values.
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
]

ARCH = {
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, modeling_qwen3_moe),
    "mixtral": (MixtralConfig, MixtralForCausalLM, modeling_mixtral),
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM, modeling_qwen2_moe),
}
IMPL = dict(attn_implementation="eager", experts_implementation="eager")


def setup_torch() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)


# ---------------------------------------------------------------------------
# Model structure helpers (transformers 5.24 module layout)
# ---------------------------------------------------------------------------
def moe_block(layer):
    """The sparse MoE block of a decoder layer, or None for a dense layer."""
    mlp = layer.mlp
    return mlp if hasattr(mlp, "experts") else None


def moe_layer_ids(model) -> list[int]:
    return [i for i, layer in enumerate(model.model.layers) if moe_block(layer) is not None]


def router_renormalises(router) -> bool:
    # Mixtral's router divides by the top-k sum unconditionally (modeling_mixtral.MixtralTopKRouter).
    if isinstance(router, modeling_mixtral.MixtralTopKRouter):
        return True
    return bool(router.norm_topk_prob)


# ---------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------
def init_weights(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):  # input/post-attention/final/q/k RMSNorm weights
                p.copy_(1.0 + NORM_WEIGHT_STD * z)
            elif name.endswith(".bias"):
                p.copy_(BIAS_STD * z)
            elif name.endswith("embed_tokens.weight"):
                p.copy_(EMBED_STD * z)
            elif name == "lm_head.weight":
                p.copy_(LM_HEAD_STD * z)
            elif name.endswith("mlp.gate.weight") or name.endswith("shared_expert_gate.weight"):
                p.copy_(ROUTER_STD * z)  # router [E, H] / shared-expert sigmoid gate [1, H]
            else:  # every other matrix: [.., out, in] -> variance preserving
                p.copy_(z / np.sqrt(p.shape[-1]))
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


# ---------------------------------------------------------------------------
# A float64 forward: the four places where transformers computes in float32
# even after model.double(), replaced by float64 versions of the same formula.
# ---------------------------------------------------------------------------
def _rmsnorm_f64(self, hidden_states):
    if hidden_states.dtype != torch.float64:
        raise RuntimeError("pure_float64 used on a non-float64 model")
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _rotary_f64(self, x, position_ids):
    cfg = self.config
    assert cfg.rope_parameters["rope_type"] == "default" and self.attention_scaling == 1.0
    base = float(cfg.rope_parameters["rope_theta"])
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = position_ids[..., None].to(torch.float64) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _router_f64(self, hidden_states):
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    router_probs = torch.softmax(router_logits, dim=-1)
    top_value, top_index = torch.topk(router_probs, self.top_k, dim=-1)
    if router_renormalises(self):
        top_value = top_value / top_value.sum(dim=-1, keepdim=True)
    return router_logits, top_value, top_index


def _eager_attention_f64(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    mod = sys.modules[type(module).__module__]
    key_states = mod.repeat_kv(key, module.num_key_value_groups)
    value_states = mod.repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = torch.softmax(attn_weights, dim=-1)
    attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
    return attn_output, attn_weights


@contextlib.contextmanager
def pure_float64(module):
    saved = []

    def patch(obj, attr, new):
        saved.append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, new)

    for cname in dir(module):
        cls = getattr(module, cname)
        if not isinstance(cls, type) or cls.__module__ != module.__name__:
            continue
        if cname.endswith("RMSNorm"):
            patch(cls, "forward", _rmsnorm_f64)
        elif cname.endswith("RotaryEmbedding"):
            patch(cls, "forward", _rotary_f64)
        elif cname.endswith("TopKRouter"):
            patch(cls, "forward", _router_f64)
    patch(module, "eager_attention_forward", _eager_attention_f64)
    assert len(saved) == 4, [s[1] for s in saved]
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
    layers = model.model.layers
    cap = {"layer_out": {}, "mlp_in": {}, "mlp_out": {}, "router": {}}
    hooks = []
    hooks.append(model.model.embed_tokens.register_forward_hook(
        lambda m, a, o: cap.__setitem__("embed", o.detach().clone())))
    hooks.append(model.model.norm.register_forward_hook(
        lambda m, a, o: cap.__setitem__("final", o.detach().clone())))
    for i, layer in enumerate(layers):
        hooks.append(layer.register_forward_hook(
            lambda m, a, o, i=i: cap["layer_out"].__setitem__(i, (o[0] if isinstance(o, tuple) else o).detach().clone())))
        def mlp_hook(m, a, o, i=i):  # a forward hook must return None (else it replaces the output)
            cap["mlp_in"][i] = a[0].detach().clone()
            cap["mlp_out"][i] = o.detach().clone()

        hooks.append(layer.mlp.register_forward_hook(mlp_hook))
        blk = moe_block(layer)
        if blk is not None:
            hooks.append(blk.gate.register_forward_hook(
                lambda m, a, o, i=i: cap["router"].__setitem__(i, tuple(t.detach().clone() for t in o))))
    try:
        with torch.no_grad():
            out = model(input_ids=ids[None], output_hidden_states=True, output_router_logits=True, use_cache=False)
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
    }
    # Cross-check the hooks against what transformers itself returns.
    hs = out.hidden_states
    assert len(hs) == L + 1
    for i in range(L):
        assert torch.equal(hs[i][0], res["hidden_states"][i]), f"hidden_states[{i}]"
    assert torch.equal(hs[L][0], res["final_hidden"]), "HF hidden_states[-1] is not the final-normed state"
    moe = moe_layer_ids(model)
    assert len(out.router_logits) == len(moe)
    for j, i in enumerate(moe):
        assert torch.equal(out.router_logits[j].reshape(T, -1), res["router"][i][0]), f"router logits {i}"
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


def router_stats(router_logits: torch.Tensor, k: int):
    """gap[t] = p_(k) - p_(k+1): k-th minus (k+1)-th largest softmax probability (f64)."""
    p = torch.softmax(router_logits.to(torch.float64), dim=-1)
    s = torch.sort(p, dim=-1, descending=True).values
    return s[:, k - 1] - s[:, k]


def compute_reference(model, ids: torch.Tensor, module) -> tuple[dict, dict, dict]:
    """Returns (tensors to save, per-token stats, numbers for the report)."""
    L = len(model.model.layers)
    moe = moe_layer_ids(model)
    k = model.config.num_experts_per_tok
    model = model.float().eval()

    r32 = forward_capture(model, ids)
    g_tok, g_margin, g_logits = greedy(model, ids, GREEDY_STEPS)
    check_greedy(model, ids, g_tok, g_logits, tol=1e-4)

    m64 = copy.deepcopy(model).double().eval()
    r64_plain = forward_capture(m64, ids)  # plain model.double(): partly float32 inside
    with pure_float64(module):
        r64 = forward_capture(m64, ids)
        g64_tok, g64_margin, g64_logits = greedy(m64, ids, GREEDY_STEPS)
        check_greedy(m64, ids, g64_tok, g64_logits, tol=1e-10)

    out: dict[str, np.ndarray] = {}
    f32 = lambda t: t.detach().to(torch.float32).contiguous().numpy()  # noqa: E731
    f64 = lambda t: t.detach().to(torch.float64).contiguous().numpy()  # noqa: E731
    i32 = lambda t: t.detach().to(torch.int32).contiguous().numpy()  # noqa: E731

    out["input_ids"] = i32(ids)
    out["moe_layers"] = np.asarray(moe, dtype=np.int32)
    for prefix, r, cv in (("", r32, f32), ("f64.", r64, f64)):
        out[prefix + "hidden_states"] = cv(r["hidden_states"])
        out[prefix + "final_hidden"] = cv(r["final_hidden"])
        out[prefix + "logits"] = cv(r["logits"])
        for i in range(L):
            out[f"{prefix}layer.{i}.mlp_input"] = cv(r["mlp_in"][i])
            out[f"{prefix}layer.{i}.mlp_output"] = cv(r["mlp_out"][i])
        for i in moe:
            logits_, weights_, ids_ = r["router"][i]
            out[f"{prefix}layer.{i}.router_logits"] = cv(logits_)
            out[f"{prefix}layer.{i}.topk_ids"] = i32(ids_)
            out[f"{prefix}layer.{i}.topk_weights"] = cv(weights_)
            out[f"{prefix}layer.{i}.router_gap"] = cv(router_stats(logits_, k))
    out["greedy.tokens"] = i32(g_tok)
    out["greedy.margin"] = f32(g_margin)
    out["greedy.logits"] = f32(g_logits)
    out["f64.greedy.tokens"] = i32(g64_tok)
    out["f64.greedy.margin"] = f64(g64_margin)

    # --- consistency checks ---------------------------------------------------------
    for i in moe:
        # topk ids/weights equal our own softmax/top-k of the router logits (tie-free).
        for r in (r32, r64):
            logits_, weights_, ids_ = r["router"][i]
            p = torch.softmax(logits_.double(), -1)
            v, ix = torch.topk(p, k, -1)
            assert torch.equal(ix, ids_), f"layer {i}: top-k ids differ from softmax top-k"
        # f32 and f64 references must route every token identically.
        assert torch.equal(r32["router"][i][2], r64["router"][i][2]), f"layer {i}: f32 and f64 routing differ"
    assert torch.equal(g_tok, g64_tok), "f32 and f64 greedy continuations differ"
    for name, arr in out.items():
        if arr.dtype.kind == "f":
            assert np.isfinite(arr).all(), name

    gaps = torch.cat([router_stats(r64["router"][i][0], k) for i in moe])
    stats = {}
    for i in moe:
        stats[i] = router_stats(r64["router"][i][0], k)
    p_top = torch.softmax(r32["logits"].double(), -1).max(-1).values
    nums = dict(
        n_moe_layers=len(moe),
        gap_min=float(gaps.min()), gap_median=float(gaps.median()), gap_max=float(gaps.max()),
        n_border=int((gaps < BORDER_THRESHOLD).sum()), n_router_tokens=int(gaps.numel()),
        border=[(i, t, float(stats[i][t])) for i in moe for t in range(len(ids)) if stats[i][t] < BORDER_THRESHOLD],
        greedy_margin_min=float(g_margin.min()), greedy_margin_median=float(g_margin.median()),
        mean_top1_prob=float(p_top.mean()),
        hidden_absmax=float(r32["hidden_states"].abs().max()),
        d_f32_vs_f64_logits=float((r32["logits"].double() - r64["logits"]).abs().max()),
        d_f32_vs_f64_hidden=float((r32["hidden_states"].double() - r64["hidden_states"]).abs().max()),
        d_plain_double_vs_f64_logits=float((r64_plain["logits"] - r64["logits"]).abs().max()),
        logits_absmax=float(r64["logits"].abs().max()),
    )
    return out, stats, nums


# ---------------------------------------------------------------------------
# Planting border tokens
# ---------------------------------------------------------------------------
def plant_border_tokens(model, ids: torch.Tensor, module, targets) -> list[dict]:
    planted = []
    k = model.config.num_experts_per_tok
    used: set[int] = set()
    for layer, want in sorted(targets):
        m64 = copy.deepcopy(model).double().eval()
        with pure_float64(module):
            r = forward_capture(m64, ids)
        x = r["mlp_in"][layer]  # router input [T, H] (f64)
        logits = r["router"][layer][0]  # [T, E] (f64)
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
        router = model.model.layers[layer].mlp.gate
        with torch.no_grad():
            router.weight[e_k1] += (delta * xv / xv.dot(xv)).to(torch.float32)
        planted.append(dict(layer=layer, token=t, expert_k=e_k, expert_k1=e_k1, natural_gap=float(gap[t]),
                            wanted_gap=want, logit_shift=delta))
    return planted


# ---------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------
def n_experts(cfg: dict) -> int:
    # Qwen3MoeConfig maps num_experts -> num_local_experts (attribute_map), so its config.json
    # says "num_local_experts"; Qwen2MoeConfig writes "num_experts".
    return int(cfg["num_experts"] if "num_experts" in cfg else cfg["num_local_experts"])


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
    mt = cfg["model_type"]
    T, H = len(ids), cfg["hidden_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    eps, theta = cfg["rms_norm_eps"], cfg["rope_parameters"]["rope_theta"]
    k = cfg["num_experts_per_tok"]
    renorm = mt == "mixtral" or bool(cfg.get("norm_topk_prob"))

    def rms(x, w):
        return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))

    def silu(x):
        return x / (1.0 + np.exp(-x))

    def lin(name, x):
        y = x @ W[name + ".weight"].T
        return y + W[name + ".bias"] if name + ".bias" in W else y

    def swiglu(prefix, names, x):
        g, u, d = (prefix + n for n in names)
        return lin(d, silu(lin(g, x)) * lin(u, x))

    ang = np.arange(T)[:, None] * (1.0 / theta ** (np.arange(0, hd, 2) / hd))[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]

    def rope(x):  # [T, heads, hd], rotate_half (NEOX) layout
        return x * cos + np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1) * sin

    mask = np.triu(np.full((T, T), -np.inf), 1)
    h = W["model.embed_tokens.weight"][ids]
    hs, topk = [h], {}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        x = rms(h, W[p + "input_layernorm.weight"])
        q = lin(p + "self_attn.q_proj", x).reshape(T, nh, hd)
        kk = lin(p + "self_attn.k_proj", x).reshape(T, nkv, hd)
        v = lin(p + "self_attn.v_proj", x).reshape(T, nkv, hd)
        if p + "self_attn.q_norm.weight" in W:
            q, kk = rms(q, W[p + "self_attn.q_norm.weight"]), rms(kk, W[p + "self_attn.k_norm.weight"])
        q, kk = rope(q), rope(kk)
        att = np.zeros((T, nh, hd))
        for a in range(nh):
            s = q[:, a] @ kk[:, a // (nh // nkv)].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            att[:, a] = (s / s.sum(-1, keepdims=True)) @ v[:, a // (nh // nkv)]
        h = h + lin(p + "self_attn.o_proj", att.reshape(T, nh * hd))
        x = rms(h, W[p + "post_attention_layernorm.weight"])
        m = p + ("block_sparse_moe." if mt == "mixtral" else "mlp.")
        names = ("w1", "w3", "w2") if mt == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        if m + "gate.weight" in W:
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
                    y[t] += w[t, j] * swiglu(f"{m}experts.{idx[t, j]}.", names, x[t:t + 1])[0]
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
    ("layer.{l}.router_logits", "MoE layers only: router gate linear output x.W_g^T (output_router_logits)"),
    ("layer.{l}.topk_ids", "MoE layers only: the k chosen experts per token, as transformers' router returned them "
                           "(torch.topk of the softmax, descending probability)"),
    ("layer.{l}.topk_weights", "MoE layers only: their combine weights as transformers used them (softmax probs, "
                               "renormalised to sum 1 when the architecture does: norm_topk_prob / always for Mixtral)"),
    ("layer.{l}.router_gap", "MoE layers only: p_(k) - p_(k+1), the k-th minus (k+1)-th largest softmax probability "
                             "(computed in f64 from the stored router logits); < 1e-3 = border token"),
    ("greedy.tokens", "greedy continuation of the prompt: GREEDY_STEPS tokens, argmax of the last logits with the "
                      "KV cache, no sampling/penalties/EOS (checked equal to model.generate(do_sample=False) and to "
                      "a no-cache recompute)"),
    ("greedy.margin", "top1 - top2 of the logits that chose each greedy token"),
    ("greedy.logits", "the full logits that chose each greedy token (step i predicts greedy.tokens[i])"),
]


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
    lines += ["`reference.safetensors` (written with the safetensors package). Every tensor is computed on the "
              "weights in this folder's `model.safetensors` as reloaded by `from_pretrained` (float32). "
              "Names without prefix: the float32 forward. Names with prefix `f64.`: a float64 forward "
              "(model.double() with RMSNorm, eager-attention softmax, router softmax and rotary cos/sin also "
              "computed in float64 — plain model.double() keeps those four in float32; see below).", "",
              "| tensor | dtype | shape | what |", "|---|---|---|---|"]
    T, L = PROMPT_LEN, cfg_json["num_hidden_layers"]
    for key, what in DESCRIPTIONS:
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
    lines += [f"Shapes: T = {T} prompt tokens, L = {L} layers, H = {cfg_json['hidden_size']}, "
              f"V = {cfg_json['vocab_size']}, E = {nums['E']} experts, k = {cfg_json['num_experts_per_tok']}.", ""]
    lines += ["## Measured", "",
              f"* max |logits f32 − f64| = {nums['d_f32_vs_f64_logits']:.3e} (max |logit| {nums['logits_absmax']:.2f}); "
              f"max |hidden_states f32 − f64| = {nums['d_f32_vs_f64_hidden']:.3e}",
              f"* plain `model.double()` vs the float64 forward: max |Δ logits| = "
              f"{nums['d_plain_double_vs_f64_logits']:.3e} (why the f64 reference patches the four float32 spots)",
              f"* router gap p_(k) − p_(k+1) over {nums['n_router_tokens']} (token, MoE layer) pairs: min "
              f"{nums['gap_min']:.3e}, median {nums['gap_median']:.3e}, max {nums['gap_max']:.3e}; "
              f"border tokens (gap < {BORDER_THRESHOLD:g}): {nums['n_border']}"
              + ("" if not nums["border"] else " — (layer, token, gap): "
                 + ", ".join(f"({i}, {t}, {g:.2e})" for i, t, g in nums["border"])),
              f"* greedy margins: min {nums['greedy_margin_min']:.3f}, median {nums['greedy_margin_median']:.3f}; "
              f"mean top-1 probability of the prompt logits {nums['mean_top1_prob']:.3f}",
              f"* max |hidden state| {nums['hidden_absmax']:.2f}",
              f"* the f64 reference agrees with an independent plain-numpy float64 forward (make_fixtures.py, "
              f"numpy_f64_forward) to {nums['d_numpy_f64']:.1e} (max |Δ| over hidden_states and logits), with "
              f"identical routing", ""]
    if planted and not planted_note:
        lines += ["## Planted border tokens", "",
                  "The router row of expert e_(k+1) was nudged along the token's router input so that "
                  "p(e_k) − p(e_(k+1)) = wanted gap (see make_fixtures.py, plant_border_tokens). Measured gaps "
                  "are in `layer.{l}.router_gap`.", "",
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


def reload(model_cls, path: Path, dtype=torch.float32):
    return model_cls.from_pretrained(str(path), dtype=dtype, **IMPL).eval()


def save_reference(path: Path, ref: dict, fx_name: str) -> None:
    meta = {"fixture": fx_name, "producer": "scripts/make_fixtures.py",
            "transformers": PINNED["transformers"], "torch": PINNED["torch"],
            "hidden_states": "[0]=embedding output, [l+1]=output of layer l before the final norm",
            "f64": "float64 forward incl. RMSNorm, softmaxes and rope in float64"}
    # One metadata key: safetensors serialises a multi-key metadata map in hash order, which
    # would make re-runs differ byte-wise.
    np_save_file({k: np.ascontiguousarray(v) for k, v in sorted(ref.items())}, str(path),
                 metadata={"kvasir_reference": json.dumps(meta, sort_keys=True)})


def file_sizes(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "fixtures"), help="fixtures folder (default: repo fixtures/)")
    args = ap.parse_args()
    setup_torch()
    out_root = Path(args.out)
    models_dir = out_root / "models"
    models_dir.mkdir(parents=True, exist_ok=True)

    min_vocab = min(fx["config"]["vocab_size"] for fx in FIXTURES)
    prompt = np.random.Generator(np.random.PCG64(TOKEN_SEED)).integers(0, min_vocab, PROMPT_LEN)
    ids = torch.tensor(prompt, dtype=torch.int64)
    stream = np.random.Generator(np.random.PCG64(TOKEN_SEED + 1)).integers(0, min_vocab, STREAM_LEN)
    (out_root / "tokens").mkdir(parents=True, exist_ok=True)
    with open(out_root / "tokens" / "default.txt", "w") as f:
        for i in range(0, STREAM_LEN, 16):
            f.write(" ".join(str(int(t)) for t in stream[i:i + 16]) + "\n")

    summary = []
    index_lines = []
    for fx in FIXTURES:
        name = fx["name"]
        print(f"== {name}", flush=True)
        model, module = build_model(fx)
        model_cls = ARCH[fx["arch"]][1]
        planted = plant_border_tokens(model, ids, module, fx.get("plant", []))
        fdir = models_dir / name
        if fdir.exists():
            shutil.rmtree(fdir)
        model.save_pretrained(str(fdir))
        cfg_json = json.loads((fdir / "config.json").read_text())
        E = n_experts(cfg_json)

        variants = [(name, fdir, torch.float32, "")]
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
            ref, stats, nums = compute_reference(m, ids, module)
            nums["d_numpy_f64"] = numpy_check(json.loads((vdir / "config.json").read_text()),
                                              st_load_file(str(vdir / "model.safetensors")), ref)
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
            index_lines.append(f"* `{vname}/` — {cfg_json['architectures'][0]}, {cfg_json['num_hidden_layers']} layers "
                               f"(MoE: {[int(x) for x in ref['moe_layers']]}), {E} experts, top-{cfg_json['num_experts_per_tok']}, "
                               f"hidden {cfg_json['hidden_size']}, vocab {cfg_json['vocab_size']}"
                               + (", BF16 weights" if vname.endswith("_bf16") else ", F32 weights"))

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
            n_q8 = sum(1 for t in types.values() if t == "Q8_0")
            index_lines.append(
                f"* `{name}.gguf` — `{name}` converted to GGUF (arch `qwen3moe`, llama.cpp tensor names, all F32: "
                f"bit-identical values). Reference: `{name}/reference.safetensors`.")
            index_lines.append(
                f"* `{name}.q8_0.gguf` — the same with {n_q8} matrices in Q8_0 (gguf.quants.quantize); norms and the "
                f"router `ffn_gate_inp` stay F32 as in llama.cpp's converter. Reference: "
                f"`{name}.q8_0.reference.safetensors` (same tensor names as the folders' reference.safetensors), "
                f"computed by transformers on the gguf package's dequantisation of this file (max relative weight "
                f"error {worst:.2e}).")

    # ---- index ------------------------------------------------------------------------
    readme = ["# Fixture models", "",
              "Tiny random MoE models built with Hugging Face transformers by `scripts/make_fixtures.py` "
              "(pinned versions in `scripts/requirements-fixtures.txt`; re-runnable, byte-identical output). "
              "Each folder holds `config.json`, `model.safetensors` (save_pretrained), `reference.safetensors` "
              "(what transformers computed on a fixed 24-token prompt, float32 and float64) and `REFERENCE.md` "
              "(every reference tensor explained).", ""] + index_lines + [
              "", "GGUF notes: experts stacked as llama.cpp's converter does (numpy [n_expert, n_ff, n_embd] for "
              "ffn_gate_exps/ffn_up_exps, [n_expert, n_embd, n_ff] for ffn_down_exps); attn_q/attn_k NOT permuted "
              "(qwen3moe uses NEOX rope, llama.cpp permutes only for llama-style rope); the dense layer "
              "(mlp_only_layers) is blk.N.ffn_gate/ffn_up/ffn_down, which stock llama.cpp's qwen3moe graph does "
              "not expect; no tokenizer metadata.", "",
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
