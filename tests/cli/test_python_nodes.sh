#!/usr/bin/env bash
# External runtimes as nodes (issue 8): the numpy RNG is bit-identical to
# kvasir's, scripts/numpy_node.py writes a valid capture of step 1 that
# `compare` judges fit against a cpu-ref capture, a float64 numpy node agrees
# with the oracle to ~1e-12, both container writers (the safetensors package
# and capture_format.py's own) give the same content hash, and a tampered or
# truncated capture is refused (exit 2, naming the content hash). The torch
# node: tests/cli/test_torch_node.sh.
# Usage: test_python_nodes.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# The interpreter (common.sh, test_python): ./scripts/test's venv with the
# pinned numpy and safetensors (KVASIR_TEST_PYTHON), else one found — Debian's
# /usr/bin/python3 has numpy (scripts/setup.sh installs python3-numpy). None
# with numpy is a FAILURE, never a skip: setup guarantees one.
py=$(test_python numpy)
if [ -z "$py" ]; then
  echo "FAIL: no python3 with numpy (KVASIR_TEST_PYTHON=${KVASIR_TEST_PYTHON:-unset}, PYTHON=${PYTHON:-unset}," \
    "python3 on PATH: $(command -v python3 || echo none); ./scripts/test makes BUILD/pyvenv: scripts/setup_python.sh)"
  echo "1 failed"
  exit 1
fi
echo "using $py (numpy $("$py" -c 'import numpy; print(numpy.__version__)'))"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ci=protocols/ci.json

# The vectorised RNG against fixtures/rng_vectors.json and rng_reference.py.
"$py" scripts/kvasir_rng.py --check --cases 100 >"$tmp/rng.out" 2>&1
check "kvasir_rng.py --check: bit-identical to the fixture and the reference" test $? -eq 0
grep -q "OK" "$tmp/rng.out" || cat "$tmp/rng.out"

# The numpy node's Gated DeltaNet ops on cases worked by hand (both dtypes).
# conv, C = 1, K = 3, history (1, 2), x (3, −1), w (1, 0.5, −1):
#   t0: 1·1 + 0.5·2 − 1·3 = −1;  t1: 1·2 + 0.5·3 − 1·(−1) = 4.5;  then silu.
# delta rule, nk = nv = 1, dk = 2, dv = 1, A_log = 0, a = dt_bias = 0 (decay
# exp(−softplus 0) = 1/2), b = 0 (β = 1/2), S = (2, 0):
#   t0: q (3,4) → (0.6,0.8)/√2, k (0,5) → (0,1), v 3: S = (1, 0), m = 0,
#       δ = 1.5, S = (1, 1.5), out = (0.6 + 1.2)/√2
#   t1: q = k = (1,0), v 0: S = (0.5, 0.75), m = 0.5, δ = −0.25,
#       S = (0.25, 0.75), out = 0.25/√2
# (l2norm's eps 1e-6 moves the results by ~1e-7 relative.)
"$py" - >"$tmp/hand.out" 2>&1 <<'EOF'
import math, sys
sys.path.insert(0, "scripts")
import numpy as np
import numpy_node
bad = 0
for dt in ("float32", "float64"):
    be = numpy_node.NumpyOps(dt)
    t = lambda a: be.tensor(np.array(a, dtype=np.float64))
    silu = lambda x: x / (1 + math.exp(-x))
    cases = []
    y = be.causal_conv1d_silu(t([[3], [-1]]), t([[1, 0.5, -1]]), t([[1], [2]]))
    cases.append(("causal_conv1d", y, np.array([[silu(-1.0)], [silu(4.5)]])))
    out = be.gated_delta(t([[[3, 4]], [[1, 0]]]), t([[[0, 5]], [[1, 0]]]), t([[[3]], [[0]]]), t([[0], [0]]),
                         t([[0], [0]]), t([0]), t([0]), t([[[2], [0]]]))
    cases.append(("gated_delta", out, np.array([[[1.8 / math.sqrt(2)]], [[0.25 / math.sqrt(2)]]])))
    # gpt-oss: q = 0, so every visible key weighs 1/(n + e^sink); window 1: each query sees only its own key;
    # clamped SwiGLU at g = 10 → 7, u = −9 → −7: (−7 + 1)·7·σ(7·1.702).
    q = t(np.zeros((2, 2, 2)))
    k, v = [t([[1, 2], [-3, 4], [0.5, 6]])], [t([[1, 2], [3, 4], [5, 6]])]
    cases.append(("attention sinks", be.attention(q, k, v, 0.5, 0, t([0.0, math.log(2.0)])),
                  np.array([[4 / 3, 6 / 3, 4 / 4, 6 / 4], [9 / 4, 12 / 4, 9 / 5, 12 / 5]])))
    cases.append(("attention window", be.attention(q, k, v, 0.5, 1), np.array([[3, 4, 3, 4], [5, 6, 5, 6]], dtype=float)))
    cases.append(("clamped_swiglu", be.clamped_swiglu(t([10.0, 0.0]), t([-9.0, 5.0]), 1.702, 7.0),
                  np.array([-6 * 7 / (1 + math.exp(-7 * 1.702)), 0.0])))
    for name, got, w in cases:
        rel = float(np.max(np.abs(got.astype(np.float64) - w)) / np.max(np.abs(w)))
        ok = got.dtype == np.dtype(dt) and got.shape == w.shape and rel <= 1e-6
        print(f"{dt} {name}: {got.ravel().tolist()} want {w.ravel().tolist()} rel {rel:.1e}")
        bad += not ok
sys.exit(1 if bad else 0)
EOF
check "numpy node: causal_conv1d, gated_delta, attention (sinks, window) and clamped_swiglu equal hand-computed values (float32, float64)" test $? -eq 0
cat "$tmp/hand.out"

# The numpy node, with both container writers: the content hash does not
# depend on the writer, and each file verifies. Without the safetensors
# package "auto" is the own writer too, and the comparison would be vacuous.
if "$py" -c "import safetensors" 2>/dev/null; then
  have_st=1; writer=safetensors
else
  have_st=0; writer=auto
  skip "the safetensors-package writer and its content hash" "$py has no safetensors (./scripts/test's venv has it)"
fi
"$py" scripts/numpy_node.py -p $ci -o "$tmp/numpy.safetensors" --writer $writer -q
check "numpy_node.py on $ci --writer $writer exits 0" test $? -eq 0
"$py" scripts/numpy_node.py -p $ci -o "$tmp/numpy-own.safetensors" --writer own -q
check "numpy_node.py --writer own exits 0" test $? -eq 0
"$py" scripts/numpy_node.py -p $ci -o "$tmp/numpy64.safetensors" --dtype float64 -q
check "numpy_node.py --dtype float64 exits 0" test $? -eq 0
check "captures verify (content hash recomputed)" \
  "$py" scripts/capture_format.py verify "$tmp/numpy.safetensors" "$tmp/numpy-own.safetensors" "$tmp/numpy64.safetensors"
content_hash() { "$py" -c 'import sys; sys.path.insert(0, "scripts"); import capture_format as c; print(c.read_capture(sys.argv[1])[0]["content_hash"])' "$1"; }
if [ $have_st -eq 1 ]; then
  check "both writers (safetensors package, own) give the same content hash" \
    test "$(content_hash "$tmp/numpy.safetensors")" = "$(content_hash "$tmp/numpy-own.safetensors")"
fi
proto_hash=$("$py" scripts/capture_format.py protocol-hash $ci)
check "capture records the protocol's content hash" \
  "$py" -c 'import sys; sys.path.insert(0, "scripts"); import capture_format as c; sys.exit(c.read_capture(sys.argv[1])[0]["protocol_hash"] != sys.argv[2])' \
  "$tmp/numpy.safetensors" "$proto_hash"
"$py" scripts/numpy_node.py -p protocols/ci.json -o "$tmp/bad.safetensors" --seed -1 -q 2>/dev/null
check "a bad seed is refused without a capture" test ! -e "$tmp/bad.safetensors"

# Against kvasir: a cpu-ref capture of step 1, then compare.
"$bin" capture --backend cpu-ref --protocol $ci --steps ops -o "$tmp/ref.safetensors" >"$tmp/capture.out" 2>&1
rc=$?
check "capture --backend cpu-ref --steps ops exits 0" test $rc -eq 0
[ $rc -eq 0 ] || cat "$tmp/capture.out"
"$bin" compare -p $ci "$tmp/ref.safetensors" "$tmp/numpy.safetensors" --only-steps ops >"$tmp/cmp.out" 2>&1
rc=$?
check "compare cpu-ref numpy:f32 --only-steps ops exits 0" test $rc -eq 0
check "compare names numpy:f32 fit" grep -qE "^numpy:f32 +fit( |$)" "$tmp/cmp.out"
[ $rc -eq 0 ] || cat "$tmp/cmp.out"

# The float64 numpy node against the oracle's own capture: same inputs, same
# routing, only the summation order and libm differ.
if [ -s "$tmp/ref.safetensors" ]; then
  "$py" tests/cli/capture_agree.py "$tmp/ref.safetensors" "$tmp/numpy64.safetensors" --rel 1e-11 >"$tmp/f64.out" 2>&1
  check "numpy float64 matches the cpu-ref capture (<= 1e-11 relative, ids as sets)" test $? -eq 0
  cat "$tmp/f64.out"
fi

# A capture whose tensor bytes were changed after writing: refused by compare.
"$py" - "$tmp/numpy.safetensors" "$tmp/tampered.safetensors" <<'EOF'
import struct, sys
raw = bytearray(open(sys.argv[1], "rb").read())
(hlen,) = struct.unpack("<Q", raw[:8])
pos = 8 + hlen + (len(raw) - 8 - hlen) // 2  # a byte inside the tensor data
raw[pos] ^= 0x01
open(sys.argv[2], "wb").write(raw)
EOF
check "the tampered copy fails capture_format.py verify" \
  bash -c "! '$py' scripts/capture_format.py verify '$tmp/tampered.safetensors' >/dev/null"
"$bin" compare -p $ci "$tmp/ref.safetensors" "$tmp/tampered.safetensors" --only-steps ops >"$tmp/tamper.out" 2>&1
rc=$?
check "compare refuses a tampered capture with exit 2" test $rc -eq 2
check "the refusal mentions the content hash" grep -qi "content.hash" "$tmp/tamper.out"
head -c "$(( $(stat -c %s "$tmp/numpy.safetensors") - 100 ))" "$tmp/numpy.safetensors" >"$tmp/truncated.safetensors"
"$bin" compare -p $ci "$tmp/ref.safetensors" "$tmp/truncated.safetensors" --only-steps ops >"$tmp/trunc.out" 2>&1
check "compare refuses a truncated capture with exit 2" test $? -eq 2

echo "$failures failure(s), $skips skipped"
[ "$failures" -eq 0 ] || exit 1
[ "$skips" -eq 0 ] || exit 77  # skipped (ctest: SKIP_RETURN_CODE 77); under CI a skip is a failure
