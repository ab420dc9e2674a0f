"""Cascade: permutation correlation against scipy and brute force, null calibration over
matched independent dimensions, and the published index-pairing flaw (n = 2, r = +-1)."""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tl_reward.audit.cascade import (
    cascade,
    cascade_across_models,
    permutation_correlation,
)
from tl_reward.compat.published import published_cascade


def test_permutation_correlation_against_scipy_and_brute_force() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=7), rng.normal(size=7)
    y += 0.8 * x
    c = permutation_correlation(x, y)
    assert c.value == pytest.approx(stats.pearsonr(x, y).statistic, rel=1e-12)
    r0 = abs(np.corrcoef(x, y)[0, 1])
    brute = np.mean([abs(np.corrcoef(x, y[list(p)])[0, 1]) >= r0 - 1e-12
                     for p in permutations(range(7))])
    assert c.method.endswith("exact permutation test")
    assert c.p_value == pytest.approx(brute, abs=1e-12)


    def abs_r(a: np.ndarray, axis: int = -1) -> np.ndarray:  # |r| with y, vectorised
        ac, yc = a - a.mean(axis, keepdims=True), y - y.mean()
        return np.abs((ac * yc).sum(axis) / np.sqrt((ac**2).sum(axis) * (yc**2).sum()))

    # scipy's two-sided doubles the smaller tail; ours is P(|r*| >= |r|): compare like for like
    ref = stats.permutation_test((x,), abs_r, permutation_type="pairings", vectorized=True,
                                 n_resamples=np.inf, alternative="greater").pvalue
    assert c.p_value == pytest.approx(ref, abs=1e-12)
    # Monte Carlo path (n = 30) agrees with scipy's exact-in-distribution t-test p closely
    x, y = rng.normal(size=30), rng.normal(size=30)
    y += 0.4 * x
    mc = permutation_correlation(x, y, n_permutations=20_000)
    assert mc.method.endswith("monte_carlo permutation test")
    assert mc.p_value == pytest.approx(stats.pearsonr(x, y).pvalue, abs=0.01)  # MC SE <= 0.004
    assert mc.ci_low < mc.value < mc.ci_high
    sp = permutation_correlation(x, y, kind="spearman", n_permutations=999)
    assert sp.value == pytest.approx(stats.spearmanr(x, y).statistic, rel=1e-12)


def test_cascade_null_calibration_over_matched_items() -> None:
    """Independent dimensions over the same 25 items: 200 simulated pairs, rejection ~5 %."""
    rng = np.random.default_rng(7)
    ps = [permutation_correlation(rng.normal(size=25), rng.standard_t(4, size=25),
                                  n_permutations=499, seed=i).p_value
          for i in range(200)]
    rate = float(np.mean(np.array(ps) <= 0.05))
    assert 0.02 <= rate <= 0.08, rate


def test_cascade_over_items_and_models() -> None:
    rng = np.random.default_rng(1)
    base = rng.normal(size=40)
    mat = pd.DataFrame({"a": base + rng.normal(0, 0.5, 40), "b": base + rng.normal(0, 0.5, 40),
                        "c": rng.normal(size=40)}, index=[f"i{k}" for k in range(40)])
    mat.loc["i0", "c"] = np.nan  # an edit that did not apply: the pair drops that item
    res = cascade(mat, n_permutations=999)
    df = res.to_dataframe().set_index(["dim_a", "dim_b"])
    assert df.loc[("a", "b"), "n"] == 40 and df.loc[("a", "c"), "n"] == 39
    assert df.loc[("a", "b"), "p_adjusted"] < 0.01
    for a, b in [("a", "b"), ("a", "c"), ("b", "c")]:  # r of the matched items: scipy's
        both = mat[[a, b]].dropna()
        assert df.loc[(a, b), "r"] == pytest.approx(stats.pearsonr(both[a], both[b]).statistic,
                                                    abs=1e-12)
    np.testing.assert_allclose(df.p_adjusted, stats.false_discovery_control(df.p_value))
    heat = res.plot().data[0]  # the heatmap shows the matrix, symmetric, 1 on the diagonal
    np.testing.assert_allclose(heat.z, res.matrix().loc[list(heat.x), list(heat.y)].to_numpy())
    assert res.matrix().loc["b", "a"] == df.loc[("a", "b"), "r"]
    across = cascade_across_models(mat.iloc[1:6])
    assert across.units == "models" and (across.pairs.n == 5).all()
    with pytest.raises(Exception, match="distinct matched units"):
        cascade(pd.concat([mat, mat.iloc[:1]]))


def test_published_cascade_flaw_reproduced_and_absent_from_ours() -> None:
    rng = np.random.default_rng(3)
    dims = ["alignment_faking", "malicious_cooperation", "sabotage", "self_preservation",
            "deception", "sycophancy"]
    noise = {d: rng.normal(size=2) for d in dims}  # 6 dimensions x 2 unrelated probes
    pub = published_cascade(noise)
    off = pub.matrix[~np.eye(len(dims), dtype=bool)]
    assert pub.n == 2 and np.allclose(np.abs(off), 1.0)  # every r is +-1 at n = 2
    assert len(pub.flagged) == 15  # so every pair is reported as a cascade
    # ours on the same numbers: n = 2, r undefined-in-evidence: exact p = 1, no CI
    ours = cascade(pd.DataFrame(noise), n_permutations=99).to_dataframe()
    assert (ours.n == 2).all() and (ours.p_value == 1.0).all() and ours.ci_low.isna().all()


def test_shared_neutral_baseline_is_controlled() -> None:
    """Deltas that share only -r(natural) (edits pull every reward toward a typical value)
    correlate raw; residualised on r(natural) they do not: rejection ~5 % over 600 pairs
    (binomial sd 0.009; at 200 pairs, sd 0.015, this seed's first 200 gave 0.015)."""
    rng = np.random.default_rng(5)
    raw_p, ctrl_p = [], []
    for i in range(600):
        nat = pd.Series(rng.normal(size=40), index=[f"i{k}" for k in range(40)])
        mat = pd.DataFrame({"a": rng.normal(size=40) - nat.to_numpy(),
                            "b": rng.normal(size=40) - nat.to_numpy()}, index=nat.index)
        raw_p.append(cascade(mat, control=None, n_permutations=199, seed=i)
                     .pairs.p_value[0])
        ctrl_p.append(cascade(mat, control=nat, n_permutations=199, seed=i)
                      .pairs.p_value[0])
    assert np.mean(np.array(raw_p) <= 0.05) > 0.3  # the confound: spurious "cascades"
    rate = float(np.mean(np.array(ctrl_p) <= 0.05))
    assert 0.02 <= rate <= 0.08, rate


def test_partial_correlation_freedman_lane_against_brute_force() -> None:
    """With a control, each permutation of x's residuals is residualised again (Freedman-Lane):
    brute force over all 7! permutations with an explicit least-squares fit each time."""
    rng = np.random.default_rng(4)
    c = rng.normal(size=7)
    x, y = rng.normal(size=7) - c, rng.normal(size=7) - c + 0.3 * rng.normal(size=7)
    res = permutation_correlation(x, y, control=c)

    def resid(v: np.ndarray) -> np.ndarray:
        design = np.column_stack([np.ones(7), c])
        return v - design @ np.linalg.lstsq(design, v, rcond=None)[0]

    ex, ey = resid(x), resid(y)
    r0 = np.corrcoef(ex, ey)[0, 1]
    # the partial correlation, as statsmodels / the textbook formula define it
    rxy, rxc, ryc = np.corrcoef(x, y)[0, 1], np.corrcoef(x, c)[0, 1], np.corrcoef(y, c)[0, 1]
    assert res.value == pytest.approx((rxy - rxc * ryc) / np.sqrt((1 - rxc**2) * (1 - ryc**2)),
                                  rel=1e-10)
    brute = np.mean([abs(np.corrcoef(resid(ex[list(p)]), ey)[0, 1]) >= abs(r0) - 1e-12
                     for p in permutations(range(7))])
    assert res.method.endswith("exact permutation test")
    assert res.p_value == pytest.approx(brute, abs=1e-12)
    # cascade() passes its control through: the same p for the same pair
    mat = pd.DataFrame({"a": x, "b": y})
    assert cascade(mat, control=pd.Series(c)).pairs.p_value[0] == pytest.approx(brute,
                                                                               abs=1e-12)
