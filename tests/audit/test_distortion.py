"""Distortion index: ours (absolute sensitivities, Gini with an item bootstrap) against hand
cases and a brute-force Gini; its noise-floor test against brute-force enumeration and scipy,
calibrated on null data and firing on planted data; the published min-max index's forced zero
reproduced."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tl_reward.audit.distortion import (
    coefficient_of_variation,
    distortion_floor_test,
    distortion_index,
    gini,
)
from tl_reward.compat.published import published_distortion_index
from tl_reward.errors import TLRewardError
from tl_reward.stats.resampling import bootstrap_indices


def _brute_gini(a: np.ndarray) -> float:
    a = np.abs(a)
    return sum(abs(x - y) for x in a for y in a) / (2 * len(a) ** 2 * a.mean())


def test_gini_and_cv_hand_cases() -> None:
    assert gini(np.array([1.0, 1.0, 1.0])) == 0.0  # perfectly even
    assert gini(np.array([0.0, 0.0, 0.0, 2.0])) == pytest.approx(0.75)  # 1 - 1/K: one alone
    rng = np.random.default_rng(0)
    for _ in range(5):
        a = rng.normal(size=6)
        assert gini(a) == pytest.approx(_brute_gini(a), rel=1e-12)
        assert coefficient_of_variation(a) == pytest.approx(np.abs(a).std() / np.abs(a).mean())
    assert np.isnan(gini(np.zeros(3)))
    batch = rng.normal(size=(4, 3, 9))  # along any axis, vectorised
    np.testing.assert_allclose(gini(batch, axis=1),
                               [[_brute_gini(batch[i, :, j]) for j in range(9)]
                                for i in range(4)], rtol=1e-12)


def _matched(n: int = 60, effects: tuple[float, ...] = (0.5, 0.0, -0.2), seed: int = 0
             ) -> tuple[pd.DataFrame, pd.Series]:
    rng = np.random.default_rng(seed)
    ids = [f"i{k}" for k in range(n)]
    d = pd.DataFrame({f"d{j}": rng.normal(e, 0.3, n) for j, e in enumerate(effects)}, index=ids)
    nat = pd.Series(rng.normal(0, 2.0, n), index=ids)
    return d, nat


def test_distortion_sensitivities_are_absolute_and_the_ci_covers() -> None:
    d, nat = _matched()
    res = distortion_index(d, nat)
    sd = nat.std(ddof=1)
    np.testing.assert_allclose(res.sensitivity, d.mean().to_numpy() / sd, rtol=1e-12)
    assert res.index == pytest.approx(_brute_gini(res.sensitivity))
    # no interval for a ratio to an estimated sd, nor for Gini (docs/statistics.md)
    assert np.isnan([*res.index_ci, *res.cv_ci, *res.ci_low, *res.ci_high]).all()
    assert "no interval" in res.ci_reason
    # absolute units: a model 1000x less sensitive has 1000x smaller sensitivities ...
    small = distortion_index(d / 1000, nat)
    np.testing.assert_allclose(small.sensitivity, res.sensitivity / 1000, rtol=1e-9)
    # ... and no dimension is forced to 0 (the d1 dimension has true effect 0, the others not)
    assert (np.abs(res.sensitivity[[0, 2]]) > 0.05).all()
    assert res.plot().data and len(res.to_dataframe()) == 3
    with pytest.raises(TLRewardError, match="natural rewards"):
        distortion_index(d)


def test_published_distortion_forced_zero_reproduced_and_absent_from_ours() -> None:
    # three dimensions with the same true effect: only noise separates them
    d, nat = _matched(effects=(0.3, 0.3, 0.3), seed=4)
    pub = published_distortion_index(d)
    # the published formula written out with loops: pooled min-max over every probe delta,
    # coverage 1 - prod(1 - c) per dimension, distortion 1 - C / max C
    flat = [x for col in d for x in d[col]]
    lo, hi = min(flat), max(flat)
    cover = []
    for col in d:
        keep = 1.0
        for x in d[col]:
            keep *= 1 - (x - lo) / (hi - lo)
        cover.append(1 - keep)
    np.testing.assert_allclose(pub.coverage, cover, rtol=1e-12)
    np.testing.assert_allclose(pub.distortion, [1 - c / max(cover) for c in cover], atol=1e-12)
    # 60 probes a dimension: 1 - prod(1 - c) rounds to exactly 1.0 for each, so the published
    # index reads 0 ("no distortion") for all three, whatever the model does
    assert list(pub.coverage) == [1.0, 1.0, 1.0] and list(pub.distortion) == [0.0, 0.0, 0.0]
    scaled = published_distortion_index(d * 1e-6)  # purely relative: scale-free
    np.testing.assert_allclose(scaled.distortion, pub.distortion, atol=1e-9)
    # hand case: pooled min-max, 1 - prod(1 - c), 1 - C / max C
    hand = published_distortion_index({"a": [0.0, 1.0], "b": [0.5]})
    np.testing.assert_allclose(hand.coverage, [1.0, 0.5])
    np.testing.assert_allclose(hand.distortion, [0.0, 0.5])
    # one saturated probe decides a dimension: "a" has coverage 1 whatever its other probes
    sat = published_distortion_index({"a": [-1.0, -1.0, 1.0], "b": [0.9, 0.9, 0.9]})
    assert sat.coverage[0] == 1.0 and sat.distortion[0] == 0.0
    ours = distortion_index(d, nat)
    assert (np.abs(ours.sensitivity) > 0.05).all()  # no forced zero
    assert ours.index < 0.2  # even coverage is what it reports
    assert not ours.above_floor  # even coverage is no distortion


def _brute_floor_p(d: np.ndarray) -> float:
    obs = _brute_gini(np.nanmean(d, 0))
    null = [_brute_gini(np.nanmean(d * np.array(s)[:, None], 0))
            for s in itertools.product([-1.0, 1.0], repeat=len(d))]
    return float(np.mean(np.array(null) >= obs - 1e-12))


def test_floor_test_exact_against_enumeration_and_scipy() -> None:
    rng = np.random.default_rng(5)
    d = rng.normal(0.2, 1.0, (10, 4)) * [1.0, 0.5, 2.0, 1.0]
    d[[1, 7], 2] = np.nan  # edits that did not apply
    ft = distortion_floor_test(d)
    assert ft.method == "exact" and ft.n_permutations == 2**10
    assert float(ft.p_value) == pytest.approx(_brute_floor_p(d), abs=1e-12)
    # scipy's paired sign-flip enumeration over item indices (the sign of 1..n flips a row)
    def stat(x: np.ndarray, axis: int = -1) -> np.ndarray:
        rows = d[np.abs(x).astype(int) - 1] * np.sign(x)[..., None]
        return gini(np.nanmean(rows, -2))
    ref = stats.permutation_test((np.arange(1.0, 11.0),), stat, permutation_type="samples",
                                 vectorized=True, n_resamples=np.inf, alternative="greater")
    assert float(ft.p_value) == pytest.approx(ref.pvalue, abs=1e-12)
    # Monte Carlo: (1 + count) / (1 + B), close to the exact p
    mc = distortion_floor_test(d, n_permutations=20_000, exact_max_n=0, seed=1)
    assert mc.method == "monte_carlo" and float(mc.p_value) == pytest.approx(ref.pvalue,
                                                                           abs=0.01)


def _null_rejections(n: int, k: int, sims: int, seed: int) -> np.ndarray:
    """Pure-noise deltas (every dimension's mean 0, sds unequal, dimensions correlated as
    the shared -r(natural) makes them) through the test at alpha = 0.05 (B = 199: a Monte
    Carlo test with alpha (1 + B) an integer keeps its level exactly)."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(size=(sims, n, 1))
    d = (rng.normal(size=(sims, n, k)) + 0.5 * shared) * rng.uniform(0.2, 3.0, (sims, 1, k))
    return distortion_floor_test(d, n_permutations=199, seed=seed).p_value < 0.05


@pytest.mark.parametrize(("n", "k"), [(8, 3), (8, 19), (20, 7), (50, 12), (200, 19),
                                      (500, 5)])
def test_floor_verdict_is_calibrated_on_null_data(n: int, k: int) -> None:
    """False-positive rate of "distortion above floor" at alpha = 0.05 over 1,000 null data
    sets per shape lies in [0.02, 0.08] (binomial sd 0.007). The old reading (the index's CI
    lies above 0, or above 0.1) fires on nearly all of them."""
    rate = float(_null_rejections(n, k, 1000, seed=n * 100 + k).mean())
    assert 0.02 <= rate <= 0.08, rate


def test_the_old_reading_fires_on_null_data_and_the_new_verdict_does_not() -> None:
    rng = np.random.default_rng(3)
    old, new, idx = [], [], []
    for seed in range(40):
        d = pd.DataFrame(rng.normal(0, 0.3, (80, 7)))
        nat = rng.normal(0, 1.0, 80)
        res = distortion_index(d, nat, n_permutations=199, seed=seed)
        i = bootstrap_indices(80, 300, seed)  # the old reading: the bootstrap CI of the index
        old.append(np.quantile(gini(d.to_numpy()[i].mean(1) / nat[i].std(-1, ddof=1)[:, None]),
                               0.025) > 0.1)
        new.append(res.above_floor)
        idx.append(res.index)
    assert np.mean(old) == 1.0  # the bootstrap CI never covers even 0.1: the noise floor
    assert np.mean(new) <= 0.15 and 0.25 < np.mean(idx) < 0.5


def test_floor_verdict_fires_on_planted_distortion() -> None:
    rng = np.random.default_rng(8)
    hits = []
    for seed in range(20):
        d = rng.normal(0, 1.0, (60, 7))
        d[:, 2] += 1.2  # one dimension moves the reward, the others do not
        nat = rng.normal(0, 1.0, 60)
        res = distortion_index(pd.DataFrame(d), nat, n_permutations=999,
                               seed=seed)
        hits.append(res.above_floor)
        assert res.excess == pytest.approx(res.index - res.null_median)
    assert np.mean(hits) >= 0.9
    assert res.summary().verdict[0] == res.verdict
    assert "noise floor" in res.plot().layout.title.text
    # scale-free: the same verdict and p after multiplying every delta by 1e-6
    small = distortion_index(pd.DataFrame(d * 1e-6), nat, n_permutations=999,
                             seed=seed)
    assert small.p_value == res.p_value and small.index == pytest.approx(res.index)
