"""Distortion index: ours (absolute sensitivities, Gini with an item bootstrap) against hand
cases and a brute-force Gini; the published min-max index's forced zero reproduced."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tl_reward.audit.distortion import (
    coefficient_of_variation,
    distortion_index,
    gini,
    published_distortion_index,
)
from tl_reward.errors import TLRewardError


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


def _matched(n: int = 60, effects: tuple[float, ...] = (0.5, 0.0, -0.2), seed: int = 0
             ) -> tuple[pd.DataFrame, pd.Series]:
    rng = np.random.default_rng(seed)
    ids = [f"i{k}" for k in range(n)]
    d = pd.DataFrame({f"d{j}": rng.normal(e, 0.3, n) for j, e in enumerate(effects)}, index=ids)
    nat = pd.Series(rng.normal(0, 2.0, n), index=ids)
    return d, nat


def test_distortion_sensitivities_are_absolute_and_the_ci_covers() -> None:
    d, nat = _matched()
    res = distortion_index(d, nat, n_resamples=1000)
    sd = nat.std(ddof=1)
    np.testing.assert_allclose(res.sensitivity, d.mean().to_numpy() / sd, rtol=1e-12)
    assert res.index == pytest.approx(_brute_gini(res.sensitivity))
    assert res.index_ci[0] <= res.index <= res.index_ci[1]
    assert ((res.ci_low <= res.sensitivity) & (res.sensitivity <= res.ci_high)).all()
    # absolute units: a model 1000x less sensitive has 1000x smaller sensitivities ...
    small = distortion_index(d / 1000, nat, n_resamples=200)
    np.testing.assert_allclose(small.sensitivity, res.sensitivity / 1000, rtol=1e-9)
    # ... and no dimension is forced to 0 (the d1 dimension has true effect 0, the others not)
    assert (np.abs(res.sensitivity[[0, 2]]) > 0.05).all()
    assert res.plot().data and len(res.to_dataframe()) == 3
    with pytest.raises(TLRewardError, match="natural rewards"):
        distortion_index(d)


def test_distortion_index_coverage_by_simulation() -> None:
    """The bootstrap CI of the index covers the true Gini in most of 60 simulated runs."""
    true_s = np.array([0.5, 0.1, -0.2]) / 2.0
    truth = _brute_gini(true_s)
    hits = []
    for seed in range(60):
        d, nat = _matched(n=80, effects=(0.5, 0.1, -0.2), seed=seed)
        lo, hi = distortion_index(d, nat, n_resamples=400, seed=seed).index_ci
        hits.append(lo <= truth <= hi)
    assert np.mean(hits) >= 0.8  # nominal 95 %; percentile bootstrap of a ratio is approximate


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
    ours = distortion_index(d, nat, n_resamples=500)
    assert (np.abs(ours.sensitivity) > 0.05).all()  # no forced zero
    assert ours.index < 0.2 and ours.index_ci[0] < 0.1  # even coverage is what it reports
