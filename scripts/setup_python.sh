#!/usr/bin/env bash
# The Python environment the external-node tests run with
# (tests/cli/test_python_nodes.sh: numpy; tests/cli/test_torch_node.sh:
# PyTorch): a venv $KVASIR_BUILD_DIR/pyvenv holding exactly the wheels pinned
# in scripts/requirements-tests.txt, from PyPI. Made once, reused between runs:
# a stamp names the hash of the requirements file, so editing it rebuilds the
# venv. Quiet: pip's output goes to $KVASIR_BUILD_DIR/pyvenv.log, one line is
# printed before and one after.
#
# kvasir_setup_python exports KVASIR_TEST_PYTHON (the venv's interpreter),
# which the tests use; without it (ctest by hand) they look for the venv next
# to the binary themselves (tests/cli/common.sh, test_python).
#
# torch: PyPI's Linux wheel is a CUDA build whose libraries are linked against
# CUDA's, so `import torch` needs those even on a CPU-only machine; they are
# installed, without the packages torch only uses on a GPU (triton, cusolver,
# ...; see the requirements file). No GPU or driver is needed. The venv is
# made with Debian's python3 (python3-venv, scripts/setup.sh): python3 on PATH
# may be any toolchain's.
#
#   scripts/setup_python.sh            (sourced by scripts/test; also runnable alone)
set -euo pipefail

KVASIR_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KVASIR_BUILD_DIR="${KVASIR_BUILD_DIR:-$KVASIR_ROOT/build}"

kvasir_setup_python() {
  local req="$KVASIR_ROOT/scripts/requirements-tests.txt"
  mkdir -p "$KVASIR_BUILD_DIR"
  local venv
  venv="$(cd "$KVASIR_BUILD_DIR" && pwd)/pyvenv"  # absolute: the tests run from the repo root
  local key
  key=$(sha256sum "$req" | cut -c1-16)
  local stamp="$venv/ready-$key"
  export KVASIR_TEST_PYTHON="$venv/bin/python"
  [ -f "$stamp" ] && [ -x "$KVASIR_TEST_PYTHON" ] && return 0
  local log="$venv.log"
  local base=/usr/bin/python3
  [ -x "$base" ] || base=$(command -v python3)
  local n
  n=$(grep -cE '^[A-Za-z0-9]' "$req")
  echo "kvasir: setting up the tests' Python in $venv, once: $n wheels pinned in scripts/requirements-tests.txt (numpy, torch) from PyPI, ~2.4 GB (log: $log)" >&2
  local t0=$SECONDS
  # (&&: errexit does not reach inside a group whose status is tested)
  {
    rm -rf "$venv" &&
      "$base" -m venv "$venv" &&
      "$venv/bin/python" -m pip install --no-deps --only-binary :all: --progress-bar off \
        --disable-pip-version-check -r "$req" &&
      # It imports and computes on the CPU; the last line is the summary.
      "$venv/bin/python" - <<'EOF'
import numpy, safetensors, torch
assert float((torch.ones(4, 4) @ torch.ones(4, 4)).sum()) == 64.0
print(f"numpy {numpy.__version__}, safetensors {safetensors.__version__}, torch {torch.__version__} "
      f"(CPU; GPU {'available' if torch.cuda.is_available() else 'not used'})")
EOF
  } >"$log" 2>&1 || {
    tail -40 "$log" >&2
    echo "kvasir: setting up the tests' Python failed (log: $log)" >&2
    exit 3
  }
  touch "$stamp"
  echo "kvasir: tests' Python ready in $((SECONDS - t0)) s: $(tail -1 "$log"), $(du -sh "$venv" | cut -f1) on disk" >&2
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  kvasir_setup_python
fi
