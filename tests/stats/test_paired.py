"""Paired statistics against scipy/statsmodels and brute-force enumeration, plus null
calibration of the sign-flip test by simulation."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest
from scipy import stats

from tl_reward.compat.published import published_cohens_d
from tl_reward.stats.multiplicity import benjamini_hochberg
from tl_reward.stats.paired import (
    paired_effect_size,
    sign_flip_null_sums,
    sign_flip_test,
    summarise_mean,
)


def _brute_force_p(x: np.ndarray) -> float:
    """Two-sided sign-flip p by listing every sign pattern with itertools (the reference)."""
    obs = abs(x.mean())
    hits = [abs(np.mean(np.array(s) * x)) >= obs - 1e-12 for s in product((1, -1), repeat=len(x))]
    return float(np.mean(hits))


@pytest.mark.parametrize("n", [1, 2, 5, 11])
def test_exact_sign_flip_equals_brute_force_enumeration(n: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.normal(0.3, 1.0, n)
    res = sign_flip_test(x)
    assert res.method == "exact" and res.n_permutations == 2**n
    assert res.p_value == pytest.approx(_brute_force_p(x), abs=1e-15)
    # the doubling enumeration lists exactly the 2^n signed sums
    ref = sorted(float(np.dot(s, x)) for s in product((1, -1), repeat=n))
    np.testing.assert_allclose(np.sort(sign_flip_null_sums(x)), ref, atol=1e-12)


def test_exact_sign_flip_with_ties_and_zeros_matches_brute_force() -> None:
    # ties make many |sum*| equal to the observed one: the tolerance must count them all
    x = np.array([0.1, 0.1, 0.1, -0.1, 0.0, 0.2, 0.2])
    assert sign_flip_test(x).p_value == pytest.approx(_brute_force_p(x), abs=1e-15)


def test_sign_flip_matches_scipy_permutation_test() -> None:
    x = np.array([0.31, -0.12, 0.44, 0.05, 0.27, -0.03, 0.19, 0.38, 0.11, -0.21, 0.02, 0.5])
    ref = stats.permutation_test((x,), lambda v, axis: np.mean(v, axis=axis),
                                 permutation_type="samples", n_resamples=np.inf,
                                 alternative="two-sided").pvalue
    assert sign_flip_test(x).p_value == pytest.approx(ref, abs=1e-12)
    # n = 20 is still exact (the brief's cut-off), n = 21 is Monte Carlo
    rng = np.random.default_rng(1)
    assert sign_flip_test(rng.normal(size=20)).method == "exact"
    y = rng.normal(0.2, 1, 21)
    mc = sign_flip_test(y, n_permutations=40_000, seed=3)
    assert mc.method == "monte_carlo"
    exact = sign_flip_test(y, exact_max_n=21).p_value
    # Monte Carlo SE at p ~ 0.4 with B = 40k is 0.0025; 4 SE
    assert mc.p_value == pytest.approx(exact, abs=0.01)


def test_monte_carlo_counts_the_observed_pattern() -> None:
    # an extreme sample: no random pattern reaches it, so p = 1 / (1 + B), never 0
    x = np.full(40, 1.0) + np.linspace(0, 0.01, 40)
    res = sign_flip_test(x, n_permutations=999)
    assert res.p_value == pytest.approx(1 / 1000)


@pytest.mark.parametrize(("n", "exact_max_n"), [(6, 20), (9, 20), (14, 20), (25, 20), (9, 4)])
def test_mean_interval_is_the_inverted_sign_flip_test(n: int, exact_max_n: int) -> None:
    """The interval is every mu the same test of ``mean = mu`` keeps (p >= 0.05): brute force
    over a grid of mu, each a fresh ``sign_flip_test(x - mu)`` with the same patterns (exact, or
    the same Monte Carlo seed), so the interval excludes 0 exactly when p < 0.05."""
    x = np.random.default_rng(n).standard_t(3, n) + 0.6
    t = sign_flip_test(x, exact_max_n, n_permutations=999, seed=4)
    assert t.ci_reason is None and t.ci_low < t.mean < t.ci_high
    assert t.mean == pytest.approx(x.mean())
    width = t.ci_high - t.ci_low
    for mu in np.linspace(t.ci_low - width, t.ci_high + width, 301):
        kept = sign_flip_test(x - mu, exact_max_n, n_permutations=999, seed=4).p_value >= 0.05
        if min(abs(mu - t.ci_low), abs(mu - t.ci_high)) > 1e-9 * width:
            assert kept == (t.ci_low <= mu <= t.ci_high), mu
    assert (t.ci_low > 0 or t.ci_high < 0) == (t.p_value < 0.05)


def test_mean_interval_at_its_smallest_n() -> None:
    """At n = 6 the 95 % set is [min, max] (only the all-same-sign patterns reach p = 2/64);
    at n = 5 the smallest p is 2/32 > 0.05, so there is no interval, and the reason says so."""
    x = np.array([0.3, -0.2, 0.5, 0.1, 0.9, 0.4])
    s = summarise_mean(np.append(x, np.nan))
    # (widened by the test's own tie tolerance, 1e-9 of sum |x|)
    assert (s.ci_low, s.ci_high, s.n) == pytest.approx((-0.2, 0.9, 6), abs=1e-8)
    assert s.value == pytest.approx(x.mean()) and s.p_value == sign_flip_test(x).p_value
    five = summarise_mean(x[:5])
    assert np.isnan(five.ci_low) and np.isnan(five.ci_high) and "smallest p 0.0625" in five.method
    assert summarise_mean(np.abs(x)).p_value == pytest.approx(2 / 64) and summarise_mean(
        np.abs(x)).ci_low == pytest.approx(0.1)


def test_one_value_has_no_p_value() -> None:
    """One value: both sign patterns give the same |sum|, so the test would report p = 1
    whatever the value; the mean says there is no p-value rather than print that one."""
    assert sign_flip_test([0.7]).p_value == 1.0  # the test itself: it cannot reject
    for x in ([0.7], [-3.0, np.nan]):
        s = summarise_mean(x)
        assert s.n == 1 and s.value == pytest.approx(np.nanmean(x))
        assert np.isnan(s.p_value) and np.isnan(s.ci_low) and "no p-value" in s.method
        assert "p =" not in str(s) and "n = 1" in str(s)
    assert not np.isnan(summarise_mean([0.7, 0.2]).p_value)  # two values have one (0.5)


def test_effect_size_ddof1_and_undefined_cases() -> None:
    x = np.array([0.2, 0.5, -0.1, 0.4, 0.3])
    es = paired_effect_size(x)
    assert es.value == pytest.approx(x.mean() / np.std(x, ddof=1), rel=1e-12)
    assert es.value != pytest.approx(x.mean() / np.std(x))  # ddof 0 would be the bug
    for bad in ([0.7], [0.0, 0.0, 0.0], [0.3, 0.3, 0.3]):
        e = paired_effect_size(bad)
        assert np.isnan(e.value) and e.reason and not e.defined


def test_published_cohens_d_flaws_reproduced() -> None:
    # reward-lens v1.0.0: ddof 0, and n = 1 (or zero spread) gives +inf, even for a negative mean
    assert published_cohens_d([0.4]) == np.inf
    assert published_cohens_d([-0.4]) == np.inf
    assert published_cohens_d([0.2, 0.2]) == np.inf
    x = np.array([0.2, 0.5, -0.1])
    assert published_cohens_d(x) == pytest.approx(x.mean() / x.std(ddof=0))
    assert np.isnan(paired_effect_size([0.4]).value)  # ours: undefined, not inf


def test_benjamini_hochberg_matches_scipy_and_statsmodels() -> None:
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(0)
    p = np.concatenate([rng.uniform(size=15), rng.uniform(0, 0.01, 5), [0.02, 0.02]])
    ours = benjamini_hochberg(p)
    np.testing.assert_allclose(ours, stats.false_discovery_control(p, method="bh"), atol=1e-14)
    np.testing.assert_allclose(ours, multipletests(p, method="fdr_bh")[1], atol=1e-14)
    with_nan = benjamini_hochberg(np.r_[np.nan, p])
    assert np.isnan(with_nan[0])
    np.testing.assert_allclose(with_nan[1:], ours, atol=1e-14)  # NaN not counted in m


def test_sign_flip_null_calibration_by_simulation() -> None:
    """No effect (symmetric deltas): the rejection rate at alpha 0.05 is about 5 %.

    500 simulated dimensions per path: exact (n = 12, normal), Monte Carlo (n = 40, Laplace).
    The binomial SD of a 5 % rate over 500 is 1.0 %, so [0.02, 0.08] is about +-3 SD.
    """
    rng = np.random.default_rng(2026)
    exact = [sign_flip_test(rng.normal(size=12)).p_value for _ in range(500)]
    mc = [sign_flip_test(rng.laplace(size=40), n_permutations=999, seed=i).p_value
          for i in range(500)]
    for ps in (exact, mc):
        rate = float(np.mean(np.array(ps) <= 0.05))
        assert 0.02 <= rate <= 0.08, rate
    # a shifted sample is detected (the test is not trivially conservative)
    shifted = [sign_flip_test(rng.normal(1.0, 1, 12)).p_value for _ in range(50)]
    assert np.mean(np.array(shifted) <= 0.05) > 0.8


@pytest.mark.parametrize("n", [2, 3, 7, 10, 100, 1000])
@pytest.mark.parametrize("v", [0.1, 0.3, 1 / 3, 0.7, -2.2, 7.7e10, 1e-200])
def test_constant_differences_are_undefined_for_any_n(n: int, v: float) -> None:
    # on main [0.1] * 3 gave sd = 1.7e-17 (rounding) and an effect of 5.9e15
    e = paired_effect_size([v] * n)
    assert np.isnan(e.value) and not e.defined and "zero spread" in e.reason


def test_tiny_real_spread_stays_defined() -> None:
    # a spread of 1e-6 relative to the values is far above 64 ulps (1.4e-14): reference numpy
    x = np.array([1.0, 1.0 + 1e-6, 1.0 - 1e-6, 1.0])
    e = paired_effect_size(x)
    assert e.value == pytest.approx(x.mean() / x.std(ddof=1), rel=1e-12)


@pytest.mark.parametrize("n", [12, 17, 18])
def test_one_sign_flip_engine_equals_brute_force(n: int) -> None:
    # main: resampling.sign_flip_pvalue drew 10,000 random patterns beyond n = 16 (and used its
    # own enumeration); now there is one engine, exact up to n = 20
    x = np.random.default_rng(n).normal(0.4, 1.0, n)
    ref = _brute_force_p(x)
    assert sign_flip_test(x).p_value == pytest.approx(ref, abs=1e-15)
    # Monte Carlo: (1 + count) / (1 + B)
    mc = sign_flip_test(x, exact_max_n=4, n_permutations=999, seed=1)
    assert mc.method == "monte_carlo" and (mc.p_value * 1000) == pytest.approx(
        round(mc.p_value * 1000), abs=1e-9)
