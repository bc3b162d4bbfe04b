#!/usr/bin/env python3
"""Read and write kvasir-equiv captures ("kvasir-equiv/capture/1", protocols/CAPTURE.md).

A capture is a plain safetensors file whose __metadata__ records the node,
protocol, seed and a content hash over metadata and tensors. This module:

  protocol_content_hash(doc)     "sha256:" + SHA-256 of nlohmann's canonical JSON
  canonical_json(doc)            that canonical JSON (sorted keys, no whitespace,
                                 numbers as nlohmann::json::dump writes them)
  content_hash(metadata, tensors)
  write_capture(path, metadata, tensors)
                                 adds format + content_hash, writes with the
                                 `safetensors` package when importable, else
                                 with the small writer below (same container)
  read_capture(path) -> (metadata, tensors)
  verify(path) -> (ok, stored_hash, recomputed_hash)

Command line:
  scripts/capture_format.py verify FILE...      exit 1 if any hash differs
  scripts/capture_format.py show FILE           metadata and tensor list
  scripts/capture_format.py protocol-hash FILE  the protocol's content hash

Only the standard library and numpy are needed.
"""

import hashlib
import json
import math
import os
import struct
import sys
import tempfile
from decimal import Decimal
from pathlib import Path

import numpy as np

FORMAT = "kvasir-equiv/capture/1"

# safetensors dtype name <-> numpy dtype. BF16 has no numpy dtype: pass it as
# ("BF16", uint16 array of bit patterns); the reader returns it that way too.
_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
    "U8": np.dtype("u1"),
}
_NUMPY_TO_ST = {np.dtype("<f8"): "F64", np.dtype("<f4"): "F32", np.dtype("<f2"): "F16",
                np.dtype("<i4"): "I32", np.dtype("<i8"): "I64", np.dtype("u1"): "U8"}


# --- canonical JSON (nlohmann::json::dump(-1), keys in byte order) -------------------
def _nlohmann_string(s):
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\b":
            out.append("\\b")
        elif ch == "\f":
            out.append("\\f")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif o < 0x20:
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)  # ensure_ascii = false: UTF-8 as is
    out.append('"')
    return "".join(out)


def _nlohmann_float(x):
    """nlohmann::detail::to_chars: shortest round-trip digits (Python's repr
    gives the same digits), then format_buffer with min_exp -4, max_exp 15."""
    if not math.isfinite(x):
        return "null"
    if x == 0.0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    sign = "-" if x < 0 else ""
    t = Decimal(repr(abs(x))).as_tuple()
    digits = "".join(str(d) for d in t.digits).lstrip("0")
    exp = t.exponent
    stripped = digits.rstrip("0")
    exp += len(digits) - len(stripped)
    digits = stripped
    k = len(digits)
    n = k + exp  # value = 0.digits * 10^n
    if k <= n <= 15:
        body = digits + "0" * (n - k) + ".0"
    elif 0 < n <= 15:
        body = digits[:n] + "." + digits[n:]
    elif -4 < n <= 0:
        body = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        mant = digits if k == 1 else digits[0] + "." + digits[1:]
        body = f"{mant}e{'-' if e < 0 else '+'}{abs(e):02d}"
    return sign + body


def canonical_json(doc):
    if doc is None:
        return "null"
    if doc is True:
        return "true"
    if doc is False:
        return "false"
    if isinstance(doc, int):
        return str(doc)
    if isinstance(doc, float):
        return _nlohmann_float(doc)
    if isinstance(doc, str):
        return _nlohmann_string(doc)
    if isinstance(doc, (list, tuple)):
        return "[" + ",".join(canonical_json(v) for v in doc) + "]"
    if isinstance(doc, dict):
        keys = sorted(doc, key=lambda k: k.encode("utf-8"))
        return "{" + ",".join(_nlohmann_string(k) + ":" + canonical_json(doc[k]) for k in keys) + "}"
    raise TypeError(f"canonical_json: {type(doc).__name__} is not JSON")


def protocol_content_hash(doc):
    return "sha256:" + hashlib.sha256(canonical_json(doc).encode("utf-8")).hexdigest()


def load_protocol(path):
    """(document, content hash) of a protocol file."""
    def no_duplicates(pairs):
        d = {}
        for k, v in pairs:
            if k in d:
                raise ValueError(f"{path}: duplicate key {k!r}")
            d[k] = v
        return d

    doc = json.loads(Path(path).read_text(encoding="utf-8"), object_pairs_hook=no_duplicates)
    return doc, protocol_content_hash(doc)


# --- tensors ------------------------------------------------------------------------
def _as_tensor(value):
    """(safetensors dtype name, C-contiguous little-endian numpy array)."""
    if isinstance(value, tuple):
        name, arr = value
        if name != "BF16":
            raise ValueError(f"explicit dtype {name!r}: only BF16 is given as (name, uint16 array)")
        return "BF16", np.ascontiguousarray(arr, dtype="<u2")
    arr = np.asarray(value)
    dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder not in ("|",) else arr.dtype
    if dt not in _NUMPY_TO_ST:
        raise ValueError(f"tensor dtype {arr.dtype} is not one of F64, F32, F16, I32, I64, U8 (BF16 as a tuple)")
    return _NUMPY_TO_ST[dt], np.ascontiguousarray(arr, dtype=dt)


def content_hash(metadata, tensors):
    """CAPTURE.md "Content hash": metadata (all keys but content_hash, byte
    order of the key) then tensors (byte order of the name)."""
    h = hashlib.sha256()
    h.update((FORMAT + "\n").encode("utf-8"))
    for key in sorted((k for k in metadata if k != "content_hash"), key=lambda k: k.encode("utf-8")):
        h.update(f"{key}={metadata[key]}\n".encode("utf-8"))
    for name in sorted(tensors, key=lambda k: k.encode("utf-8")):
        st, arr = _as_tensor(tensors[name])
        data = arr.tobytes(order="C")
        shape = ",".join(str(d) for d in arr.shape)
        h.update(f"{name}\n{st}\n{shape}\n{len(data)}\n".encode("utf-8"))
        h.update(data)
    return "sha256:" + h.hexdigest()


# --- the container --------------------------------------------------------------------
def _write_own(path, metadata, tensors):
    """safetensors container: u64 LE header length, JSON header (space-padded
    to a multiple of 8), then the tensor bytes in header order."""
    header = {"__metadata__": dict(metadata)}
    blobs = []
    offset = 0
    for name in sorted(tensors, key=lambda k: k.encode("utf-8")):
        st, arr = _as_tensor(tensors[name])
        data = arr.tobytes(order="C")
        header[name] = {"dtype": st, "shape": [int(d) for d in arr.shape], "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    hjson = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def _write_safetensors_pkg(path, metadata, tensors):
    from safetensors.numpy import save_file  # noqa: import inside: optional dependency

    arrays = {}
    for name, value in tensors.items():
        st, arr = _as_tensor(value)
        if st == "BF16":
            raise ValueError("BF16 through the safetensors package needs torch; use the own writer")
        arrays[name] = arr
    save_file(arrays, str(path), metadata=dict(metadata))


def have_safetensors_package():
    try:
        import safetensors.numpy  # noqa: F401
        return True
    except Exception:
        return False


def write_capture(path, metadata, tensors, writer="auto"):
    """Write a capture atomically. `metadata`: str -> str, every key of
    CAPTURE.md except format/content_hash (added here). writer: "auto" (the
    safetensors package if importable), "safetensors" or "own". Returns the
    content hash."""
    meta = {str(k): str(v) for k, v in metadata.items()}
    meta["format"] = FORMAT
    meta.pop("content_hash", None)
    missing = [k for k in ("node", "capabilities", "protocol_id", "protocol_version", "protocol_hash", "seed",
                           "model_fingerprint", "tool", "steps", "errors") if k not in meta]
    if missing:
        raise ValueError(f"capture metadata lacks {', '.join(missing)}")
    for name in tensors:
        if name == "__metadata__" or not name:
            raise ValueError(f"bad tensor name {name!r}")
    meta["content_hash"] = content_hash(meta, tensors)
    if writer == "auto":
        writer = "safetensors" if have_safetensors_package() else "own"
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=str(path.parent.resolve()))
    os.close(fd)
    try:
        if writer == "safetensors":
            _write_safetensors_pkg(tmp, meta, tensors)
        elif writer == "own":
            _write_own(tmp, meta, tensors)
        else:
            raise ValueError(f"unknown writer {writer!r}")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a capture is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return meta["content_hash"]


class CaptureError(Exception):
    pass


def read_capture(path):
    """(metadata dict, {name: numpy array}); BF16 tensors come back as
    ("BF16", uint16 array). Raises CaptureError on a malformed container."""
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise CaptureError(f"{path}: {len(raw)} bytes: too short for a safetensors header")
    (hlen,) = struct.unpack("<Q", raw[:8])
    if hlen > len(raw) - 8:
        raise CaptureError(f"{path}: header of {hlen} bytes but only {len(raw) - 8} follow (truncated?)")
    try:
        header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CaptureError(f"{path}: header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise CaptureError(f"{path}: header is not a JSON object")
    data = memoryview(raw)[8 + hlen:]
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    spans = []
    for name, info in header.items():
        st = info.get("dtype")
        if st not in _DTYPES:
            raise CaptureError(f"{path}: tensor {name!r}: unknown dtype {st!r}")
        shape = [int(d) for d in info["shape"]]
        b, e = (int(v) for v in info["data_offsets"])
        want = math.prod(shape) * _DTYPES[st].itemsize
        if not (0 <= b <= e <= len(data)) or e - b != want:
            raise CaptureError(f"{path}: tensor {name!r}: data_offsets [{b},{e}] do not fit {st}{shape} "
                               f"in {len(data)} data bytes (truncated?)")
        spans.append((b, e))
        arr = np.frombuffer(data[b:e], dtype=_DTYPES[st]).reshape(shape)
        tensors[name] = ("BF16", arr) if st == "BF16" else arr
    spans.sort()
    pos = 0
    for b, e in spans:
        if b != pos:
            raise CaptureError(f"{path}: tensor data has a hole or overlap at byte {b}")
        pos = e
    if pos != len(data):
        raise CaptureError(f"{path}: {len(data) - pos} bytes after the last tensor")
    return meta, tensors


def verify(path):
    """(ok, stored content hash, recomputed content hash)."""
    meta, tensors = read_capture(path)
    stored = meta.get("content_hash", "")
    computed = content_hash(meta, tensors)
    ok = meta.get("format") == FORMAT and stored == computed
    return ok, stored, computed


def main(argv):
    if len(argv) >= 2 and argv[0] == "verify":
        bad = 0
        for p in argv[1:]:
            try:
                ok, stored, computed = verify(p)
            except CaptureError as e:
                print(f"{p}: REFUSED: {e}")
                bad += 1
                continue
            print(f"{p}: {'OK' if ok else 'CONTENT HASH MISMATCH'} {stored}" + ("" if ok else f" (recomputed {computed})"))
            bad += 0 if ok else 1
        return 1 if bad else 0
    if len(argv) == 2 and argv[0] == "show":
        meta, tensors = read_capture(argv[1])
        for k in sorted(meta):
            print(f"{k} = {meta[k]}")
        for name in sorted(tensors):
            v = tensors[name]
            st, arr = (v if isinstance(v, tuple) else (_NUMPY_TO_ST[v.dtype], v))
            print(f"  {name} {st} {list(arr.shape)}")
        return 0
    if len(argv) == 2 and argv[0] == "protocol-hash":
        print(load_protocol(argv[1])[1])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `show FILE | head` ends quietly
    sys.exit(main(sys.argv[1:]))
