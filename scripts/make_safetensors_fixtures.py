#!/usr/bin/env python3
"""Write the safetensors reference fixtures with the public reference library.

The C++ reader (lib/kvasir/model/safetensors.cpp) is checked against files
that code nobody here wrote produced: the `safetensors` package (Hugging
Face's Rust implementation) serialises every tensor below, and
fixtures/safetensors/expected.json records each element's IEEE bits in hex so
tests/model/test_safetensors.cpp compares the loaded values bit-exactly.

Outputs (all small, a few KB in total):
  fixtures/safetensors/reference.safetensors   F32/F16/BF16/F64/I32/U8 tensors,
                                               specials (±0, ±inf, NaNs with
                                               payloads, subnormals, extremes),
                                               a scalar, an empty tensor, metadata
  fixtures/safetensors/sharded/                model.safetensors.index.json + 2 shards
  fixtures/safetensors/expected.json           dtype, shape, hex bits, metadata

Re-runnable: the same versions write byte-identical files.
Usage: python3 scripts/make_safetensors_fixtures.py [--out DIR]
"""
import argparse
import json
import pathlib
import sys

import numpy as np
import safetensors
import torch
from safetensors import safe_open
from safetensors.torch import save_file

# The versions these fixtures were produced with. Other versions most likely
# write the same bytes (the format is frozen), but say so loudly if they differ.
PINNED = {"numpy": "2.4.6", "safetensors": "0.8.0", "torch": "2.15.0"}


def check_versions():
    found = {"numpy": np.__version__, "safetensors": safetensors.__version__,
             "torch": torch.__version__.split("+")[0]}
    for name, want in PINNED.items():
        if found[name] != want:
            print(f"warning: {name} {found[name]} is installed; fixtures were pinned with {want}",
                  file=sys.stderr)


F32_SPECIALS = [
    0x00000000, 0x80000000,  # +0, -0
    0x3F800000, 0xBF800000,  # 1, -1
    0x7F800000, 0xFF800000,  # +inf, -inf
    0x7FC00000, 0x7F800001,  # quiet NaN, signalling NaN with payload 1
    0xFFC12345,              # negative quiet NaN with a payload
    0x00000001, 0x007FFFFF,  # smallest and largest subnormal
    0x00800000, 0x7F7FFFFF,  # smallest normal, largest finite
    0x40490FDB, 0x3DCCCCCD,  # pi, 0.1
    0xC2F6E979,              # -123.456
]
F16_VALUES = [
    0x0000, 0x8000, 0x3C00, 0xBC00, 0x7C00, 0xFC00, 0x7E00, 0x7C01,
    0x0001, 0x03FF, 0x0400, 0x7BFF, 0x4248, 0x2E66, 0xD7B6, 0x3555,
]
BF16_VALUES = [
    0x0000, 0x8000, 0x3F80, 0xBF80, 0x7F80, 0xFF80, 0x7FC0, 0x7F81,
    0x0001, 0x007F, 0x0080, 0x7F7F, 0x4049, 0x3DCD, 0xC2F7, 0x3EAB,
    0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0, 0x4100, 0x4110,
]
F64_VALUES = [
    0x0000000000000000, 0x8000000000000000, 0x3FF0000000000000, 0x7FF0000000000000,
    0x7FF8000000000000, 0x7FF0000000000001, 0x0000000000000001, 0x7FEFFFFFFFFFFFFF,
    0x400921FB54442D18, 0x3FB999999999999A,
]


def t_bits(bits, width, torch_dtype, shape):
    np_uint = {16: np.uint16, 32: np.uint32, 64: np.uint64}[width]
    np_int = {16: np.int16, 32: np.int32, 64: np.int64}[width]
    raw = np.array(bits, dtype=np_uint).reshape(shape).view(np_int)
    return torch.from_numpy(raw.copy()).view(torch_dtype)


def reference_tensors():
    rng = np.random.default_rng(20240611)
    random_f32 = rng.standard_normal((3, 5)).astype(np.float32)
    return {
        "f32.specials": t_bits(F32_SPECIALS, 32, torch.float32, (2, 8)),
        "f32.random": torch.from_numpy(random_f32.copy()),
        "f32.scalar": torch.tensor(2.5, dtype=torch.float32),
        "f32.empty": torch.zeros((0, 3), dtype=torch.float32),
        "f16.values": t_bits(F16_VALUES, 16, torch.float16, (4, 4)),
        "bf16.values": t_bits(BF16_VALUES, 16, torch.bfloat16, (2, 3, 4)),
        "f64.values": t_bits(F64_VALUES, 64, torch.float64, (10,)),
        "i32.values": torch.tensor([0, 1, -1, 2147483647, -2147483648], dtype=torch.int32),
        "u8.refused": torch.arange(7, dtype=torch.uint8),
    }


def sharded_tensors():
    """Two layers of a toy model, one layer per shard."""
    rng = np.random.default_rng(7)
    out = {}
    for layer in range(2):
        out[f"model.layers.{layer}.mlp.up_proj.weight"] = torch.from_numpy(
            rng.standard_normal((4, 3)).astype(np.float32))
        out[f"model.layers.{layer}.mlp.down_proj.weight"] = t_bits(
            list(rng.integers(0, 0x7F00, size=12, dtype=np.uint16)), 16, torch.bfloat16, (3, 4))
        out[f"model.layers.{layer}.input_layernorm.weight"] = torch.from_numpy(
            rng.standard_normal(3).astype(np.float16))
    return out


DTYPE_NAME = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
              torch.float64: "F64", torch.int32: "I32", torch.uint8: "U8"}
BITS_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
             torch.float64: torch.int64, torch.int32: torch.int32, torch.uint8: torch.uint8}


def describe(t):
    width = t.element_size() * 8
    ints = t.contiguous().view(BITS_VIEW[t.dtype]).reshape(-1).tolist()
    mask = (1 << width) - 1
    return {"dtype": DTYPE_NAME[t.dtype], "shape": list(t.shape),
            "bits": [f"0x{(v & mask):0{width // 4}x}" for v in ints]}


def read_back(path):
    """What the reference library reads from `path`, described the same way."""
    with safe_open(str(path), framework="pt") as f:
        return {k: describe(f.get_tensor(k)) for k in sorted(f.keys())}, f.metadata() or {}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "safetensors"))
    args = ap.parse_args()
    check_versions()
    out = pathlib.Path(args.out)
    (out / "sharded").mkdir(parents=True, exist_ok=True)

    expected = {"versions": PINNED, "files": {}}

    ref = reference_tensors()
    meta = {"format": "pt", "producer": "scripts/make_safetensors_fixtures.py", "note": "ünïcødé ✓"}
    save_file(ref, str(out / "reference.safetensors"), metadata=meta)
    tensors, md = read_back(out / "reference.safetensors")
    assert tensors == {k: describe(v) for k, v in sorted(ref.items())}, "reference library read back different bits"
    assert md == meta
    expected["files"]["reference.safetensors"] = {"metadata": md, "tensors": tensors}

    shard_src = sharded_tensors()
    weight_map = {}
    total = 0
    for i, layer in enumerate((0, 1)):
        name = f"model-{i + 1:05d}-of-00002.safetensors"
        part = {k: v for k, v in shard_src.items() if k.startswith(f"model.layers.{layer}.")}
        save_file(part, str(out / "sharded" / name), metadata={"format": "pt"})
        for k, v in part.items():
            weight_map[k] = name
            total += v.numel() * v.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "sharded" / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    sharded = {}
    for name in sorted(set(weight_map.values())):
        tensors, _ = read_back(out / "sharded" / name)
        sharded.update(tensors)
    assert sharded == {k: describe(v) for k, v in sorted(shard_src.items())}
    expected["files"]["sharded"] = {"weight_map": index["weight_map"], "tensors": sharded}

    for p in out.rglob("*.safetensors"):
        p.chmod(0o644)  # the library creates 0600 files; fixtures are for everyone to read
    (out / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({size} bytes)")


if __name__ == "__main__":
    main()
