#!/usr/bin/env bash
# Whole-model prefill and decode, kvasir's cpu node next to llama.cpp's CPU
# backend on the same GGUF, alternating (BENCHMARKS.md, "Whole model"). Not a
# test: timings go to stdout only.
#
#   bench/side_by_side_llamacpp.sh [ROUNDS] [MODEL]
#
# MODEL defaults to /work/bench-models/qwen3moe-bench-f32.gguf (written by
# scripts/make_bench_gguf.py with the llama.cpp venv's numpy and gguf:
# build/llamacpp/venv/bin/python scripts/make_bench_gguf.py). llama.cpp is the
# build/llamacpp that ./scripts/test makes; llama-bench is built here, once,
# with one local change: its -ctk/-ctv parser knows f16, bf16 and the q types
# only, so "f32" is added for a like-for-like f32 KV cache (kvasir's).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rounds="${1:-3}"
model="${2:-/work/bench-models/qwen3moe-bench-f32.gguf}"
lc=build/llamacpp
[ -f "$model" ] || { echo "no $model (scripts/make_bench_gguf.py writes it)" >&2; exit 2; }
[ -x build/bench_model ] || { echo "no build/bench_model (./scripts/kvasir builds it)" >&2; exit 2; }
[ -d "$lc/build" ] || { echo "no $lc/build (./scripts/test builds llama.cpp once)" >&2; exit 2; }
src="$lc/src/vendor/llama.cpp/tools/llama-bench/llama-bench.cpp"
if ! grep -q 'if (s == "f32")' "$src"; then
  python3 - "$src" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
old = 'static ggml_type ggml_type_from_name(const std::string & s) {\n'
assert old in s
open(p, 'w').write(s.replace(old, old + '    if (s == "f32") {\n        return GGML_TYPE_F32;\n    }\n', 1))
PY
fi
cmake --build "$lc/build" --target llama-bench >/dev/null
export LD_LIBRARY_PATH="$lc/build/bin"
lb="$lc/build/bin/llama-bench"
for round in $(seq 1 "$rounds"); do
  for t in 1 2; do
    echo "== round $round, $t thread(s)"
    build/bench_model "$model" --node "cpu:threads=$t" --prompt 512 --gen 128 --reps 2 | tail -2
    build/bench_model "$model" --node "cpu:threads=$t" --prompt 1 --gen 128 --reps 2 | tail -2
    "$lb" -m "$model" -t "$t" -p 512 -n 128 -ctk f32 -ctv f32 -fa 0 --poll 0 -r 2 | grep -E "pp512|tg128" | awk -F'|' '{print "llama.cpp", $11, $12}'
    "$lb" -m "$model" -t "$t" -p 0 -n 128 -ctk f32 -ctv f32 -fa 0 --poll 0 -r 2 | grep -E "tg128" | awk -F'|' '{print "llama.cpp (empty cache)", $11, $12}'
  done
done
