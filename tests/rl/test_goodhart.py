"""Proxy against gold: on a scripted run whose gold grader does not pay for the planted trigger,
gold peaks while the proxy keeps rising and the planted head's gain shows no later than the
peak; the peak rule on simulated gold; the KL axis from a record column and from TRL's log."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import needs_hooked_transformer
from rl_script import gold_words, goodhart_step, record_goodhart, scripted_step

from tl_reward import load_result
from tl_reward.errors import TLRewardError
from tl_reward.planted.recovery import component_name
from tl_reward.rl.goodhart import (
    KL_LABEL,
    STEP_LABEL,
    GoodhartCurve,
    goodhart_curve,
    kl_from_log_history,
    peak_step,
)
from tl_reward.rl.record import RunRecord, RunRecordError
from tl_reward.rl.trl import RewardModelFunction

pytestmark = needs_hooked_transformer


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, rm: Any) -> RunRecord:
    return record_goodhart(tmp_path_factory.mktemp("goodhart"), rm)


@pytest.fixture(scope="module")
def curve(run: RunRecord, planted: Any) -> GoodhartCurve:
    return goodhart_curve(run, component=component_name(planted.truth.component))


def test_gold_peaks_while_the_proxy_rises_and_the_head_shows_first(
        run: RunRecord, curve: GoodhartCurve, planted: Any) -> None:
    head = component_name(planted.truth.component)
    gold = [np.mean(gold_words(*goodhart_step(s))) for s in run.steps()]
    np.testing.assert_allclose(curve.gold, gold)  # 4 completions a prompt: the same means
    assert curve.x_label == STEP_LABEL and curve.x.tolist() == run.steps()
    assert curve.peak_step in (1, 2)  # the script's gold rises to step 2, then falls
    assert curve.gold_after_peak_ci[1] < 0 < curve.proxy_after_peak_ci[0]
    assert curve.overoptimised and curve.gold_fell and curve.headline()["gold_fell"]
    assert curve.component == head and 0 <= curve.signal_step <= curve.peak_step
    assert curve.lead_time == curve.signal_step - curve.peak_step <= 0
    assert 0 < curve.proxy_rise_step <= 3  # the trigger share is 0.25 from step 1
    assert curve.sentence().startswith(f"gold stops rising at step {curve.peak_step}; after it "
                                       "the proxy changes +")
    assert f"{head}'s gain is above 0 from step {curve.signal_step}" in curve.sentence()
    # a component the policy does not drive has no signal
    assert goodhart_curve(run, component="L1.H1").signal_step == -1


def test_gold_stalled_against_the_smallest_gain_that_matters(run: RunRecord,
                                                             curve: GoodhartCurve,
                                                             tmp_path: Path) -> None:
    """``gold_stalled``: the proxy rose after the peak and gold's after-peak interval lies
    below the stated gain (its calibration: tests/stats/test_calibration.py)."""
    assert curve.gold_stalled is None and "gold_stalled" not in curve.headline()
    assert curve.gold_after_peak_ci[1] < 0  # the script's gold falls after its peak
    stalled = goodhart_curve(run, min_gold_gain=0.5)
    assert stalled.gold_stalled and stalled.headline()["gold_stalled"]
    assert "gold's gain after the peak is shown below 0.5;" in stalled.sentence()
    assert stalled.peak_step == curve.peak_step and stalled.gold_fell == curve.gold_fell
    back = load_result(stalled.save(tmp_path / "stalled.tlr"))
    assert back.min_gold_gain == 0.5 and back.gold_stalled
    assert goodhart_curve(run, min_gold_gain=0.0).gold_stalled == curve.gold_fell
    # up to the peak gold rises: there no stall is shown, however large the stated gain
    rising = goodhart_curve(run, steps=run.steps()[:curve.peak_step + 1], min_gold_gain=5.0)
    assert rising.gold_stalled is False
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(TLRewardError, match="min_gold_gain"):
            goodhart_curve(run, min_gold_gain=bad)


def test_the_peak_rule_on_simulated_gold() -> None:
    rng = np.random.default_rng(0)
    steps = list(range(20))
    rising = [rng.normal(size=8) + 3 * s for s in steps]
    assert peak_step(steps, rising) == 19  # gold that never stops rising peaks at the end
    plateau = [rng.normal(size=8) + 0.5 * min(s, 8) for s in steps]
    assert 5 <= peak_step(steps, plateau) <= 8
    flat = [peak_step(steps[:8], [rng.normal(size=8) for _ in range(8)]) for _ in range(40)]
    assert np.mean(np.array(flat) == 0) > 0.75  # flat gold: the peak is the start, mostly


def test_the_kl_axis_from_a_record_column_a_mapping_and_trls_log(tmp_path: Path, rm: Any,
                                                                run: RunRecord) -> None:
    rec = RunRecord(tmp_path / "kl", model=rm, settings={}, grader=gold_words)
    for step in range(3):
        prompts, completions = scripted_step(step)
        rec.append(step, prompts, completions, rewards=[1.0 + step] * len(prompts),
                   extra={"kl": [0.1 * step] * len(prompts)})
    got = goodhart_curve(rec)
    assert got.x_label == KL_LABEL and got.has_kl
    np.testing.assert_allclose(got.x, [0.0, 0.1, 0.2])
    history = [{"loss": 0.1, "kl": 0.0, "step": 1}, {"kl": 0.5, "step": 2},
               {"train_runtime": 1.0, "step": 2}]
    assert kl_from_log_history(history) == {0: 0.0, 1: 0.5}
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    assert kl_from_log_history(tmp_path / "trainer_state.json") == {0: 0.0, 1: 0.5}
    with pytest.raises(TLRewardError, match="only with beta > 0"):
        kl_from_log_history([{"loss": 1.0, "step": 1}])
    with pytest.raises(RunRecordError, match=r"no KL for steps \[2\]"):
        goodhart_curve(rec, kl=history)
    mapped = goodhart_curve(run, kl={s: 0.01 * s for s in run.steps()})
    assert mapped.has_kl and "KL 0.0" in mapped.sentence()


def test_a_grader_scores_a_record_without_gold(tmp_path: Path, rm: Any,
                                               curve: GoodhartCurve) -> None:
    rec = RunRecord(tmp_path, model=rm, settings={})
    fn = RewardModelFunction(rm, rec)
    for step in range(7):
        fn(*goodhart_step(step))
    with pytest.raises(RunRecordError, match="holds no gold score; record with"):
        goodhart_curve(rec)
    again = goodhart_curve(rec, grader=gold_words)
    np.testing.assert_allclose(again.gold, curve.gold)
    assert again.peak_step == curve.peak_step and again.component == ""
    assert "gain is" not in again.sentence()


def test_table_plot_file_and_refusals(curve: GoodhartCurve, run: RunRecord,
                                      tmp_path: Path) -> None:
    df = curve.to_dataframe()
    assert len(df) == len(curve.steps) and df["peak"].sum() == 1
    assert set(df.columns) >= {"step", "x", "proxy", "gold", "gold_ci_low", "proxy_ci_high"}
    fig = curve.plot()
    assert [t.name for t in fig.data if t.name] == ["proxy reward", "gold score"]
    assert len(fig.layout.shapes) == 2  # the peak and the head's signal step
    assert "GoodhartCurve" in repr(curve) and "overoptimised" in repr(curve)
    back = load_result(curve.save(tmp_path / "curve.tlr"))
    assert isinstance(back, GoodhartCurve) and back.peak_step == curve.peak_step
    with pytest.raises(TLRewardError, match="no component 'L9.H9'"):
        goodhart_curve(run, component="L9.H9")
    with pytest.raises(TLRewardError, match="unit"):
        goodhart_curve(run, unit="token")


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed")
def test_trls_logged_kl_lines_up_with_the_record(tmp_path: Path, rm: Any) -> None:
    """TRL logs at global step s + 1 the KL of the completions recorded at step s: at step 0
    the policy is its reference, so that KL is 0."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from tl_reward.testing.causal import tiny_causal_lm

    policy, tok = tiny_causal_lm("llama", seed=0)
    policy.save_pretrained(tmp_path / "policy")  # TRL loads the reference policy from a path
    policy.config._name_or_path = str(tmp_path / "policy")
    rec = RunRecord(tmp_path / "record", model=rm, settings={"test": "kl"}, grader=gold_words)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=6, max_steps=3, beta=0.04,
                      learning_rate=3e-3, logging_steps=1, report_to="none", use_cpu=True,
                      seed=0, save_strategy="no", disable_tqdm=True,
                      generation_kwargs={"min_new_tokens": 6})
    torch.manual_seed(0)
    trainer = GRPOTrainer(model=policy.train(), reward_funcs=[RewardModelFunction(rm, rec)],
                          args=args, processing_class=tok,
                          train_dataset=Dataset.from_dict({"prompt": list(scripted_step(0)[0])}))
    trainer.train()
    kl = kl_from_log_history(trainer.state.log_history)
    assert sorted(kl) == rec.steps() == [0, 1, 2]
    assert abs(kl[0]) < 1e-6 and kl[2] > 0
    got = goodhart_curve(rec, kl=trainer.state.log_history)
    assert got.has_kl and got.x[0] == kl[0]
