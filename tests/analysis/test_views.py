"""Views and the explain command: figures hold the analysis numbers, HTML is standalone."""

from __future__ import annotations

import json
import re

import pytest
import torch

from tl_reward.analysis.attribution import direct_reward_attribution
from tl_reward.analysis.patching import activation_patching
from tl_reward.cli import main
from tl_reward.data import PreferencePair
from tl_reward.testing import save_tiny_reward_model
from tl_reward.testing.browser import embedded_libraries
from tl_reward.viz.html import save_html
from tl_reward.viz.tokens import attribution_token_map, head_attention_view, top_heads

PAIR = PreferencePair.from_prompt("Is the sky blue?", "Yes, the sky is blue.", "No, it is red.")


def test_views_and_standalone_html(tiny, tmp_path) -> None:
    model, _, _ = tiny("llama", 1)
    dra = direct_reward_attribution(model, [("Is the sky blue?", "Yes.")], per_position=True)
    fig = dra.plot(index=0)
    torch.testing.assert_close(torch.tensor(fig.data[0].z), dra.heads[0, ..., 0])
    view = attribution_token_map(dra)
    vals = dra.head_positions[0][..., 0].sum((0, 1))
    spans = re.findall(r'<span title="[^"]*: ([^"]+)" style="[^"]*background:rgb\((\d+),\d+,'
                       r'(\d+)\)', str(view))
    assert len(spans) == len(dra.tokens[0]) == len(vals)
    torch.testing.assert_close(torch.tensor([float(v) for v, _, _ in spans]), vals, rtol=1e-3,
                               atol=1e-7)  # the title prints 4 significant digits
    assert all((int(b) > int(r)) == (v > 0) for v, (_, r, b) in zip(vals, spans, strict=True)
               if v != 0)  # blue raises the reward, red lowers it
    lim = float(vals.abs().max())
    assert f"{-lim:+.3g}</span>" in str(view) and f"{lim:+.3g}</span>" in str(view)
    heads = top_heads(dra, k=2)
    flat = dra.heads[0, ..., 0].abs()
    assert flat[heads[0]] == flat.max()
    attn = head_attention_view(model, model.encode(("Is the sky blue?", "Yes.")).ids, heads)
    res = activation_patching(model, PAIR, "resid", "denoising")
    pfig = res.plot()
    torch.testing.assert_close(torch.tensor(pfig.data[0].z, dtype=torch.float32), res.effect)
    path = save_html(tmp_path / "r.html", "<h2>x</h2>", fig, view, attn, pfig,
                     res.to_dataframe().head(), title="t")
    text = path.read_text()
    assert [n for n, _ in embedded_libraries(text)] == ["Plotly", "CircuitsVis"]
    assert "https://unpkg.com" not in text and text.count("<div id=\"circuits-vis") == 1
    assert text.count('class="token-map"') == 1


def test_explain_command(tmp_path, capsys) -> None:
    path = save_tiny_reward_model(tmp_path / "rm", "gpt2")
    out = tmp_path / "explain.html"
    rc = main(["explain", "--model", str(path), "--device", "cpu", "--prompt", "Is the sky blue?",
               "--chosen", "Yes, the sky is blue.", "--rejected", "No, it is red.",
               "--output", str(out), "--patching", "--cdn"])
    assert rc == 0 and out.exists()
    text = out.read_text()
    for needle in ("Differential reward lens", "Top components", "Token reward maps",
                   "Attention patterns", "direct path against whole-sublayer noising"):
        assert needle in text
    assert "wrote" in capsys.readouterr().out
    hh = tmp_path / "pairs.jsonl"
    hh.write_text(json.dumps({"chosen": "\n\nHuman: hi\n\nAssistant: Hello!",
                              "rejected": "\n\nHuman: hi\n\nAssistant: Go away."}) + "\n")
    assert main(["explain", "--model", str(path), "--device", "cpu", "--input", str(hh),
                 "--output", str(out), "--cdn"]) == 0
    assert main(["explain", "--model", str(path), "--input", str(hh), "--line", "3"]) == 1
    assert "out of range" in capsys.readouterr().err


@pytest.mark.parametrize("missing", [["--chosen", "a"], []])
def test_explain_needs_a_pair(tmp_path, capsys, missing: list[str]) -> None:
    assert main(["explain", "--model", str(tmp_path), "--prompt", "p", *missing]) == 1
    assert "--prompt, --chosen and --rejected" in capsys.readouterr().err
