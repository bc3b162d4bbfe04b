#!/usr/bin/env bash
# Every edge answers correctly (issue #22), one block per class: bad option
# values, special files where a file is read, output misuse, a config that
# lacks a size or disagrees with its tensors, non-finite step results. Each
# case asserts the exit code and that the one-line message names the object.
# (Tampered-but-rehashed captures: tests/steps/test_capture.cpp; SIGINT and
# the atomic write's temporaries: tests/core/test_io.cpp.)
# Usage: test_cli_edges.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
M=fixtures/models/qwen3_moe_tiny
ci=protocols/ci.json

# expect_rc RC WANT ARGS...: exit RC, and stderr's error line contains WANT.
expect_rc() {
  local want_rc="$1" want="$2"; shift 2
  local err rc
  err=$(timeout 60 "$bin" "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne "$want_rc" ] || { [ -n "$want" ] && ! printf '%s' "$err" | grep -qF -- "$want"; }; then
    echo "FAIL: kvasir-equiv $* → rc=$rc: $err (wanted rc $want_rc, a line containing '$want')"
    failures=$((failures + 1))
  else
    echo "ok: $* → rc $rc: $(printf '%s' "$err" | head -1)"
  fi
}

# --- 1. options are validated, never coerced --------------------------------
expect_usage_error "--seed: '-1' is not an unsigned decimal integer" ops --seed -1 --ops matmul
expect_usage_error "--seed: '18446744073709551616' is outside 0..18446744073709551615" ops --seed 18446744073709551616
expect_usage_error "--seed: ' 7' is not" ops --seed " 7"
expect_usage_error "--seed: '-5' is not" audit --seed -5
expect_usage_error "--seed: '1e3' is not" capture --backend cpu -o "$tmp/c.st" --seed 1e3
expect_usage_error "--seed: '-1' is not" logits --seed -1
expect_usage_error "--tokens: '99999999999999999999' is outside" ops --tokens 99999999999999999999
expect_usage_error "--tokens: '0x10' is not a decimal integer" ops --tokens 0x10
expect_usage_error "--rms-eps: '1e999' is outside the range of a double" ops --rms-eps 1e999
expect_usage_error "--threshold: 'nan' is not a finite decimal number" drift --threshold nan
expect_usage_error "--border: 'inf' is not a finite" decide --border inf
expect_usage_error "--layer -1 is outside 0..3" ops --model $M --layer -1
expect_usage_error "--layer -1 is outside 0..3" matrix --layer -1
expect_usage_error "--output: an empty value" audit -o ""
expect_usage_error "--reference: an empty value" logits --reference ""
# A token count the run cannot hold: refused with the estimate, before anything is allocated. The model
# claims a 2²⁰-token vocabulary (its tensors are never read: the refusal comes first), so 2²⁰ tokens'
# logits alone are ~16 TiB per node run — more than any machine has.
mkdir "$tmp/bigvocab" && ln -s "$PWD/$M/model.safetensors" "$tmp/bigvocab/model.safetensors"
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["vocab_size"] = 1 << 20; json.dump(c, open(sys.argv[2], "w"))' \
  $M/config.json "$tmp/bigvocab/config.json"
# The view runs in this process: every node's logits are held until they are compared.
expect_usage_error "logits: 1048576 tokens (2 node runs held at once) need at least" logits -m "$tmp/bigvocab" --tokens 1048576 \
  -b cpu-ref,cpu
expect_usage_error "logits: 1048576 tokens (3 node runs held at once) need at least" logits -m "$tmp/bigvocab" --tokens 1048576 \
  --repeat -b cpu-ref,cpu,cpu:acc=f16
# A healthy node whose drift has no power-law fit (bit-identical to the reference: every delta 0) is not "non-finite".
expect_rc 0 "" drift -b cpu,cpu:threads=1 -r cpu
# A candidate whose step fails is named as an error, exit 1 (not as non-finite results).
expect_rc 1 "cpu:fault=bitflip,fault_bit=60: error in logits: fault=bitflip: bit 60 does not exist" logits \
  -b cpu-ref,cpu:fault=bitflip,fault_bit=60
expect_usage_error "unknown command 'frobnicate' (commands: audit, capture, compare" frobnicate
# A multi-value option takes one value per use: it never swallows the captures after it.
"$bin" capture --backend cpu-ref -p $ci --steps ops -o "$tmp/ref.st" >/dev/null 2>&1
"$bin" capture --backend cpu -p $ci --steps ops -o "$tmp/cpu.st" >/dev/null 2>&1
check "compare --only-steps ops A B: both captures compared" \
  bash -c "'$bin' compare -p $ci --only-steps ops '$tmp/ref.st' '$tmp/cpu.st' | grep -qE '^cpu +fit'"
expect_usage_error "--only-steps: protocol 'ci' does not run step \"warmup\"" compare -p $ci --only-steps warmup "$tmp/ref.st" "$tmp/cpu.st"
expect_usage_error "not expected: cpu" ops --backends cpu-ref cpu

# A protocol value that overflows a double, a protocol field the model does not fit: exit 2 naming the
# JSON path, before any step runs.
sed 's/"rope_theta": 1000000.0/"rope_theta": 1e999/' $ci >"$tmp/overflow.json"
expect_usage_error "overflow.json: /steps/ops/rope_theta: a number outside the range of a double" audit -p "$tmp/overflow.json"
python3 tests/cli/protocol_variant.py $ci "$tmp/layer9.json" ci-layer9 --set 'ops.weights="model"' --set ops.layer=9 >/dev/null
expect_usage_error "layer9.json: /steps/ops/layer: 9 is outside 0..3" audit -p "$tmp/layer9.json" -b cpu-ref,cpu
python3 tests/cli/protocol_variant.py $ci "$tmp/dense.json" ci-dense --set 'ops.weights="model"' --set ops.layer=2 \
  --set 'ops.ops=["moe"]' >/dev/null
expect_usage_error "dense.json: /steps/ops: op 'moe' needs a MoE layer, but layer 2" audit -p "$tmp/dense.json" -b cpu-ref,cpu

# --- 2. special files are refused by name before they are read -------------
mkfifo "$tmp/fifo"
python3 -c "import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])" "$tmp/sock"
mkdir "$tmp/dir"
ln -s loop2 "$tmp/loop1"; ln -s loop1 "$tmp/loop2"
ln -s nowhere "$tmp/dangling"
for what in "--model:inspect" "--protocol:audit -p" "--tokens-file:logits --tokens-file" "capture:compare"; do
  label=${what%%:*}; args=${what#*:}
  # shellcheck disable=SC2086  # $args is the command and its option, split on purpose
  {
    expect_usage_error "$tmp/fifo: is a FIFO (named pipe), not a regular file" $args "$tmp/fifo"
    expect_usage_error "$tmp/sock: is a socket, not a regular file" $args "$tmp/sock"
    expect_usage_error "/dev/zero: is a character device, not a regular file" $args /dev/zero
    expect_usage_error "$tmp/loop1: a symlink loop" $args "$tmp/loop1"
    expect_usage_error "$tmp/dangling: a symlink to nothing" $args "$tmp/dangling"
    expect_usage_error "$tmp/missing: no such file or directory" $args "$tmp/missing"
  }
  [ "$label" = "--model" ] || expect_usage_error "$tmp/dir: is a directory, not a regular file" $args "$tmp/dir"
done
expect_usage_error "$tmp/dir/config.json: no such file or directory" inspect "$tmp/dir"
# Permission denied says so (root reads anything: run as nobody).
cp $ci "$tmp/secret.json" && chmod 000 "$tmp/secret.json" && chmod 755 "$tmp"
if [ "$(id -u)" -eq 0 ]; then
  err=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$bin" audit -p "$tmp/secret.json" 2>&1 >/dev/null); rc=$?
else
  err=$("$bin" audit -p "$tmp/secret.json" 2>&1 >/dev/null); rc=$?
fi
check "an unreadable protocol: exit 2, 'permission denied' ($err)" \
  bash -c "[ $rc -eq 2 ] && grep -qF '$tmp/secret.json: permission denied' <<<\"\$1\"" _ "$err"

# --- 3. outputs ---------------------------------------------------------------
expect_usage_error "--output and --junit name the same file" audit -p $ci -b cpu-ref -o "$tmp/r.json" --junit "$tmp/r.json"
expect_usage_error "--output and --html name the same file" audit -p $ci -b cpu-ref -o "$tmp/r.json" --html "$tmp/./r.json"
ln -s r.json "$tmp/alias.json"
expect_usage_error "--markdown and --csv name the same file" compare -p $ci "$tmp/ref.st" --markdown "$tmp/r.json" --csv "$tmp/alias.json"
expect_usage_error "--output and --markdown name the same file" matrix -o "$tmp/m" --markdown "$tmp/m"
expect_usage_error "--output $tmp/fifo: is a FIFO (named pipe); an output is never written over one" audit -p $ci -b cpu-ref -o "$tmp/fifo"
expect_usage_error "--html $tmp/dir: is a directory; an output is never written over one" compare -p $ci "$tmp/ref.st" --html "$tmp/dir"
expect_usage_error "--output $tmp/sock: is a socket" capture --backend cpu -p $ci --steps ops -o "$tmp/sock"
expect_usage_error "--output $tmp/fifo: is a FIFO" logits -o "$tmp/fifo"
expect_usage_error "--output $tmp/fifo: is a FIFO" ops --ops matmul -o "$tmp/fifo"
check "the FIFO, socket and folder are still what they were" test -p "$tmp/fifo" -a -S "$tmp/sock" -a -d "$tmp/dir"
check "nothing was written over them, no temporary left" test -z "$(find "$tmp" -name '*.tmp-*')"

# Interrupted: SIGTERM to an isolated audit (one node hangs) removes the node processes' temporary folder.
mkdir "$tmp/tmpdir"
TMPDIR="$tmp/tmpdir" "$bin" audit -p $ci -b cpu-ref,cpu:fault=hang -o "$tmp/interrupted.json" >/dev/null 2>&1 &
audit_pid=$!
for _ in $(seq 600); do [ -n "$(ls -A "$tmp/tmpdir")" ] && break; sleep 0.1; done
check "the isolated audit made its temporary folder" test -n "$(ls -A "$tmp/tmpdir")"
kill -TERM $audit_pid; wait $audit_pid; rc=$?
check "SIGTERM ends the audit by the signal (exit 143, got $rc)" test $rc -eq 143
check "SIGTERM removed the temporary folder and everything in it" test -z "$(ls -A "$tmp/tmpdir")"
check "no report was half-written" test ! -e "$tmp/interrupted.json"

# --- 4. a config that lacks a size, or disagrees with its tensors -----------
mkdir "$tmp/nosize" "$tmp/wrong"
cp $M/model.safetensors "$tmp/nosize/" && cp $M/model.safetensors "$tmp/wrong/"
python3 - "$M/config.json" "$tmp" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
d = dict(c); d.pop("hidden_size"); json.dump(d, open(sys.argv[2] + "/nosize/config.json", "w"))
w = dict(c); w["moe_intermediate_size"] += 8; json.dump(w, open(sys.argv[2] + "/wrong/config.json", "w"))
EOF
expect_usage_error "nosize/config.json: required key \"hidden_size\" is missing" inspect "$tmp/nosize"
expect_usage_error "model.layers.0.mlp.experts.0.gate_proj.weight has shape .64, 96., expected .72, 96. from the config" inspect "$tmp/wrong"
expect_usage_error "expected .72, 96. from the config" logits --model "$tmp/wrong"

# Integer weights: refused naming the tensor and the file (the header says I32 for a norm; same bytes).
mkdir "$tmp/intw" && cp $M/config.json "$tmp/intw/"
python3 - $M/model.safetensors "$tmp/intw/model.safetensors" <<'EOF'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
h = json.loads(raw[8:8 + n])
h["model.norm.weight"]["dtype"] = "I32"
text = json.dumps(h, separators=(",", ":")).encode()
text += b" " * ((8 - (8 + len(text)) % 8) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
EOF
expect_usage_error "intw/model.safetensors: tensor model.norm.weight is I32: a model weight must be floating point" inspect "$tmp/intw"
expect_usage_error "intw/model.safetensors: tensor model.norm.weight is i32: a model weight must be floating point" logits -m "$tmp/intw"

# --- 5. non-finite step results end in a non-zero exit ----------------------
expect_rc 1 "cpu:fault=nan: error in generate: generate: step 0 produced only NaN logits" generate \
  --backends cpu-ref,cpu:fault=nan,cpu
for c in drift logits perplexity matrix; do
  expect_rc 1 "cpu:fault=nan: non-finite results in $c" $c --backends cpu-ref,cpu:fault=nan,cpu
done
expect_rc 1 "cpu:fault=nan: non-finite results in ops" ops --backends cpu-ref,cpu:fault=nan --ops matmul --hidden 32 --intermediate 16
expect_rc 2 "the reference cpu:fault=nan computed non-finite values" ops --reference cpu:fault=nan --backends cpu --ops matmul \
  --hidden 32 --intermediate 16
expect_rc 0 "" logits --backends cpu-ref,cpu
expect_rc 0 "" ops --backends cpu-ref,cpu --ops matmul --hidden 32 --intermediate 16

# --- 6. the backends table stays readable: an absent backend's long reason goes below it, wrapped.
"$bin" backends >"$tmp/backends.txt"
check "backends: the table and the reasons fit in 110 columns" \
  bash -c "sed '/^Variants/,\$d' '$tmp/backends.txt' | awk 'length > 110 { bad = 1 } END { exit bad }'"
check "backends: an absent backend says why below the table" \
  bash -c "! grep -q absent '$tmp/backends.txt' || grep -qE '^  (cuda|hip|opencl): ' '$tmp/backends.txt'"

# --- 7. what users hit (issue #44), each with its exact message ---------------
# -o /dev/null discards an output that must be named; every output may be discarded at once; /dev/null stays
# the null device; other devices are still refused, saying which one is allowed.
expect_rc 0 "" ops --backends cpu-ref,cpu --ops matmul --hidden 32 --intermediate 16 -o /dev/null
expect_rc 0 "" audit -p $ci -b cpu-ref,cpu --steps ops -o /dev/null --html /dev/null --junit /dev/null
expect_rc 0 "" capture --backend cpu -p $ci --steps ops -o /dev/null
expect_rc 0 "timings (wall seconds; not part of the report)" capture --backend cpu -p $ci --steps ops -o /dev/null --timings
ln -s /dev/null "$tmp/sink"
expect_rc 0 "" matrix -o "$tmp/sink" --markdown /dev/null
check "/dev/null is still the null device, the link still a link" test -c /dev/null -a -L "$tmp/sink"
expect_usage_error "--output /dev/zero: is a character device; an output is never written over one (of the devices only /dev/null, which discards it)" \
  ops --ops matmul -o /dev/zero
expect_usage_error "--html /dev/full: is a character device" audit -p $ci -b cpu-ref --html /dev/full
# A model folder whose model.safetensors is there but not a file: named as what it is, never "holds neither".
for kind in fifo dir zero dangling; do
  mkdir "$tmp/m_$kind" && cp $M/config.json "$tmp/m_$kind/"
done
mkfifo "$tmp/m_fifo/model.safetensors"
mkdir "$tmp/m_dir/model.safetensors"
ln -s /dev/zero "$tmp/m_zero/model.safetensors"
ln -s nowhere "$tmp/m_dangling/model.safetensors"
expect_usage_error "m_fifo/model.safetensors: is a FIFO (named pipe), not a regular file" inspect "$tmp/m_fifo"
expect_usage_error "m_dir/model.safetensors: is a directory, not a regular file" inspect "$tmp/m_dir"
expect_usage_error "m_zero/model.safetensors: is a character device, not a regular file" logits -m "$tmp/m_zero"
expect_usage_error "m_dangling/model.safetensors: a symlink to nothing" audit -m "$tmp/m_dangling"
# A protocol's perplexity context out of range: the protocol file and its JSON path, not a CLI option's name.
python3 tests/cli/protocol_variant.py $ci "$tmp/ctx1.json" ci-ctx1 --set perplexity.context=1 >/dev/null
expect_usage_error "ctx1.json: /steps/perplexity/context: 1 is out of range \[2, 65536\]" audit -p "$tmp/ctx1.json"
python3 tests/cli/protocol_variant.py $ci "$tmp/ctx_big.json" ci-ctxbig --set perplexity.context=65537 >/dev/null
expect_usage_error "ctx_big.json: /steps/perplexity/context: 65537 is out of range \[2, 65536\]" capture -b cpu \
  -p "$tmp/ctx_big.json" -o "$tmp/never.st"
check "no capture was written for the refused protocol" test ! -e "$tmp/never.st"
# matrix on a dense layer names the MoE layers, so the next command is obvious.
expect_usage_error "op 'moe' needs a MoE layer, but layer 0 of fixtures/models/deepseek_v3_tiny is dense (layers: dense 0, MoE 1-3)" \
  matrix -m fixtures/models/deepseek_v3_tiny --layer 0
expect_usage_error "is dense (layers: dense 0, MoE 1-2)" ops -m fixtures/models/glm4_moe_tiny --layer 0 --ops moe
# llama-perplexity's flags are checked like every option.
expect_usage_error "--kl-divergence: exactly not in {exact,llamacpp-u16}" perplexity --kl-divergence=exactly
expect_usage_error "--score: second_half not in {all,second-half}" audit --score second_half
python3 tests/cli/protocol_variant.py $ci "$tmp/noppl.json" ci-noppl --steps ops >/dev/null
expect_usage_error "--kl-divergence: protocol 'ci-noppl' (.*noppl.json) has no perplexity step to apply it to" \
  audit -p "$tmp/noppl.json" --kl-divergence

echo "$failures failed"
[ "$failures" -eq 0 ]
