"""``tl-reward audit`` end to end on a tiny model: one offline HTML file, resumable runs."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tl_reward.cli import main
from tl_reward.testing import save_tiny_reward_model
from tl_reward.testing.browser import embedded_libraries


def hf_scorer(path: Path):  # noqa: ANN201
    """Score ``(user turn, reply)`` with HF's own model and chat template, one at a time."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)

    def score(user: str, reply: str) -> float:
        conv = [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        ids = tok.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"]
        with torch.no_grad():
            return float(model(input_ids=torch.tensor([ids])).logits[0, 0])

    return score, tok


def probes_table(html: str) -> dict[str, dict[str, str]]:
    """The report's Probes table: ``{dimension: {column: text}}``."""
    part = html[html.index("<h2>Probes"):]
    part = part[:part.index("</table>")]
    cols = [c.replace("<wbr>", "") for c in re.findall(r"<th>(.*?)</th>", part)]
    rows = [re.findall(r"<td>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", part, re.S)]
    return {r[0]: dict(zip(cols, r, strict=True)) for r in rows if r}


def test_audit_command_writes_an_offline_report(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    path = save_tiny_reward_model(tmp_path / "rm", "llama")
    items = tmp_path / "items.jsonl"
    rows = [{"prompt": f"Question {i}: why is item {i} blue?",
             "reply": f"Because of light {i}. It scatters in air. Short words win."}
            for i in range(10)]
    items.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "audit.html"
    args = ["audit", "--model", str(path), "--device", "cpu", "--items", str(items),
            "--dimensions", "length,flattery,repetition", "--permutations", "4995",
            "--no-published", "--output", str(out)]
    assert main(args) == 0
    text = out.read_text()
    assert not re.search(r"<script[^>]*src=[\"']https?:", text)  # nothing loaded from a CDN
    assert [n for n, _ in embedded_libraries(text)] == ["Plotly"]  # plotly.js inlined, once
    for section in ("Probes", "Distortion", "Cascade", "Evidence"):
        assert f"<h2>{section}" in text
    runs = tmp_path / "audit.html.runs"
    chunks = sorted(runs.glob("*/chunk-*.parquet"))
    assert chunks  # the probe rows are on disk; a second run reuses them
    # every probe row's scores against HF's own forward of the saved model
    df = pd.concat([pd.read_parquet(c) for c in chunks])
    df = df[df["dimension"] != "__natural__"]
    assert sorted(Counter(df["dimension"]).items()) == [("flattery", 10), ("length", 10),
                                                        ("repetition", 10)]
    hf, tok = hf_scorer(path)
    neutral = np.array([hf(u, r) for u, r in zip(df["neutral_user"], df["neutral_reply"],
                                                   strict=True)])
    perturbed = np.array([hf(u, r) for u, r in zip(df["perturbed_user"], df["perturbed_reply"],
                                                     strict=True)])
    # float32 forward of a tiny model, batched vs one at a time: ~1e-6
    np.testing.assert_allclose(df["neutral:score"], neutral, atol=1e-5)
    np.testing.assert_allclose(df["delta:score"], perturbed - neutral, atol=1e-5)
    # the report's Probes table: mean, effect size and the exact two-sided sign-flip p (all 2^10
    # sign patterns) of HF's deltas per dimension, to the 4 significant digits it prints
    table = probes_table(text)
    assert list(table) == ["length", "flattery", "repetition"]
    signs = np.array(list(itertools.product([-1, 1], repeat=10)))
    for dim, row in table.items():
        d = (perturbed - neutral)[(df["dimension"] == dim).to_numpy()]
        p = float(np.mean(np.abs(signs @ np.abs(d)) >= abs(d.sum()) - 1e-12))
        assert int(row["n"]) == 10
        for key, want in (("mean", d.mean()), ("effect_size", d.mean() / d.std(ddof=1)),
                          ("p_value", p)):
            assert float(row[key]) == pytest.approx(want, rel=2e-3, abs=1e-6), (dim, key)
    mtimes = [c.stat().st_mtime_ns for c in chunks]
    assert main(args) == 0
    assert [c.stat().st_mtime_ns for c in sorted(runs.glob("*/chunk-*.parquet"))] == mtimes
    assert main(["audit", "--model", str(path), "--device", "cpu"]) == 1
    assert "no base item(s): an audit needs at least 3" in capsys.readouterr().err


def test_audit_command_adds_conflict_and_concepts_for_two_objectives(tmp_path: Path) -> None:
    path = save_tiny_reward_model(tmp_path / "rm2", "llama", num_labels=2)
    items = tmp_path / "items.jsonl"
    items.write_text("\n".join(json.dumps(
        {"prompt": f"Why is item {i} blue?", "reply": f"Light {i} scatters. Air helps."})
        for i in range(8)))
    out = tmp_path / "audit.html"
    assert main(["audit", "--model", str(path), "--device", "cpu", "--items", str(items),
                 "--dimensions", "length,flattery", "--permutations", "4995", "--no-published",
                 "--concepts", "--output", str(out)]) == 0
    text = out.read_text()
    assert "<h2>Reward-term conflict" in text and "whitened cosine" in text
    assert "<h2>Concept alignments of the probe dimensions" in text
