"""The circuit view: offline, every embedded edge drawn, and the slider and hover work in
headless Chromium (skipped without a ``chromium`` binary)."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tl_reward.errors import TLRewardError
from tl_reward.testing.browser import chromium_path, page_problems, render_page
from tl_reward.viz.circuit import circuit_html

needs_chromium = pytest.mark.skipif(chromium_path() is None,
                                    reason="no chromium binary (apt-get install -y chromium)")
L, H, KV = 3, 4, 2


def _table(seed: int = 0) -> tuple[pd.DataFrame, dict[str, float]]:
    """Every edge of a 3-layer, 4-head, 2-KV-head graph with SAE nodes splitting m1 and the
    residual entering layer 2, random scores."""
    rng = np.random.default_rng(seed)
    order = ["input", *(n for la in range(L) for n in
                        ([f"r{la}.f3", f"r{la}.err"] if la == 2 else [])
                        + [*(f"a{la}.h{h}" for h in range(H)), f"m{la}"]
                        + ([f"m{la}.f0", f"m{la}.f7", f"m{la}.err"] if la == 1 else []))]
    rows = []
    for i, src in enumerate(order):
        for dst in [*order[i + 1:], "reward"]:
            if dst.startswith("a"):
                la, h = map(int, dst[1:].split(".h"))
                if src.startswith((f"a{la}.", f"m{la}.")):
                    continue  # a head reads the layers before its own
                rows.append((src, dst, "q"))
                if h < KV:
                    rows += [(src, dst, "k"), (src, dst, "v")]
            elif dst != "input":
                rows.append((src, dst, ""))
    df = pd.DataFrame(rows, columns=["src", "dst", "qkv"])
    df["score"] = rng.standard_normal(len(df)) * rng.exponential(1.0, len(df)) ** 2
    return df, {n: float(rng.standard_normal()) for n in order}


def _drawn(text: str) -> list[tuple[str, str, int, str]]:
    return [(m[2], m[3], int(m[1]), m[4]) for m in re.finditer(
        r'<path class="e" data-rank="(\d+)" data-src="([^"]+)" data-dst="([^"]+)"[^>]*'
        r"><title>([^<]*)</title>", text)]


def test_embeds_the_top_edges_and_nothing_external() -> None:
    df, eff = _table()
    text = circuit_html(df, eff, L, H, max_edges=50, shown=10, n_kv_heads=KV)
    assert not re.search(r"(?:src|href)\s*=\s*[\"']?(?:https?:)?//", text)
    assert "http" not in text
    drawn = _drawn(text)
    top = df.loc[df["score"].abs().sort_values(ascending=False, kind="stable").index[:50]]
    assert [(s, d) for s, d, _, _ in drawn] == list(zip(top["src"], top["dst"], strict=True))
    assert [r for _, _, r, _ in drawn] == list(range(50))
    for (_, _, _, title), q, s in zip(drawn, top["qkv"], top["score"], strict=True):
        assert title.endswith(f"{f' ({q})' if q else ''}: score {s:+.4g}")
    assert text.count("display:none") == 40  # shown before any script runs: the top 10
    for name in ("a1.h2", "m1.f7", "m1.err", "r2.f3", "m0"):  # direct effects on hover
        assert f"{name}: direct effect on the reward {eff[name]:+.4g}" in text
    m1_nodes = re.findall(r'data-name="(m1\.[^"]+)"', text)  # each linked to m1, r2's not
    assert len(m1_nodes) == text.count('<line class="split"') > 0
    assert 'data-name="r2.f3"' in text
    rows = re.findall(r'<text x="8" y="([\d.]+)" class="lab">([^<]+)</text>', text)
    assert [n for _, n in sorted(rows, key=lambda r: -float(r[0]))] == [
        "L0 heads", "L0 MLP", "L1 heads", "L1 MLP", "m1 SAE", "r2 SAE", "L2 heads", "L2 MLP"]


def test_notebook_and_page(tmp_path: Path) -> None:
    df, eff = _table()
    view = circuit_html(df, eff, L, H, title="My <circuit>", n_kv_heads=KV)
    assert view._repr_html_() == str(view) and "<h3>My &lt;circuit&gt;</h3>" in view
    page = view.save(tmp_path / "c.html").read_text()
    assert page.count("My &lt;circuit&gt;") == 2  # the page's <title> and <h1>, no <h3>
    assert "<h1>My &lt;circuit&gt;</h1>" in page and "<h3>" not in page


def test_bad_tables_are_named() -> None:
    df, eff = _table()
    with pytest.raises(TLRewardError, match="lacks columns"):
        circuit_html(df.drop(columns="qkv"), eff, L, H)
    with pytest.raises(TLRewardError, match="outside the model"):
        circuit_html(df, eff, L, 2)
    with pytest.raises(TLRewardError, match="key/value head >= n_kv_heads 1"):
        circuit_html(df, eff, L, H, n_kv_heads=1)
    with pytest.raises(TLRewardError, match="unknown node"):
        circuit_html(df.assign(src="logits"), eff, L, H)


#: set the slider, fire its input event, count the edges on screen; then hover the top edge
_PROBE = """var root = document.querySelector(".tlr-circuit"), s = root.querySelector("input");
  var out = [];
  [1, 7, 50, 23].forEach(function (k) {
    s.value = k; s.dispatchEvent(new Event("input"));
    var on = Array.from(root.querySelectorAll("path.e")).filter(function (e) {
      return getComputedStyle(e).display != "none"; });
    var idle = root.querySelectorAll("g.n.idle").length;
    out.push([k, on.length, idle, root.querySelector(".count").textContent].join("#"));
  });
  root.querySelector("path.e").dispatchEvent(new MouseEvent("mouseover"));
  out.push(root.querySelector(".info").textContent);
  return out;"""


@needs_chromium
def test_slider_and_hover_in_chromium(tmp_path: Path) -> None:
    df, eff = _table()
    view = circuit_html(df, eff, L, H, title="Random circuit", max_edges=50, shown=10,
                        n_kv_heads=KV)
    path = view.save(tmp_path / "circuit.html")
    shots = Path(os.environ.get("TL_REWARD_SCREENSHOTS", tmp_path))
    page = render_page(path, screenshot=shots / "circuit_view.png", height=900, script=_PROBE)
    assert not page_problems(page), page_problems(page)
    lines = page.probe
    drawn = _drawn(str(view))
    nodes = len(re.findall(r'<g class="n', str(view)))
    for line, k in zip(lines, (1, 7, 50, 23), strict=False):
        got_k, on, idle, count = line.split("#")
        used = {n for s, d, r, _ in drawn if r < k for n in (s, d)}
        assert (int(got_k), int(on), int(idle)) == (k, k, nodes - len(used))
        assert count.startswith(f"{k} of 50 edges shown")
    assert lines[-1] == drawn[0][3]  # the top edge's score, from hovering it


BL, BH, BKV = 30, 9, 3  # SmolLM2-135M's shape


def _deep_table() -> pd.DataFrame:
    """A 30-layer graph whose strong edges sit in layers 10-16 (every MLP -> MLP pair there
    up to 4 layers apart, k/v edges into grouped heads), and weak q edges climbing every
    layer from input to reward."""
    strong = [(f"m{a}", f"m{b}", "") for a in range(10, 16) for b in range(a + 1, min(a + 5, 17))]
    strong += [("m11", f"a{la}.h{kv}", qkv) for la in (12, 14) for kv in range(BKV)
               for qkv in "kv"]
    weak = [("input", "a0.h0", "q"), *((f"a{la}.h{la % BH}", f"a{la + 1}.h{(la + 4) % BH}", "q")
                                       for la in range(BL - 1)), (f"a{BL - 1}.h2", "reward", "")]
    scores = [2.0 - i / len(strong) for i in range(len(strong))] + [0.01] * len(weak)
    return pd.DataFrame([(*e, v) for e, v in zip(strong + weak, scores, strict=True)],
                        columns=["src", "dst", "qkv", "score"])


#: the drawing's geometry in window pixels: head nodes (circle box, text, its box), row
#: labels, the top edges (box, the area visible: window and scroll box), the drawing's
#: boxes, and 100 points along each MLP -> MLP edge
_GEOMETRY = """var root = document.querySelector(".tlr-circuit");
  function box(el) {
    var r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }
  function meet(a, b) { return [Math.max(a[0], b[0]), Math.max(a[1], b[1]), Math.min(a[2], b[2]),
                                Math.min(a[3], b[3])]; }
  var heads = Array.from(root.querySelectorAll("g.n")).filter(function (g) {
    return /^a\\d+\\.h\\d+$/.test(g.dataset.name); }).map(function (g) {
    var t = g.querySelector("text");
    return [g.dataset.name, box(g.querySelector("circle")), t && t.textContent, t && box(t)]; });
  var labels = Array.from(root.querySelectorAll("text")).map(function (t) {
    return [t.textContent, box(t)]; });
  var paths = Array.from(root.querySelectorAll("path.e"));
  var top = paths.slice(0, 3).map(function (e) {
    var s = e.closest(".scroll"), seen = [0, 0, innerWidth, innerHeight];
    return [box(e), s ? meet(seen, box(s)) : seen]; });
  var drawing = Array.from(root.querySelectorAll("svg")).filter(function (s) {
    return !s.parentElement.closest("svg") && !s.closest(".legend"); }).map(box);
  var mlp = paths.filter(function (e) {
    return /^m\\d+$/.test(e.dataset.src) && /^m\\d+$/.test(e.dataset.dst); }).map(function (e) {
    e.style.display = "";
    var m = e.getScreenCTM(), n = e.getTotalLength(), pts = [];
    for (var i = 0; i <= 100; i++) {
      var p = e.getPointAtLength(n * i / 100).matrixTransform(m); pts.push([p.x, p.y]); }
    return [e.dataset.src, e.dataset.dst, pts]; });
  return {heads: heads, labels: labels, top: top, drawing: drawing, mlp: mlp,
          window: [innerWidth, innerHeight]};"""


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict]:
    """The deep table's view measured in 1280 x 800 and 1920 x 1080 windows."""
    view = circuit_html(_deep_table(), {"a13.h4": 0.3, "m12": -0.2}, BL, BH, n_kv_heads=BKV)
    path = view.save(tmp_path_factory.mktemp("deep") / "deep.html")
    out = {}
    for w, h in ((1280, 800), (1920, 1080)):
        page = render_page(path, width=w, screen_height=h, script=_GEOMETRY)
        assert not page_problems(page), page_problems(page)
        out[w] = page.probe
    return out


def _centre(b: list[float]) -> tuple[float, float]:
    return (b[0] + b[2]) / 2, (b[1] + b[3]) / 2


@needs_chromium
def test_every_head_is_labelled_where_it_is(deep: dict[int, dict]) -> None:
    """Each head circle holds its index, and its row's label ("L{l} heads") is level with it."""
    geo = deep[1280]
    assert geo["heads"]
    rows = {t: _centre(b)[1] for t, b in geo["labels"] if t.endswith(" heads")}
    for name, circle, text, tbox in geo["heads"]:
        layer, head = name[1:].split(".h")
        assert text == head, (name, text)
        cx, cy = _centre(tbox)
        assert circle[0] <= cx <= circle[2] and circle[1] <= cy <= circle[3], name
        assert abs(rows[f"L{layer} heads"] - _centre(circle)[1]) < 4, name


@needs_chromium
def test_opens_on_the_top_edges(deep: dict[int, dict]) -> None:
    """After load the three top edges are (partly) on screen: inside the window and the box
    that scrolls the drawing."""
    for edge, seen in deep[1280]["top"]:
        assert max(edge[0], seen[0]) <= min(edge[2], seen[2]), (edge, seen)
        assert max(edge[1], seen[1]) <= min(edge[3], seen[3]), (edge, seen)


@needs_chromium
@pytest.mark.parametrize("width", [1280, 1920])
def test_fills_the_window_width(deep: dict[int, dict], width: int) -> None:
    geo = deep[width]
    boxes = geo["drawing"]
    assert geo["window"][0] == width
    assert max(b[2] for b in boxes) - min(b[0] for b in boxes) >= 0.9 * width


@needs_chromium
def test_mlp_to_mlp_edges_run_apart(deep: dict[int, dict]) -> None:
    """No two MLP -> MLP edges (different layer pairs) run within 2 px of each other for more
    than 10 px, away from a node they share (14 px around its end of the edge)."""
    arcs = {(s, d): np.array(p) for s, d, p in deep[1280]["mlp"]}
    assert len(arcs) == 18
    for (a, pa), (b, pb) in itertools.combinations(arcs.items(), 2):
        near = np.linalg.norm(pa[:, None] - pb[None], axis=2).min(1) < 2
        for end, point in ((a[0], pa[0]), (a[1], pa[-1])):
            if end in b:
                near &= np.linalg.norm(pa - point, axis=1) > 14
        run = np.linalg.norm(np.diff(pa, axis=0), axis=1)[near[1:] & near[:-1]].sum()
        assert run <= 10, (a, b, run)
