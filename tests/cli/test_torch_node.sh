#!/usr/bin/env bash
# The PyTorch external node (scripts/torch_node.py), run for real on the CPU
# with the torch that ./scripts/test installs (scripts/setup_python.sh: torch
# 2.15.0 from PyPI in BUILD/pyvenv): its step-1 capture of protocols/ci.json
# verifies and records torch's version, `compare` judges torch:f32 fit against
# a cpu-ref capture, and torch:f64 agrees with the oracle to ~1e-11.
# No python with torch: under CI (CI=true) a FAILURE; elsewhere SKIP (exit 77).
# Usage: test_torch_node.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
require_test_python "the torch node" numpy torch
echo "using $py ($("$py" -c 'import numpy, torch; print(f"numpy {numpy.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads")'))"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ci=protocols/ci.json

"$bin" capture --backend cpu-ref --protocol $ci --steps ops -o "$tmp/ref.safetensors" >"$tmp/capture.out" 2>&1
check "cpu-ref capture written" test -s "$tmp/ref.safetensors"
[ -s "$tmp/ref.safetensors" ] || cat "$tmp/capture.out"
"$py" scripts/torch_node.py -p $ci -o "$tmp/torch.safetensors" -q
check "torch_node.py on $ci exits 0" test $? -eq 0
"$py" scripts/torch_node.py -p $ci -o "$tmp/torch64.safetensors" --dtype float64 -q
check "torch_node.py --dtype float64 exits 0" test $? -eq 0
check "the torch captures verify (content hash recomputed)" \
  "$py" scripts/capture_format.py verify "$tmp/torch.safetensors" "$tmp/torch64.safetensors"
check "the capture names the node torch:f32 and records torch's version" "$py" - "$tmp/torch.safetensors" <<'PY'
import json, sys
sys.path.insert(0, "scripts")
import torch
import capture_format as c
meta = c.read_capture(sys.argv[1])[0]
runtime = json.loads(meta["capabilities"])["runtime"]
print("node:", meta["node"], "| runtime:", runtime)
sys.exit(not (meta["node"] == "torch:f32" and runtime.startswith(f"torch {torch.__version__} ")))
PY

"$bin" compare -p $ci "$tmp/ref.safetensors" "$tmp/torch.safetensors" --only-steps ops >"$tmp/cmp.out" 2>&1
rc=$?
check "compare cpu-ref torch:f32 --only-steps ops exits 0" test $rc -eq 0
check "compare names torch:f32 fit" grep -qE "^torch:f32 +fit( |$)" "$tmp/cmp.out"
[ $rc -eq 0 ] || cat "$tmp/cmp.out"

# The float64 torch node against the oracle's own capture: same inputs, same
# routing; only the summation order and libm differ.
"$py" tests/cli/capture_agree.py "$tmp/ref.safetensors" "$tmp/torch64.safetensors" --rel 1e-11 >"$tmp/f64.out" 2>&1
check "torch float64 matches the cpu-ref capture (<= 1e-11 relative, ids as sets)" test $? -eq 0
cat "$tmp/f64.out"

echo "$failures failed"
[ "$failures" -eq 0 ]
