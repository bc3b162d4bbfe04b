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
