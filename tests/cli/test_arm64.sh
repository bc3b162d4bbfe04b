#!/usr/bin/env bash
# The AArch64 build, run for real under qemu-user (issue #40): the static
# aarch64 kvasir-equiv that a phone or a Grace/Graviton server runs, built by
# scripts/setup_arm64.sh (./scripts/test) into $KVASIR_ARM64_BUILD_DIR
# (default build-arm64).
#   1. one statically linked AArch64 executable that runs with nothing
#      installed (qemu with an empty library root);
#   2. its CPU kernel and conformance tests under qemu: the NEON kernels give the contract's
#      bits (one FMA chain per output per K block of 64, block sums in order:
#      the bits of the x86-64 kernels), for every shape, thread count,
#      weight format and rounding those tests cover; the generic ones too;
#   3. a capture of the trained fixture by the AArch64 cpu node, run from the
#      folder scripts/phone-bundle.sh stages for a phone, against the
#      x86-64 cpu node's: `compare` judges it fit against the x86-64 cpu-ref,
#      and every tensor of the two cpu captures has the same bits (the
#      contract fixes every order the cpu node's kernels use; glibc's libm
#      gives the same values on both, as this test shows).
# Usage: test_arm64.sh KVASIR_EQUIV (the x86-64 one; run from the repo root).
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
arm="${KVASIR_ARM64_BUILD_DIR:-build-arm64}"
qemu=qemu-aarch64-static
if [ ! -x "$arm/kvasir-equiv" ] || [ ! -x "$arm/test_cpu_backends" ] || [ ! -x "$arm/test_conformance" ] || ! command -v "$qemu" >/dev/null; then
  skip "the AArch64 build under qemu" "no $arm/kvasir-equiv, test_cpu_backends, test_conformance or $qemu (scripts/setup_arm64.sh makes them)"
  [ "$failures" -eq 0 ] && exit 77 || exit 1
fi
py=$(test_python numpy)
[ -n "$py" ] || { echo "FAIL: no Python with numpy"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/empty-root"
arm_run() { "$qemu" -L "$tmp/empty-root" "$@"; }  # no AArch64 library anywhere: a static binary needs none

# 1. One file, nothing to install.
kind=$(file -b "$arm/kvasir-equiv")
check "kvasir-equiv is an AArch64 executable ($kind)" grep -q "ARM aarch64" <<<"$kind"
check "kvasir-equiv is statically linked" grep -q "statically linked" <<<"$kind"
check "it runs under qemu with an empty library root" arm_run "$arm/kvasir-equiv" --version
arm_run "$arm/kvasir-equiv" backends >"$tmp/backends.out" 2>&1
check "its cpu node is available" grep -qE "^cpu +available +f32 +f32 +yes" "$tmp/backends.out"

# 2. The kernel tests (NEON, and the generic kernels with the dispatch capped).
arm_run "$arm/test_cpu_backends" >"$tmp/kernels.out" 2>&1; rc=$?
check "test_cpu_backends passes on AArch64 (NEON kernels)" test $rc -eq 0
check "... and skips nothing" bash -c "! grep -q SKIPPED '$tmp/kernels.out'"
[ $rc -eq 0 ] || tail -40 "$tmp/kernels.out"
KVASIR_CPU_ISA=generic arm_run "$arm/test_cpu_backends" \
  "--gtest_filter=CpuRefMatmul.*:Cpu.ResultsDoNotDependOnThreadCount:CpuPacked.AwkwardShapes*:CpuPacked.ATokenGives*:CpuPacked.HalfAndBf16*:F16Accumulation.Every*" \
  >"$tmp/generic.out" 2>&1; rc=$?
check "the generic kernels pass on AArch64 too" test $rc -eq 0
[ $rc -eq 0 ] || tail -40 "$tmp/generic.out"
# The conformance suite on the cpu nodes (cpu-ref, cpu and its variants):
# every op by hand, within its bound of the oracle, the fused attention its
# own composition bit for bit, non-finite values never passing.
arm_run "$arm/test_conformance" "--gtest_filter=*/cpu*" >"$tmp/conformance.out" 2>&1; rc=$?
check "the conformance suite passes on AArch64's cpu nodes ($(grep -oE '[0-9]+ tests from [0-9]+ test suites ran' "$tmp/conformance.out"))" test $rc -eq 0
check "... and skips nothing" bash -c "! grep -q SKIPPED '$tmp/conformance.out'"
[ $rc -eq 0 ] || grep -E "FAILED|Failure" -A5 "$tmp/conformance.out" | head -60

# 3. The fixture (trained protocol) on both architectures. Every step but the
# task, whose 250 items take minutes under emulation (its numbers come from
# the same forward pass as perplexity's).
steps=ops,drift,logits,decide,generate,perplexity,determinism,invariance
"$bin" capture -b cpu-ref --steps $steps -o "$tmp/ref.safetensors" >"$tmp/ref.out" 2>&1 \
  || { cat "$tmp/ref.out"; echo "FAIL: x86-64 cpu-ref capture"; exit 1; }
"$bin" capture -b cpu --steps $steps -o "$tmp/x86.safetensors" >"$tmp/x86.out" 2>&1 \
  || { cat "$tmp/x86.out"; echo "FAIL: x86-64 cpu capture"; exit 1; }
# As on a phone: the folder scripts/phone-bundle.sh stages for `adb push`, run
# from inside it (README "Auditing a phone or an ARM server").
KVASIR_ARM64_BUILD_DIR="$arm" scripts/phone-bundle.sh "$tmp/phone" >"$tmp/bundle.out" 2>&1 \
  || { cat "$tmp/bundle.out"; echo "FAIL: scripts/phone-bundle.sh"; exit 1; }
(cd "$tmp/phone" && arm_run ./kvasir-equiv capture -p protocols/trained.json -b cpu --name cpu@aarch64 --steps $steps \
  -o "$tmp/arm.safetensors") >"$tmp/arm.out" 2>&1; rc=$?
check "the AArch64 cpu node captures the fixture under qemu, from the phone bundle ($(cat "$tmp/bundle.out"))" test $rc -eq 0
[ $rc -eq 0 ] || cat "$tmp/arm.out"
"$bin" compare --only-steps $steps "$tmp/ref.safetensors" "$tmp/x86.safetensors" "$tmp/arm.safetensors" >"$tmp/cmp.out" 2>&1; rc=$?
check "compare cpu-ref (x86-64), cpu (x86-64), cpu@aarch64 exits 0" test $rc -eq 0
check "compare judges cpu@aarch64 fit" grep -qE "^cpu@aarch64 +fit " "$tmp/cmp.out"
[ $rc -eq 0 ] || cat "$tmp/cmp.out"
"$py" tests/cli/capture_agree.py "$tmp/x86.safetensors" "$tmp/arm.safetensors" --bits >"$tmp/bits.out" 2>&1; rc=$?
check "every tensor of the AArch64 cpu capture has the x86-64 cpu capture's bits ($(tail -1 "$tmp/bits.out"))" test $rc -eq 0
[ $rc -eq 0 ] || grep -v "same bits" "$tmp/bits.out"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
