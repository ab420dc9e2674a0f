"""A reward circuit drawn as a layered graph: one self-contained HTML fragment (inline SVG and
JavaScript: no CDN, no server, no graphviz) that displays in notebooks and saves with
:func:`tl_reward.viz.html.save_html`.

Rows from the bottom: ``input``, then per layer its heads and its MLP, and ``reward`` on top;
SAE nodes (:mod:`tl_reward.circuits` names: ``m{l}.f{i}`` and ``m{l}.err`` split ``m{l}``,
``r{l}.f{i}`` and ``r{l}.err`` the residual entering layer ``l``) get a row of their own where
their hook reads: after layer ``l``'s MLP, or before layer ``l``'s heads. Edges are
coloured by the sign of their score (blue +, orange -), as wide as ``|score|``, dashed by the
input they enter (q, k, v, or an MLP's / the reward's); a slider shows the top-k edges by
``|score|``; hovering an edge or a node shows its score or direct effect on the reward.
"""

from __future__ import annotations

import hashlib
import html
import json
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
_LEFT, _TOP = 92, 24


class CircuitHTML(str):
    """The view's HTML; shows itself in a notebook and saves as a standalone page."""

    title = "Reward circuit"

    def _repr_html_(self) -> str:
        return str(self)

    def save(self, path: str | Path) -> Path:
        """Write a standalone page holding this view (its title as the page's)."""
        from tl_reward.viz.html import save_html

        heading = f"<h3>{html.escape(self.title)}</h3>"
        return save_html(path, str(self).replace(heading, "", 1), title=self.title)


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
    # rows bottom-up: input, then per layer (residual SAE), heads, MLP, (MLP SAE); reward
    rows: list[tuple[str, int]] = [("input", -1)]
    for layer in range(n_layers + 1):
        rows += [("feat", 2 * layer)] if 2 * layer in feats else []
        if layer < n_layers:
            rows += [("attn", layer), ("mlp", layer)]
            rows += [("feat", 2 * layer + 1)] if 2 * layer + 1 in feats else []
    rows.append(("reward", n_layers))
    kv_gap, row_h = (14 if rep > 1 else 0), (46 if n_layers <= 8 else 34)
    y_of: dict[tuple[str, int], float] = {}
    y = 0.0
    for row in rows:
        y -= kv_gap if row[0] == "attn" else 0
        y_of[row] = y
        y -= row_h + (24 if row[0] == "input" else 0)  # room for the head labels
    height = _TOP - y_of[rows[-1]] + 40
    y_of = {r: v - y_of[rows[-1]] + _TOP for r, v in y_of.items()}
    dx = max(30.0, min(90.0, 720 / n_heads))
    fdx = min(dx, 52.0)  # SAE nodes' spacing
    widest = max([n_heads * dx, *(len(v) * fdx for v in feats.values())])
    width = _LEFT + widest + dx + 60
    centre, mlp_x = _LEFT + (n_heads - 1) * dx / 2, _LEFT + n_heads * dx + 10

    def pos(name: str, kv_dst: bool = False) -> tuple[float, float]:
        kind, layer, index = parsed[name]
        if kind in ("input", "reward"):
            return centre, y_of[(kind, layer)]
        if kind == "head":
            if kv_dst and rep > 1:  # a key/value head, under its query heads
                return _LEFT + (index * rep + (rep - 1) / 2) * dx, y_of[("attn", layer)] + 16
            return _LEFT + index * dx, y_of[("attn", layer)]
        if kind == "mlp":  # a column right of the heads
            return mlp_x, y_of[("mlp", layer)]
        row = feats[layer]  # centred under the heads, or from the left edge if wider
        start = max(float(_LEFT), centre - (len(row) - 1) * fdx / 2)
        return start + row.index(name) * fdx, y_of[("feat", layer)]

    limit_e = float(top["_abs"].max()) if len(top) else 1.0
    limit_n = max([abs(float(v)) for v in effects.values()] or [0.0]) or 1.0
    k0 = min(shown, len(top))
    paths = []
    for rank, (src, dst, q, s) in enumerate(zip(top["src"], top["dst"], qkv, top["score"],
                                                strict=True)):
        x1, y1 = pos(src)
        x2, y2 = pos(dst, kv_dst=q in ("k", "v"))
        x2 += ({"q": -5, "v": 5} if rep == 1 else {"k": -3, "v": 3}).get(q, 0)
        y1, y2 = y1 - 7, y2 + (4 if q in ("k", "v") and rep > 1 else 8)
        if y2 < y1 - 4:  # upwards: a vertical S, bowed aside past the rows it skips
            mid = (y1 - y2) / 2
            bow = 0.0 if mid < row_h else min(12 + 0.4 * mid, 140) * (1 - 2 * (rank % 2))
            d = f"M{x1:.1f},{y1:.1f} C{x1 + bow:.1f},{y1 - mid:.1f} {x2 + bow:.1f}," \
                f"{y2 + mid:.1f} {x2:.1f},{y2:.1f}"
        else:  # within a row or downwards: bow to the side
            d = f"M{x1:.1f},{y1:.1f} C{x1 + 60:.1f},{y1 - 40:.1f} {x2 + 60:.1f},{y2 + 40:.1f} " \
                f"{x2:.1f},{y2:.1f}"
        w = 0.6 + 5.4 * abs(float(s)) / limit_e
        label = f"{src} \u2192 {dst}{f' ({q})' if q else ''}: score {float(s):+.4g}"
        paths.append(
            f'<path class="e" data-rank="{rank}" data-src="{html.escape(src)}" '
            f'data-dst="{html.escape(dst)}" d="{d}" stroke="{POS if s >= 0 else NEG}" '
            f'stroke-width="{w:.2f}" stroke-dasharray="{DASH[q]}" fill="none" '
            f'stroke-opacity="{0.45 + 0.5 * abs(float(s)) / limit_e:.2f}"'
            f"{'' if rank < k0 else ' style=display:none'}>"
            f"<title>{html.escape(label)}</title></path>")
    used = set(top["src"].head(k0)) | set(top["dst"].head(k0))
    nodes = []
    drawn = ["input", "reward", *(f"a{la}.h{h}" for la in range(n_layers) for h in range(n_heads)),
             *(f"m{la}" for la in range(n_layers)), *(n for v in feats.values() for n in v)]
    for name in drawn:
        parsed.setdefault(name, _parse(name, n_layers, n_heads))
        kind = parsed[name][0]
        x, y = pos(name)
        eff = effects.get(name)
        fill = _colour(float(eff), limit_n) if eff is not None else "#f4f4f4"
        tip = f"{name}: direct effect on the reward " + (
            f"{float(eff):+.4g}" if eff is not None else "not given")
        shape = {"head": f'<circle cx="{x:.1f}" cy="{y:.1f}" r="7"/>',
                 "mlp": f'<rect x="{x - 16:.1f}" y="{y - 7:.1f}" width="32" height="14" rx="3"/>',
                 "feat": f'<path d="M{x:.1f},{y - 8:.1f} l8,8 l-8,8 l-8,-8z"/>',
                 "err": f'<rect x="{x - 7:.1f}" y="{y - 7:.1f}" width="14" height="14"/>'}.get(
            kind, f'<rect x="{x - 28:.1f}" y="{y - 9:.1f}" width="56" height="18" rx="9"/>')
        text = {"input": "input", "reward": "reward", "mlp": f"m{parsed[name][1]}"}.get(kind)
        below = kind in ("feat", "err")  # a feature's name under it
        nodes.append(
            f'<g class="n{"" if name in used else " idle"}" data-name="{html.escape(name)}" '
            f'fill="{fill}" stroke="#333"><title>{html.escape(tip)}</title>{shape}'
            + (f'<text x="{x:.1f}" y="{y + (19 if below else 4):.1f}" text-anchor="middle" '
               f'stroke="none" fill="#000">{html.escape(text or name)}</text>'
               if text or below else "") + "</g>")
    splits = []  # an MLP's SAE nodes read its output whole: a grey link from it to each
    for slot, row in feats.items():
        if slot % 2:
            x1, y1 = pos(f"m{slot // 2}")
            splits += [f'<line class="split" x1="{x1:.1f}" y1="{y1 - 7:.1f}" '
                       f'x2="{pos(n)[0]:.1f}" y2="{pos(n)[1] + 23:.1f}" stroke="#bbb" '
                       'stroke-dasharray="1 3"/>' for n in row]
    if rep > 1:  # key/value head markers
        for la in range(n_layers):
            for kv in range(n_kv):
                x, y = _LEFT + (kv * rep + (rep - 1) / 2) * dx, y_of[("attn", la)] + 16
                nodes.append(f'<rect class="kv" x="{x - 4:.1f}" y="{y - 3:.1f}" width="8" '
                             f'height="6" fill="#ddd" stroke="#777"><title>a{la}.h{kv}: '
                             f"key/value head {kv} (query heads {kv * rep}-{kv * rep + rep - 1})"
                             "</title></rect>")
    row_name = {"attn": "L{} heads", "mlp": "L{} MLP"}
    labels = [f'<text x="8" y="{y_of[r] + 4:.1f}" class="lab">'
              + (row_name[r[0]].format(r[1]) if r[0] in row_name
                 else f"{'rm'[r[1] % 2]}{r[1] // 2} SAE") + "</text>"
              for r in rows if r[0] in (*row_name, "feat")]
    labels += [f'<text x="{_LEFT + h * dx:.1f}" y="{y_of[("attn", 0)] + 22 + kv_gap:.1f}" '
               f'class="lab" text-anchor="middle">h{h}</text>' for h in range(n_heads)]
    uid = "tlrc" + hashlib.sha1(json.dumps([title, top[["src", "dst"]].values.tolist(),
                                            top["score"].tolist()]).encode()).hexdigest()[:10]
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
               "(same colours); circles: heads" + ("; grey squares: their key/value heads"
                                                  if rep > 1 else "")
               + "; boxes: MLPs" + ("; diamonds: SAE features, squares: SAE errors (grey "
                                    "dots: the MLP output they split)" if feats else "")
               + "</span>")
    style = (f"#{uid}{{font-family:sans-serif;font-size:13px}}#{uid} .lab{{font-size:11px;"
             f"fill:#555}}#{uid} .n.idle{{opacity:.35}}#{uid} .legend{{display:flex;"
             f"flex-wrap:wrap;gap:.4em 1.4em;margin:.3em 0}}#{uid} .e:hover{{stroke-opacity:1}}"
             f"#{uid} .info{{min-height:1.3em;color:#222;font-family:monospace}}"
             f"#{uid} svg text{{font-size:11px}}")
    script = f"""<script>(function () {{
  var root = document.getElementById("{uid}"), slider = root.querySelector("input");
  var edges = root.querySelectorAll("path.e"), nodes = root.querySelectorAll("g.n");
  var count = root.querySelector(".count"), info = root.querySelector(".info");
  function show(k) {{
    var used = {{}}, last = null;
    edges.forEach(function (e) {{
      var on = +e.dataset.rank < k; e.style.display = on ? "" : "none";
      if (on) {{ used[e.dataset.src] = used[e.dataset.dst] = 1; last = e; }}
    }});
    nodes.forEach(function (n) {{ n.classList.toggle("idle", !used[n.dataset.name]); }});
    count.textContent = k + " of {len(top)} edges shown" + (last ? " (|score| \\u2265 " +
      last.querySelector("title").textContent.split("score ")[1].replace(/^[+-]/, "") + ")"
      : "");
  }}
  slider.addEventListener("input", function () {{ show(+slider.value); }});
  root.querySelectorAll("path.e, g.n, rect.kv").forEach(function (el) {{
    el.addEventListener("mouseover", function () {{
      info.textContent = el.querySelector("title").textContent; }});
  }});
  show(+slider.value);
}})();</script>"""
    total = f" (the top {len(top)} of {len(edges)} by |score|)" if len(edges) > len(top) else ""
    body = (f'<div id="{uid}" class="tlr-circuit"><style>{style}</style>'
            f"<h3>{html.escape(title)}</h3>"
            f'<div><input type="range" min="1" max="{max(len(top), 1)}" value="{k0}" '
            f'aria-label="edges shown"> <span class="count">{k0} of {len(top)} edges shown'
            f"</span>{total}</div><div class=\"legend\">{legend}</div>"
            '<div class="info">hover an edge or a node</div>'
            f'<svg width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} '
            f'{height:.0f}">'
            + "".join(labels + splits + paths + nodes) + "</svg>" + script + "</div>")
    out = CircuitHTML(body)
    out.title = title
    return out
