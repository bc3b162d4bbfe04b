#!/usr/bin/env bash
# Random option values to every subcommand (tests/cli/cli_fuzz.py, seeded):
# never an exit code other than 0/1/2, never a signal or a hang; a malformed
# number is exit 2 naming its option. Python: Debian's python3 suffices.
# Usage: test_cli_fuzz.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
py=$(command -v /usr/bin/python3 || command -v python3)
"$py" tests/cli/cli_fuzz.py "$bin" "$tmp" --cases "${KVASIR_CLI_FUZZ_CASES:-160}"
