#!/usr/bin/env bash
# Stage what a phone (or any AArch64 Linux machine) needs to capture the
# fixture with kvasir-equiv's own cpu node into one folder, for `adb push`:
#   DIR/kvasir-equiv                         static AArch64 binary (scripts/setup_arm64.sh)
#   DIR/protocols/trained.json               the protocol (paths in it are relative to it)
#   DIR/fixtures/models/qwen3_moe_trained/   the trained fixture model
#   DIR/fixtures/text/, DIR/fixtures/tasks/  its held-out text and task
# README "Auditing a phone or an ARM server" has the commands around it.
#
#   scripts/phone-bundle.sh DIR      (builds the AArch64 side first if needed)
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: scripts/phone-bundle.sh DIR" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup_arm64.sh"
kvasir_setup_arm64
out="$1"
rm -rf "$out.tmp"
mkdir -p "$out.tmp/protocols" "$out.tmp/fixtures/models"
cp "$KVASIR_ARM64_BUILD_DIR/kvasir-equiv" "$out.tmp/"
cp "$root/protocols/trained.json" "$out.tmp/protocols/"
cp -r "$root/fixtures/models/qwen3_moe_trained" "$out.tmp/fixtures/models/"
cp -r "$root/fixtures/text" "$root/fixtures/tasks" "$out.tmp/fixtures/"
rm -rf "$out"
mv "$out.tmp" "$out"
echo "$out: $(du -sh "$out" | cut -f1) (kvasir-equiv $(file -b "$out/kvasir-equiv" | cut -d, -f1-2))"
