#!/usr/bin/env python3
"""A deep model with large logits, for the noise-floor protocol test (issue #18).

    make_deep_model.py TEMPLATE_DIR OUT_DIR [--layers 48] [--logit-scale 8] [--seed 1]

TEMPLATE_DIR is a transformers-made qwen3_moe fixture (fixtures/models/qwen3_moe_tiny).
OUT_DIR gets its config.json with num_hidden_layers = --layers (the dense-MLP
layers keep the template's period: layer l is dense iff l mod L0 is) and a
model.safetensors written by the safetensors library: every 2-D weight of layer
l drawn fresh from N(0, sd^2) with sd the template's own weight of layer l mod
L0 (seed --seed), norm weights copied, embeddings copied, and lm_head the
template's times --logit-scale: logits a few tens in size after a deep
residual stream — where correct f32 arithmetic moves them by more than the
default protocol's absolute 1e-3. numpy + safetensors only.
"""
import argparse
import json
import re
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("template")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--logit-scale", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    src = Path(a.template)
    cfg = json.loads((src / "config.json").read_text())
    l0 = cfg["num_hidden_layers"]
    t = load_file(str(src / "model.safetensors"))
    rng = np.random.default_rng(a.seed)
    out = {}
    pat = re.compile(r"^model\.layers\.(\d+)\.(.*)$")
    per_layer = {}
    for name, x in t.items():
        m = pat.match(name)
        if m:
            per_layer.setdefault(int(m.group(1)), {})[m.group(2)] = x
        elif name == "lm_head.weight":
            out[name] = (x * a.logit_scale).astype(np.float32)
        else:
            out[name] = x
    for l in range(a.layers):
        for rest, x in sorted(per_layer[l % l0].items()):
            if x.ndim == 2:
                y = rng.normal(0.0, float(x.std()), x.shape).astype(np.float32)
            else:
                y = x.copy()
            out[f"model.layers.{l}.{rest}"] = y
    cfg["num_hidden_layers"] = a.layers
    cfg["mlp_only_layers"] = [l for l in range(a.layers) if (l % l0) in cfg.get("mlp_only_layers", [])]
    dst = Path(a.out)
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    print(dst, a.layers, "layers")


if __name__ == "__main__":
    main()
