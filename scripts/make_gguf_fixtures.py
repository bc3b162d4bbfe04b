#!/usr/bin/env python3
"""Write the GGUF test fixtures and their reference dequantisation.

Outputs (fixtures/gguf/, a few tens of KB in all):
  types.gguf     one tensor of each dequantisable ggml type (F32, F16, BF16,
                 Q8_0, Q4_K, Q6_K; 1-D, 2-D and 3-D) and metadata of every
                 GGUF value type, scalar and array; general.alignment = 64.
  moe.gguf       a tiny qwen3moe-style model: two layers, four experts,
                 stacked expert tensors (blk.N.ffn_*_exps), router, q/k norms,
                 default alignment (32).
  ref/*.bin      for every tensor of both files, gguf.quants.dequantize of the
                 bytes *read back from the written file* by gguf.GGUFReader,
                 as raw little-endian f32 in row-major order.
  ref/index.json {file: {tensor: {type, ne (ggml order), shape (row-major),
                 bin, sha256 of the bin}}}.
  tests/fuzz/corpus/gguf/seed_*.gguf  small seeds for the libFuzzer target.

The C++ test (tests/model/test_gguf.cpp) dequantises every tensor itself and
requires bit equality with these references, and checks the metadata values
written here (keep the two in sync).

Q4_K and Q6_K: gguf-py 0.19 can dequantise these but not quantise them, so
their blocks are built from seeded random bytes, with the f16 super-block
scales (d, dmin) overwritten by sane positive values so the results are
ordinary finite numbers of weight-like magnitude. Every other byte pattern
(6-bit scales/mins, int8 scales, 4/6-bit quants) is a valid encoding, so these
are legitimate blocks of the format. Q8_0 is quantised with
gguf.quants.quantize from seeded normal data.

Re-run:  python3 scripts/make_gguf_fixtures.py   (deterministic: same bytes).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

PINNED = {"gguf": "0.19.0", "numpy": "2.4.6"}


def check_versions() -> None:
    import importlib.metadata as md

    found = {name: md.version(name) for name in PINNED}
    if found != PINNED:
        sys.exit(f"make_gguf_fixtures.py: pinned {PINNED}, found {found}; install the pinned versions "
                 "(the references must come from a known gguf release)")


ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fixtures" / "gguf"
REF = OUT / "ref"
RNG = np.random.default_rng(20240611)


def f16_bytes(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def random_q4_k(n_blocks: int) -> np.ndarray:
    """Q4_K blocks: f16 d, f16 dmin, 12 bytes of packed 6-bit scales/mins, 128 bytes of nibbles."""
    blocks = RNG.integers(0, 256, size=(n_blocks, 144), dtype=np.uint8)
    blocks[:, 0:2] = f16_bytes(RNG.uniform(0.0002, 0.002, n_blocks))  # d:    |y| ≤ d·63·15 < 2
    blocks[:, 2:4] = f16_bytes(RNG.uniform(0.0001, 0.001, n_blocks))  # dmin: offsets ≤ dmin·63
    return blocks


def random_q6_k(n_blocks: int) -> np.ndarray:
    """Q6_K blocks: 128 bytes ql, 64 bytes qh, 16 int8 scales, f16 d."""
    blocks = RNG.integers(0, 256, size=(n_blocks, 210), dtype=np.uint8)
    blocks[:, 208:210] = f16_bytes(RNG.uniform(0.00005, 0.0003, n_blocks))  # d: |y| ≤ d·128·32 < 1.3
    return blocks


def special_values(n: int, dtype) -> np.ndarray:
    """Normal data with IEEE edge cases mixed in: ±0, ±inf, subnormals, the largest finite."""
    x = RNG.standard_normal(n).astype(np.float32)
    info = np.finfo(dtype)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, float(info.smallest_subnormal), -float(info.smallest_subnormal),
                         float(info.max), -float(info.max), float(info.tiny)], dtype=np.float32)
    x[: len(specials)] = specials
    return x


def add_metadata_of_every_type(w: gguf.GGUFWriter) -> None:
    # Scalars (values mirrored in test_gguf.cpp).
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.1)                # stored as the f32 nearest 0.1
    w.add_bool("test.bool_true", True)
    w.add_bool("test.bool_false", False)
    w.add_string("test.string", "héllo, GGUF ✓")  # UTF-8, multi-byte
    w.add_uint64("test.u64", 18000000000000000000)
    w.add_int64("test.i64", -9000000000000000000)
    w.add_float64("test.f64", 2.718281828459045)
    # Arrays of every non-array type.
    arrays = {
        "test.arr_u8": ([0, 1, 255], VT.UINT8),
        "test.arr_i8": ([-128, 0, 127], VT.INT8),
        "test.arr_u16": ([0, 65535], VT.UINT16),
        "test.arr_i16": ([-32768, 32767], VT.INT16),
        "test.arr_u32": ([1, 2, 3, 4294967295], VT.UINT32),
        "test.arr_i32": ([-1, 0, 1], VT.INT32),
        "test.arr_f32": ([1.5, -2.25, 1e-3], VT.FLOAT32),
        "test.arr_bool": ([True, False, True], VT.BOOL),
        "test.arr_string": (["alpha", "", "γάμμα"], VT.STRING),
        "test.arr_u64": ([0, 18446744073709551615], VT.UINT64),
        "test.arr_i64": ([-9223372036854775808, 9223372036854775807], VT.INT64),
        "test.arr_f64": ([0.5, -1e300], VT.FLOAT64),
    }
    for key, (values, sub) in arrays.items():
        w.add_key_value(key, values, VT.ARRAY, sub_type=sub)


def write_types(path: Path) -> None:
    w = gguf.GGUFWriter(str(path), arch="test")
    w.add_custom_alignment(64)
    add_metadata_of_every_type(w)
    # numpy shapes are row-major; GGUFWriter stores them reversed (ggml ne order).
    w.add_tensor("f32_3d", RNG.standard_normal((2, 3, 32)).astype(np.float32))
    f32 = special_values(8 * 16, np.float32).reshape(8, 16)
    f32[0, 9] = np.float32(1e-45)  # an f32 subnormal survives the copy
    w.add_tensor("f32", f32)
    w.add_tensor("f16", special_values(4 * 24, np.float16).astype(np.float16).reshape(4, 24))
    bf16_src = special_values(3 * 40, np.float32)
    bf16_src[: 9] = 0.0  # bf16 has f32's range: keep the specials simple
    bf16_src[1] = -0.0
    bf16_src[2] = np.inf
    bf16_src[3] = np.float32(1e-40)  # f32 subnormal → bf16 subnormal
    w.add_tensor("bf16", gguf.quants.quantize(bf16_src.reshape(3, 40), QT.BF16), raw_dtype=QT.BF16)
    q8_src = (RNG.standard_normal((4, 96)) * 0.05).astype(np.float32)
    q8_src[1, :32] = 0.0  # an all-zero block: d = 0
    w.add_tensor("q8_0", gguf.quants.quantize(q8_src, QT.Q8_0), raw_dtype=QT.Q8_0)
    w.add_tensor("q8_0_1d", gguf.quants.quantize(RNG.standard_normal(64).astype(np.float32), QT.Q8_0),
                 raw_dtype=QT.Q8_0)
    w.add_tensor("q4_k", random_q4_k(3 * 2).reshape(3, 2 * 144), raw_dtype=QT.Q4_K)      # [3, 512]
    w.add_tensor("q6_k", random_q6_k(2 * 2 * 1).reshape(2, 2, 210), raw_dtype=QT.Q6_K)   # [2, 2, 256]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_moe(path: Path) -> None:
    n_embd, n_ff_exp, n_expert, n_layer, vocab, n_head, n_head_kv, head_dim = 64, 32, 4, 2, 48, 4, 2, 16
    w = gguf.GGUFWriter(str(path), arch="qwen3moe")
    w.add_name("kvasir-tiny-qwen3moe")
    w.add_block_count(n_layer)
    w.add_context_length(128)
    w.add_embedding_length(n_embd)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_token_list([f"tok{i}" for i in range(vocab)])

    def normal(*shape, scale=0.05):
        return (RNG.standard_normal(shape) * scale).astype(np.float32)

    w.add_tensor("token_embd.weight", normal(vocab, n_embd).astype(np.float16))
    w.add_tensor("output_norm.weight", 1.0 + normal(n_embd))
    w.add_tensor("output.weight", gguf.quants.quantize(normal(vocab, n_embd), QT.Q8_0), raw_dtype=QT.Q8_0)
    for i in range(n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", 1.0 + normal(n_embd))
        w.add_tensor(b + "attn_q.weight", normal(n_head * head_dim, n_embd).astype(np.float16))
        w.add_tensor(b + "attn_k.weight", normal(n_head_kv * head_dim, n_embd).astype(np.float16))
        w.add_tensor(b + "attn_v.weight", normal(n_head_kv * head_dim, n_embd).astype(np.float16))
        w.add_tensor(b + "attn_output.weight", normal(n_embd, n_head * head_dim).astype(np.float16))
        w.add_tensor(b + "attn_q_norm.weight", 1.0 + normal(head_dim))
        w.add_tensor(b + "attn_k_norm.weight", 1.0 + normal(head_dim))
        w.add_tensor(b + "ffn_norm.weight", 1.0 + normal(n_embd))
        w.add_tensor(b + "ffn_gate_inp.weight", normal(n_expert, n_embd))
        # Expert stacks, row-major [n_expert, out, in] (ggml ne = [in, out, n_expert]).
        w.add_tensor(b + "ffn_gate_exps.weight", gguf.quants.quantize(normal(n_expert, n_ff_exp, n_embd), QT.Q8_0),
                     raw_dtype=QT.Q8_0)
        w.add_tensor(b + "ffn_up_exps.weight", gguf.quants.quantize(normal(n_expert, n_ff_exp, n_embd), QT.BF16),
                     raw_dtype=QT.BF16)
        w.add_tensor(b + "ffn_down_exps.weight", normal(n_expert, n_embd, n_ff_exp).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_references(files: list[Path]) -> None:
    REF.mkdir(parents=True, exist_ok=True)
    for old in REF.glob("*.bin"):
        old.unlink()
    index: dict[str, dict] = {}
    for path in files:
        reader = gguf.GGUFReader(str(path))
        entries = {}
        for t in reader.tensors:
            values = gguf.quants.dequantize(t.data, t.tensor_type)
            values = np.ascontiguousarray(values, dtype="<f4")
            shape = [int(x) for x in reversed(t.shape.tolist())]
            assert list(values.shape) == shape, (t.name, values.shape, shape)
            raw = values.tobytes()
            bin_name = f"{path.stem}__{t.name}.bin"
            (REF / bin_name).write_bytes(raw)
            entries[t.name] = {
                "type": t.tensor_type.name,
                "ne": [int(x) for x in t.shape.tolist()],
                "shape": shape,
                "bin": bin_name,
                "sha256": hashlib.sha256(raw).hexdigest(),
            }
        index[path.name] = entries
    (REF / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")


def write_fuzz_seeds() -> None:
    """Small seeds for tests/fuzz/fuzz_gguf.cpp: one tensor of each dequantisable
    type with odd alignment, a metadata-only file (arrays, strings), and a copy
    of types.gguf (every value type)."""
    seeds = ROOT / "tests" / "fuzz" / "corpus" / "gguf"
    seeds.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(seeds / "seed_tensors.gguf"), arch="qwen3moe")
    w.add_custom_alignment(8)
    w.add_block_count(1)
    w.add_uint32("k", 1)
    w.add_tensor("blk.0.ffn_up_exps.weight", RNG.standard_normal((2, 1, 4)).astype(np.float32))
    w.add_tensor("f16", RNG.standard_normal(3).astype(np.float16))
    w.add_tensor("bf16", gguf.quants.quantize(RNG.standard_normal(2).astype(np.float32), QT.BF16), raw_dtype=QT.BF16)
    w.add_tensor("q8_0", gguf.quants.quantize(RNG.standard_normal(32).astype(np.float32), QT.Q8_0), raw_dtype=QT.Q8_0)
    w.add_tensor("q4_k", random_q4_k(1).reshape(144), raw_dtype=QT.Q4_K)
    w.add_tensor("q6_k", random_q6_k(1).reshape(210), raw_dtype=QT.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    w = gguf.GGUFWriter(str(seeds / "seed_metadata.gguf"), arch="llama")
    w.add_bool("b", True)
    w.add_int64("i", -5)
    w.add_float64("d", 0.25)
    w.add_key_value("a", ["x", "yz"], VT.ARRAY, sub_type=VT.STRING)
    w.add_key_value("n", [1, 2], VT.ARRAY, sub_type=VT.INT16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (seeds / "seed_types.gguf").write_bytes((OUT / "types.gguf").read_bytes())


def main() -> None:
    check_versions()
    OUT.mkdir(parents=True, exist_ok=True)
    files = [OUT / "types.gguf", OUT / "moe.gguf"]
    write_types(files[0])
    write_moe(files[1])
    write_references(files)
    write_fuzz_seeds()
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    assert total < 2 * 1024 * 1024, f"fixtures too large: {total} bytes"
    print(f"wrote {', '.join(p.name for p in files)} and references to {OUT.relative_to(ROOT)} ({total} bytes)")


if __name__ == "__main__":
    main()
