"""Check an HTML report as a person sees it: rendered by headless Chromium with the network off.

Example:
    >>> page = render_page("explain.html", screenshot="explain.png")
    >>> assert not page_problems(page), page_problems(page)

Needs a ``chromium`` binary (Debian: ``apt-get install -y chromium``); :func:`chromium_path`
is ``None`` without one.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

#: resolve no host and route everything to a closed port: a report must not need the network
OFFLINE_FLAGS = ('--host-resolver-rules=MAP * ~NOTFOUND', "--proxy-server=127.0.0.1:9")
_CONSOLE = re.compile(r":INFO:CONSOLE[^\]]*\] (.*)$", re.M)
#: what a page would fetch (links a reader may follow, ``<a href>``, are not requests)
_EXTERNAL = re.compile(r"""(?:\bsrc\s*=\s*["']?|<link\b[^>]*\bhref\s*=\s*["']?|url\(\s*["']?"""
                       r"""|@import\s+["']?)(?:https?:)?//""", re.I)


def chromium_path() -> str | None:
    """The headless browser's path, or ``None`` when none is installed."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


@dataclass
class RenderedPage:
    """A page as Chromium left it: the source, the DOM after scripts ran, console messages,
    and its tables' layout on a laptop screen: ``{"width", "height", "tables": [{"box":
    [left, right, height], "scrolls": sideways, "columns": [[header, left, right], ...]}]}``
    (pixels in the window); ``probe``: what the ``script`` given to :func:`render_page`
    returned."""

    source: str
    dom: str
    console: list[str] = field(default_factory=list)
    layout: dict = field(default_factory=dict)
    probe: Any = None


#: appended to the page: writes the tables' layout (and the probe's result) into
#: ``<pre id="tlr-layout">`` after load
_MEASURE = """<script>addEventListener("load", function () { setTimeout(function () {
  var out = {width: innerWidth, height: innerHeight, tables: [], probe: (function () {
    PROBE })()};
  document.querySelectorAll("table").forEach(function (t) {
    var box = t.closest(".table-wrap") || t, b = box.getBoundingClientRect();
    out.tables.push({box: [b.left, b.right, b.height],
      scrolls: box.scrollWidth > box.clientWidth && getComputedStyle(box).overflowX != "visible",
      columns: Array.from(t.querySelectorAll("th"), function (h) {
        var r = h.getBoundingClientRect(); return [h.textContent, r.left, r.right]; })});
  });
  var pre = document.createElement("pre"); pre.id = "tlr-layout";
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
}, 0); });</script>"""


def render_page(path: str | Path, screenshot: str | Path | None = None, width: int = 1280,
                height: int = 3000, screen_height: int = 800, budget_ms: int = 10_000,
                timeout: float = 180.0, script: str = "") -> RenderedPage:
    """Render ``path`` offline in a ``width`` x ``screen_height`` window (a laptop screen);
    ``screenshot`` also writes a ``width`` x ``height`` PNG. ``script``: the body of a
    JavaScript function run once the page has loaded (its scripts too); its JSON-able
    return value is the result's ``probe``."""
    exe = chromium_path()
    if exe is None:
        raise RuntimeError("no chromium: apt-get install -y chromium")
    path = Path(path).resolve()
    source = path.read_text(encoding="utf-8")
    base = [exe, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
            *OFFLINE_FLAGS, "--enable-logging=stderr", "--v=0",
            f"--virtual-time-budget={budget_ms}"]
    with tempfile.TemporaryDirectory() as tmp:
        measured = Path(tmp) / path.name
        end = source.rfind("</body>") % (len(source) + 1)  # the end when there is none
        measure = _MEASURE.replace("PROBE", script)
        measured.write_text(source[:end] + measure + source[end:], encoding="utf-8")
        run = subprocess.run([*base, f"--window-size={width},{screen_height}", "--dump-dom",
                              measured.as_uri()], capture_output=True, text=True,
                             timeout=timeout, check=True)
    if screenshot is not None:
        subprocess.run([*base, f"--window-size={width},{height}",
                        f"--screenshot={Path(screenshot).resolve()}", path.as_uri()],
                       capture_output=True, text=True, timeout=timeout, check=True)
    m = re.search(r'<pre id="tlr-layout">(.*?)</pre>', run.stdout, re.S)
    layout = json.loads(html.unescape(m[1])) if m else {}
    return RenderedPage(source, run.stdout, _CONSOLE.findall(run.stderr), layout,
                        layout.pop("probe", None))


def embedded_libraries(source: str) -> list[tuple[str, str]]:
    """The libraries a page embeds with ``tlr.load`` (:func:`tl_reward.viz.html.save_html`):
    ``(name, JavaScript)`` in page order."""
    return [(m[1], gzip.decompress(base64.b64decode(m[2])).decode("utf-8"))
            for m in re.finditer(r'tlr\.load\("(\w+)", "([^"]*)"\)', source)]


class _Outline(HTMLParser):
    """Headings' text, plot and circuitsvis containers, and how much each holds."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.headings: list[str] = []
        self.containers: dict[str, int] = {}  # id -> elements inside
        self._heading: list[str] | None = None
        self._open: list[tuple[str, str | None]] = []  # (tag, container id)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        cls, ident = a.get("class") or "", a.get("id") or ""
        for _, cid in self._open:
            if cid is not None:
                self.containers[cid] += 1
        is_box = tag == "div" and (ident.startswith("circuits-vis-") or "plotly-graph-div" in cls)
        if is_box:
            self.containers[ident] = 0
        if tag in ("h2", "h3"):
            self._heading = []
        if tag not in _VOID:
            self._open.append((tag, ident if is_box else None))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("h2", "h3") and self._heading is not None:
            self.headings.append(" ".join("".join(self._heading).split()))
            self._heading = None
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i][0] == tag:
                del self._open[i:]
                break

    def handle_data(self, data: str) -> None:
        if self._heading is not None:
            self._heading.append(data)


_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
         "track", "wbr"}


def outline(html: str) -> _Outline:
    """The headings and containers of an HTML document."""
    parser = _Outline()
    parser.feed(html)
    return parser


def page_problems(page: RenderedPage) -> list[str]:
    """What a reader would miss: each heading or container of the source absent from the
    rendered page, each container left empty, each console message, each table column out of
    reach (right of the window, with no sideways scrollbar on screen), each external address."""
    want = outline(re.sub(r"<script\b.*?</script>", "", page.source, flags=re.S | re.I))
    got = outline(page.dom)  # want: what the source declares, its scripts' text ignored
    problems = [f"heading missing: {h!r}" for h in want.headings if h not in got.headings]
    for cid in want.containers:
        if cid not in got.containers:
            problems.append(f"container missing: {cid}")
        elif got.containers[cid] == 0:
            problems.append(f"container empty (not rendered): {cid}")
    problems += [f"console: {m}" for m in page.console]
    lay = page.layout
    for i, t in enumerate(lay.get("tables", [])):  # a scrollbar below a tall box is off screen
        cut = [c for c, _, r in t["columns"] if r > min(t["box"][1], lay["width"]) + 1]
        if cut and not (t["scrolls"] and t["box"][2] <= lay["height"]):
            problems.append(f"table {i}: columns {cut} out of reach")
    scripts_out = re.sub(r"<script\b[^>]*>.*?</script>", "<script></script>", page.dom,
                         flags=re.S | re.I)
    problems += [f"external address: ...{scripts_out[max(0, m.start() - 60):m.end() + 40]}..."
                 for m in _EXTERNAL.finditer(scripts_out)]
    problems += [f"external import in a script: {m[0]}" for m in
                 re.finditer(r"""import\s*\{?[^;]*?from\s*["']https?://[^"']+""", page.source)]
    return problems
