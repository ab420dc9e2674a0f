"""The one interval rule for correlations (docs/statistics.md): Kendall's tau-b carries the
interval (U-statistic variance, Fisher z, at least 8 units); Spearman's rho the cascade's
jackknife Fisher-z interval (at least 10 units); a normal-theory Fisher-z interval for Pearson
fails on heavy tails.

The reference is a brute-force O(n^2) computation of the same variance, and simulated coverage
on normal and bivariate-t(3) data (heavy tails with tail dependence)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from tl_reward.stats.agreement import rank_agreement
from tl_reward.stats.ranks import KENDALL_MIN_N, concordance, kendall_interval
from tl_reward.stats.resampling import FISHER_MIN_N


def _brute_interval(x, y, units=None, confidence=0.95):
    n = len(x)
    s = (np.sign(x[:, None] - x[None]) * np.sign(y[:, None] - y[None])).sum(1)
    c = s / (n - 1)
    ta, tb = c.mean(), stats.kendalltau(x, y).statistic
    units = np.arange(n) if units is None else units
    d = np.array([(c[units == u] - ta).sum() for u in np.unique(units)])
    m = len(d)
    var = 4 / n**2 * m / (m - 1) * (d**2).sum() + 2 * (1 - ta**2) / (n * (n - 1))
    se = math.sqrt(var) * tb / ta / (1 - tb**2)
    q = stats.norm.ppf(0.5 + confidence / 2)
    return math.tanh(math.atanh(tb) - q * se), math.tanh(math.atanh(tb) + q * se)


@pytest.mark.parametrize("ties", [False, True])
def test_concordance_and_interval_equal_brute_force(ties):
    rng = np.random.default_rng(3)
    x = rng.normal(size=40)
    y = 0.6 * x + rng.normal(size=40)
    if ties:
        x, y = np.round(x), np.round(2 * y)
    s = (np.sign(x[:, None] - x[None]) * np.sign(y[:, None] - y[None])).sum(1)
    assert np.array_equal(concordance(x, y), s)
    tb = stats.kendalltau(x, y).statistic
    units = np.repeat(np.arange(10), 4)
    for u in (None, units):
        lo, hi, why = kendall_interval(x, y, tb, 0.9, u)
        assert why == "" and (lo, hi) == pytest.approx(_brute_interval(x, y, u, 0.9), abs=1e-12)


def test_below_the_smallest_n_and_at_one_no_interval():
    x = np.arange(KENDALL_MIN_N - 1.0)
    lo, hi, why = kendall_interval(x, x[::-1] + 0.5 * (x % 2), -0.5)
    assert math.isnan(lo) and math.isnan(hi) and "below 8" in why
    x = np.arange(20.0)
    assert "|tau| = 1" in kendall_interval(x, x, 1.0)[2]
    res = rank_agreement(np.arange(6.0), np.array([1.0, 0, 2, 4, 3, 5]))
    assert math.isnan(res.kendall_tau_b.ci_low) and "below 8" in res.kendall_tau_b.method
    assert math.isnan(res.spearman_rho.ci_low) and "no interval" in res.spearman_rho.method


def _draw(rng, reps, n, rho, heavy):
    z = rng.standard_normal((reps, n, 2)) @ np.linalg.cholesky([[1, rho], [rho, 1]]).T
    return z / np.sqrt(rng.chisquare(3, (reps, n, 1)) / 3) if heavy else z


@pytest.mark.parametrize("heavy", [False, True])
@pytest.mark.parametrize("n", [8, 30])
def test_tau_interval_covers_and_fisher_z_pearson_does_not(n, heavy):
    """600 data sets each (Monte Carlo sd of a coverage of 0.95: 0.009); true tau of an
    elliptical law: (2 / pi) arcsin(rho). Measured with 4,000 data sets: tau 0.98 / 0.98 at
    n = 8, 0.97 / 0.96 at n = 30 (normal / t(3)); Pearson's Fisher-z interval, the candidate
    for r, covers 0.95 on normal data but 0.88 and 0.77 on t(3): so r gets no interval."""
    rng = np.random.default_rng(n + heavy)
    rho, reps = 0.8, 600
    data = _draw(rng, reps, n, rho, heavy)
    truth = 2 / np.pi * np.arcsin(rho)
    cover = 0
    for x, y in data.transpose(0, 2, 1):
        lo, hi, _ = kendall_interval(x, y, stats.kendalltau(x, y).statistic)
        cover += lo <= truth <= hi
    assert cover / reps >= 0.93
    r = np.array([np.corrcoef(x, y)[0, 1] for x, y in data.transpose(0, 2, 1)])
    half = stats.norm.ppf(0.975) / math.sqrt(n - 3)
    fisher = np.mean((np.tanh(np.arctanh(r) - half) <= rho) & (rho <= np.tanh(np.arctanh(r)
                                                                                + half)))
    if heavy and n == 30:
        assert fisher < 0.85
    else:
        assert fisher > 0.85


@pytest.mark.parametrize("grouped", [False, True])
def test_rho_interval_is_the_jackknife_fisher_interval_by_hand(grouped):
    """rho's interval: atanh(rho) +- t_{n-1} se, se the jackknife se of atanh over the
    leave-one-unit-out rho (scipy on the data without that unit), at least the normal-theory
    sqrt((1 + rho^2 / 2) / (n - 3)); with ties, and with words of 1-4 tokens as units."""
    rng = np.random.default_rng(4)
    x = np.round(rng.normal(size=48), 1)
    y = np.round(0.5 * x + rng.normal(size=48), 1)
    units = rng.integers(0, 16, size=48) if grouped else np.arange(48)
    res = rank_agreement(x, y, units=units if grouped else None).spearman_rho
    keep = np.unique(units)
    n = len(keep)
    rho = stats.spearmanr(x, y).statistic
    z = np.arctanh([stats.spearmanr(x[units != u], y[units != u]).statistic for u in keep])
    se = max(math.sqrt((n - 1) / n * ((z - z.mean()) ** 2).sum()),
             math.sqrt((1 + rho**2 / 2) / (n - 3)))
    half = stats.t.ppf(0.975, n - 1) * se
    assert res.n == n and res.value == pytest.approx(rho, abs=1e-12)
    assert (res.ci_low, res.ci_high) == pytest.approx(
        (math.tanh(math.atanh(rho) - half), math.tanh(math.atanh(rho) + half)), abs=1e-12)
    assert res.method.startswith("jackknife Fisher-z interval over")
    few = rank_agreement(x[: FISHER_MIN_N - 1], y[: FISHER_MIN_N - 1]).spearman_rho
    assert math.isnan(few.ci_low) and "below 10 units" in few.method


@pytest.mark.parametrize("heavy", [False, True])
def test_rho_interval_covers_at_its_smallest_n(heavy):
    """600 data sets of FISHER_MIN_N = 10 units, rho = 0.8, normal and bivariate t(3) (Monte
    Carlo sd of a coverage of 0.95: 0.009); the population rho from 400,000 draws (sd 0.001).
    Measured: 0.990 (normal), 0.952 (t(3))."""
    rng = np.random.default_rng(30 + heavy)
    data = _draw(rng, 600, FISHER_MIN_N, 0.8, heavy)
    big = _draw(np.random.default_rng(5), 1, 400_000, 0.8, heavy)[0]
    truth = stats.spearmanr(big[:, 0], big[:, 1]).statistic
    est = [rank_agreement(x, y).spearman_rho for x, y in data.transpose(0, 2, 1)]
    assert np.mean([e.ci_low <= truth <= e.ci_high for e in est]) >= 0.93
