"""The calibrated verdict (``RewardGain.alarm``): on simulated runs where nothing changes, the
chance of any alarm is at most alpha, over the steps and over steps x components, while the
uncorrected rule (the first step whose interval lies above 0) fires far more often; on a run
with a shift it fires at the shift's step and names the shifted component; a fall never fires
it (the test is one-sided); Holm's step-down is statsmodels'."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from tl_reward.errors import TLRewardError
from tl_reward.rl.gain import ALL, Alarm, RewardGain, gain_from_units
from tl_reward.stats.multiplicity import holm

NAMES = ["L0.H0", "L0.H1", "L1.H0", "mlp"]
SCALES = np.array([1.0, 0.5, 2.0, 1.0])  # the components' unit sd


def simulated(rng: np.random.Generator, steps: int, units: tuple[int, int] = (4, 7),
              shift: float = 0.0, at: int = 0, component: int = 3) -> RewardGain:
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


def null_gains(rng: np.random.Generator, runs: int, steps: int, units: int = 5
               ) -> list[RewardGain]:
    """``runs`` null runs' gains since step 0 (nothing changes), their Welch tests made for
    all runs at once (``gain_from_units`` makes the same per run; checked below)."""
    parts = rng.normal(size=(runs, steps, units, len(NAMES))) * SCALES
    x = np.concatenate([parts.sum(3, keepdims=True), parts], axis=3)  # reward, then parts
    out = np.empty((4, runs, steps - 1, 1 + len(NAMES)))  # change, low, high, p
    for s in range(1, steps):
        res = stats.ttest_ind(x[:, s], x[:, 0], axis=1, equal_var=False)
        ci = res.confidence_interval(0.95)
        p = stats.ttest_ind(x[:, s], x[:, 0], axis=1, equal_var=False,
                            alternative="greater").pvalue
        out[:, :, s - 1] = x[:, s].mean(1) - x[:, 0].mean(1), ci.low, ci.high, p
    later = list(range(1, steps))
    return [RewardGain(later, [0] * len(later), NAMES, out[0, r, :, 1:], out[1, r, :, 1:],
                       out[2, r, :, 1:], out[0, r, :, 1:], out[0, r, :, 0], out[1, r, :, 0],
                       out[2, r, :, 0], out[0, r, :, 0], np.full((len(later), 2), units),
                       p_value=out[3, r, :, 1:], reward_p_value=out[3, r, :, 0])
            for r in range(runs)]


def test_null_runs_alarm_at_most_alpha_and_the_uncorrected_rule_far_more() -> None:
    runs, alpha = 2000, 0.05
    gains = null_gains(np.random.default_rng(0), runs, steps=12)
    calibrated = sum(g.alarm(alpha).fired for g in gains)
    scanned = sum(g.alarm(alpha, ALL).fired for g in gains)
    uncorrected = sum(bool((g.reward_ci_low > 0).any()) for g in gains)
    bound = stats.binom.ppf(0.99, runs, alpha)  # at most alpha, up to the binomial noise
    assert calibrated <= bound and scanned <= bound, (calibrated, scanned, bound)
    # the uncorrected rule: 11 steps at one-sided 2.5 % each, clearly above alpha
    assert stats.binomtest(uncorrected, runs, alpha, alternative="greater").pvalue < 1e-3
    assert uncorrected > 2 * max(calibrated, 1)
    # uncorrected one-sided tests at alpha (the verdict without Holm) fire far more often
    raw = sum(bool((g.p_value < alpha).any()) for g in gains)
    assert stats.binomtest(raw, runs, alpha, alternative="greater").pvalue < 1e-6


def test_a_shift_fires_at_its_step_and_names_its_component() -> None:
    gain = simulated(np.random.default_rng(1), steps=10, units=(10, 11), shift=6.0, at=5)
    assert gain.alarm().step == 5 and gain.alarm().components == ["reward"]
    scan = gain.alarm(component=ALL)
    assert scan.step == 5 and scan.component == "mlp" and scan.fired
    assert scan.n_tests == 9 * len(NAMES)
    i = gain.steps.index(5)
    assert scan.p_value == gain.p_value[i, 3] < scan.p_adjusted <= 0.05
    assert scan.change == gain.change[i, 3] and scan.ci == [gain.ci_low[i, 3], gain.ci_high[i, 3]]
    assert gain.alarm(component="mlp").step == 5
    assert not gain.alarm(component="L0.H1").fired  # an unchanged component
    assert scan.sentence().startswith("mlp's change since step 0 is above 0 from step 5: +")
    assert "(36 tests, family-wise alpha 0.05)" in scan.sentence()


def test_a_fall_never_fires_the_one_sided_verdict() -> None:
    gain = simulated(np.random.default_rng(1), steps=10, units=(10, 11), shift=-6.0, at=5)
    assert gain.ci_high[gain.steps.index(5), 3] < 0  # a clear fall
    for target in (None, ALL, "mlp"):
        alarm = gain.alarm(component=target)
        assert isinstance(alarm, Alarm) and not alarm.fired and alarm.step == -1
    assert gain.alarm(component=ALL).sentence().startswith("no component's change is above 0")
    assert gain.alarm().sentence().startswith("the reward's change is above 0 at no step (9 ")


def test_p_values_are_welchs_one_sided_and_holm_is_statsmodels() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.normal(0.5, 1, size=(6, 4)), rng.normal(size=(5, 4))
    gain = gain_from_units({0: (b.sum(1), b), 1: (a.sum(1), a)}, NAMES, [(1, 0)])
    want = stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue
    np.testing.assert_allclose(gain.p_value[0], want, rtol=1e-12)
    np.testing.assert_allclose(gain.reward_p_value[0], stats.ttest_ind(
        a.sum(1), b.sum(1), equal_var=False, alternative="greater").pvalue, rtol=1e-12)
    for n in (1, 7, 19):  # few: statsmodels' holm runs gc.collect() on each call
        p = rng.uniform(0, 0.1, size=n) ** 2
        p[-1] = p[0]  # a tie
        rejected, adjusted = holm(p, 0.05)
        want_rejected, want_adjusted, _, _ = multipletests(p, 0.05, method="holm")
        assert rejected.tolist() == want_rejected.tolist()
        np.testing.assert_allclose(adjusted, want_adjusted, rtol=1e-12)
    rejected, adjusted = holm(np.array([[0.015, np.nan], [0.03, 0.5]]), 0.05)
    assert rejected.tolist() == [[True, False], [False, False]]  # a family of 3, not 4
    np.testing.assert_allclose(adjusted, [[0.045, np.nan], [0.06, 0.5]])
    with pytest.raises(TLRewardError, match="no component 'L9.H9'"):
        gain.alarm(component="L9.H9")
    with pytest.raises(TLRewardError, match="alpha must lie in"):
        gain.alarm(alpha=5)
