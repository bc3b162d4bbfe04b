#!/usr/bin/env python3
"""Metadata-only fuzz seeds for fuzz_gguf from the fixtures llama.cpp's converter made.

Each seed keeps every `<arch>.*` and `general.*` key of a fixture GGUF (the tokenizer arrays are
dropped: they are large and have their own seeds) and the tensor list of its first two layers and
the globals with one-element data — enough for read_gguf_model_params / model_config_from_gguf to
walk the architecture's whole key set (deepseek2's MLA and router keys, qwen3next / qwen35moe's ssm.*
keys and recurrent_layers) while staying a few KB, so libFuzzer mutates it quickly.

    /tmp/fxvenv/bin/python tests/fuzz/make_gguf_seeds.py     (gguf 0.19 from PyPI)
"""
from pathlib import Path

import gguf
import numpy as np

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "fuzz" / "corpus" / "gguf"


def seed(src: Path, dst: Path) -> None:
    r = gguf.GGUFReader(str(src))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(str(dst), arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name.startswith("tokenizer.") or name == "general.architecture":
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.STRING:
            w.add_key_value(name, bytes(f.parts[-1]).decode(), t)
        elif t == gguf.GGUFValueType.ARRAY:
            sub = f.types[1]
            vals = [f.parts[i].tolist()[0] for i in f.data]
            w.add_key_value(name, [bool(v) for v in vals] if sub == gguf.GGUFValueType.BOOL else vals, t, sub)
        else:
            w.add_key_value(name, f.parts[-1].tolist()[0], t)
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) > 1:
            continue
        w.add_tensor(t.name, np.zeros(1, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(dst, dst.stat().st_size, "bytes")


if __name__ == "__main__":
    for name in ("deepseek_v3_tiny", "qwen3_next_tiny", "qwen3_5_moe_tiny"):
        seed(REPO / "fixtures" / "models" / f"{name}.gguf", OUT / f"seed_{name}.gguf")
