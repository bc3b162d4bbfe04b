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
