#!/usr/bin/env bash
# scripts/make_synthetic_checkpoint.py's real-size layouts against the
# parameter counts their publishers state (an independent check of every
# width the script takes from a config: one wrong figure moves the count by
# far more than the rounding of the published number). --count sums the
# tensors the script would write, without writing them; the language model
# only (no vision tower, no multi-token-prediction layer):
#   Qwen3.5-122B-A10B  122.11B  (the GGUF releases' parameter count; the
#                               model name's "122B")
#   Qwen3-30B-A3B      30.5B    (its model card: "Number of Parameters: 30.5B")
#   DeepSeek-V3        671B     (its model card: 671B total, MTP's 14B apart)
# Usage: test_synthetic_checkpoint.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
py=$(test_python numpy)
if [ -z "$py" ]; then
  echo "FAIL: no python3 with numpy (./scripts/test makes BUILD/pyvenv; scripts/setup.sh installs python3-numpy)"
  echo "1 failed"
  exit 1
fi
failed=0
check() {  # arch layers published half-width-of-its-rounding
  local got
  got=$("$py" scripts/make_synthetic_checkpoint.py unused --count --arch "$1" --layers "$2") || { echo "FAIL: $1 --count"; failed=$((failed + 1)); return; }
  if "$py" -c "import sys; sys.exit(0 if abs($got - $3) <= $4 else 1)"; then
    echo "ok: $1 at $2 layers: $got parameters (published $3 ± $4)"
  else
    echo "FAIL: $1 at $2 layers: $got parameters, published $3 ± $4"
    failed=$((failed + 1))
  fi
}
check qwen3_5_moe_122b 48 122.11e9 0.005e9
check qwen3_moe 48 30.5e9 0.05e9
check deepseek_v3 61 671e9 0.5e9
# Nothing is written with --count.
[ ! -e unused ] || { echo "FAIL: --count wrote unused/"; failed=$((failed + 1)); }
echo "$failed failed"
[ "$failed" -eq 0 ]
