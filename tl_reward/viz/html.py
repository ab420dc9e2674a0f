"""Standalone HTML: plotly figures and circuitsvis views in one file that opens offline.

Example:
    >>> save_html("report.html", "<h2>Lens</h2>", lens.plot(), token_view, title="Pair 0")
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any


def is_view(obj: Any) -> bool:
    """True for a circuitsvis ``RenderedHTML``."""
    return hasattr(obj, "local_src") and hasattr(obj, "cdn_src")


def to_html_fragment(part: Any, include_plotlyjs: bool | str = True, offline: bool = True) -> str:
    """An HTML fragment for a plotly figure, a circuitsvis view, a DataFrame or an HTML string.

    ``offline``: inline circuitsvis's JavaScript (about 1.3 MB per view) rather than load it
    from a CDN.
    """
    if hasattr(part, "to_html") and hasattr(part, "layout"):  # plotly figure
        return part.to_html(full_html=False, include_plotlyjs=include_plotlyjs)
    if is_view(part):
        return part.local_src if offline else part.cdn_src
    if hasattr(part, "to_html"):  # DataFrame
        return part.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0)
    return str(part)


def save_html(path: str | Path, *parts: Any, title: str = "tl_reward report",
              offline: bool = True) -> Path:
    """Write ``parts`` (figures, views, tables, HTML strings) into one standalone HTML file.

    Plotly's JavaScript is embedded once; with ``offline=False`` it and circuitsvis load from
    CDNs (a much smaller file that needs a network to render).
    """
    body, plotly_done = [], False
    for part in parts:
        is_fig = hasattr(part, "layout") and hasattr(part, "to_html")
        inc: bool | str = (True if offline else "cdn") if not plotly_done else False
        body.append(to_html_fragment(part, include_plotlyjs=inc, offline=offline))
        plotly_done = plotly_done or is_fig
    doc = (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}"
           "</title><style>body{font-family:sans-serif;margin:2em;max-width:1200px}"
           "table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #ddd}"
           f"</style></head><body><h1>{html.escape(title)}</h1>\n" + "\n".join(body)
           + "\n</body></html>\n")
    path = Path(path)
    path.write_text(doc, encoding="utf-8")
    return path
