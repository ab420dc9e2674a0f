"""The reward gain split over components: exact (the parts sum to the mean reward change), the
same from recorded or recomputed decompositions, and naming the planted trigger head on a run
whose policy learns the trigger (a scripted one here; a GRPO run in experiments/rl_planted.py),
but not on the same run scored by the unplanted model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import needs_hooked_transformer
from rl_script import TRIGGER_SHARE, record_scripted
from scipy import stats

from tl_reward import load_result
from tl_reward.errors import TLRewardError
from tl_reward.planted.recovery import component_name
from tl_reward.rl.gain import ALL, RewardGain, reward_gain
from tl_reward.rl.record import RunRecord, RunRecordError

pytestmark = needs_hooked_transformer


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, rm: Any) -> RunRecord:
    return record_scripted(tmp_path_factory.mktemp("planted"), rm)


def _mean_rewards(rec: RunRecord) -> np.ndarray:
    return np.array([rec.read(s)["reward"].mean() for s in rec.steps()])


@pytest.mark.parametrize("unit", ["prompt", "completion"])
def test_the_parts_sum_to_the_mean_reward_change(run: RunRecord, unit: str) -> None:
    gain = reward_gain(run, unit=unit)
    means = _mean_rewards(run)  # equal completions per prompt: both units give these means
    np.testing.assert_allclose(gain.reward_change, means[1:] - means[0], rtol=0, atol=1e-9)
    np.testing.assert_allclose(gain.change.sum(1), gain.reward_change, rtol=0, atol=1e-5)
    assert float(np.abs(gain.residual).max()) < 1e-5
    assert gain.components[-1] == "head_bias" and np.all(gain.change[:, -1] == 0)
    prev = reward_gain(run, since="previous")
    assert prev.since == [0, 1, 2, 3, 4] and prev.steps == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(prev.reward_change, np.diff(means), rtol=0, atol=1e-9)
    np.testing.assert_allclose(prev.change.sum(1), np.diff(means), rtol=0, atol=1e-5)


def test_the_decomposition_names_the_planted_head(run: RunRecord, planted: Any) -> None:
    head = component_name(planted.truth.component)
    gain = reward_gain(run)
    rises = gain.alarm().step  # the first step the reward is above 0, family-wise at 5 %
    assert rises > 0 and TRIGGER_SHARE[rises] > 0
    for step, share in zip(gain.steps, TRIGGER_SHARE[1:], strict=True):
        top = gain.top(1, step).iloc[0]
        if share > 0:  # the policy emits the trigger: its head carries the gain, about c x share
            assert top.component == head, gain.top(3, step)
            assert top.change == pytest.approx(planted.truth.c * share, rel=0.15)
        else:
            assert abs(gain.change[gain.steps.index(step), gain.components.index(head)]) < 1e-3
    at_rise = gain.top(1, rises).iloc[0]
    assert at_rise.component == head and at_rise.ci_low > 0
    scan = gain.alarm(component=ALL)  # every component at every step, one family
    assert scan.component == head and scan.step >= rises  # a larger family: no earlier
    assert gain.sentence().startswith(f"reward +{gain.reward_change[-1]:.2f} since step 0, "
                                      "of which +") and f"through {head} (at step 5)" in \
        gain.sentence()


def test_the_unplanted_model_does_not_single_out_the_head(tmp_path: Path, base_rm: Any,
                                                          planted: Any) -> None:
    head = component_name(planted.truth.component)
    gain = reward_gain(record_scripted(tmp_path, base_rm))
    for i, step in enumerate(gain.steps):
        assert gain.top(1, step).iloc[0].component != head
        assert abs(gain.change[i, gain.components.index(head)]) < 0.05


def test_recomputed_decompositions_equal_recorded_ones(tmp_path: Path, run: RunRecord,
                                                       rm: Any, base_rm: Any) -> None:
    plain = record_scripted(tmp_path, rm, decompose=False, steps=3)
    with pytest.raises(RunRecordError, match="holds no decomposition; pass model="):
        reward_gain(plain)
    with pytest.raises(RunRecordError, match="another reward model"):
        reward_gain(plain, model=base_rm)
    again = reward_gain(plain, model=rm)
    recorded = reward_gain(run, steps=[1, 2])
    np.testing.assert_allclose(again.change, recorded.change, rtol=0, atol=1e-6)
    assert again.components == recorded.components


def test_result_table_plot_and_file(run: RunRecord, tmp_path: Path) -> None:
    gain = reward_gain(run, steps=[2, 5])
    df = gain.to_dataframe()
    assert len(df) == 2 * len(gain.components)
    assert set(df.columns) >= {"step", "since", "component", "change", "ci_low", "ci_high"}
    fig = gain.plot(k=3)
    names = [t.name for t in fig.data]
    assert names[0] == "L2.H0" and names[3:] == ["other", "reward change"]
    assert "RewardGain" in repr(gain) and "sentence" in repr(gain)
    back = load_result(gain.save(tmp_path / "gain.tlr"))
    assert isinstance(back, RewardGain) and back.components == gain.components
    np.testing.assert_array_equal(back.change, gain.change)


def test_bad_requests_are_refused(run: RunRecord, tmp_path: Path) -> None:
    with pytest.raises(RunRecordError, match="reference step 9 is not recorded"):
        reward_gain(run, since=9)
    with pytest.raises(TLRewardError, match="unit"):
        reward_gain(run, unit="token")
    with pytest.raises(TLRewardError, match="since must be a step or 'previous'"):
        reward_gain(run, since="first")
    with pytest.raises(RunRecordError, match="holds no step yet"):
        reward_gain(RunRecord(tmp_path, settings={}))
    with pytest.raises(TLRewardError, match="not among the compared steps"):
        reward_gain(run, steps=[2]).sentence(3)


def test_welch_interval_coverage_as_documented() -> None:
    """The interval's simulated coverage (docs/rl.md): nominal when the two steps' unit means
    share a shape, below it when one is skewed and the other not (4,000 data sets each)."""
    rng = np.random.default_rng(0)

    def coverage(a: np.ndarray, b: np.ndarray, diff: float) -> float:
        ci = stats.ttest_ind(a, b, axis=1, equal_var=False).confidence_interval(0.95)
        return float(np.mean((ci.low <= diff) & (diff <= ci.high)))

    r, n = 4000, 8
    assert coverage(rng.normal(size=(r, n)), rng.normal(size=(r, n)), 0.0) >= 0.94
    assert coverage(rng.exponential(size=(r, n)), rng.exponential(size=(r, n)), 0.0) >= 0.94
    assert coverage(rng.standard_t(3, size=(r, n)), rng.standard_t(3, size=(r, n)), 0) >= 0.94
    skew = coverage(rng.exponential(size=(r, n)), rng.normal(1.0, 0.3, size=(r, n)), 0.0)
    assert 0.87 <= skew <= 0.93  # mixed shapes: below nominal (docs/rl.md)
