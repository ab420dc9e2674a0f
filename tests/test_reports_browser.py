"""Reports as a person sees them: every section and plot rendered by headless Chromium, offline.

The browser tests skip without a ``chromium`` binary (Debian: ``apt-get install -y chromium``).
``TL_REWARD_SCREENSHOTS=docs/images`` keeps the explain and audit screenshots there.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import circuitsvis as cv
import plotly.express as px
import pytest
from plotly.offline import get_plotlyjs

from tl_reward.cli import main
from tl_reward.testing import browser, save_tiny_reward_model
from tl_reward.testing.browser import chromium_path, outline, page_problems, render_page
from tl_reward.viz.html import save_html

needs_chromium = pytest.mark.skipif(chromium_path() is None,
                                    reason="no chromium binary (apt-get install -y chromium)")


def _views_page(path: Path) -> Path:
    return save_html(path, "<h2>First</h2>", cv.tokens.colored_tokens(["a", "b"], [1.0, -1.0]),
                     "<h2>After the first view</h2>", px.bar(x=["x", "y"], y=[1, 2]),
                     cv.tokens.colored_tokens(["c"], [0.5]), "<h3>After the second view</h3>")


def test_views_are_closed_and_share_one_bundle(tmp_path: Path) -> None:
    text = _views_page(tmp_path / "p.html").read_text()
    assert not re.search(r"<div[^>]*/>", text)  # a self-closing div swallows the rest
    assert len(re.findall(r'<div id="circuits-vis-[^"]+"[^>]*></div>', text)) == 2
    assert [n for n, _ in browser.embedded_libraries(text)] == ["Plotly", "CircuitsVis"]
    assert "https://unpkg.com" not in text
    cdn = save_html(tmp_path / "c.html", cv.tokens.colored_tokens(["a"], [1.0]), "<h2>x</h2>",
                    offline=False).read_text()
    assert not re.search(r"<div[^>]*/>", cdn) and "tlr.load" not in cdn


def test_token_labels_are_readable_text() -> None:
    from tl_reward.viz.tokens import token_label, token_labels

    assert token_labels(["Ġare", "Ċ", "<|im_end|>", "ĠmoreĠthan", "Ã©t"]) == [
        "\u00b7are", "\u21b5", "\u27e8im_end\u27e9", "\u00b7more\u00b7than", "\u00e9t"]
    assert token_label("\u2581are") == "\u00b7are" and token_label("<0x0A>") == "\u21b5"
    assert token_label("hello", special={"hello"}) == "\u27e8hello\u27e9"


def test_patching_position_labels_are_readable(tiny) -> None:  # noqa: ANN001
    from tl_reward.data import PreferencePair
    from tl_reward.data.pairs import tokenize_pair

    model = tiny("llama", 1)[0]
    tp = tokenize_pair(model, PreferencePair.from_prompt("Is the sky blue?", "Yes, it is.",
                                                         "No, it is not."))
    labels = tp.position_labels(model.tokenizer)
    tokens = model.tokenizer.convert_ids_to_tokens(tp.chosen_ids)
    assert len(labels) == len(tp.aligned)
    raw = {t for t in tokens if re.search("[\u0120\u010a\u2581]", t)}
    assert raw, "the tiny tokenizer should produce marked tokens"
    assert not any(t in lab for lab in labels for t in raw)  # no tokenizer symbols left
    assert not any("'" in lab for lab in labels)  # no Python repr quotes


@needs_chromium
def test_browser_check_finds_what_a_broken_page_hides(tmp_path: Path) -> None:
    """The check itself can fail: circuitsvis's own fragments, pasted as they are, lose the
    headings after the first view and fill the console with 'already registered'."""
    v1, v2 = cv.tokens.colored_tokens(["a"], [1.0]), cv.tokens.colored_tokens(["b"], [1.0])
    broken = tmp_path / "broken.html"
    broken.write_text(f"<html><body><h2>One</h2>{v1.local_src}<h2>Two</h2>{v2.local_src}"
                      "<h3>Three</h3></body></html>")
    problems = page_problems(render_page(broken))
    assert "heading missing: 'Two'" in problems and "heading missing: 'Three'" in problems
    assert any("already registered" in p for p in problems)
    page = render_page(_views_page(tmp_path / "ok.html"))
    assert page_problems(page) == []
    assert outline(page.dom).headings == ["First", "After the first view",
                                          "After the second view"]


@needs_chromium
def test_explain_report_renders_completely(tmp_path: Path) -> None:
    model = save_tiny_reward_model(tmp_path / "rm", "gpt2")
    out = tmp_path / "explain.html"
    assert main(["explain", "--model", str(model), "--device", "cpu",
                 "--prompt", "Is the sky blue?\nAnswer briefly.",
                 "--chosen", "Yes, the sky is blue on a clear day.",
                 "--rejected", "No, it is red.", "--patching", "--output", str(out)]) == 0
    shot = Path(os.environ.get("TL_REWARD_SCREENSHOTS", tmp_path)) / "explain_report.png"
    page = render_page(out, screenshot=shot, height=4900)
    assert page_problems(page) == []
    heads = outline(page.dom).headings
    assert "Rejected" in heads and any(h.startswith("Attention patterns") for h in heads)
    assert "Patching: direct path against whole-sublayer noising" in heads
    assert "\u0120" not in _rendered_text(page.dom)  # no 'Ġ' on the page
    # plotly.js (4.8 MB) and circuitsvis (1.3 MB) once each, compressed: 6.3 MB before
    libs = browser.embedded_libraries(page.source)
    assert [n for n, _ in libs] == ["Plotly", "CircuitsVis"] and out.stat().st_size < 3.5e6
    assert libs[0][1] == get_plotlyjs()
    # the head heatmap has a tick per layer, none between (it had 0.5, 1.5, ...)
    assert _ticks(page.dom, "Per-head contribution", "y") == ["0", "1", "2"]
    assert _ticks(page.dom, "Per-head contribution", "x") == ["0", "1", "2", "3"]
    # each token map says what its colours mean
    bars = re.findall(r'<div class="colorbar".*?</div>', page.dom, re.S)
    assert len(bars) == 2 and all("red lowers the reward, blue raises it" in b for b in bars)


def _ticks(dom: str, title: str, axis: str) -> list[str]:
    """The tick labels drawn on ``axis`` of the plot titled ``title...``."""
    plot = next(p for p in dom.split('class="plotly-graph-div')
                if re.search(f'class="gtitle"[^>]*>{re.escape(title)}', p))
    return re.findall(f'class="{axis}tick"[^>]*>.*?<text[^>]*>([^<]*)</text>', plot)


def _rendered_text(dom: str) -> str:
    return re.sub(r"<[^>]+>", " ", re.sub(r"<script\b.*?</script>", "", dom, flags=re.S))


@needs_chromium
def test_sae_page_renders_completely(tiny, tmp_path: Path) -> None:  # noqa: ANN001
    import torch
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

    from tl_reward.sae import as_sae_model
    from tl_reward.sae.features import feature_views
    from tl_reward.testing import CONVERSATIONS

    model = as_sae_model(tiny("llama", 1)[0])
    hook = "blocks.1.hook_resid_post"
    torch.manual_seed(3)
    cfg = TopKSAEConfig(d_in=model.cfg.d_model, d_sae=32, k=6,
                        rescale_acts_by_decoder_norm=True)
    cfg.metadata = SAEMetadata(hook_name=hook)
    sae = TopKSAE(cfg)
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.1)
    views = feature_views(model, sae, list(range(12)), list(CONVERSATIONS)[:4], n_examples=2,
                          context=2, ablate_items=1)
    for src in (views.dashboard()._repr_html_(), views.dashboard().cdn_src):
        assert not re.search(r"<div[^>]*/>", src)  # a notebook keeps the cells after it
    out = save_html(tmp_path / "sae.html", "<h2>Feature dashboard</h2>", views.dashboard(),
                    "<h2>Features and the reward</h2>", views.plot(),
                    "<h2>Summary</h2>", views.summary())
    page = render_page(out)
    assert page_problems(page) == []
    ticks = re.findall(r'class="xtick"[^>]*>.*?<text[^>]*>([^<]*)</text>', page.dom)
    assert {f"f{f}" for f in range(12)} <= set(ticks)  # every feature labelled
    assert json.dumps("\u0120")[1:-1] not in out.read_text()  # no 'Ġ' in the dashboard data


@needs_chromium
def test_audit_report_renders_completely(tmp_path: Path) -> None:
    model = save_tiny_reward_model(tmp_path / "rm", "llama")
    items = tmp_path / "items.jsonl"
    items.write_text("\n".join(json.dumps({"prompt": f"Question {i}: why is it blue?",
                                           "reply": f"Because of light {i}.\n- It scatters."})
                               for i in range(10)))
    out = tmp_path / "audit.html"
    assert main(["audit", "--model", str(model), "--device", "cpu", "--items", str(items),
                 "--dimensions", "length,flattery,repetition", "--permutations", "4995",
                 "--no-published", "--output", str(out)]) == 0
    shot = Path(os.environ.get("TL_REWARD_SCREENSHOTS", tmp_path)) / "audit_report.png"
    page = render_page(out, screenshot=shot, height=2600)
    # no 'Invalid color specifier' warnings; every column of the 200-row evidence table within
    # reach (its sideways scrollbar was 3000 px down the page)
    assert page_problems(page) == []
    probes = page.layout["tables"][0]  # every column in sight at 1280 px, no scrolling
    assert [c for c, _, right in probes["columns"] if right > probes["box"][1]] == []
    assert {"p_adjusted", "published_d", "effect_reason"} <= {c for c, *_ in probes["columns"]}
    assert {"Probes", "Distortion", "Cascade"} <= set(outline(page.dom).headings)
    text = _rendered_text(page.dom)
    assert "light 0." in text and "\\n-" not in text  # the reply's newline is not a literal \n
    assert page.dom.count('class="table-wrap"') == out.read_text().count("<table")


@needs_chromium
def test_compare_report_renders_completely(tmp_path: Path) -> None:
    a = save_tiny_reward_model(tmp_path / "rm_a", "llama", seed=0)
    b = save_tiny_reward_model(tmp_path / "rm_b", "llama", seed=1)
    words = ["Is the sky blue?", "Yes, on a clear day.", "No.", "I cannot help.", "Be kind.",
             "Sure!\nFirst, this.", "Thanks for asking.", "Hate. War."]
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("\n".join(json.dumps({"prompt": words[i % 8], "chosen": words[(i + 3) % 8],
                                           "rejected": words[(i + 5) % 8]}) for i in range(12)))
    out = tmp_path / "compare.html"
    assert main(["compare", "--model", str(a), "--model", str(b), "--input", str(jsonl),
                 "--device", "cpu", "--layers", "--permutations", "9",
                 "--output", str(out)]) == 0
    page = render_page(out)
    assert page_problems(page) == []
    assert len(outline(page.dom).headings) >= 2
    assert out.stat().st_size < 2.5e6  # 4.8 MB with plotly.js uncompressed


def test_compare_legend_sits_beside_the_plot_it_names() -> None:
    """Plotly draws the legend right of the figure: the traces it lists (the model pairs' bars)
    belong in the rightmost subplot, not the scatter of rewards."""
    import numpy as np
    import pandas as pd

    from tl_reward.viz.compare import plot_behaviour

    table = pd.DataFrame({"model_a": ["a", "a"], "model_b": ["b", "a"],
                          "measure": ["kendall_tau_b", "readability_r2"], "value": [0.2, 0.9],
                          "ci_low": [0.0, np.nan], "ci_high": [0.4, np.nan]})
    fig = plot_behaviour(table, {"a": np.arange(4.0), "b": np.arange(4.0) ** 2})
    right = max(("x", "x2"), key=lambda ax: fig.layout[ax.replace("x", "xaxis")].domain[1])
    listed = [t for t in fig.data if t.showlegend is not False]
    assert [t.name for t in listed] == ["a / b", "a / a"]
    assert {t.xaxis for t in listed} == {right}
