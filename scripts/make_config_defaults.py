#!/usr/bin/env python3
"""What each family's transformers config class makes of a config.json that
gives only the sizes: the reference for the defaults in kvasir's family
records (lib/kvasir/model/families/*.cpp; tests/model/test_config.cpp
ConfigDefaults.*).

For every family, the config class is built with small, distinctive sizes
(hidden_size / num_attention_heads != any class's head_dim default, so a
head_dim field default and the hidden_size // heads fallback tell apart) and
nothing else; the script writes those sizes as the minimal config.json and the
values transformers resolved for the keys every family shares.

Needs transformers (scripts/requirements-fixtures.txt; torch is not needed
for config classes). Usage: make_config_defaults.py [--out fixtures/config_defaults.json]
"""
import argparse
import json
import pathlib

import transformers
from transformers import CONFIG_MAPPING

# model_type → the sizes given (only the keys the class has are passed).
SIZES = {
    "hidden_size": 384, "num_hidden_layers": 4, "num_attention_heads": 32, "vocab_size": 320,
    "intermediate_size": 160, "moe_intermediate_size": 48, "num_experts": 64, "num_local_experts": 64,
    "n_routed_experts": 64, "num_experts_per_tok": 2, "shared_expert_intermediate_size": 48,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "kv_lora_rank": 32, "q_lora_rank": 24,
}
# MLA expands the latent to every head: kvasir needs num_key_value_heads == num_attention_heads, and the
# class default of num_key_value_heads is 128.
OVERRIDES = {"deepseek_v3": {"num_attention_heads": 128}}
MODEL_TYPES = ["qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v3", "qwen3_5_moe_text", "qwen3_next", "llama", "mistral",
               "qwen2", "qwen3", "qwen3_5_text", "olmoe", "gpt_oss", "glm4_moe"]


def resolved(cfg) -> dict:
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    heads = cfg.num_attention_heads
    if getattr(cfg, "kv_lora_rank", None):  # MLA: q·k over nope + rope
        head_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    else:  # the attention classes: getattr(config, "head_dim", None) or hidden_size // num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    sliding = getattr(cfg, "sliding_window", None)
    return {
        "num_key_value_heads": cfg.num_key_value_heads if cfg.num_key_value_heads is not None else heads,
        "head_dim": head_dim,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": rope.get("rope_theta", getattr(cfg, "rope_theta", None)),
        "rope_type": rope.get("rope_type", "default"),
        "partial_rotary_factor": rope.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", None) or 1.0),
        "tie_word_embeddings": bool(cfg.tie_word_embeddings),
        "sliding_window": sliding or 0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "config_defaults.json"))
    args = ap.parse_args()
    out = {"transformers": transformers.__version__, "families": {}}
    for mt in MODEL_TYPES:
        cls = CONFIG_MAPPING[mt]
        known = cls().to_dict()
        sizes = {k: v for k, v in {**SIZES, **OVERRIDES.get(mt, {})}.items() if k in known}
        cfg = cls(**sizes)
        out["families"][mt] = {"config": {"model_type": mt, **sizes}, "transformers": resolved(cfg)}
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
