"""The circuit view: offline, every embedded edge drawn, and the slider and hover work in
headless Chromium (skipped without a ``chromium`` binary)."""

from __future__ import annotations

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
_PROBE = """<script>addEventListener("load", function () { setTimeout(function () {
  var root = document.querySelector(".tlr-circuit"), s = root.querySelector("input"), out = [];
  [1, 7, 50, 23].forEach(function (k) {
    s.value = k; s.dispatchEvent(new Event("input"));
    var on = Array.from(root.querySelectorAll("path.e")).filter(function (e) {
      return getComputedStyle(e).display != "none"; });
    var idle = root.querySelectorAll("g.n.idle").length;
    out.push([k, on.length, idle, root.querySelector(".count").textContent].join("#"));
  });
  root.querySelector("path.e").dispatchEvent(new MouseEvent("mouseover"));
  out.push(root.querySelector(".info").textContent);
  var pre = document.createElement("pre"); pre.id = "probe"; pre.textContent = out.join("\\n");
  document.body.appendChild(pre);
}, 0); });</script>"""


@needs_chromium
def test_slider_and_hover_in_chromium(tmp_path: Path) -> None:
    df, eff = _table()
    view = circuit_html(df, eff, L, H, title="Random circuit", max_edges=50, shown=10,
                        n_kv_heads=KV)
    path = view.save(tmp_path / "circuit.html")
    shots = Path(os.environ.get("TL_REWARD_SCREENSHOTS", tmp_path))
    page = render_page(path, screenshot=shots / "circuit_view.png", height=900)
    assert not page_problems(page), page_problems(page)
    probe = tmp_path / "probe.html"
    probe.write_text(path.read_text().replace("</body>", _PROBE + "</body>"))
    dom = render_page(probe).dom
    lines = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)[1].split("\n")
    drawn = _drawn(str(view))
    nodes = len(re.findall(r'<g class="n', str(view)))
    for line, k in zip(lines, (1, 7, 50, 23), strict=False):
        got_k, on, idle, count = line.split("#")
        used = {n for s, d, r, _ in drawn if r < k for n in (s, d)}
        assert (int(got_k), int(on), int(idle)) == (k, k, nodes - len(used))
        assert count.startswith(f"{k} of 50 edges shown")
    assert lines[-1] == drawn[0][3]  # the top edge's score, from hovering it
