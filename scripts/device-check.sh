#!/usr/bin/env bash
# scripts/device-check.sh [BUNDLE.tar.xz] OUTDIR — the GPU check, for a machine with an NVIDIA GPU.
#
# With a BUNDLE (scripts/device-bundle.sh, built on a machine of this
# project's kind: binaries, the shared libraries the target lacks, fixtures),
# nothing is built: the bundle is unpacked, its source tree linked at the path
# the binaries were compiled with (unless that path exists), its lib/ put on
# LD_LIBRARY_PATH before /usr/local/cuda/lib64, and the phases below from
# "tests" on run from it — the way for a bare GPU machine (no package
# registry, no -dev packages, minutes of device time). Besides the phases
# below, bundle mode measures the matmul against cuBLAS and the MoE block on
# resident weights (bench_opencl's GPU rows: GFLOP/s), a capture's host↔device
# transfers per step (--timings) and the GPU's utilisation during it
# (nvidia-smi dmon), and leaves OUTDIR.tar.gz, every log in one archive.
#
# Without one (OUTDIR alone):
# Builds kvasir-equiv with CUDA (-DKVASIR_CUDA=ON -DKVASIR_HIP=OFF) in
# build-device/, runs the test suite, lists the backends, and measures the
# cuda node, its variants and the cuBLAS TF32 on/off nodes against cpu-ref and
# cpu with `ops` on the default shapes and on a real-size MoE layer
# (Qwen3-30B-A3B: hidden 2048, expert FFN 768, 128 experts, top-8, 64 tokens);
# then `audit` and `matrix` (on the fixture model) when this build has them, and
# the invariance step on the cuda and cuBLAS TF32 on/off nodes. Everything lands in
# OUTDIR: one log per phase, ops*.json/.txt, backends.json, ctest logs and
# JUnit, and summary.txt (phase, status, seconds, and the headline figures).
#
# Budget: the whole run must fit in 8 minutes on an H200 host with 16 cores.
# Each phase gets a timeout from what is left of a 450 s deadline; a phase that
# would start with under 10 s left is skipped and says so.
#
# Packages: best effort. On a machine where apt is unreachable (typical for a
# lent GPU box) the install step is skipped and the build uses what exists;
# configure falls back to no tests if GoogleTest is missing.
#
# Environment:
#   KVASIR_DEVICE_BUILD_DIR      build folder (default: <repo>/build-device)
#   KVASIR_DEVICE_BUILD_TARGETS  build only these targets (default: all); the
#                                test phase then runs the test_* among them directly
#   KVASIR_DEVICE_CHECK_FORCE=1  go on without an NVIDIA GPU (tests the script itself)
#   KVASIR_DEVICE_DEADLINE_S     overall budget in seconds (default 450)
#   KVASIR_DEVICE_BUILD_TIMEOUT_S cap of the build phase (default 300)
#
# Exit: 0 every phase passed; 1 a phase failed or timed out; 2 usage;
#       4 no CUDA device here, nothing measured (summary.txt says why).
set -uo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ] || [ "${1:0:1}" = "-" ]; then
  echo "usage: scripts/device-check.sh [BUNDLE.tar.xz] OUTDIR" >&2
  exit 2
fi
BUNDLE=""
if [ $# -eq 2 ]; then
  BUNDLE="$1"
  shift
  [ -f "$BUNDLE" ] || { echo "device-check: $BUNDLE: no such bundle" >&2; exit 2; }
fi
mkdir -p "$1" || exit 2
OUT="$(cd "$1" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${KVASIR_DEVICE_BUILD_DIR:-$ROOT/build-device}"
if [ -n "$BUNDLE" ]; then
  UNPACK="$(mktemp -d)"
  LINKED=""
  trap '[ -n "$LINKED" ] && rm -f "$LINKED"; rm -rf "$UNPACK"' EXIT
  tar -C "$UNPACK" -xJf "$BUNDLE" || { echo "device-check: $BUNDLE: cannot unpack" >&2; exit 2; }
  B="$UNPACK/kvasir-device"
  BUILD="$B/bin"
  ROOT="$B/src"
  export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  compiled_at="$(sed -n 's/^source_dir //p' "$B/MANIFEST")"
  if [ -L "$compiled_at" ] && [ ! -e "$compiled_at" ]; then
    rm -f "$compiled_at"  # a link an interrupted run left, to a bundle since deleted
  fi
  if [ -n "$compiled_at" ] && [ ! -e "$compiled_at" ]; then
    if mkdir -p "$(dirname "$compiled_at")" && ln -s "$ROOT" "$compiled_at"; then
      LINKED="$compiled_at"
    else
      echo "device-check: cannot link the bundle's tree at $compiled_at, where the binaries look for fixtures" >&2
      exit 2
    fi
  elif [ -n "$compiled_at" ]; then
    ROOT="$compiled_at"  # a tree is already there (this repository's checkout): the binaries read it
  fi
fi
JOBS="$(nproc)"
START=$(date +%s)
DEADLINE=$((START + ${KVASIR_DEVICE_DEADLINE_S:-450}))
SUMMARY="$OUT/summary.txt"
FAILED=0
BIN="$BUILD/kvasir-equiv"

: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

# run_phase NAME CAP_SECONDS LOG COMMAND... : runs COMMAND with stdout+stderr
# in LOG under a timeout of min(CAP, time left), records status and seconds.
run_phase() {
  local name=$1 cap=$2 log=$3
  shift 3
  local now left limit t0 rc status
  now=$(date +%s)
  left=$((DEADLINE - now))
  if [ "$left" -lt 10 ]; then
    say "$(printf '%-22s %-28s %5s s' "$name" "SKIPPED (time budget spent)" 0)"
    FAILED=1
    return 1
  fi
  limit=$((cap < left ? cap : left))
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    status="ok"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    status="TIMEOUT after ${limit}s"
    FAILED=1
  else
    status="FAILED (exit $rc)"
    FAILED=1
  fi
  say "$(printf '%-22s %-28s %5s s   %s' "$name" "$status" $(($(date +%s) - t0)) "${log#"$OUT"/}")"
  return $rc
}

say "kvasir-equiv device check — $(date -u '+%Y-%m-%d %H:%M:%SZ') on $(hostname)"
if [ -n "$BUNDLE" ]; then
  say "bundle $BUNDLE: $(sed -n 's/^commit //p' "$B/MANIFEST" | cut -c1-12), $(sed -n 's/^built //p' "$B/MANIFEST"); CUDA archs $(sed -n 's/^cuda_archs //p' "$B/MANIFEST")"
  say "tree $ROOT${LINKED:+ (linked at $LINKED)}, $JOBS cores"
else
  say "repo $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'no git')), build $BUILD, $JOBS cores"
fi

# --- 0. is there an NVIDIA GPU at all? -------------------------------------------
{
  uname -a
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  nvcc --version 2>&1 || echo "nvcc: not on PATH"
  cmake --version 2>&1 | head -1
} >"$OUT/env.txt" 2>&1
gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
if [ "${gpus:-0}" -eq 0 ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then why="nvidia-smi lists no GPU"; else why="nvidia-smi not found: no NVIDIA driver"; fi
  if [ "${KVASIR_DEVICE_CHECK_FORCE:-0}" != "1" ]; then
    say "no CUDA device: $why — nothing to measure on this machine (env in env.txt)."
    say "(KVASIR_DEVICE_CHECK_FORCE=1 runs the build and the CPU-side phases anyway.)"
    exit 4
  fi
  say "no CUDA device: $why — KVASIR_DEVICE_CHECK_FORCE=1, going on; cuda phases will report it absent"
else
  say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
fi
say ""
say "$(printf '%-22s %-28s %5s     %s' phase status time log)"

if [ -z "$BUNDLE" ]; then
# --- 1. packages (best effort) -------------------------------------------------------
# setup.sh exits when it cannot install (not root / apt unreachable): in a
# subshell that only ends this phase.
failed_before=$FAILED
run_phase packages 60 "$OUT/packages.log" \
  bash -c "source '$ROOT/scripts/setup.sh' && kvasir_install_packages" \
  || say "  (packages: best effort, not counted; continuing with what is installed)"
FAILED=$failed_before

# --- 2. configure + build -----------------------------------------------------------
cmake_args=(-S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVASIR_CUDA=ON -DKVASIR_HIP=OFF
            -DKVASIR_BENCH=OFF)
command -v ninja >/dev/null 2>&1 || cmake_args=(-S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKVASIR_CUDA=ON
                                                -DKVASIR_HIP=OFF -DKVASIR_BENCH=OFF)
if ! run_phase configure 120 "$OUT/configure.log" cmake "${cmake_args[@]}"; then
  if grep -q "GTest" "$OUT/configure.log"; then
    rm -rf "$BUILD"
    run_phase configure-no-tests 120 "$OUT/configure-no-tests.log" cmake "${cmake_args[@]}" -DKVASIR_TESTS=OFF
  fi
fi
grep -E "✓|✗|cuda:|hip:" "$OUT/configure"*.log >>"$SUMMARY" 2>/dev/null
targets=()
for t in ${KVASIR_DEVICE_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
run_phase build "${KVASIR_DEVICE_BUILD_TIMEOUT_S:-300}" "$OUT/build.log" cmake --build "$BUILD" --parallel "$JOBS" "${targets[@]}"
fi  # not a bundle
BIN="$BUILD/kvasir-equiv"
if [ ! -x "$BIN" ]; then
  say "no kvasir-equiv binary: stopping (see build.log)"
  exit 1
fi
if [ -n "$BUNDLE" ]; then
  # The bundle's binaries load: every library resolved (ldd names what is missing).
  missing="$(ldd "$BIN" "$BUILD"/test_* 2>/dev/null | grep "not found" | sort -u)"
  [ -z "$missing" ] || say "libraries missing: $missing"
fi

# --- 3. tests ---------------------------------------------------------------------------------
if [ -n "$BUNDLE" ]; then
  # No ctest here: the two suites that speak for the device, run directly.
  for t in test_gpu test_conformance; do
    [ -x "$BUILD/$t" ] && run_phase "$t" 150 "$OUT/$t.log" env -C "$ROOT" "$BUILD/$t" --gtest_output="xml:$OUT/$t.xml"
  done
  grep -E "tests? from .* ran|PASSED|FAILED  \]" "$OUT/test_conformance.log" 2>/dev/null | sed 's/^/  /' >>"$SUMMARY"
elif [ -n "${KVASIR_DEVICE_BUILD_TARGETS:-}" ]; then
  for t in $KVASIR_DEVICE_BUILD_TARGETS; do
    case "$t" in test_*)
      [ -x "$BUILD/$t" ] && run_phase "$t" 120 "$OUT/$t.log" env -C "$ROOT" "$BUILD/$t" --gtest_output="xml:$OUT/$t.xml" ;;
    esac
  done
elif [ -f "$BUILD/CTestTestfile.cmake" ]; then
  run_phase ctest 180 "$OUT/ctest.log" \
    ctest --test-dir "$BUILD" --output-on-failure --parallel "$JOBS" --timeout 170 --output-junit "$OUT/ctest.xml"
  grep -E "tests passed|tests failed|Total Test time" "$OUT/ctest.log" | sed 's/^/  /' >>"$SUMMARY"
  # The GPU suite on its own, verbose: its skips and the [ info ] lines (TF32 figures).
  [ -x "$BUILD/test_gpu" ] && run_phase test_gpu 120 "$OUT/test_gpu.log" env -C "$ROOT" "$BUILD/test_gpu" \
    --gtest_output="xml:$OUT/test_gpu.xml"
else
  say "tests: not configured (no GoogleTest), skipped"
fi
[ -f "$OUT/test_gpu.log" ] && grep -E "^\[ info \]|PASSED|FAILED  \]|SKIPPED \] [0-9]" "$OUT/test_gpu.log" \
  | sed 's/^/  /' >>"$SUMMARY"

# --- 4. backends ----------------------------------------------------------------------------
run_phase backends 30 "$OUT/backends.json" "$BIN" backends --json
"$BIN" backends >"$OUT/backends.txt" 2>&1
grep -E "^cuda|^hip" "$OUT/backends.txt" | sed 's/^/  /' >>"$SUMMARY"

cuda_ok=0
if grep -qE "^cuda:0 +available" "$OUT/backends.txt"; then
  cuda_ok=1
else
  # The reason is the "Absent" list's entry (the table only says "why: below").
  why=$(awk '/^  cuda: /{on=1; sub(/^  cuda: /, ""); printf "%s", $0; next} on && /^      /{sub(/^ +/, " "); printf "%s", $0; next} {on=0}' "$OUT/backends.txt")
  say "cuda absent: ${why:-see backends.txt} — cuda measurements skipped"
  FAILED=1
fi

# --- 5. ops: default shapes, every GPU variant ------------------------------------------------
# Node specs with several options use ':' between them (cuda:0:blas=cublas:tf32=1):
# --backends splits its list on ','.
nodes="cpu-ref,cpu,cpu:acc=f16,cuda:0,cuda:0:acc=f16,cuda:0:storage=bf16,cuda:0:nondeterministic=1"
nodes="$nodes,cuda:0:blas=cublas:tf32=0,cuda:0:blas=cublas:tf32=1"
real_nodes="cpu-ref,cpu,cuda:0,cuda:0:blas=cublas:tf32=0,cuda:0:blas=cublas:tf32=1"
if [ $cuda_ok -eq 1 ]; then
  run_phase ops-default 90 "$OUT/ops.txt" "$BIN" ops --backends "$nodes" -o "$OUT/ops.json"

  # --- 6. ops: real-size Qwen3-30B-A3B MoE layer (synthetic weights) ------------------------------
  real_shape=(--hidden 2048 --intermediate 768 --top-k 8 --tokens 64)
  if ! run_phase ops-real-128experts 150 "$OUT/ops-real.txt" \
      "$BIN" ops --backends "$real_nodes" "${real_shape[@]}" --experts 128 -o "$OUT/ops-real.json"; then
    run_phase ops-real-32experts 60 "$OUT/ops-real-32.txt" \
      "$BIN" ops --backends "$real_nodes" "${real_shape[@]}" --experts 32 -o "$OUT/ops-real-32.json"
  fi
fi

# --- 7. audit and matrix (real model layers: the fixture), when this build has them -----------
# Both default to every available node (cuda:0 included when present) plus cpu:acc=f16.
# The default audit is the trained fixture from text (protocols/trained.json,
# with its 250-item task: 1000 scored requests per node); the invariance run
# takes protocols/default.json, the id-stream protocol, to stay short.
help="$("$BIN" --help 2>&1)"
if grep -qE "^\s+audit\b" <<<"$help"; then
  run_phase audit 150 "$OUT/audit.txt" "$BIN" audit --json -o "$OUT/audit.json"
  # The invariance step on the GPU nodes (issue #21): cuBLAS picks its
  # algorithm by shape (TF32 off and on), the hand-written kernels do not;
  # the atomics variant shows in the repeated requests. The whole default
  # protocol runs (steps 1–6 too), so every figure has its context.
  if [ $cuda_ok -eq 1 ]; then
    run_phase invariance 90 "$OUT/invariance.txt" "$BIN" audit -p "$ROOT/protocols/default.json" --gate none \
      --backends "cpu-ref,cpu,cuda:0,cuda:0:blas=cublas:tf32=0,cuda:0:blas=cublas:tf32=1,cuda:0:nondeterministic=1" \
      -o "$OUT/invariance.json"
    sed -n '/^Invariance/,/^$/p' "$OUT/invariance.txt" | sed 's/^/  /' >>"$SUMMARY"
  fi
else
  say "audit: not in this build, skipped"
fi
if grep -qE "^\s+matrix\b" <<<"$help"; then
  matrix_nodes=()
  [ $cuda_ok -eq 1 ] && matrix_nodes=(--backends "cpu-ref,cpu,cpu:acc=f16,cuda:0,cuda:0:blas=cublas:tf32=0,cuda:0:blas=cublas:tf32=1")
  run_phase matrix 90 "$OUT/matrix.txt" "$BIN" matrix "${matrix_nodes[@]}" -o "$OUT/matrix.json" \
    --markdown "$OUT/matrix.md"
else
  say "matrix: not in this build, skipped"
fi

# --- 7b. bundle mode: GFLOP/s, transfers per step, utilisation --------------------------------------
if [ -n "$BUNDLE" ] && [ $cuda_ok -eq 1 ]; then
  [ -x "$BUILD/bench_opencl" ] && run_phase gflops 120 "$OUT/gflops.txt" "$BUILD/bench_opencl" \
    --benchmark_filter='^(matmul_resident|moe_block_resident)/cuda' --benchmark_min_time=0.1
  grep -E "^(matmul_resident|moe_block_resident)/" "$OUT/gflops.txt" 2>/dev/null | sed 's/^/  /' >>"$SUMMARY"
  # One capture of the default protocol on cuda:0 with its transfers per step,
  # the GPU's utilisation sampled every second meanwhile.
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi dmon -s u -d 1 >"$OUT/dmon.txt" 2>&1 &
    dmon=$!
  fi
  run_phase capture-cuda 120 "$OUT/capture-cuda.txt" "$BIN" capture -b cuda:0 -p "$ROOT/protocols/default.json" \
    -o "$OUT/cuda.safetensors" --timings
  [ -n "${dmon:-}" ] && kill "$dmon" 2>/dev/null
  sed -n '/^  transfers/,$p' "$OUT/capture-cuda.txt" | sed 's/^/  /' >>"$SUMMARY"
  [ -s "$OUT/dmon.txt" ] && awk '$1 ~ /^[0-9]+$/ { n++; s += $2; if ($2 > 0) busy++ } END {
      if (n) printf "  GPU utilisation during the capture: mean %.1f %%, %d of %d one-second samples non-zero\n", s / n, busy, n }' \
      "$OUT/dmon.txt" >>"$SUMMARY"
  rm -f "$OUT/cuda.safetensors"
fi

# --- 8. headline figures ---------------------------------------------------------------------------
figures() {  # figures OPS_JSON TITLE
  [ -s "$1" ] || return 0
  command -v python3 >/dev/null 2>&1 || { say "  (python3 missing: see $1)"; return 0; }
  say ""
  say "$2 — max|Δ| and cosine per op (reference → candidate)"
  python3 - "$1" <<'PY' | tee -a "$SUMMARY"
import json, sys
doc = json.load(open(sys.argv[1]))
def num(v, spec):  # NaN/inf are written as strings or null by the JSON report
    return format(v, spec) if isinstance(v, (int, float)) else str(v)
want = [("cpu-ref", "cuda:0"), ("cpu", "cuda:0"), ("cpu-ref", "cpu"),
        ("cpu-ref", "cuda:0:blas=cublas,tf32=0"), ("cpu-ref", "cuda:0:blas=cublas,tf32=1"),
        ("cuda:0", "cuda:0:blas=cublas,tf32=0"), ("cpu-ref", "cuda:0:acc=f16"), ("cpu:acc=f16", "cuda:0:acc=f16"),
        ("cpu-ref", "cuda:0:storage=bf16"), ("cuda:0", "cuda:0:nondeterministic=1")]
for op in doc["ops"]:
    pairs = {(p["reference"], p["candidate"]): p["stats"] for p in op["pairs"]}
    for ref, cand in want:
        s = pairs.get((ref, cand))
        if s is not None:
            print(f"  {op['op']:<15} {ref:>12} → {cand:<28} max|Δ| {num(s['max_abs'], '<10.3g')} cosine {num(s['cosine'], '.10f')}")
    for node, err in op.get("errors", {}).items():
        print(f"  {op['op']:<15} {node}: ERROR {err}")
for s in doc.get("shard_checks", []):
    if s["node"].startswith("cuda"):
        st = s.get("stats")
        print(f"  shard check {s['node']:<28} " + (f"max|Δ| {num(st['max_abs'], '.3g')}" if st else "ERROR " + s.get("error", "")))
PY
}
figures "$OUT/ops.json" "default shapes"
figures "$OUT/ops-real.json" "real-size Qwen3-30B-A3B layer, 128 experts"
figures "$OUT/ops-real-32.json" "real-size Qwen3-30B-A3B layer, 32 experts"

say ""
say "total $(($(date +%s) - START)) s (budget ${KVASIR_DEVICE_DEADLINE_S:-450} s); $([ $FAILED -eq 0 ] && echo 'every phase passed' || echo 'some phase FAILED')"
if [ -n "$BUNDLE" ]; then
  tar -C "$(dirname "$OUT")" -czf "$OUT.tar.gz" "$(basename "$OUT")" && echo "every log: $OUT.tar.gz"
fi
exit $FAILED
