# Shared by tests/cli/test_*.sh (sourced, not run by ctest: no test_ prefix).
# Expects $bin (the kvasir-equiv binary) and counts failures in $failures.
failures=0

# check DESCRIPTION COMMAND...: passes iff COMMAND exits 0.
check() {
  local what="$1"; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}

# expect_usage_error WANT ARGS...: kvasir-equiv ARGS must exit 2 with exactly
# one line on stderr containing WANT.
expect_usage_error() {
  local want="$1"; shift
  local err rc lines
  err=$("$bin" "$@" 2>&1 >/dev/null); rc=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! printf '%s' "$err" | grep -q -- "$want"; then
    echo "FAIL: kvasir-equiv $* → rc=$rc, stderr ($lines lines): $err (wanted rc 2, one line containing '$want')"
    failures=$((failures + 1))
  else
    echo "ok: $* → $err"
  fi
}

# python_with MODULE: the first of python3 (PATH) and Debian's /usr/bin/python3
# that imports MODULE (scripts/setup.sh installs python3-numpy and
# python3-jsonschema for the latter); empty when none does — callers FAIL then,
# never skip: setup guarantees one.
python_with() {
  local cand
  for cand in python3 /usr/bin/python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import $1" 2>/dev/null; then echo "$cand"; return; fi
  done
}

# skip WHAT WHY: WHAT could not run (a missing dependency). Under CI (CI=true)
# that is a failure — ./scripts/test installs every dependency the tests
# need, so a missing one is a setup bug, and a skip counted as a pass hides
# it. Elsewhere (ctest by hand) it prints SKIP and counts in $skips.
skips=0
skip() {
  if [ "${CI:-}" = true ]; then
    echo "FAIL: $1 did NOT run: $2 (CI=true: a skip is a failure)"
    failures=$((failures + 1))
  else
    echo "SKIP: $1: $2"
    skips=$((skips + 1))
  fi
}

# test_python MODULE...: the interpreter the external-node tests run with,
# which must import every MODULE: $KVASIR_TEST_PYTHON (./scripts/test exports
# its venv, scripts/setup_python.sh) or $PYTHON when set — no other is tried
# then —, else the build folder's venv beside $bin (BUILD/pyvenv, made by
# ./scripts/test), else python3 on PATH or Debian's /usr/bin/python3. Empty
# when none imports them all.
test_python() {
  local cand mods
  mods=$(IFS=,; echo "$*")
  local chosen="${KVASIR_TEST_PYTHON:-${PYTHON:-}}"
  if [ -n "$chosen" ]; then
    "$chosen" -c "import $mods" 2>/dev/null && echo "$chosen"
    return 0
  fi
  for cand in "$(cd "$(dirname "$bin")" && pwd)/pyvenv/bin/python" python3 /usr/bin/python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import $mods" 2>/dev/null; then echo "$cand"; return 0; fi
  done
}

# require_test_python WHAT MODULE...: sets $py to test_python MODULE... or,
# when none imports them, skips WHAT (a FAILURE under CI) and ends the test
# (exit 77 = skipped, or 1 under CI).
require_test_python() {
  local what="$1"
  shift
  py=$(test_python "$@")
  [ -n "$py" ] && return 0
  skip "$what" "no python3 with $* (KVASIR_TEST_PYTHON=${KVASIR_TEST_PYTHON:-unset}, PYTHON=${PYTHON:-unset}; ./scripts/test makes BUILD/pyvenv: scripts/setup_python.sh)"
  echo "$failures failed, $skips skipped"
  [ "$failures" -eq 0 ] || exit 1
  exit 77
}
