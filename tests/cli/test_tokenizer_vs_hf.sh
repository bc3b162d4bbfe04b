#!/usr/bin/env bash
# The C++ tokenizer against Hugging Face tokenizers, run live: random
# multilingual texts through both (tests/cli/tokenizer_vs_hf.py), for the
# three fixture tokenizers; then --text on the steps with a tokenizer trained
# here by tokenizers for the qwen3_moe fixture (vocabulary 384): the prompt's
# ids are tokenizers' ids, generate prints the decoded continuation, and the
# tokenize command's errors are one line, exit 2.
set -u
bin="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$here/common.sh"
require_test_python "the live tokenizers comparison" tokenizers

tok="$root/fixtures/tokenizers"
check "random texts: ids and decode equal tokenizers" \
  "$py" "$here/tokenizer_vs_hf.py" "$bin" "$tok/qwen2_style.json" "$tok/llama3_style.json" "$tok/gpt2_style.json"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$root/fixtures/models/qwen3_moe_tiny" "$work/m"
rm -f "$work/m/reference.safetensors"
"$py" - "$work/m/tokenizer.json" "$root/fixtures/tokenizers/multilingual.txt" <<'PY'
import sys
from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, processors, trainers
t = Tokenizer(models.BPE())
t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), "isolated"),
                                           pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
t.decoder = decoders.ByteLevel()
tr = trainers.BpeTrainer(vocab_size=384, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
t.train_from_iterator([open(sys.argv[2], encoding="utf-8").read()] * 2, trainer=tr)
assert t.get_vocab_size() <= 384, t.get_vocab_size()
t.save(sys.argv[1])
PY
printf 'The quick brown fox, Привет мир! 日本語' > "$work/prompt.txt"
want=$("$py" -c "from tokenizers import Tokenizer; import sys; print(len(Tokenizer.from_file(sys.argv[1]).encode(open(sys.argv[2]).read()).ids))" "$work/m/tokenizer.json" "$work/prompt.txt")
out=$("$bin" logits -m "$work/m" --backends cpu --text "$work/prompt.txt" --json)
check "logits --text: the prompt is tokenizers' $want ids" \
  "$py" -c "import json,sys; c=json.loads(sys.stdin.read())['protocol']['view']['tokens']; s=c['source']; assert c['count'] == $want and '$want tokens' in s and 'sha256' in s, s" <<<"$out"
gen=$("$bin" generate -m "$work/m" --backends cpu --text "$work/prompt.txt" -n 6 --json)
check "generate --text: the reference's continuation decoded as tokenizers decodes it" \
  "$py" -c "
import json,sys
from tokenizers import Tokenizer
j=json.loads(sys.stdin.read())['steps']['generate']; t=Tokenizer.from_file(sys.argv[1])
assert j['reference_text'] == t.decode(j['reference_tokens']), (j['reference_text'],)
for r in j['results']: assert r['text'] == t.decode(r['tokens'])
" "$work/m/tokenizer.json" <<<"$gen"
check "generate prints the decoded text" bash -c "'$bin' generate -m '$work/m' --backends cpu --text '$work/prompt.txt' -n 4 | grep -q 'reference text:'"
check "perplexity --text runs" bash -c "'$bin' perplexity -m '$work/m' --backends cpu --text '$root/fixtures/tokenizers/multilingual.txt' --context 32 >/dev/null"

expect_usage_error "no tokenizer.json beside" tokenize -m "$root/fixtures/models/qwen3_moe_tiny" hello
expect_usage_error "one of them" tokenize --tokenizer "$tok/qwen2_style.json"
expect_usage_error "not valid UTF-8 at byte 1" tokenize --tokenizer "$tok/qwen2_style.json" $'a\xff'
expect_usage_error "is not a token id" tokenize --tokenizer "$tok/qwen2_style.json" --decode "1 x"
expect_usage_error "no token has id 99999" tokenize --tokenizer "$tok/qwen2_style.json" --decode "99999"
expect_usage_error "--text excludes" logits -m "$work/m" --backends cpu --text "$work/prompt.txt" --tokens 4
printf '{"model": {"type": "WordPiece"}}' > "$work/wp.json"
expect_usage_error 'model "WordPiece"' tokenize --tokenizer "$work/wp.json" hi

echo "$failures failed, $skips skipped"
[ "$failures" -eq 0 ]
