#!/usr/bin/env bash
# scripts/device-bundle.sh [--build-dir DIR] OUT.tar.xz — everything a bare
# GPU machine needs to run scripts/device-check.sh, built HERE (issue #38):
# a lent GPU machine has a driver and the CUDA runtime libraries but no
# package registry, no -dev packages and ~15 minutes of device time, so
# nothing is compiled there.
#
# The bundle (one xz tarball, ≲ 40 MB) holds
#   bin/    kvasir-equiv, test_gpu, test_conformance, bench_opencl (its GPU rows)
#   lib/    every shared library those load that is not the C/C++ runtime
#           (libc, libm, libstdc++, libgcc_s, ld.so — newer on the target) nor
#           the CUDA runtime the target has (libcudart, libcublas*, libcuda):
#           ldd decides, e.g. libfmt, libutf8proc, libOpenCL, libpcre2-8,
#           libcrypto, libgomp
#   src/    the fixtures, protocols and scripts the checks read, under the
#           path the binaries were compiled with (KVASIR_SOURCE_DIR): the
#           check links it there
#   MANIFEST  commit, build flags, KVASIR_SOURCE_DIR, CUDA archs, sizes
#
# Without --build-dir, configures and builds build-device/ with
# -DKVASIR_CUDA=ON -DKVASIR_HIP=OFF -DKVASIR_CUDA_ARCHITECTURES=90-real (H100,
# H200; KVASIR_BUNDLE_CUDA_ARCHS overrides). --build-dir packs an existing
# build as it is (its CUDA archs must include the target's; a HIP-enabled
# build drags the ROCm runtime libraries in).
#
# Exit: 0 written; 1 build or packing failed; 2 usage.
set -euo pipefail

usage() { echo "usage: scripts/device-bundle.sh [--build-dir DIR] OUT.tar.xz" >&2; exit 2; }
build_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) [ $# -ge 2 ] || usage; build_dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) usage ;;
    *) break ;;
  esac
done
[ $# -eq 1 ] || usage
out="$1"
case "$out" in *.tar.xz) ;; *) echo "device-bundle: the output must be a .tar.xz, not $out" >&2; exit 2 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [ -z "$build_dir" ]; then
  build_dir="$ROOT/build-device"
  archs="${KVASIR_BUNDLE_CUDA_ARCHS:-90-real}"
  command -v nvcc >/dev/null 2>&1 || PATH="/usr/local/cuda/bin:$PATH"
  echo "device-bundle: building $build_dir (CUDA archs $archs, HIP off); the first time takes minutes" >&2
  cmake -S "$ROOT" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVASIR_CUDA=ON -DKVASIR_HIP=OFF \
    -DKVASIR_CUDA_ARCHITECTURES="$archs" >"$build_dir.log" 2>&1 \
    || { tail -30 "$build_dir.log" >&2; echo "device-bundle: configure failed ($build_dir.log)" >&2; exit 1; }
  cmake --build "$build_dir" --parallel "$(nproc)" --target kvasir-equiv test_gpu test_conformance bench_opencl \
    >>"$build_dir.log" 2>&1 \
    || { grep -E "error|FAILED" "$build_dir.log" | head -30 >&2; echo "device-bundle: build failed ($build_dir.log)" >&2; exit 1; }
fi
build_dir="$(cd "$build_dir" && pwd)"
[ -x "$build_dir/kvasir-equiv" ] || { echo "device-bundle: $build_dir/kvasir-equiv: not built" >&2; exit 1; }
source_dir="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build_dir/CMakeCache.txt")"
cuda_archs="$(sed -n 's/^KVASIR_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build_dir/CMakeCache.txt")"
ls "$build_dir"/kvasir_gpu_cuda/CMakeFiles/*/cuda_backend.cu.o >/dev/null 2>&1 \
  || echo "device-bundle: warning: $build_dir has no CUDA backend compiled in" >&2

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
b="$stage/kvasir-device"
mkdir -p "$b/bin" "$b/lib" "$b/src"
bins=()
for t in kvasir-equiv test_gpu test_conformance bench_opencl; do
  [ -x "$build_dir/$t" ] && { cp "$build_dir/$t" "$b/bin/"; bins+=("$build_dir/$t"); }
done
# The libraries: what ldd resolves, less the C/C++ runtime and CUDA's own.
ldd "${bins[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
  case "$name" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) continue ;;
    libcudart.so*|libcublas.so*|libcublasLt.so*|libcuda.so*|libnvidia*) continue ;;
  esac
  cp -L "$path" "$b/lib/$name"
done
# What the checks read: fixtures (the models test_gpu and the audits open),
# protocols, the token streams, tasks and tokenizers.
models="qwen3_moe_tiny qwen3_moe_trained qwen3_5_moe_trained qwen3_5_moe_tiny llama_tiny mistral_tiny qwen2_tiny
        qwen3_tiny olmoe_tiny gpt_oss_tiny deepseek_v3_tiny kimi_k2_tiny glm4_moe_tiny"
mkdir -p "$b/src/fixtures/models"
cp -r "$ROOT/protocols" "$b/src/"
for m in $models; do cp -r "$ROOT/fixtures/models/$m" "$b/src/fixtures/models/"; done
for f in "$ROOT"/fixtures/*; do  # everything but the models (text, tokens, tasks, tokenizers, … are small)
  [ "$(basename "$f")" = models ] || cp -r "$f" "$b/src/fixtures/"
done
cp "$ROOT/fixtures/models/README.md" "$b/src/fixtures/models/" 2>/dev/null || true
# Every file a shipped protocol names must be in the bundle (the default audit reads fixtures/text).
named="$(grep -ohE '"\.\./fixtures/[^"]+"' "$ROOT"/protocols/*.json | tr -d '"' | sort -u || true)"
for rel in $named; do
  [ -e "$b/src/protocols/$rel" ] || { echo "device-bundle: a shipped protocol names $rel, not in the bundle" >&2; exit 1; }
done
mkdir -p "$b/src/scripts" && cp "$ROOT/scripts/device-check.sh" "$b/src/scripts/"
{
  echo "commit $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "built $(date -u '+%Y-%m-%d %H:%M:%SZ') on $(hostname) ($(uname -m)), $(nvcc --version 2>/dev/null | tail -1 || echo 'nvcc ?')"
  echo "source_dir $source_dir"
  echo "cuda_archs $cuda_archs"
  echo "binaries $(cd "$b/bin" && echo *)"
  echo "libraries $(cd "$b/lib" && echo *)"
  echo "models $(echo $models)"
} >"$b/MANIFEST"
mkdir -p "$(dirname "$out")"
tmp_out="$out.tmp-$$"
tar -C "$stage" -cJf "$tmp_out" kvasir-device
mv "$tmp_out" "$out"
echo "device-bundle: $out ($(du -h "$out" | cut -f1)); on the GPU machine: scripts/device-check.sh $(basename "$out") OUTDIR" >&2
