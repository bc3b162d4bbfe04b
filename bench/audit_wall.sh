#!/usr/bin/env bash
# Wall time of the default audit (trained fixture, default nodes, one process
# per node) quiet, at 16 OpenMP threads and beside one busy process, with
# -j 1 and the default --jobs; optionally an older binary beside it
# (BENCHMARKS.md "Stop 46"). Not a test: timings go to stdout only.
#
#   bench/audit_wall.sh [OLD_BINARY]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
new=./build/kvasir-equiv
old="${1:-}"
err=$(mktemp)
trap 'rm -f "$err"; [ -n "${busy:-}" ] && kill "$busy" 2>/dev/null' EXIT
t() { local label="$1"; shift; /usr/bin/time -f "$label %e s" "$@" -o /dev/null >/dev/null 2>"$err"; tail -1 "$err"; }
for mode in quiet omp16 busy; do
  echo "== $mode"
  env=()
  [ "$mode" = omp16 ] && env=(OMP_NUM_THREADS=16)
  busy=
  if [ "$mode" = busy ]; then ( while :; do :; done ) & busy=$!; fi
  [ -n "$old" ] && t "old" env "${env[@]}" "$old" audit
  t "-j 1" env "${env[@]}" "$new" audit -j 1
  t "default --jobs" env "${env[@]}" "$new" audit
  [ -n "$busy" ] && kill "$busy" && busy=
done
echo "== per node (capture, authority cpu-ref)"
for b in cpu-ref cpu opencl:0 cpu:acc=f16; do
  /usr/bin/time -f "$b wall %e s user %U sys %S" "$new" capture --backend "$b" --authority cpu-ref \
    --protocol protocols/trained.json -o /dev/null 2>&1 | tail -1
done
