#!/usr/bin/env bash
# Installs the Debian packages kvasir-equiv needs to build and test, and
# configures + builds it. Sourced by scripts/kvasir and scripts/test.
#
#   KVASIR_BUILD_DIR   build folder (default: build)
#   KVASIR_BUILD_TYPE  CMake build type (default: Release)
set -euo pipefail

KVASIR_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KVASIR_BUILD_DIR="${KVASIR_BUILD_DIR:-$KVASIR_ROOT/build}"
KVASIR_BUILD_TYPE="${KVASIR_BUILD_TYPE:-Release}"

# Build and test dependencies, all from Debian. hipcc/libamdhip64-dev let CI
# compile the HIP backend even though this machine has no AMD GPU; PoCL gives
# a real OpenCL device on the CPU; OpenBLAS is only the benchmarks' yardstick.
# libssl-dev (libcrypto) computes SHA-256, Random123 is the reference Philox,
# json-schema-test-suite is the official suite the schema validator is tested
# against; PCRE2 and utf8proc give the tokenizer its Unicode regexes and
# normalization forms; libomp-dev is clang's OpenMP for the fuzz build (the
# whole library, sanitized). Chromium (headless) renders the HTML report in its browser test
# (tests/cli/test_html_report.sh), in the DejaVu fonts the page asks for.
# slurm-wlm and munge make the one-machine Slurm cluster on which
# tests/cli/test_slurm.sh runs an audit as a job array (audit --slurm).
KVASIR_PACKAGES=(
  cmake ninja-build g++ pkg-config git
  libcli11-dev nlohmann-json3-dev libfmt-dev libgtest-dev libbenchmark-dev
  ocl-icd-opencl-dev opencl-headers pocl-opencl-icd clinfo
  clang libclang-rt-14-dev libomp-dev
  hipcc libamdhip64-dev
  libopenblas-dev
  libssl-dev librandom123-dev json-schema-test-suite
  libpcre2-dev libutf8proc-dev
  python3-jsonschema python3-numpy python3-venv
  chromium fonts-dejavu-core
  slurm-wlm munge
)

# Installs the missing ones quietly: apt's and dpkg's output goes to
# $KVASIR_BUILD_DIR-setup.log (beside the build folder, which may not exist
# yet); one line says what is installed and where the log is, one that it is
# done. On failure: the log's tail, exit 3.
kvasir_install_packages() {
  local missing=()
  local p
  for p in "${KVASIR_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "kvasir: missing Debian packages; run as root:" >&2
    echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 2
  fi
  local log="$KVASIR_BUILD_DIR-setup.log"
  mkdir -p "$(dirname "$log")"
  echo "kvasir: installing ${#missing[@]} Debian packages: ${missing[*]} (log: $log)" >&2
  local t0=$SECONDS
  if ! {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q &&
      apt-get install -y -q --no-install-recommends "${missing[@]}"
  } >"$log" 2>&1; then
    tail -30 "$log" >&2
    echo "kvasir: installing Debian packages failed (log: $log)" >&2
    exit 3
  fi
  echo "kvasir: Debian packages installed in $((SECONDS - t0)) s" >&2
}

# Configure (once) and build the given targets (default: all), quietly unless
# something fails.
kvasir_build() {
  local log="$KVASIR_BUILD_DIR.log"
  if [ ! -f "$KVASIR_BUILD_DIR/build.ninja" ]; then
    echo "kvasir: configuring and building $KVASIR_BUILD_DIR, the first time takes minutes (log: $log)" >&2
    if ! cmake -S "$KVASIR_ROOT" -B "$KVASIR_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$KVASIR_BUILD_TYPE" \
        "${KVASIR_CMAKE_ARGS[@]}" >"$log" 2>&1; then
      cat "$log" >&2
      echo "kvasir: configure failed (log above, also in $log)" >&2
      exit 3
    fi
    grep -E "✓|✗" "$log" >&2 || true
  fi
  if ! cmake --build "$KVASIR_BUILD_DIR" "$@" >"$log" 2>&1; then
    grep -E "error|Error|FAILED" "$log" | head -40 >&2
    echo "kvasir: build failed (full log: $log)" >&2
    exit 3
  fi
}

KVASIR_CMAKE_ARGS=(${KVASIR_CMAKE_ARGS:-})
