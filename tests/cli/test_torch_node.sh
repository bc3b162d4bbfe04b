#!/usr/bin/env bash
# The PyTorch external node, by hand (not a ctest test: PyTorch is not part of
# ./scripts/test's setup yet, issue #22, and a test that would skip in CI is no
# test). Writes a cpu-ref and a torch capture of step 1 and checks that
# `compare` judges torch:f32 fit. FAILS when no python3 has torch.
# Usage: tests/cli/manual_torch_node.sh PATH/TO/kvasir-equiv   (from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
py="${PYTHON:-$(python_with torch)}"
if [ -z "$py" ]; then
  echo "FAIL: no python3 with torch (set PYTHON=/path/to/venv/bin/python)"
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ci=protocols/ci.json
"$bin" capture --backend cpu-ref --protocol $ci --steps ops -o "$tmp/ref.safetensors" >/dev/null
check "cpu-ref capture written" test -s "$tmp/ref.safetensors"
"$py" scripts/torch_node.py -p $ci -o "$tmp/torch.safetensors" -q
check "torch_node.py on $ci exits 0" test $? -eq 0
"$bin" compare -p $ci "$tmp/ref.safetensors" "$tmp/torch.safetensors" --only-steps ops >"$tmp/cmp.out" 2>&1
rc=$?
check "compare cpu-ref torch exits 0" test $rc -eq 0
check "compare names torch:f32 fit" grep -qE "^torch:f32 +fit( |$)" "$tmp/cmp.out"
[ $rc -eq 0 ] || cat "$tmp/cmp.out"
echo "$failures failed"
[ "$failures" -eq 0 ]
