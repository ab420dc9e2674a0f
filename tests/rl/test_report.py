"""The run report: ``tl-reward run-report`` writes one offline page from a record's recorded
decompositions (no model loaded), with the gain split, the text drift and, with gold, the
Goodhart curve; it renders completely in a browser."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import needs_hooked_transformer
from rl_script import record_goodhart, record_scripted

from tl_reward.cli import main
from tl_reward.rl.record import RunRecord, RunRecordError
from tl_reward.rl.report import has_decomposition, run_report, write_run_report
from tl_reward.testing.browser import chromium_path, page_problems, render_page

pytestmark = needs_hooked_transformer


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, rm: Any) -> RunRecord:
    return record_goodhart(tmp_path_factory.mktemp("report"), rm)


def test_the_cli_writes_the_page_without_a_model(run: RunRecord, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.html"
    assert main(["run-report", str(run.folder), "--output", str(out), "--threads", "1",
                 "--min-gold-gain", "0.5"]) == 0
    printed = capsys.readouterr().out
    assert "loading" not in printed  # the recorded dra:* columns suffice
    assert "through L2.H0" in printed and "gold stops rising at step" in printed
    assert "gold's gain after the peak is shown below 0.5" in printed  # the script's gold falls
    page = out.read_text()
    for title in ("Reward and where its gain comes from", "What the policy's text changed",
                  "Proxy against gold", "L2.H0", "shown below 0.5"):
        assert title in page, title
    assert 1e6 < out.stat().st_size < 4e6  # plotly.js embedded once, compressed
    if chromium_path() is not None:
        assert page_problems(render_page(out)) == []


def test_a_record_without_decomposition_or_gold(tmp_path: Path, rm: Any,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    plain = record_scripted(tmp_path / "plain", rm, decompose=False, steps=3)
    assert not has_decomposition(plain)
    report = run_report(plain, model=rm)  # decomposed afresh; no gold: no curve
    assert report.gain is not None and report.curve is None and report.drift is not None
    assert "no gold scores" in report.parts()[-1]
    path = write_run_report(plain, tmp_path / "plain.html", model=rm, offline=False)
    assert path.stat().st_size < 2e5  # plotly from a CDN
    with pytest.raises(RunRecordError, match="holds no decomposition; pass model="):
        run_report(plain)
    assert main(["run-report", str(tmp_path / "plain"), "--model", str(tmp_path / "nowhere"),
                 "--output", str(tmp_path / "x.html")]) == 1
    assert "tl-reward: error:" in capsys.readouterr().err
