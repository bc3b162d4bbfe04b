#!/usr/bin/env python3
"""Check an HTML report with Python's own HTML parser (independent of the C++ checks).

Usage: html_check.py REPORT.html [--json REPORT.json]

  * well-formed: <!DOCTYPE html> first; every element closed in order
    (void elements excepted), one <html>, <head>, <body>; nothing left open;
  * self-contained: no http(s):// anywhere; no element that loads something
    (link, img, iframe, object, embed, base, audio, video, source, ...); no
    attribute that points elsewhere (src, srcset, action, data, poster,
    xlink:href; href other than "#id"); url() only as url(#id); no @import
    or @font-face; a Content-Security-Policy of default-src 'none';
  * with --json (the JSON report of the same run): every node of the report
    is in the verdict table with its verdict, and every criterion of every
    judged node is in that node's collapsible criteria table, no more, no less.
Prints one "ok:" / "FAIL:" line per check; exit 0 iff all pass.
"""
import html.parser
import json
import re
import sys

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
LOADERS = {"link", "img", "iframe", "object", "embed", "base", "audio", "video", "source", "track", "image", "use",
           "form", "frame", "picture", "portal"}
POINTERS = {"src", "srcset", "action", "formaction", "data", "poster", "xlink:href", "ping"}


class Checker(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.problems, self.counts = [], [], {}
        self.doctype = None
        self.csp = None
        # criteria tables: node -> [criterion names]; verdict table: node -> verdict
        self.criteria, self.verdicts = {}, {}
        self._in_criteria = None  # node of the open <details class="criteria">
        self._summary_code = None
        self._row, self._cell, self._text = None, None, []
        self._table = None
        self._code_text = []

    def handle_decl(self, decl):
        if self.doctype is None:
            self.doctype = decl

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.counts[tag] = self.counts.get(tag, 0) + 1
        if tag in LOADERS:
            self.problems.append(f"<{tag}> loads something")
        for name, value in attrs:
            if name in POINTERS:
                self.problems.append(f"<{tag} {name}=...> points elsewhere")
            if name == "href" and not (value or "").startswith("#"):
                self.problems.append(f"<{tag} href={value!r}> leaves the page")
            if name == "style" and "url(" in (value or ""):
                self.problems.append(f"<{tag} style> with url()")
        if tag == "meta" and a.get("http-equiv", "").lower() == "content-security-policy":
            self.csp = a.get("content", "")
        if tag == "details" and "criteria" in a.get("class", "").split():
            self._in_criteria = ""
        if tag == "code":
            self._code_text = []
        if tag == "table":
            self._table = a.get("class", "")
        if tag == "tr":
            self._row = []
        if tag in ("td", "th"):
            self._cell, self._text = True, []
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes <{self.stack[-1] if self.stack else 'nothing'}> (line {self.getpos()[0]})")
            if tag in self.stack:
                while self.stack and self.stack.pop() != tag:
                    pass
            return
        self.stack.pop()
        if tag in ("td", "th") and self._row is not None:
            self._row.append("".join(self._text).strip())
            self._cell = None
        elif tag == "code" and self._in_criteria == "" and "summary" in self.stack:
            self._in_criteria = "".join(self._code_text).strip()
        elif tag == "tr" and self._row is not None:
            row = self._row
            self._row = None
            if self._in_criteria and len(row) >= 2 and row[0] in ("sensitive", "tolerant"):
                self.criteria.setdefault(self._in_criteria, []).append((row[0], row[1]))
            elif self._table and "verdicts" in self._table.split() and row and row[0] != "node":
                self.verdicts[row[0].split("contrast")[0].strip()] = row[1]
        elif tag == "details":
            self._in_criteria = None

    def handle_data(self, data):
        if self._cell:
            self._text.append(data)
        if self._in_criteria == "" and "summary" in self.stack and self.stack[-1] == "code":
            self._code_text.append(data)


def main():
    args = sys.argv[1:]
    report = None
    if "--json" in args:
        i = args.index("--json")
        report = json.load(open(args[i + 1], encoding="utf-8"))
        del args[i:i + 2]
    raw = open(args[0], encoding="utf-8").read()
    failures = 0

    def check(what, ok, detail=""):
        nonlocal failures
        print(("ok: " if ok else "FAIL: ") + what + (f" ({detail})" if detail and not ok else ""))
        failures += not ok

    p = Checker()
    p.feed(raw)
    p.close()
    check("starts with <!DOCTYPE html>", raw.startswith("<!DOCTYPE html>") and (p.doctype or "").lower() == "doctype html")
    check("every element closed, in order (html.parser)", not [x for x in p.problems if "closes" in x] and not p.stack,
          "; ".join([x for x in p.problems if "closes" in x][:5] + ([f"left open: {p.stack}"] if p.stack else [])))
    check("one <html>, <head>, <body>, <main>", all(p.counts.get(t) == 1 for t in ("html", "head", "body", "main")),
          str({t: p.counts.get(t) for t in ("html", "head", "body", "main")}))
    urls = re.findall(r"(?:https?|ftp)://\S{0,40}", raw)
    check("no http(s):// anywhere", not urls, ", ".join(urls[:5]))
    check("nothing that loads or points elsewhere", not [x for x in p.problems if "closes" not in x],
          "; ".join([x for x in p.problems if "closes" not in x][:5]))
    bad_url = [m for m in re.findall(r"url\(([^)]{0,30})", raw) if not m.startswith("#")]
    check("url() only to ids in the page", not bad_url, ", ".join(bad_url[:5]))
    check("no @import / @font-face", "@import" not in raw and "@font-face" not in raw)
    check("Content-Security-Policy default-src 'none'", (p.csp or "").startswith("default-src 'none'"), p.csp or "none")

    if report is not None:
        for n in report["nodes"]:
            got = p.verdicts.get(n["node"])
            check(f"verdict table: {n['node']} is {n['verdict']}", got is not None and n["verdict"] in got, f"found {got!r}")
        check("verdict table has exactly the report's nodes", set(p.verdicts) == {n["node"] for n in report["nodes"]},
              f"{sorted(p.verdicts)}")
        for n in report["nodes"]:
            if n["verdict"] == "reference":
                continue
            want = [(t, c["criterion"]) for t in ("sensitive", "tolerant") for c in n["criteria"][t]]
            got = p.criteria.get(n["node"], [])
            check(f"every criterion of {n['node']} ({len(want)}) in its table", sorted(got) == sorted(want),
                  f"missing {sorted(set(want) - set(got))[:4]}, extra {sorted(set(got) - set(want))[:4]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
