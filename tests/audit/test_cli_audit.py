"""``tl-reward audit`` end to end on a tiny model: one offline HTML file, resumable runs."""

from __future__ import annotations

import json
from pathlib import Path

from tl_reward.cli import main
from tl_reward.testing import save_tiny_reward_model


def test_audit_command_writes_an_offline_report(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    path = save_tiny_reward_model(tmp_path / "rm", "llama")
    items = tmp_path / "items.jsonl"
    rows = [{"prompt": f"Question {i}: why is item {i} blue?",
             "reply": f"Because of light {i}. It scatters in air. Short words win."}
            for i in range(10)]
    items.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "audit.html"
    args = ["audit", "--model", str(path), "--device", "cpu", "--items", str(items),
            "--dimensions", "length,flattery,repetition", "--resamples", "200",
            "--no-published", "--output", str(out)]
    assert main(args) == 0
    text = out.read_text()
    import re

    assert not re.search(r"<script[^>]*src=[\"']https?:", text)  # nothing loaded from a CDN
    assert "plotly.js v" in text or "Plotly" in text  # plotly.js itself is inlined
    for section in ("Probes", "Distortion", "Cascade", "Evidence"):
        assert f"<h2>{section}" in text
    assert "length" in text and "flattery" in text
    runs = tmp_path / "audit.html.runs"
    chunks = sorted(runs.glob("*/chunk-*.parquet"))
    assert chunks  # the probe rows are on disk; a second run reuses them
    mtimes = [c.stat().st_mtime_ns for c in chunks]
    assert main(args) == 0
    assert [c.stat().st_mtime_ns for c in sorted(runs.glob("*/chunk-*.parquet"))] == mtimes
    assert main(["audit", "--model", str(path), "--device", "cpu"]) == 1
    assert "no base items" in capsys.readouterr().err


def test_audit_command_adds_conflict_and_concepts_for_two_objectives(tmp_path: Path) -> None:
    path = save_tiny_reward_model(tmp_path / "rm2", "llama", num_labels=2)
    items = tmp_path / "items.jsonl"
    items.write_text("\n".join(json.dumps(
        {"prompt": f"Why is item {i} blue?", "reply": f"Light {i} scatters. Air helps."})
        for i in range(8)))
    out = tmp_path / "audit.html"
    assert main(["audit", "--model", str(path), "--device", "cpu", "--items", str(items),
                 "--dimensions", "length,flattery", "--resamples", "100", "--no-published",
                 "--concepts", "--output", str(out)]) == 0
    text = out.read_text()
    assert "<h2>Reward-term conflict" in text and "whitened cosine" in text
    assert "<h2>Concept alignments of the probe dimensions" in text
