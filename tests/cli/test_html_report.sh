#!/usr/bin/env bash
# The HTML report (--html on audit, compare and matrix), checked by Python's
# HTML parser (tests/cli/html_check.py: well-formed, self-contained, every
# node and criterion of the JSON report in it) and in a real browser
# (tests/cli/browser_check.py: headless Chromium over the DevTools protocol —
# no console error, no network request, the verdict table, a heatmap, the
# drift and KL plots visible, table sorting works, a screenshot). Both
# checkers are shown to catch a broken page. Chromium missing is a FAILURE,
# not a skip: scripts/setup.sh installs Debian's chromium.
#   KVASIR_SCREENSHOT=FILE  also copy the fixture report's screenshot there
#                           (how docs/html-report.png is made)
# Usage: test_html_report.sh PATH/TO/kvasir-equiv   (run from the repo root)
set -u
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ci=protocols/ci.json
here=tests/cli
export SOURCE_DATE_EPOCH=1767225600  # the header's date: fixed, so two runs give the same bytes

# audit --html: the fixture audit the README shows.
"$bin" audit -p $ci -b cpu-ref,cpu,cpu:acc=f16 --html "$tmp/r.html" -o "$tmp/r.json" >"$tmp/audit.out" 2>&1; rc=$?
check "audit --html keeps the exit code (f16 accumulation unfit-sensitive → 1)" test $rc -eq 1
check "audit --html writes the page" test -s "$tmp/r.html"
echo "size: fixture audit report (3 nodes, 4 layers, 9 ops): $(stat -c %s "$tmp/r.html") bytes"
check "HTML well-formed, self-contained, every node and criterion of the JSON report (html.parser)" \
  python3 $here/html_check.py "$tmp/r.html" --json "$tmp/r.json"
check "the header records the date from SOURCE_DATE_EPOCH" grep -q "<dd>2026-01-01 00:00 UTC</dd>" "$tmp/r.html"
"$bin" audit -p $ci -b cpu-ref,cpu,cpu:acc=f16 --html "$tmp/r2.html" >/dev/null 2>&1
check "the same audit twice → byte-identical HTML" cmp -s "$tmp/r.html" "$tmp/r2.html"
check "no temporary left beside the page" bash -c "! ls -A '$tmp' | grep -q '^\.r.*tmp'"

# A dense model: the decisions section says there is no router, the verdicts that routing agreement is not judged.
"$bin" audit -p $ci --model fixtures/models/qwen2_tiny -b cpu-ref,cpu --html "$tmp/dense.html" -o "$tmp/dense.json" >/dev/null 2>&1
check "audit --html of a dense model exits 0" test $? -eq 0
check "dense HTML well-formed, every node and criterion of its JSON" python3 $here/html_check.py "$tmp/dense.html" --json "$tmp/dense.json"
check "dense HTML: no MoE layers, routing agreement not judged" bash -c "grep -q 'No MoE layers: the model has no router' '$tmp/dense.html' && grep -q 'Not judged: <code>decide.routing_agreement_min</code>' '$tmp/dense.html'"

# The parser check is not vacuous: a page with an unclosed element, an
# external image or a link out is refused.
sed 's|<main>|<main><div><img src="https://example.invalid/x.png" alt=""/>|' "$tmp/r.html" >"$tmp/bad.html"
check "html_check.py refuses an unclosed element and an external image" bash -c "! python3 $here/html_check.py '$tmp/bad.html' >/dev/null"
sed 's|<nav>|<nav><a href="http://example.invalid/">out</a>|' "$tmp/r.html" >"$tmp/bad2.html"
check "html_check.py refuses a link out" bash -c "! python3 $here/html_check.py '$tmp/bad2.html' >/dev/null"

# In a real browser.
if ! command -v chromium >/dev/null 2>&1; then
  echo "FAIL: chromium is not installed (scripts/setup.sh installs it: apt-get install chromium); the browser checks did NOT run"
  failures=$((failures + 1))
else
  python3 $here/browser_check.py "$tmp/r.html" "$tmp/shot.png" >"$tmp/browser.out" 2>&1; rc=$?
  cat "$tmp/browser.out"
  check "headless Chromium: every browser check passes" test $rc -eq 0
  check "screenshot written" test -s "$tmp/shot.png"
  if [ -n "${KVASIR_SCREENSHOT:-}" ] && [ -s "$tmp/shot.png" ]; then cp "$tmp/shot.png" "$KVASIR_SCREENSHOT"; fi
  # Not vacuous: a script error and an external request are caught — the
  # CSP blocks the request (an error in the browser's log); without the CSP
  # the request itself shows.
  sed 's|<main>|<main><img src="https://example.invalid/x.png" alt=""/><script>no_such_function();</script>|' "$tmp/r.html" >"$tmp/bad.html"
  python3 $here/browser_check.py "$tmp/bad.html" "$tmp/bad.png" >"$tmp/bad.out" 2>&1; rc=$?
  check "browser check fails a page with a script error and a blocked request" test $rc -eq 1
  check "… naming the script error" grep -q "^FAIL: no console errors.*no_such_function" "$tmp/bad.out"
  check "… and the request the Content-Security-Policy blocked" grep -q "^FAIL: no console errors.*x.png' violates the following Content Security Policy" "$tmp/bad.out"
  grep -v 'Content-Security-Policy' "$tmp/bad.html" >"$tmp/bad2.html"
  python3 $here/browser_check.py "$tmp/bad2.html" "$tmp/bad2.png" >"$tmp/bad2.out" 2>&1
  check "browser check sees the request a page without the CSP makes" grep -q "^FAIL: no network request other than the page itself (https://example.invalid/x.png" "$tmp/bad2.out"
fi

# compare --html: the page from captures.
"$bin" capture -b cpu-ref -p $ci --steps ops,drift,logits -o "$tmp/ref.safetensors" >/dev/null 2>&1
"$bin" capture -b cpu -p $ci --steps ops,drift,logits -o "$tmp/cpu.safetensors" >/dev/null 2>&1
"$bin" compare -p $ci "$tmp/ref.safetensors" "$tmp/cpu.safetensors" --only-steps ops,drift,logits \
  --html "$tmp/c.html" -o "$tmp/c.json" >"$tmp/compare.out" 2>&1; rc=$?
check "compare --html exits 0 (cpu fit)" test $rc -eq 0
[ $rc -eq 0 ] || cat "$tmp/compare.out"
check "compare's page: well-formed, self-contained, every node and criterion" python3 $here/html_check.py "$tmp/c.html" --json "$tmp/c.json"
check "compare's page says compare" grep -q "<h1>kvasir-equiv compare" "$tmp/c.html"
check "compare's page leaves out the steps it did not compare" bash -c "! grep -q '<section id=\"generate\">' '$tmp/c.html'"

# matrix --html: the pair matrices of one layer, nothing judged.
"$bin" matrix -b cpu-ref,cpu,cpu:acc=f16 --tokens 4 --html "$tmp/m.html" >/dev/null 2>&1; rc=$?
check "matrix --html exits 0" test $rc -eq 0
check "matrix's page: well-formed, self-contained (html.parser)" python3 $here/html_check.py "$tmp/m.html"
check "matrix's page has the two heatmaps of the moe op" test "$(grep -c '<svg class="heatmap"' "$tmp/m.html")" -eq 2

# An unwritable path is bad input, said in one line, after nothing half-written.
expect_usage_error "no/such/dir/r.html" audit -p $ci -b cpu-ref,cpu --html "$tmp/no/such/dir/r.html"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
