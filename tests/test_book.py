"""The Jupyter Book builds offline, warnings as errors, shows T00 with its outputs, loads nothing
from the network, and renders in a real browser: every page opened in headless Chromium loads
with no failed request, no script error and every equation typeset by MathJax.

The browser check drives Chromium through the DevTools protocol (websocket-client, a dev extra);
run it on a built book by hand with `python tests/test_book.py BUILD/html [PAGE ...]`.
"""

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# a script or stylesheet fetched from the network: <script src="https://...">, <link href="//...">,
# or a URL in an inline script (a loader that fetches it later)
REMOTE = re.compile(r"<(?:script|link)\b[^>]*\b(?:src|href)\s*=\s*[\"'](?:https?:)?//|"
                    r"<script\b[^>]*>[^<]*https?://", re.IGNORECASE)
GET_CHROMIUM = ("Chromium is not installed: `apt-get install -y chromium` (Debian, Ubuntu), "
                "or set XTRAIN_CHROMIUM to a Chromium or Chrome executable")


@pytest.fixture(scope="module")
def book_html(tmp_path_factory):
    """The book built once for this module's tests: its html folder."""
    jb = shutil.which("jupyter-book") or str(Path(sys.executable).parent / "jupyter-book")
    if not Path(jb).exists():
        pytest.skip("jupyter-book is not installed (pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("book")
    res = subprocess.run([jb, "build", str(REPO / "book"), "--path-output", str(out), "-W", "-n",
                          "--keep-going"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    return out / "_build" / "html"


@pytest.mark.slow
def test_book_builds_offline_with_warnings_as_errors(book_html):
    html = book_html
    t00 = (html / "solutions" / "T00_welcome.html").read_text(encoding="utf-8")
    assert "How an exercise works" in t00
    assert "T00.1 rms: pass" in t00  # the executed output is in the page
    assert (html / "course_map.html").exists()
    remote = [f"{p.relative_to(html)}: {m.group(0)[:120]}" for p in html.rglob("*.html")
              for m in [REMOTE.search(p.read_text(encoding="utf-8"))] if m]
    assert not remote, "pages load from the network:\n" + "\n".join(remote[:10])
    t05 = (html / "solutions" / "T05_transformer.html").read_text(encoding="utf-8")
    assert 'src="../_static/mathjax/MathJax.js' in t05 and (html / "_static" / "mathjax" / "MathJax.js").exists()


@pytest.mark.slow
def test_every_page_renders_in_chromium(book_html):
    """Every page, served on 127.0.0.1 and opened in headless Chromium: no request fails (a
    missing MathJax font, a 404), no script throws, MathJax typesets every equation without a
    "[Math Processing Error]", a TeX error or a file it could not load."""
    pytest.importorskip("websocket", reason="websocket-client is not installed (pip install -e '.[dev]')")
    if chromium_executable() is None:
        if os.environ.get("CI"):  # .ci/run installs it: a CI run without it fails, never skips
            pytest.fail(GET_CHROMIUM)
        pytest.skip(GET_CHROMIUM)
    pages = book_pages(book_html)
    assert len(pages) > 20, pages
    start = time.perf_counter()
    reports = open_in_chromium(book_html, pages)
    seconds = time.perf_counter() - start
    problems = [f"{r.page}: {p}" for r in reports for p in r.problems()]
    assert not problems, f"{len(problems)} problems on {len(pages)} pages:\n" + "\n".join(problems[:40])
    equations = sum(r.equations for r in reports)
    assert equations > 500, f"only {equations} equations typeset in the whole book: is MathJax running?"
    print(f"{len(pages)} pages, {equations} equations typeset, in {seconds:.1f} s")


def test_the_course_map_is_generated_from_the_phase_table():
    """book/course_map.md, the book's first chapter, is the phase table's (phases.py), every phase in it."""
    from xtrain_lessons.course import phases

    page = (REPO / "book" / "course_map.md").read_text(encoding="utf-8")
    assert page == phases.course_map_markdown(), \
        "book/course_map.md is stale: run `xtrain notebooks build` (it regenerates the page from phases.py)"
    for p in phases.TABLE:
        assert f"**{p.id}** {p.title}" in page, p.id
    assert phases.runs_where_markdown() in page


# ---- the browser -------------------------------------------------------------------------------

def book_pages(html: Path) -> list[str]:
    """Every page of a built book, as paths relative to its root (index.html only redirects)."""
    skip = {"_static", "_sources", "_images"}
    return sorted(str(p.relative_to(html)) for p in html.rglob("*.html")
                  if not skip & set(p.relative_to(html).parts) and p.name != "index.html")


def chromium_executable() -> str | None:
    named = os.environ.get("XTRAIN_CHROMIUM")
    if named:
        return named if Path(named).exists() else None
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


# In the page, once MathJax has typeset it: what it typeset and every message it posted. The
# signals of MathJax 2 replay past messages to a new listener, so nothing before this is lost.
MATHJAX_REPORT = r"""new Promise(resolve => {
  const report = () => {
    const math = [...document.querySelectorAll('.math.notranslate')];
    const messages = [];
    if (window.MathJax && MathJax.Hub) MathJax.Hub.signal.Interest(m => { messages.push([].concat(m).map(String).join(' ')); });
    const source = e => { const s = e.closest('.MathJax_Preview, .MathJax, .MathJax_Display');
                          const script = s && [...s.parentElement.querySelectorAll('script[type^="math/"]')][0];
                          return script ? script.textContent.slice(0, 160) : e.textContent.slice(0, 160); };
    resolve(JSON.stringify({
      mathjax: !!(window.MathJax && MathJax.Hub), timed_out: !!window.__xtrain_timed_out,
      equations: math.length,
      typeset: math.filter(e => e.querySelector('script[type^="math/"]')).length,
      errors: [...document.querySelectorAll('.MathJax_Error, .noError, .merror')].map(source),
      // not "unknown char": a glyph STIX-Web lacks (the dot of \texttt{blockIdx.x}) is drawn
      // from the browser's own font, typeset all the same
      messages: messages.filter(m => /error|undefined/i.test(m)).slice(0, 20)}));
  };
  setTimeout(() => { window.__xtrain_timed_out = true; report(); }, 120000);
  if (!(window.MathJax && MathJax.Hub)) return report();
  const ready = () => (MathJax.isReady ? MathJax.Hub.Queue(report) : setTimeout(ready, 50));
  ready();
})"""


@dataclass
class PageReport:
    page: str
    mathjax: dict = field(default_factory=dict)
    failed: list = field(default_factory=list)      # (url, status or error)
    exceptions: list = field(default_factory=list)  # uncaught script errors
    seconds: float = 0.0

    @property
    def equations(self) -> int:
        return self.mathjax.get("typeset", 0)

    def problems(self) -> list[str]:
        m = self.mathjax
        first = {}
        for url, why in self.failed:  # a 404 script is also reported as aborted: say it once
            first.setdefault(url, why)
        out = [f"request failed: {url} ({why})" for url, why in first.items()]
        out += [f"script error: {e}" for e in self.exceptions]
        if m.get("equations") and not m.get("mathjax"):
            out.append("MathJax did not load")
        elif m.get("timed_out"):
            out.append("MathJax had not finished after 120 s")
        if m.get("typeset", 0) != m.get("equations", 0):
            out.append(f"{m.get('equations', 0) - m.get('typeset', 0)} of {m.get('equations')} equations not typeset")
        out += [f"MathJax error in: {src!r}" for src in m.get("errors", [])]
        out += [f"MathJax: {msg}" for msg in m.get("messages", [])]
        return out


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _DevTools:
    """A Chromium over its DevTools protocol: one websocket, one session per page (flat mode)."""

    FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-extensions", "--disable-dev-shm-usage", "--mute-audio", "--window-size=1280,900",
             # nothing but this machine: any other host fails at once (and is reported as a failed request)
             "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", "--remote-debugging-port=0"]

    def __init__(self, executable: str, profile: Path):
        import websocket

        log = profile / "chromium.log"  # a file, not a pipe: nobody reads a pipe, and a full one blocks Chromium
        with open(log, "wb") as err:
            self.proc = subprocess.Popen([executable, *self.FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                         stdout=subprocess.DEVNULL, stderr=err)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"Chromium did not start its DevTools endpoint:\n{tail}")
            time.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", suppress_origin=True, timeout=5)
        self.next_id = 0
        self.events: list[dict] = []

    def _recv(self, deadline: float) -> dict | None:
        import websocket

        self.ws.settimeout(max(0.05, min(5.0, deadline - time.monotonic())))
        try:
            return json.loads(self.ws.recv())
        except websocket.WebSocketTimeoutException:
            return None

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self._recv(deadline)
            if m is None:
                continue
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]
            self.events.append(m)
        raise TimeoutError(f"{method}: no answer from Chromium in {timeout} s")

    def wait_for(self, predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not any(predicate(e) for e in self.events):
            if time.monotonic() > deadline:
                return False
            m = self._recv(deadline)
            if m is not None:
                self.events.append(m)
        return True

    def drain(self, quiet: float):
        """Read events until none has come for `quiet` seconds."""
        while (m := self._recv(time.monotonic() + quiet)) is not None:
            self.events.append(m)

    def close(self):
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _open_page(browser: _DevTools, url: str, page: str) -> PageReport:
    start = time.perf_counter()
    target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    sid = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Network", "Page", "Runtime"):
        browser.call(f"{domain}.enable", session=sid)
    browser.events.clear()
    browser.call("Page.navigate", {"url": url}, session=sid)
    report = PageReport(page)
    if not browser.wait_for(lambda e: e.get("method") == "Page.loadEventFired" and e.get("sessionId") == sid, 120):
        report.exceptions.append("the page did not finish loading in 120 s")
    else:
        res = browser.call("Runtime.evaluate", {"expression": MATHJAX_REPORT, "awaitPromise": True,
                                                "returnByValue": True}, session=sid, timeout=150)
        report.mathjax = json.loads(res["result"]["value"])
    # requests still in flight (a font asked for by what MathJax drew) end before the page is judged
    for _ in range(100):
        mine = [e for e in browser.events if e.get("sessionId") == sid]
        sent = {e["params"]["requestId"] for e in mine if e.get("method") == "Network.requestWillBeSent"}
        done = {e["params"]["requestId"] for e in mine
                if e.get("method") in ("Network.loadingFinished", "Network.loadingFailed")}
        if sent <= done:
            break
        browser.drain(0.1)
    browser.drain(0.3)
    mine = [e for e in browser.events if e.get("sessionId") == sid]
    urls = {e["params"]["requestId"]: e["params"]["request"]["url"]
            for e in mine if e.get("method") == "Network.requestWillBeSent"}
    for e in mine:
        p = e.get("params", {})
        if e.get("method") == "Network.responseReceived" and p["response"]["status"] >= 400:
            report.failed.append((p["response"]["url"], p["response"]["status"]))
        elif e.get("method") == "Network.loadingFailed" and not urls.get(p["requestId"], "").startswith("about:"):
            report.failed.append((urls.get(p["requestId"], "?"), p.get("blockedReason") or p["errorText"]))
        elif e.get("method") == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            report.exceptions.append((d.get("exception", {}).get("description") or d.get("text", "?")).splitlines()[0])
    browser.call("Target.closeTarget", {"targetId": target})
    report.seconds = time.perf_counter() - start
    return report


def open_in_chromium(html: Path, pages: list[str]) -> list[PageReport]:
    """Serve `html` on 127.0.0.1 and open each page in one headless Chromium, one after another."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(html)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    with tempfile.TemporaryDirectory(prefix="xtrain-chromium-", ignore_cleanup_errors=True) as profile:
        browser = _DevTools(chromium_executable() or "chromium", Path(profile))
        try:
            return [_open_page(browser, base + page, page) for page in pages]
        finally:
            browser.close()
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    root = Path(sys.argv[1])
    start = time.perf_counter()
    for r in open_in_chromium(root, sys.argv[2:] or book_pages(root)):
        print(f"{r.page}: {r.seconds:.1f} s, {r.equations} equations", *r.problems(), sep="\n  ")
    print(f"{time.perf_counter() - start:.1f} s")
