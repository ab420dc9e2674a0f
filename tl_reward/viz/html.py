"""Standalone HTML: plotly figures and circuitsvis views in one file that opens offline.

Example:
    >>> save_html("report.html", "<h2>Lens</h2>", lens.plot(), token_view, title="Pair 0")
"""

from __future__ import annotations

import html
import re
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


def circuitsvis_bundle() -> str:
    """circuitsvis's JavaScript bundle (defines ``CircuitsVis``) as one classic ``<script>``."""
    import circuitsvis

    js = (Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js").read_text("utf-8")
    js = re.sub(r"//# sourceMappingURL=\S*", "", js.replace("</script>", ""))
    return f"<script>{js}</script>"


def view_fragment(view: Any, offline: bool = True, bundle: bool = True) -> str:
    """A circuitsvis view as HTML: its container closed, then the call that renders it.

    Offline, the call uses the global ``CircuitsVis`` that :func:`circuitsvis_bundle` defines;
    ``bundle=False`` leaves the bundle out (:func:`save_html` writes it once per page).
    """
    if not offline:
        return close_divs(view.cdn_src)
    m = _RENDER_CALL.search(view.cdn_src)
    if m is None:  # an unknown circuitsvis layout: its own (closed) fragment, bundle and all
        return close_divs(view.local_src)
    props = m["props"].strip().replace("</", "<\\/")
    call = (f'<div id="{m["id"]}" style="margin: 15px 0;"></div>\n<script type="module">\n'
            f'CircuitsVis.render("{m["id"]}", CircuitsVis.{m["name"]}, {props});\n</script>')
    return (circuitsvis_bundle() + "\n" + call) if bundle else call


def to_html_fragment(part: Any, include_plotlyjs: bool | str = True, offline: bool = True,
                     bundle: bool = True) -> str:
    """An HTML fragment for a plotly figure, a circuitsvis view, a DataFrame or an HTML string.

    ``offline``: inline circuitsvis's JavaScript (about 1.3 MB; ``bundle=False`` leaves it to
    the page) rather than load it from a CDN.
    """
    if hasattr(part, "to_html") and hasattr(part, "layout"):  # plotly figure
        return part.to_html(full_html=False, include_plotlyjs=include_plotlyjs)
    if is_view(part):
        return view_fragment(part, offline=offline, bundle=bundle)
    if hasattr(part, "to_html"):  # DataFrame
        return table_fragment(part)
    return str(part)


def table_fragment(df: Any) -> str:
    """A DataFrame as an HTML table in a box that scrolls sideways (a wide table would run off
    the page), newlines in text shown as line breaks (pandas would print a literal ``\\n``)."""
    def cell(v: Any) -> Any:
        return html.escape(v).replace("\n", "<br>") if isinstance(v, str) else v

    shown = df.rename(columns=lambda c: html.escape(str(c)))
    shown = shown.apply(lambda col: col.map(cell)) if len(shown.columns) else shown
    table = shown.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0,
                          escape=False)
    return f'<div class="table-wrap">{table}</div>'



def save_html(path: str | Path, *parts: Any, title: str = "tl_reward report",
              offline: bool = True) -> Path:
    """Write ``parts`` (figures, views, tables, HTML strings) into one standalone HTML file.

    Plotly's and circuitsvis's JavaScript are each embedded once; with ``offline=False`` they
    load from CDNs (a much smaller file that needs a network to render).
    """
    body, plotly_done = [], False
    for part in parts:
        is_fig = hasattr(part, "layout") and hasattr(part, "to_html")
        inc: bool | str = (True if offline else "cdn") if not plotly_done else False
        body.append(to_html_fragment(part, include_plotlyjs=inc, offline=offline, bundle=False))
        plotly_done = plotly_done or is_fig
    head = circuitsvis_bundle() if offline and any(is_view(p) for p in parts) else ""
    doc = (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}"
           "</title><style>body{font-family:sans-serif;margin:2em;max-width:1200px}"
           "table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #ddd;"
           "vertical-align:top}td{max-width:36em}"
           ".table-wrap{overflow-x:auto;max-width:100%}"
           f"</style>{head}</head><body><h1>{html.escape(title)}</h1>\n" + "\n".join(body)
           + "\n</body></html>\n")
    path = Path(path)
    path.write_text(doc, encoding="utf-8")
    return path
