#!/usr/bin/env python3
"""Open an HTML report in headless Chromium and check it as a reader would see it.

Usage: browser_check.py REPORT.html SCREENSHOT.png [--height PIXELS] [--top PIXELS]

Drives Chromium over the DevTools protocol on a pipe (--remote-debugging-pipe:
commands on fd 3, replies on fd 4, NUL-separated JSON), standard library
only. Loads the page at 1280 px wide, then checks:
  * no console error, no uncaught exception, no error in the browser's log
    (a Content-Security-Policy violation or a failed load lands there);
  * no network request other than the page itself (Network.requestWillBeSent);
  * the verdict table, a heatmap, the drift plot and the KL plot are visible:
    laid out with a real size, not display:none / visibility:hidden, not in a
    closed <details>, and the element itself is what is drawn at its centre
    once scrolled into view (nothing covers it);
  * the inline script works: clicking a header of the verdict table sorts it;
and saves a PNG screenshot of the top of the page (before sorting).
Prints one "ok:" / "FAIL:" line per check and the Chromium version; exit 0
iff every check passed, 1 if one failed, 2 if Chromium could not be driven.
"""
import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

WIDTH = 1280


class Browser:
    def __init__(self, chromium, profile):
        cmd_r, self.cmd_w = os.pipe()
        self.res_r, res_w = os.pipe()
        flags = [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--remote-debugging-pipe", f"--user-data-dir={profile}", "--no-first-run",
            "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--mute-audio", "--hide-scrollbars",
            "--force-color-profile=srgb", "--font-render-hinting=none", "about:blank",
        ]
        # The shell puts the pipe ends on fds 3 and 4, where Chromium expects them.
        script = 'exec "$0" "$@" 3<&%d 4>&%d' % (cmd_r, res_w)
        self.log = open(os.path.join(profile, "chromium.log"), "w+b")  # a file: a full pipe would stall Chromium
        self.proc = subprocess.Popen(["bash", "-c", script, chromium, *flags], pass_fds=(cmd_r, res_w),
                                     stdout=self.log, stderr=self.log)
        os.close(cmd_r)
        os.close(res_w)
        self.buf = b""
        self.next_id = 0
        self.events = []

    def _read_message(self, deadline):
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply from Chromium")
            ready, _, _ = select.select([self.res_r], [], [], left)
            if ready:
                chunk = os.read(self.res_r, 1 << 20)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe")
                self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, session=None, timeout=30):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read_message(deadline)
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method, timeout=30):
        deadline = time.monotonic() + timeout
        for m in self.events:
            if m.get("method") == method:
                return m
        while True:
            m = self._read_message(deadline)
            self.events.append(m)
            if m.get("method") == method:
                return m

    def drain(self, seconds):
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._read_message(deadline))
        except TimeoutError:
            pass

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


VISIBLE_JS = r"""
(() => {
  const visible = (sel) => {
    const el = document.querySelector(sel);
    if (!el) return 'missing';
    if (el.closest('details:not([open])')) return 'inside a closed <details>';
    const s = getComputedStyle(el);
    if (s.display === 'none' || s.visibility === 'hidden' || Number(s.opacity) === 0) return 'hidden by CSS';
    el.scrollIntoView({block: 'center'});
    const r = el.getBoundingClientRect();
    if (r.width < 100 || r.height < 40) return `too small (${r.width}x${r.height})`;
    const hit = document.elementFromPoint(r.left + r.width / 2, r.top + Math.min(r.height / 2, 200));
    if (!hit || !(el === hit || el.contains(hit))) return 'covered by ' + (hit ? hit.tagName : 'nothing');
    return 'visible';
  };
  const out = {
    verdicts: visible('table.verdicts'),
    heatmap: visible('svg.heatmap'),
    drift: visible('svg.drift'),
    kl: visible('svg.kl'),
    heatmap_cells: document.querySelectorAll('svg.heatmap rect.cell').length,
    verdict_rows: document.querySelectorAll('table.verdicts tbody tr').length,
    height: document.documentElement.scrollHeight,
  };
  window.scrollTo(0, 0);
  return out;
})()
"""

SORT_JS = r"""
(() => {
  const t = document.querySelector('table.verdicts');
  const names = () => Array.from(t.tBodies[0].rows).map(r => r.cells[0].textContent);
  const th = Array.from(t.tHead.rows[0].cells).find(c => c.textContent === 'node');
  th.click();
  const up = names();
  th.click();
  const down = names();
  const sorted = [...up].sort((a, b) => a.localeCompare(b));
  return {up: up, down: down, ok: JSON.stringify(up) === JSON.stringify(sorted) &&
          JSON.stringify(down) === JSON.stringify([...sorted].reverse())};
})()
"""


def main():
    args = sys.argv[1:]
    opts = {"--height": 2200, "--top": 0}
    for name in opts:
        if name in args:
            i = args.index(name)
            opts[name] = int(args[i + 1])
            del args[i:i + 2]
    height, top = opts["--height"], opts["--top"]
    if len(args) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    report, shot = os.path.abspath(args[0]), args[1]
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("FAIL: chromium not found (scripts/setup.sh installs Debian's chromium package)")
        return 2
    version = subprocess.run([chromium, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"browser: {version}")

    failures = 0

    def check(what, ok, detail=""):
        nonlocal failures
        print(("ok: " if ok else "FAIL: ") + what + (f" ({detail})" if detail and not ok else ""))
        failures += not ok

    profile = tempfile.mkdtemp(prefix="kvasir-chromium-")
    browser = Browser(chromium, profile)
    try:
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.call(f"{domain}.enable", session=session)
        browser.call("Emulation.setDeviceMetricsOverride",
                     {"width": WIDTH, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
        url = "file://" + report
        browser.events.clear()
        t0 = time.monotonic()
        browser.call("Page.navigate", {"url": url}, session=session)
        browser.wait_event("Page.loadEventFired")
        load_s = time.monotonic() - t0
        browser.drain(1.0)  # anything late: a request, a console message

        ev = [e for e in browser.events if e.get("sessionId") == session]
        errors = []
        for e in ev:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
                errors.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                errors.append(f"exception at line {d.get('lineNumber')}: " +
                              d.get("exception", {}).get("description", d.get("text", "")).splitlines()[0])
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
                errors.append("log: " + p["entry"].get("text", ""))
        check("no console errors, warnings or exceptions", not errors, "; ".join(errors))
        requests = [e["params"]["request"]["url"] for e in ev if e.get("method") == "Network.requestWillBeSent"]
        others = [u for u in requests if u != url]
        check("the page itself was loaded (the request log works)", url in requests, f"requests seen: {requests}")
        check("no network request other than the page itself", not others, ", ".join(others))

        res = browser.call("Runtime.evaluate", {"expression": VISIBLE_JS, "returnByValue": True}, session=session)
        v = res.get("result", {}).get("value", {})
        for key, what in (("verdicts", "the verdict table"), ("heatmap", "a heatmap"), ("drift", "the drift plot"),
                          ("kl", "the KL percentile plot")):
            check(f"{what} is visible", v.get(key) == "visible", v.get(key))
        check("the heatmap has cells", v.get("heatmap_cells", 0) > 0, str(v.get("heatmap_cells")))
        print(f"page: {os.path.getsize(report)} bytes, loaded in {load_s:.2f} s, {v.get('verdict_rows')} verdict rows, "
              f"{v.get('height')} px tall at {WIDTH} px wide")

        page_h = v.get("height") or (top + height)
        clip = {"x": 0, "y": min(top, page_h - 1), "width": WIDTH, "height": max(1, min(height, page_h - top)), "scale": 1}
        png = browser.call("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True},
                           session=session)["data"]
        with open(shot, "wb") as f:
            f.write(base64.b64decode(png))
        check("screenshot saved", os.path.getsize(shot) > 10000, f"{os.path.getsize(shot)} bytes")

        res = browser.call("Runtime.evaluate", {"expression": SORT_JS, "returnByValue": True}, session=session)
        s = res.get("result", {}).get("value", {})
        check("clicking the 'node' header sorts the verdict table both ways", s.get("ok") is True, json.dumps(s))
        browser.drain(0.3)
        late = [e for e in browser.events if e.get("method") in ("Runtime.exceptionThrown", "Network.requestWillBeSent")
                and e not in ev]
        check("sorting threw nothing and requested nothing", not late, json.dumps(late)[:300])
    except Exception as e:  # a browser that cannot be driven is a failure, not a skip
        browser.log.seek(0)
        stderr = browser.log.read().decode(errors="replace")[-2000:]
        print(f"FAIL: driving Chromium: {e}\nChromium's output:\n{stderr}")
        browser.close()
        shutil.rmtree(profile, ignore_errors=True)
        return 2
    browser.close()
    shutil.rmtree(profile, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
