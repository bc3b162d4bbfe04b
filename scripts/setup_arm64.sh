#!/usr/bin/env bash
# The AArch64 side of the suite (tests/cli/test_arm64.sh): kvasir-equiv and
# its CPU kernel tests cross-compiled for AArch64 Linux, statically linked
# (the binary a phone runs: README "Auditing a phone"), into
# $KVASIR_ARM64_BUILD_DIR (default: build-arm64 beside the x86 build), and
# run here under Debian's qemu-user-static.
#
# Installs Debian's crossbuild-essential-arm64, qemu-user-static and the
# :arm64 multiarch -dev packages the tool links (adding the arm64
# architecture to dpkg once). A unity build (each library's files compiled a
# few at a time: the headers parsed once per batch, ~3 min instead of ~8
# from scratch on 2 cores); incremental like the x86 one after that.
#
#   scripts/setup_arm64.sh          (sourced by scripts/test; also runnable alone)
set -euo pipefail

KVASIR_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KVASIR_ARM64_BUILD_DIR="${KVASIR_ARM64_BUILD_DIR:-$KVASIR_ROOT/build-arm64}"

KVASIR_ARM64_PACKAGES=(
  crossbuild-essential-arm64 qemu-user-static file
  libfmt-dev:arm64 libssl-dev:arm64 libpcre2-dev:arm64 libutf8proc-dev:arm64 libgtest-dev:arm64
)
# What the AArch64 side builds: the tool and the tests that prove its kernels.
KVASIR_ARM64_TARGETS=(kvasir-equiv test_cpu_backends test_conformance)

kvasir_setup_arm64() {
  local log="$KVASIR_ARM64_BUILD_DIR.log"
  mkdir -p "$(dirname "$log")"
  local missing=() p
  for p in "${KVASIR_ARM64_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
      echo "kvasir: missing Debian packages for the AArch64 build; run as root:" >&2
      echo "  dpkg --add-architecture arm64 && apt-get update && apt-get install -y ${missing[*]}" >&2
      exit 2
    fi
    echo "kvasir: installing ${#missing[@]} Debian packages for the AArch64 build (log: $log)" >&2
    if ! {
      export DEBIAN_FRONTEND=noninteractive
      { dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64; } &&
        apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"
    } >"$log" 2>&1; then
      tail -30 "$log" >&2
      echo "kvasir: installing the AArch64 packages failed (log: $log)" >&2
      exit 3
    fi
  fi
  local t0=$SECONDS
  if [ ! -f "$KVASIR_ARM64_BUILD_DIR/build.ninja" ]; then
    echo "kvasir: configuring and building the AArch64 side in $KVASIR_ARM64_BUILD_DIR, the first time takes minutes (log: $log)" >&2
    if ! cmake -S "$KVASIR_ROOT" -B "$KVASIR_ARM64_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_TOOLCHAIN_FILE="$KVASIR_ROOT/cmake/aarch64-linux-gnu.cmake" -DKVASIR_STATIC=ON -DCMAKE_UNITY_BUILD=ON \
        -DKVASIR_OPENCL=OFF -DKVASIR_CUDA=OFF -DKVASIR_HIP=OFF -DKVASIR_BENCH=OFF >"$log" 2>&1; then
      cat "$log" >&2
      echo "kvasir: AArch64 configure failed (log: $log)" >&2
      exit 3
    fi
  fi
  if ! cmake --build "$KVASIR_ARM64_BUILD_DIR" --target "${KVASIR_ARM64_TARGETS[@]}" --parallel "$(nproc)" >"$log" 2>&1; then
    grep -E "error|Error|FAILED" "$log" | head -40 >&2
    echo "kvasir: AArch64 build failed (full log: $log)" >&2
    exit 3
  fi
  [ $((SECONDS - t0)) -gt 5 ] && echo "kvasir: AArch64 side built in $((SECONDS - t0)) s" >&2
  export KVASIR_ARM64_BUILD_DIR
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  kvasir_setup_arm64
fi
