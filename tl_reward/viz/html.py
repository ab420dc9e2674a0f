"""Standalone HTML: plotly figures and circuitsvis views in one file that opens offline.

Example:
    >>> save_html("report.html", "<h2>Lens</h2>", lens.plot(), token_view, title="Pair 0")
"""

from __future__ import annotations

import base64
import gzip
import html
import re
import textwrap
from pathlib import Path
from typing import Any

#: circuitsvis's container: ``<div id="circuits-vis-..." .../>`` (HTML has no self-closing div)
_SELF_CLOSING_DIV = re.compile(r"<div(\s[^<>]*?)\s*/>")
#: the call circuitsvis puts after its bundle: ``render("id", Name, {props})``
_RENDER_CALL = re.compile(
    r'render\(\s*"(?P<id>circuits-vis-[^"]+)",\s*(?:CircuitsVis\.)?(?P<name>\w+),\s*'
    r"(?P<props>.*)\)\s*</script>\s*$", re.S)


def is_view(obj: Any) -> bool:
    """True for a circuitsvis ``RenderedHTML``."""
    return hasattr(obj, "local_src") and hasattr(obj, "cdn_src")


def close_divs(fragment: str) -> str:
    """``<div .../>`` rewritten as ``<div ...></div>``: a browser reads ``<div/>`` as an open
    tag, so everything after it would become the view's content and vanish when it renders."""
    return _SELF_CLOSING_DIV.sub(r"<div\1></div>", fragment)


def closed_view(view: Any) -> Any:
    """The circuitsvis view with its container closed, so a notebook's output (or a page built
    from ``local_src``) keeps what follows it."""
    from circuitsvis.utils.render import RenderedHTML

    return RenderedHTML(close_divs(view.local_src), close_divs(view.cdn_src))


#: ``tlr.load(lib, b64)`` unzips and runs a library stored as base64 gzip; ``tlr.when(lib, fn)``
#: runs ``fn`` once it has loaded
_LOADER = """<script>window.PlotlyConfig = {MathJaxConfig: "local"}; var tlr = {ready: {}, q: {}};
tlr.when = function (lib, fn) { tlr.ready[lib] ? fn() : (tlr.q[lib] = tlr.q[lib] || []).push(fn); };
tlr.load = async function (lib, b64) {
  var zip = Uint8Array.from(atob(b64), function (c) { return c.charCodeAt(0); }), s = document.createElement("script");
  s.text = await new Response(new Blob([zip]).stream().pipeThrough(new DecompressionStream("gzip"))).text();
  document.head.appendChild(s); tlr.ready[lib] = true; (tlr.q[lib] || []).forEach(function (fn) { fn(); });
};</script>"""  # noqa: E501


def embedded_library(name: str, js: str) -> str:
    """A ``<script>`` that defines ``name`` from ``js`` stored gzip-compressed (about a quarter
    of its size); code waiting in ``tlr.when(name, ...)`` runs once it has loaded."""
    data = base64.b64encode(gzip.compress(js.encode("utf-8"), 9, mtime=0)).decode("ascii")
    return f'<script>tlr.load("{name}", "{data}");</script>'


def view_fragment(view: Any, offline: bool = True) -> str:
    """A circuitsvis view as HTML: its container closed, then the call that renders it.

    Offline, the call waits for the ``CircuitsVis`` that :func:`save_html` embeds once per page.
    """
    if not offline:
        return close_divs(view.cdn_src)
    m = _RENDER_CALL.search(view.cdn_src)
    if m is None:  # an unknown circuitsvis layout: its own (closed) fragment, bundle and all
        return close_divs(view.local_src)
    props = m["props"].strip().replace("</", "<\\/")
    return (f'<div id="{m["id"]}" style="margin: 15px 0;"></div>\n<script>tlr.when("CircuitsVis",'
            f' function () {{ CircuitsVis.render("{m["id"]}", CircuitsVis.{m["name"]}, {props});'
            " });</script>")


def is_figure(part: Any) -> bool:
    """True for a plotly figure."""
    return hasattr(part, "to_html") and hasattr(part, "layout")


def wrapped_title(fig: Any, width: int = 110) -> Any:
    """``fig``, or a copy whose title longer than ``width`` characters is broken into lines
    (plotly draws a title on one line, cut off at the figure's edge)."""
    text = fig.layout.title.text
    if not text or len(text) <= width or "<br>" in text:
        return fig
    lines = textwrap.wrap(text, width)
    return type(fig)(fig).update_layout(title_text="<br>".join(lines),
                                        margin_t=max(100, 50 + 24 * len(lines)))


def to_html_fragment(part: Any, offline: bool = True, plotly_cdn: bool = False) -> str:
    """An HTML fragment for a plotly figure, a circuitsvis view, a DataFrame or an HTML string.

    Offline, figures and views wait for the libraries :func:`save_html` embeds once per page;
    online, circuitsvis loads from its CDN, and plotly too where ``plotly_cdn``.
    """
    if is_figure(part):
        frag = wrapped_title(part).to_html(full_html=False,
                                           include_plotlyjs="cdn" if plotly_cdn else False)
        return frag if not offline else re.sub(
            r"<script[^>]*>(.*?)</script>",
            lambda m: f'<script>tlr.when("Plotly", function () {{{m[1]}}});</script>', frag,
            flags=re.S)
    if is_view(part):
        return view_fragment(part, offline=offline)
    if hasattr(part, "to_html"):  # DataFrame
        return table_fragment(part)
    return str(part)


def table_fragment(df: Any) -> str:
    """A DataFrame as an HTML table in a box that scrolls both ways under a sticky header (a
    wide or long table keeps every column reachable on screen), headers breakable at ``_``,
    newlines in text shown as line breaks (pandas would print a literal ``\\n``)."""
    def cell(v: Any) -> Any:
        return html.escape(v).replace("\n", "<br>") if isinstance(v, str) else v

    shown = df.rename(columns=lambda c: html.escape(str(c)).replace("_", "_<wbr>"))
    shown = shown.apply(lambda col: col.map(cell)) if len(shown.columns) else shown
    table = shown.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0,
                          escape=False)
    return f'<div class="table-wrap">{table}</div>'


#: the page style; a table box shades the side with columns scrolled out of view
_CSS = ("body{font-family:sans-serif;margin:2em}"
        "table{border-collapse:collapse;font-size:.9em}td,th{padding:2px 6px;"
        "border-bottom:1px solid #ddd;vertical-align:top}td{max-width:30em}"
        "th{position:sticky;top:0;background:#fff}"
        ".table-wrap{overflow:auto;max-width:100%;max-height:85vh;margin:.5em 0;"
        "background:linear-gradient(to right,#fff 30%,#fff0) left/3em 100% no-repeat local,"
        "linear-gradient(to left,#fff 30%,#fff0) right/3em 100% no-repeat local,"
        "radial-gradient(farthest-side at 0 50%,#0003,#0000) left/1em 100% no-repeat scroll,"
        "radial-gradient(farthest-side at 100% 50%,#0003,#0000) right/1em 100% no-repeat scroll}")


#: the page's width
_WIDTH = "body{{max-width:{}px}}"


def save_html(path: str | Path, *parts: Any, title: str = "tl_reward report",
              offline: bool = True, max_width: int | None = 1200) -> Path:
    """Write ``parts`` (figures, views, tables, HTML strings) into one standalone HTML file.

    Plotly's and circuitsvis's JavaScript are each embedded once, compressed (a report is
    about 2 MB, plotly.js's 4.8 MB gzipped and base64-coded); with ``offline=False`` they load
    from CDNs (a much smaller file that needs a network to render). ``max_width``: the page's
    width in px (``None``: the window's).
    """
    figs = [is_figure(p) for p in parts]
    first = figs.index(True) if any(figs) else -1
    body = [to_html_fragment(p, offline, plotly_cdn=not offline and i == first)
            for i, p in enumerate(parts)]
    head = ""
    if offline:
        from plotly.offline import get_plotlyjs

        head = _LOADER + (embedded_library("Plotly", get_plotlyjs()) if any(figs) else "")
        if any(map(is_view, parts)):  # circuitsvis's bundle (defines CircuitsVis), no source map
            import circuitsvis

            js = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
            head += embedded_library("CircuitsVis", re.sub(r"//# sourceMappingURL=\S*", "",
                                                           js.read_text("utf-8")))
    doc = (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}"
           f"</title><style>{_CSS}{'' if max_width is None else _WIDTH.format(max_width)}"
           f"</style>{head}</head><body><h1>{html.escape(title)}</h1>\n"
           + "\n".join(body) + "\n</body></html>\n")
    path = Path(path)
    path.write_text(doc, encoding="utf-8")
    return path
