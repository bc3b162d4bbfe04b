#!/usr/bin/env bash
# Bad usage and bad input: exit code 2 and exactly one line on stderr that
# names the problem. Usage: test_cli_errors.sh PATH/TO/kvasir-equiv
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
expect_usage_error "unknown backend 'tpu'" ops --backends tpu
expect_usage_error "unknown op 'gemm'" ops --ops gemm
expect_usage_error "unknown option 'speed'" ops --backends cpu:speed=fast
expect_usage_error "acc must be f32 or f16" ops --backends cpu:acc=f8
expect_usage_error "--tokens must be in 1.." ops --tokens 0
expect_usage_error "--hidden must be in 1.." ops --hidden -5
expect_usage_error "--head-dim must be even" ops --head-dim 7
expect_usage_error "--top-k must be in 1..16" ops --top-k 17
expect_usage_error "not key=value" ops --backends cpu:acc
expect_usage_error "given twice" ops --backends cpu,cpu
expect_usage_error "error" ops --no-such-flag
expect_usage_error "error" frobnicate
expect_usage_error "error" ops --tokens abc

# --help and --version succeed.
"$bin" --help >/dev/null || { echo "FAIL: --help"; failures=$((failures + 1)); }
"$bin" ops --help | grep -q -- "--backends" || { echo "FAIL: ops --help lacks --backends"; failures=$((failures + 1)); }
"$bin" --version | grep -q "kvasir-equiv" || { echo "FAIL: --version"; failures=$((failures + 1)); }
# --version names the commit the binary was built from (a git checkout: never "unknown").
if git rev-parse --git-dir >/dev/null 2>&1; then
  "$bin" --version | grep -qE "^kvasir-equiv [0-9.]+ \(git [0-9a-f]{12}(-dirty)?\)$" \
    || { echo "FAIL: --version does not name the git commit: $("$bin" --version)"; failures=$((failures + 1)); }
else
  skip "--version names the git commit" "not a git checkout"
fi

# Commas separate nodes and also a node's options.
"$bin" ops --backends cpu-ref,cpu:acc=f16,storage=bf16,cpu --ops matmul --tokens 2 --hidden 16 --intermediate 8 \
  | grep -q "cpu:acc=f16,storage=bf16" || { echo "FAIL: multi-option node in --backends"; failures=$((failures + 1)); }

# A report file is written whole, and an unwritable path is a clear error.
tmp=$(mktemp -d)
if "$bin" ops --backends cpu --ops matmul,softmax --tokens 2 --hidden 64 --intermediate 32 -o "$tmp/r.json" >/dev/null; then
  grep -q '"schema": "kvasir-equiv/ops/1"' "$tmp/r.json" || { echo "FAIL: report lacks schema"; failures=$((failures + 1)); }
  [ -z "$(ls -A "$tmp" | grep -v '^r.json$')" ] || { echo "FAIL: temp files left: $(ls -A "$tmp")"; failures=$((failures + 1)); }
else
  echo "FAIL: small ops run failed"; failures=$((failures + 1))
fi
expect_usage_error "$tmp/missing/r.json" ops --backends cpu --ops matmul --tokens 1 --hidden 8 --intermediate 8 -o "$tmp/missing/r.json"
rm -rf "$tmp"

echo "$failures failed, $skips skipped"
[ "$failures" -eq 0 ] || exit 1
[ "$skips" -eq 0 ] || exit 77  # skipped (ctest: SKIP_RETURN_CODE 77); under CI a skip is a failure
