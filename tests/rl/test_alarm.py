"""The calibrated verdict (``RewardGain.alarm``): on simulated runs where nothing changes, the
chance of any alarm is at most alpha, over the steps and over steps x components, while the
uncorrected rule (the first step whose interval lies above 0) fires far more often; on a run
with a shift it fires at the shift's step and names the shifted component; a fall never fires
it (the test is one-sided)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tl_reward.errors import TLRewardError
from tl_reward.rl.gain import ALL, Alarm, RewardGain, gain_from_units
from tl_reward.stats.multiplicity import holm

NAMES = ["L0.H0", "L0.H1", "L1.H0", "mlp"]
SCALES = np.array([1.0, 0.5, 2.0, 1.0])  # the components' unit sd


def simulated(rng: np.random.Generator, steps: int, units: tuple[int, int] = (4, 7),
              shift: float = 0.0, at: int = 0, component: int = 2) -> RewardGain:
    """The gain since step 0 of a simulated run: per step, 4 to 6 units (as GRPO's steps of 8
    groups), each unit's parts normal; ``component``'s part moves by ``shift`` from step ``at``
    (0: nothing changes)."""
    data = {}
    for s in range(steps):
        parts = rng.normal(size=(int(rng.integers(*units)), len(NAMES))) * SCALES
        if shift and s >= at:
            parts[:, component] += shift
        data[s] = (parts.sum(1), parts)
    return gain_from_units(data, NAMES, [(s, 0) for s in range(1, steps)])


def test_null_runs_alarm_at_most_alpha_and_the_uncorrected_rule_far_more() -> None:
    rng = np.random.default_rng(0)
    runs, alpha = 300, 0.05
    gains = [simulated(rng, steps=12) for _ in range(runs)]
    calibrated = sum(g.alarm(alpha).fired for g in gains)
    scanned = sum(g.alarm(alpha, ALL).fired for g in gains)
    uncorrected = sum(bool((g.reward_ci_low > 0).any()) for g in gains)
    bound = stats.binom.ppf(0.99, runs, alpha)  # at most alpha, up to the binomial noise
    assert calibrated <= bound and scanned <= bound, (calibrated, scanned, bound)
    # the uncorrected rule: 11 steps at one-sided 2.5 % each, clearly above alpha
    assert stats.binomtest(uncorrected, runs, alpha, alternative="greater").pvalue < 1e-3
    assert uncorrected > 2 * max(calibrated, 1)


def test_a_shift_fires_at_its_step_and_names_its_component() -> None:
    gain = simulated(np.random.default_rng(1), steps=10, units=(10, 11), shift=4.0, at=5)
    assert gain.alarm().step == 5 and gain.alarm().components == ["reward"]
    scan = gain.alarm(component=ALL)
    assert scan.step == 5 and scan.component == "L1.H0" and scan.fired
    assert scan.n_tests == 9 * len(NAMES)
    i = gain.steps.index(5)
    assert scan.p_value == gain.p_value[i, 2] < scan.p_adjusted <= 0.05
    assert scan.change == gain.change[i, 2] and scan.ci == [gain.ci_low[i, 2], gain.ci_high[i, 2]]
    assert gain.alarm(component="L1.H0").step == 5
    assert not gain.alarm(component="L0.H1").fired  # an unchanged component
    assert scan.sentence().startswith("L1.H0's change since step 0 is above 0 from step 5: +")
    assert "(36 tests, family-wise alpha 0.05)" in scan.sentence()


def test_a_fall_never_fires_the_one_sided_verdict() -> None:
    gain = simulated(np.random.default_rng(1), steps=10, units=(10, 11), shift=-4.0, at=5)
    assert gain.ci_high[gain.steps.index(5), 2] < 0  # a clear fall
    for target in (None, ALL, "L1.H0"):
        alarm = gain.alarm(component=target)
        assert isinstance(alarm, Alarm) and not alarm.fired and alarm.step == -1
    assert gain.alarm(component=ALL).sentence().startswith("no component's change is above 0")


def test_p_values_are_welchs_one_sided_and_holm_leaves_out_untested() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.normal(0.5, 1, size=(6, 4)), rng.normal(size=(5, 4))
    gain = gain_from_units({0: (b.sum(1), b), 1: (a.sum(1), a)}, NAMES, [(1, 0)])
    want = stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue
    np.testing.assert_allclose(gain.p_value[0], want, rtol=1e-12)
    rejected, adjusted = holm(np.array([0.02, np.nan, 0.03]), 0.05)
    assert rejected.tolist() == [True, False, True]  # a family of 2, not 3
    np.testing.assert_allclose(adjusted, [0.04, np.nan, 0.04])
    with pytest.raises(TLRewardError, match="no component 'L9.H9'"):
        gain.alarm(component="L9.H9")
    with pytest.raises(TLRewardError, match="alpha must lie in"):
        gain.alarm(alpha=5)
