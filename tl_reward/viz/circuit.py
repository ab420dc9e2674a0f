"""A reward circuit drawn as a layered graph: one self-contained HTML fragment (inline SVG and
JavaScript: no CDN, no server, no graphviz) that displays in notebooks and saves with
:func:`tl_reward.viz.html.save_html`.

Rows from the bottom: ``input``, then per layer its heads (each circle holds its head index;
row labels on the left) and its MLP, and ``reward`` on top; SAE nodes
(:mod:`tl_reward.circuits` names: ``m{l}.f{i}`` and ``m{l}.err`` split ``m{l}``, ``r{l}.f{i}``
and ``r{l}.err`` the residual entering layer ``l``) get a row of their own where their hook
reads: after layer ``l``'s MLP, or before layer ``l``'s heads. Runs of layers that no embedded
edge touches shrink to one grey band. The drawing fills its container's width (edges stretch
sideways; nodes, text and strokes keep their size) and scrolls inside a box that opens on the
shown edges. Edges are coloured by the sign of their score (blue +, orange -), as wide as
``|score|``, dashed by the input they enter (q, k, v, or an MLP's / the reward's); MLP -> MLP
edges arc out right of the MLP column, each leaving and entering at its own angle; a slider
shows the top-k edges by ``|score|``; hovering an edge or a node shows its score or direct
effect on the reward.
"""

from __future__ import annotations

import hashlib
import html
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from tl_reward.errors import TLRewardError

#: colour-blind-safe diverging pair: positive, negative
POS, NEG = "#0072B2", "#E66100"
#: stroke-dasharray per destination input ("": an MLP's input or the reward)
DASH = {"": "", "q": "9 3", "k": "2 3", "v": "9 3 2 3"}
_NODE = re.compile(r"^(?:(input|reward)|a(\d+)\.h(\d+)|m(\d+)|([mr])(\d+)\.(?:f(\d+)|(err)))$")
#: px: the row labels' column, the top margin, a collapsed run of layers' band
_GUTTER, _TOP, _BAND = 84, 24, 24
#: drawing units (px at the narrowest): side margin, least heads' span, room for MLP arcs
_PAD, _SPAN, _LANE = 24.0, 360.0, 150.0


class CircuitHTML(str):
    """The view's HTML; shows itself in a notebook and saves as a standalone page."""

    title = "Reward circuit"

    def _repr_html_(self) -> str:
        return str(self)

    def save(self, path: str | Path) -> Path:
        """Write a standalone page holding this view (its title as the page's), as wide as
        the window."""
        from tl_reward.viz.html import save_html

        heading = f"<h3>{html.escape(self.title)}</h3>"
        return save_html(path, str(self).replace(heading, "", 1), title=self.title,
                         max_width=None)


def _parse(name: str, n_layers: int, n_heads: int) -> tuple[str, int, int]:
    """``(kind, layer, index)`` of a node name; kinds: input, reward, head, mlp, feat, err (an
    SAE node's ``layer`` is its row slot: ``2 l`` for ``r{l}``, ``2 l + 1`` for ``m{l}``)."""
    m = _NODE.match(name)
    if m is None:
        raise TLRewardError(f"unknown node {name!r}: expected input, reward, a{{l}}.h{{h}}, "
                            "m{l}, or an SAE node m{l}.f{i}, m{l}.err, r{l}.f{i}, r{l}.err")
    if m[1]:
        return m[1], -1 if m[1] == "input" else n_layers, 0
    if m[5]:
        layer = int(m[6])
        if not 0 <= layer < n_layers + (m[5] == "r"):
            raise TLRewardError(f"node {name!r} is outside the model ({n_layers} layers)")
        return ("err" if m[8] else "feat"), 2 * layer + (m[5] == "m"), int(m[7] or 0)
    kind, layer, index = ("head", int(m[2]), int(m[3])) if m[2] else ("mlp", int(m[4]), 0)
    if not 0 <= layer < n_layers or (kind == "head" and not 0 <= index < n_heads):
        raise TLRewardError(f"node {name!r} is outside the model ({n_layers} layers, "
                            f"{n_heads} heads)")
    return kind, layer, index


def _colour(value: float, limit: float) -> str:
    """White at 0 towards POS (positive) or NEG (negative) at ``|value| = limit``."""
    t = min(abs(value) / limit, 1.0) if limit > 0 else 0.0
    end = POS if value >= 0 else NEG
    rgb = [round(255 + t * (int(end[i:i + 2], 16) - 255)) for i in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def _ink(fill: str) -> str:
    """Black text on a light fill, white on a dark one."""
    r, g, b = (int(fill[i:i + 2], 16) for i in (1, 3, 5))
    return "#000" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#fff"


def _rows(n_layers: int, slots: set[int], touched: set[int]) -> list[tuple[str, int]]:
    """Rows bottom-up: input, per layer (residual SAE), heads, MLP, (MLP SAE); reward. A run
    of untouched layers is one ``("band", first)`` row (SAE slots touch their layer)."""
    rows: list[tuple[str, int]] = [("input", -1)]
    for layer in range(n_layers + 1):
        rows += [("feat", 2 * layer)] if 2 * layer in slots else []
        if layer == n_layers:
            break
        if layer in touched:
            rows += [("attn", layer), ("mlp", layer)]
            rows += [("feat", 2 * layer + 1)] if 2 * layer + 1 in slots else []
        elif rows[-1][0] != "band":
            rows.append(("band", layer))
    rows.append(("reward", n_layers))
    return rows


def _spread(ends: list[int]) -> dict[int, float]:
    """Angles from the vertical (radians) for arcs to ``ends`` ordered nearest first: 25 to
    75 degrees, nearer ends steeper (so arcs nest), 50 for a lone one."""
    n = len(ends)
    return {e: math.radians(50.0 if n == 1 else 25 + 50 * i / (n - 1)) for i, e in
            enumerate(ends)}


def _arc(x: float, y1: float, y2: float, out: float, into: float) -> str:
    """An MLP -> MLP arc from the right side of the box at ``(x, y1)`` up to ``(x, y2)``,
    leaving and entering at angles ``out`` and ``into`` from the vertical."""
    r = min(0.45 * (y1 - y2), (_LANE - 6) / math.sin(math.radians(75)))
    return (f"M{x:.1f},{y1:.1f} C{x + r * math.sin(out):.1f},{y1 - r * math.cos(out):.1f} "
            f"{x + r * math.sin(into):.1f},{y2 + r * math.cos(into):.1f} {x:.1f},{y2:.1f}")


def _curve(x1: float, y1: float, x2: float, y2: float, rank: int, row_h: float,
           width: float, lean: float = 0.0) -> str:
    """Any other edge: upwards a vertical S, bowed aside (alternately by rank) past the rows
    it skips, plus ``lean`` (a key's edge and a value's from one source part); within a row
    or downwards a bow to the side; control points kept inside."""
    def cx(x: float) -> float:
        return min(max(x, 4.0), width - 4.0)

    if y2 < y1 - 4:
        mid = (y1 - y2) / 2
        bow = lean + (0.0 if mid < row_h else min(12 + 0.4 * mid, 140) * (1 - 2 * (rank % 2)))
        return (f"M{x1:.1f},{y1:.1f} C{cx(x1 + bow):.1f},{y1 - mid:.1f} "
                f"{cx(x2 + bow):.1f},{y2 + mid:.1f} {x2:.1f},{y2:.1f}")
    return (f"M{x1:.1f},{y1:.1f} C{cx(x1 + 60):.1f},{y1 - 40:.1f} {cx(x2 + 60):.1f},"
            f"{y2 + 40:.1f} {x2:.1f},{y2:.1f}")


def circuit_html(edges: pd.DataFrame, node_effects: Mapping[str, float] | None, n_layers: int,
                 n_heads: int, title: str = "Reward circuit", max_edges: int = 200,
                 shown: int = 30, n_kv_heads: int | None = None) -> CircuitHTML:
    """The circuit view of an edge table (see the module doc).

    Args:
        edges: one row per edge, columns ``src``, ``dst``, ``qkv`` ("q"/"k"/"v" into a head,
            "" otherwise) and ``score``.
        node_effects: node name -> its direct effect on the reward (shown on hover and as the
            node's fill; missing nodes show none).
        n_layers, n_heads: the model's shape; n_kv_heads: on grouped-query models, k/v
            destinations ``a{l}.h{kv}`` are key/value heads, drawn under their query heads.
        title: the view's heading.
        max_edges: the edges embedded (the top ones by ``|score|``); shown: how many of them
            the slider starts at.
    """
    missing = {"src", "dst", "qkv", "score"} - set(edges.columns)
    if missing:
        raise TLRewardError(f"the edge table lacks columns {sorted(missing)}; expected src, "
                            "dst, qkv, score (one row per edge)")
    if max_edges < 1 or shown < 1:
        raise TLRewardError(f"max_edges and shown must be >= 1, got {max_edges} and {shown}")
    effects = dict(node_effects or {})
    n_kv = n_kv_heads or n_heads
    if n_heads % n_kv:
        raise TLRewardError(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv}")
    rep = n_heads // n_kv
    top = edges.assign(_abs=edges["score"].abs()).sort_values("_abs", ascending=False,
                                                              kind="stable").head(max_edges)
    qkv = top["qkv"].fillna("").astype(str)
    bad = sorted(set(qkv) - set(DASH))
    if bad:
        raise TLRewardError(f"qkv values {bad} unknown: use 'q', 'k', 'v' or ''")
    kv_rows = top["dst"][qkv.isin(["k", "v"]).to_numpy()]
    if rep > 1 and any(int(d.split(".h")[1]) >= n_kv for d in kv_rows if ".h" in d):
        raise TLRewardError(f"a k/v edge names a key/value head >= n_kv_heads {n_kv}")
    names = set(top["src"]) | set(top["dst"])  # SAE nodes: drawn where an edge touches them
    parsed = {n: _parse(n, n_layers, n_heads) for n in names | set(effects)}
    feats: dict[int, list[str]] = {}
    for n, (kind, layer, _) in sorted(((n, parsed[n]) for n in names), key=lambda kv: kv[1]):
        if kind in ("feat", "err"):
            feats.setdefault(layer, []).append(n)
    touched = {parsed[n][1] // (2 if parsed[n][0] in ("feat", "err") else 1) for n in names
               if parsed[n][0] not in ("input", "reward")} & set(range(n_layers))
    rows = _rows(n_layers, set(feats), touched)
    kv_gap, row_h = (14 if rep > 1 else 0), (46 if n_layers <= 8 else 36)
    y_of: dict[tuple[str, int], float] = {}
    y = 0.0
    for row in rows:
        y -= kv_gap if row[0] == "attn" else 0
        y_of[row] = y
        y -= _BAND if row[0] == "band" else row_h + (10 if row[0] == "input" else 0)
    height = _TOP - y_of[rows[-1]] + 40
    y_of = {r: v - y_of[rows[-1]] + _TOP for r, v in y_of.items()}

    mlp_pairs = {(parsed[s][1], parsed[d][1]) for s, d in zip(top["src"], top["dst"],
                                                               strict=True)
                 if parsed[s][0] == parsed[d][0] == "mlp" and parsed[s][1] < parsed[d][1]}
    span = max(_SPAN, 24.0 * (n_heads - 1))
    dx = span / max(n_heads - 1, 1)
    fdx = min(dx, 52.0)  # SAE nodes' spacing
    centre, mlp_x = _PAD + (n_heads - 1) * dx / 2, _PAD + span + 48
    lane = _LANE if mlp_pairs else 40.0  # room right of the MLPs for their arcs
    width = max([mlp_x + 16 + lane, *(max(_PAD, centre - (len(v) - 1) * fdx / 2)
                                      + (len(v) - 1) * fdx + _PAD for v in feats.values())])

    def pct(x: float) -> str:
        return f"{100 * x / width:.3f}%"

    def pos(name: str, kv_dst: bool = False) -> tuple[float, float]:
        kind, layer, index = parsed[name]
        if kind in ("input", "reward"):
            return centre, y_of[(kind, layer)]
        if kind == "head":
            if kv_dst and rep > 1:  # a key/value head, under its query heads
                return _PAD + (index * rep + (rep - 1) / 2) * dx, y_of[("attn", layer)] + 17
            return _PAD + index * dx, y_of[("attn", layer)]
        if kind == "mlp":  # a column right of the heads
            return mlp_x, y_of[("mlp", layer)]
        row = feats[layer]  # centred under the heads, or from the left edge if wider
        start = max(_PAD, centre - (len(row) - 1) * fdx / 2)
        return start + row.index(name) * fdx, y_of[("feat", layer)]

    leave = {(a, b): v for a in {a for a, _ in mlp_pairs}
             for b, v in _spread(sorted(b for s, b in mlp_pairs if s == a)).items()}
    enter = {(a, b): v for b in {b for _, b in mlp_pairs}
             for a, v in _spread(sorted((a for a, d in mlp_pairs if d == b), reverse=True)
                                 ).items()}
    limit_e = float(top["_abs"].max()) if len(top) else 1.0
    limit_n = max([abs(float(v)) for v in effects.values()] or [0.0]) or 1.0
    k0 = min(shown, len(top))
    paths = []
    for rank, (src, dst, q, s) in enumerate(zip(top["src"], top["dst"], qkv, top["score"],
                                                strict=True)):
        pair = (parsed[src][1], parsed[dst][1])
        if pair in mlp_pairs and parsed[src][0] == parsed[dst][0] == "mlp":
            d = _arc(mlp_x + 16, y_of[("mlp", pair[0])], y_of[("mlp", pair[1])],
                     leave[pair], enter[pair])
        else:
            x1, y1 = pos(src)
            x2, y2 = pos(dst, kv_dst=q in ("k", "v"))
            x2 += ({"q": -2, "v": 2} if rep == 1 else {"k": -1.2, "v": 1.2}).get(q, 0)
            y1, y2 = y1 - 9, y2 + (3 if q in ("k", "v") and rep > 1 else 10)
            d = _curve(x1, y1, x2, y2, rank, row_h, width, {"k": -12, "v": 12}.get(q, 0))
        w = 0.6 + 5.4 * abs(float(s)) / limit_e
        label = f"{src} \u2192 {dst}{f' ({q})' if q else ''}: score {float(s):+.4g}"
        paths.append(
            f'<path class="e" data-rank="{rank}" data-src="{html.escape(src)}" '
            f'data-dst="{html.escape(dst)}" data-w="{abs(float(s)) / limit_e:.4f}" d="{d}" '
            f'stroke="{POS if s >= 0 else NEG}" stroke-width="{w:.2f}" '
            f'stroke-dasharray="{DASH[q]}" fill="none" vector-effect="non-scaling-stroke" '
            f'stroke-opacity="{0.45 + 0.5 * abs(float(s)) / limit_e:.2f}"'
            f"{'' if rank < k0 else ' style=display:none'}>"
            f"<title>{html.escape(label)}</title></path>")
    used = set(top["src"].head(k0)) | set(top["dst"].head(k0))
    nodes = []
    drawn = ["input", "reward",
             *(f"a{la}.h{h}" for la in sorted(touched) for h in range(n_heads)),
             *(f"m{la}" for la in sorted(touched)), *(n for v in feats.values() for n in v)]
    for name in drawn:
        parsed.setdefault(name, _parse(name, n_layers, n_heads))
        kind, layer, index = parsed[name]
        x, y = pos(name)
        eff = effects.get(name)
        fill = _colour(float(eff), limit_n) if eff is not None else "#f4f4f4"
        tip = f"{name}: direct effect on the reward " + (
            f"{float(eff):+.4g}" if eff is not None else "not given")
        shape = {"head": '<circle r="9"/>',
                 "mlp": '<rect x="-16" y="-7" width="32" height="14" rx="3"/>',
                 "feat": '<path d="M0,-8 l8,8 l-8,8 l-8,-8z"/>',
                 "err": '<rect x="-7" y="-7" width="14" height="14"/>'}.get(
            kind, '<rect x="-28" y="-9" width="56" height="18" rx="9"/>')
        text = {"head": str(index), "mlp": f"m{layer}"}.get(kind, name)
        below = kind in ("feat", "err")  # a feature's name under it, others inside
        nodes.append(
            f'<g class="n{"" if name in used else " idle"}" data-name="{html.escape(name)}" '
            f'fill="{fill}" stroke="#333"><title>{html.escape(tip)}</title>'
            f'<svg x="{pct(x)}" y="{y:.1f}" overflow="visible">{shape}<text y="'
            f'{19 if below else 3.5}" text-anchor="middle" stroke="none" fill="'
            f'{"#000" if below else _ink(fill)}" class="{"hl" if kind == "head" else ""}">'
            f"{html.escape(text)}</text></svg></g>")
    splits = []  # an MLP's SAE nodes read its output whole: a grey link from it to each
    for slot, row in feats.items():
        if slot % 2:
            x1, y1 = pos(f"m{slot // 2}")
            splits += [f'<line class="split" x1="{pct(x1)}" y1="{y1 - 7:.1f}" '
                       f'x2="{pct(pos(n)[0])}" y2="{pos(n)[1] + 23:.1f}" stroke="#bbb" '
                       'stroke-dasharray="1 3"/>' for n in row]
    if rep > 1:  # key/value head markers
        for la in sorted(touched):
            for kv in range(n_kv):
                x, y = _PAD + (kv * rep + (rep - 1) / 2) * dx, y_of[("attn", la)] + 17
                nodes.append(f'<svg x="{pct(x)}" y="{y:.1f}" overflow="visible"><rect '
                             'class="kv" x="-4" y="-3" width="8" height="6" fill="#ddd" '
                             f'stroke="#777"><title>a{la}.h{kv}: key/value head {kv} (query '
                             f"heads {kv * rep}-{kv * rep + rep - 1})</title></rect></svg>")
    row_name = {"attn": "L{} heads", "mlp": "L{} MLP"}
    labels, bands = [], []
    for r in rows:
        if r[0] == "band":
            lo = r[1]
            hi = min([t for t in touched if t > lo], default=n_layers) - 1
            span_text = f"L{lo}" + (f"\u2013{hi}" if hi > lo else "")
            labels.append(f'<text x="8" y="{y_of[r] + 4:.1f}" class="lab">{span_text}</text>')
            bands.append(f'<rect class="band" x="0" y="{y_of[r] - 9:.1f}" width="100%" '
                         f'height="18" fill="#f3f3f3"/><text x="50%" y="{y_of[r] + 4:.1f}" '
                         f'class="lab" text-anchor="middle">{span_text}: no edge among these '
                         f"{len(top)} touches {'them' if hi > lo else 'it'}</text>")
        elif r[0] in (*row_name, "feat"):
            labels.append(f'<text x="8" y="{y_of[r] + 4:.1f}" class="lab">'
                          + (row_name[r[0]].format(r[1]) if r[0] in row_name
                             else f"{'rm'[r[1] % 2]}{r[1] // 2} SAE") + "</text>")
    uid = "tlrc" + hashlib.sha1(json.dumps([title, top[["src", "dst"]].values.tolist(),
                                            top["score"].tolist()]).encode()).hexdigest()[:10]
    figure = (f'<div class="scroll"><div class="draw"><svg class="gut" width="{_GUTTER}" '
              f'height="{height:.0f}">{"".join(labels)}</svg><svg class="fig" height="'
              f'{height:.0f}" style="min-width:{width:.0f}px">{"".join(bands + splits)}'
              f'<svg class="edges" width="100%" height="{height:.0f}" viewBox="0 0 '
              f'{width:.1f} {height:.0f}" preserveAspectRatio="none" overflow="visible">'
              + "".join(paths) + "</svg>" + "".join(nodes) + "</svg></div></div>")
    return _page(uid, title, figure, len(top), len(edges), k0,
                 rep > 1, bool(feats))


def _page(uid: str, title: str, figure: str, n_top: int, n_edges: int, k0: int, grouped: bool,
          sae: bool) -> CircuitHTML:
    """The view around the drawing: heading, slider, legend, hover line, style and script."""
    legend = "".join(
        f'<span><svg width="34" height="10"><line x1="0" y1="5" x2="34" y2="5" stroke="#444" '
        f'stroke-width="2" stroke-dasharray="{dash}"/></svg> {name}</span>'
        for name, dash in (("into query", DASH["q"]), ("into key", DASH["k"]),
                           ("into value", DASH["v"]), ("into MLP / reward", DASH[""])))
    legend += "".join(
        f'<span><svg width="34" height="10"><line x1="0" y1="5" x2="34" y2="5" stroke="{c}" '
        f'stroke-width="4"/></svg> {name}</span>' for name, c in (("positive score", POS),
                                                                 ("negative score", NEG)))
    legend += ("<span>width \u221d |score|; node fill: the node's direct effect on the reward "
               "(same colours); circles: heads (their index)" + (
                   "; grey squares: their key/value heads" if grouped else "")
               + "; boxes: MLPs" + ("; diamonds: SAE features, squares: SAE errors (grey "
                                    "dots: the MLP output they split)" if sae else "")
               + "</span>")
    style = (f"#{uid}{{font-family:sans-serif;font-size:13px}}#{uid} .lab{{font-size:11px;"
             f"fill:#555}}#{uid} .n.idle{{opacity:.35}}#{uid} .legend{{display:flex;"
             f"flex-wrap:wrap;gap:.4em 1.4em;margin:.3em 0}}#{uid} .e:hover{{stroke-opacity:1}}"
             f"#{uid} .info{{min-height:1.3em;color:#222;font-family:monospace}}"
             f"#{uid} svg text{{font-size:11px}}#{uid} .hl{{font-size:10px}}"
             f"#{uid} .scroll{{max-height:75vh;overflow:auto;border:1px solid #eee}}"
             f"#{uid} .draw{{display:flex}}#{uid} .gut{{flex:none;position:sticky;left:0;"
             f"background:#fff;z-index:1}}#{uid} .fig{{flex:1 1 0}}")
    script = _SCRIPT.replace("__UID__", uid).replace("__N__", str(n_top))
    total = f" (the top {n_top} of {n_edges} by |score|)" if n_edges > n_top else ""
    body = (f'<div id="{uid}" class="tlr-circuit"><style>{style}</style>'
            f"<h3>{html.escape(title)}</h3>"
            f'<div><input type="range" min="1" max="{max(n_top, 1)}" value="{k0}" '
            f'aria-label="edges shown"> <span class="count">{k0} of {n_top} edges shown'
            f"</span>{total}</div><div class=\"legend\">{legend}</div>"
            '<div class="info">hover an edge or a node</div>' + figure + script + "</div>")
    out = CircuitHTML(body)
    out.title = title
    return out


#: the slider and hover; on load the scroll box moves to the window holding the most shown
#: |score| (each edge counted by the share of its height inside)
_SCRIPT = """<script>(function () {
  var root = document.getElementById("__UID__"), slider = root.querySelector("input");
  var edges = root.querySelectorAll("path.e"), nodes = root.querySelectorAll("g.n");
  var count = root.querySelector(".count"), info = root.querySelector(".info");
  var box = root.querySelector(".scroll"), fig = root.querySelector("svg.fig");
  function show(k) {
    var used = {}, last = null;
    edges.forEach(function (e) {
      var on = +e.dataset.rank < k; e.style.display = on ? "" : "none";
      if (on) { used[e.dataset.src] = used[e.dataset.dst] = 1; last = e; }
    });
    nodes.forEach(function (n) { n.classList.toggle("idle", !used[n.dataset.name]); });
    count.textContent = k + " of __N__ edges shown" + (last ? " (|score| \\u2265 " +
      last.querySelector("title").textContent.split("score ")[1].replace(/^[+-]/, "") + ")"
      : "");
  }
  function focus() {
    var h = box.clientHeight, spans = [], best = 0, top = 0;
    if (fig.clientHeight <= h) return;
    edges.forEach(function (e) {
      if (e.style.display == "none") return;
      var b = e.getBBox(); spans.push([b.y, b.y + Math.max(b.height, 1), +e.dataset.w]);
    });
    spans.forEach(function (c) {
      [c[0] - 24, c[1] + 24 - h].forEach(function (t) {
        var sum = 0;
        spans.forEach(function (s) {
          sum += s[2] * Math.max(0, Math.min(s[1], t + h) - Math.max(s[0], t)) / (s[1] - s[0]);
        });
        if (sum > best) { best = sum; top = t; }
      });
    });
    box.scrollTop = Math.max(0, top);
  }
  slider.addEventListener("input", function () { show(+slider.value); });
  root.querySelectorAll("path.e, g.n, rect.kv").forEach(function (el) {
    el.addEventListener("mouseover", function () {
      info.textContent = el.querySelector("title").textContent; });
  });
  show(+slider.value);
  focus();
})();</script>"""
