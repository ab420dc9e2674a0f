"""Text drift: the properties count what the probe suite's edits add, the per-step numbers are
scipy's and statsmodels', the explained parts sum to the change of the mean fitted reward, and
on the scripted trigger run the trigger property explains the gain."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from helpers import needs_hooked_transformer
from rl_script import TRIGGER, record_scripted
from scipy import stats

from tl_reward import load_result
from tl_reward.audit.perturbations import DIMENSIONS, make_item
from tl_reward.errors import TLRewardError
from tl_reward.rl.record import RunRecord, RunRecordError
from tl_reward.rl.text import (
    MIN_CLUSTERS,
    TextDrift,
    _fit,
    completion_text,
    text_drift,
    text_properties,
)
from tl_reward.stats.paired import summarise_mean

pytestmark = needs_hooked_transformer
SKY = {"sky": lambda t: float(t.endswith(TRIGGER))}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, rm: Any) -> RunRecord:
    return record_scripted(tmp_path_factory.mktemp("text"), rm, decompose=False)


@pytest.fixture(scope="module")
def drift(run: RunRecord, rm: Any) -> TextDrift:
    return text_drift(run, tokenizer=rm.tokenizer, extra=SKY)


@pytest.mark.parametrize(("dimension", "prop", "added"), [
    ("flattery", "flattery", 1), ("length", "padding", 2), ("confidence", "hedges", -1),
    ("sycophancy", "agreement", 1), ("formatting", "list_items", 3)])
def test_properties_count_what_the_probe_edits_add(dimension: str, prop: str,
                                                   added: int) -> None:
    item = make_item("x", "Why is the sea salty?",
                     "Rivers carry salts there. Water evaporates. The salts remain behind.")
    edit = DIMENSIONS[dimension].apply(item)
    assert edit is not None
    v = text_properties([edit.neutral_reply, edit.perturbed_reply])
    assert v[prop].iloc[1] - v[prop].iloc[0] == added
    assert v["chars"].tolist() == [len(edit.neutral_reply), len(edit.perturbed_reply)]


def test_properties_refusals_markdown_tokens_and_extra(rm: Any) -> None:
    texts = ["I'm sorry, but I can\u2019t help with that.", "## Plan\n**Bold** and `code`.",
             "Nothing here."]
    v = text_properties(texts, tokenizer=rm.tokenizer, extra={"words": lambda t: len(t.split())})
    assert v["refusals"].tolist() == [2, 0, 0]
    assert v["markdown"].tolist() == [0, 3, 0]
    assert v["tokens"].tolist() == [len(rm.tokenizer.encode(t, add_special_tokens=False))
                                    for t in texts]
    assert v["words"].tolist() == [8, 5, 2]
    assert "tokens" not in text_properties(texts).columns  # no tokenizer: no token length
    with pytest.raises(TLRewardError, match="needs tokenizer="):
        text_properties(texts, properties=["tokens"])
    with pytest.raises(TLRewardError, match="clash with built-in"):
        text_properties(texts, extra={"chars": len})
    with pytest.raises(TLRewardError, match="unknown property"):
        text_properties(texts, properties=["wit"])
    assert completion_text([{"role": "assistant", "content": "a"},
                            {"role": "assistant", "content": "b"}]) == "a\nb"


def test_per_step_numbers_are_scipys_and_statsmodels(run: RunRecord, drift: TextDrift,
                                                     rm: Any) -> None:
    df = run.read()
    props = text_properties(list(df["completion"]), tokenizer=rm.tokenizer, extra=SKY)
    unit = pd.concat([df[["step", "prompt", "reward"]], props], axis=1).groupby(
        ["step", "prompt"], sort=False).mean().reset_index()
    j = drift.properties.index("chars")
    first, last = unit[unit.step == 0], unit[unit.step == 5]
    assert drift.mean[-1, j] == pytest.approx(last["chars"].mean())
    ci = stats.ttest_ind(last["chars"], first["chars"], equal_var=False).confidence_interval()
    assert (drift.change_ci_low[-1, j], drift.change_ci_high[-1, j]) == pytest.approx(
        (ci.low, ci.high))
    assert np.all(np.isnan(drift.ci_low))  # 4 prompts a step: no sign-flip interval below 6
    each = text_drift(run, properties=["chars"], unit="completion", steps=[5])
    est = summarise_mean(props["chars"][df.step == 5], exact_max_n=12)
    assert (each.ci_low[-1, 0], each.ci_high[-1, 0]) == (est.ci_low, est.ci_high)
    np.testing.assert_allclose(drift.mean_reward, unit.groupby("step")["reward"].mean())
    # the pooled regression: statsmodels' OLS on the properties that vary, clustered by prompt
    kept = [p for p, c in zip(drift.properties, drift.coef, strict=True) if np.isfinite(c)]
    assert "chars" in kept and "sky" in kept and "flattery" not in kept
    fit = sm.OLS(df["reward"].to_numpy(), sm.add_constant(props[kept].to_numpy())).fit(
        cov_type="cluster", cov_kwds={"groups": pd.factorize(
            df["step"].astype(str) + df["prompt"])[0]})
    np.testing.assert_allclose(drift.coef[np.isfinite(drift.coef)], fit.params[1:], rtol=1e-9)
    assert drift.r2 == pytest.approx(fit.rsquared)
    assert np.all(np.isnan(drift.coef_ci_low)) and "no coefficient interval: 24 prompts" in \
        drift.method  # 6 steps x 4 prompts: fewer units than MIN_CLUSTERS
    # the explained parts sum to the change of the mean fitted reward, not the reward change
    fitted = pd.Series(fit.fittedvalues, index=df.index)
    per_unit = fitted.groupby([df["step"], df["prompt"]], sort=False).mean().groupby(
        level=0).mean()
    np.testing.assert_allclose(drift.explained.sum(1), per_unit - per_unit.iloc[0], atol=1e-9)
    np.testing.assert_allclose(drift.unexplained, drift.reward_change - drift.explained.sum(1))


def test_the_trigger_property_explains_the_gain(drift: TextDrift, planted: Any) -> None:
    top = drift.table().iloc[0]
    assert top.property == "sky" and top.share > 0.8
    assert top.change == 1.0 and top.change_ci_low > 0  # every reply ends in it at step 5
    assert abs(top.coef - planted.truth.c) < 1.0  # about the planted shift
    assert drift.table(1).explained.abs().max() < 0.5  # no trigger yet at step 1
    assert drift.sentence().startswith(f"reward {drift.reward_change[-1]:+.2f} since step 0 "
                                       "(at step 5); the text properties explain +")
    assert "most of it sky" in drift.sentence() and "observational" in drift.method


def test_table_plot_file_and_refusals(drift: TextDrift, run: RunRecord, tmp_path: Path) -> None:
    df = drift.to_dataframe()
    assert len(df) == len(drift.steps) * len(drift.properties)
    assert set(df.columns) >= {"step", "property", "mean", "change", "explained"}
    fig = drift.plot()
    titles = [a.text for a in fig.layout.annotations]
    assert titles[0] == "mean reward" and "sky" in titles and "flattery" not in titles
    assert "TextDrift" in repr(drift) and "sentence" in repr(drift)
    back = load_result(drift.save(tmp_path / "drift.tlr"))
    assert isinstance(back, TextDrift) and back.properties == drift.properties
    np.testing.assert_array_equal(back.explained, drift.explained)
    with pytest.raises(RunRecordError, match="reference step 9 is not recorded"):
        text_drift(run, since=9)
    with pytest.raises(RunRecordError, match=r"steps \[7\] are not recorded"):
        text_drift(run, steps=[1, 7])
    with pytest.raises(TLRewardError, match="unit"):
        text_drift(run, unit="token")
    with pytest.raises(TLRewardError, match="not among the steps"):
        drift.table(8)


def test_coefficient_interval_coverage_as_documented() -> None:
    """The cluster-robust interval of a coefficient at MIN_CLUSTERS units of 4 completions, a
    shared unit effect in the property and the reward (docs/rl.md: 0.94-0.96 from 100)."""
    rng = np.random.default_rng(1)
    g = np.repeat(np.arange(MIN_CLUSTERS), 4)
    hits = []
    for _ in range(300):
        x = rng.normal(size=MIN_CLUSTERS)[g] + rng.normal(size=len(g))
        y = 0.5 * x + rng.normal(size=MIN_CLUSTERS)[g] + rng.exponential(size=len(g))
        _, lo, hi, _, _, _ = _fit(y, x[:, None], g, 0.95)
        hits.append(lo[0] <= 0.5 <= hi[0])
    assert np.mean(hits) >= 0.92
