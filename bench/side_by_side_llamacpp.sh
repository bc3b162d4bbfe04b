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
# with two local changes, both for like-for-like figures: its -ctk/-ctv parser
# knows f16, bf16 and the q types only, so "f32" is added (kvasir's f32 KV
# cache); and its prompt batches ask for the last row's logits only, where
# kvasir's Decoder computes every row's (what an audit needs: 512 x vocab x
# hidden more multiply-adds), so they ask for every row's.
#
# Decode is measured twice: from an empty cache (llama-bench -p 0 -n 128,
# kvasir --prompt 1) and after 512 cached tokens (llama-bench -d 512 -n 128,
# kvasir --prompt 512: the tg figure after its prefill). llama-bench's -p 512
# -n 128 runs tg128 from an empty cache; comparing that with kvasir's decode
# after 512 tokens (as stops 33-34 did) held kvasir to the harder case.
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
if ! grep -q 'kvasir: every row' "$src"; then
  python3 - "$src" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
old = '        common_batch batch = common_batch_get_one(ctx, tokens.data(), n_tokens);\n'
assert s.count(old) == 1
new = ('        common_batch batch(ctx);  // kvasir: every row\'s logits, as its Decoder computes them\n'
       '        const llama_pos pos0 = llama_memory_seq_pos_max(llama_get_memory(ctx), 0) + 1;\n'
       '        for (int i = 0; i < n_tokens; ++i) batch.add(tokens[i], pos0 + i, 0, true);\n')
open(p, 'w').write(s.replace(old, new, 1))
PY
fi
cmake --build "$lc/build" --target llama-bench >/dev/null
export LD_LIBRARY_PATH="$lc/build/bin"
lb="$lc/build/bin/llama-bench"
for round in $(seq 1 "$rounds"); do
  for t in ${THREADS:-1 2}; do
    echo "== round $round, $t thread(s)"
    build/bench_model "$model" --node "cpu:threads=$t" --prompt 512 --gen 128 --reps 2 | tail -2
    build/bench_model "$model" --node "cpu:threads=$t" --prompt 1 --gen 128 --reps 2 | tail -2
    "$lb" -m "$model" -t "$t" -p 512 -n 0 -ctk f32 -ctv f32 -fa 0 --poll 0 -r 2 | grep -E "pp512" | awk -F'|' '{print "llama.cpp", $11, $12}'
    "$lb" -m "$model" -t "$t" -p 0 -n 128 -d 512 -ctk f32 -ctv f32 -fa 0 --poll 0 -r 2 | grep -E "tg128" | awk -F'|' '{print "llama.cpp (after 512)", $11, $12}'
    "$lb" -m "$model" -t "$t" -p 0 -n 128 -ctk f32 -ctv f32 -fa 0 --poll 0 -r 2 | grep -E "tg128" | awk -F'|' '{print "llama.cpp (empty cache)", $11, $12}'
  done
done
