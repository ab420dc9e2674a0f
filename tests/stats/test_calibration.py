"""Every verdict calibrated against its null (issue 18): on data with no effect, of the shapes
users have (n from 8 to 500 items, K up to 19 dimensions or terms), the false-positive rate of
each verdict at alpha = 0.05 lies in [0.02, 0.08].

The verdicts and their families:

* probe "significant": Benjamini-Hochberg p (over the K dimensions of a report) < alpha;
  the rate is the family-wise rate (any dimension called) under the global null, which BH
  controls at alpha;
* conflict: :func:`tl_reward.audit.conflict.pair_disagreement`'s verdict other than
  "no evidence" (BH over the T(T-1)/2 pairs of terms), any pair called;
* cascade link: :func:`tl_reward.audit.cascade.cascade`'s BH p over the pairs of dimensions
  < alpha, any pair called;
* divergence flag: :class:`tl_reward.audit.divergence.SiteFit` p < alpha for a natural
  activation (one more draw of what the fit and its reference came from);
* distortion above floor: :func:`tl_reward.audit.distortion.distortion_floor_test` p < alpha
  (the per-shape grid is in tests/audit/test_distortion.py);
* the Goodhart curve's peak (not the first step on flat gold) and its after-peak verdicts
  (:mod:`tl_reward.rl.goodhart`; the scenario grid is experiments/goodhart_null.py).

The interval of a mean (the sign-flip test inverted) is checked the same way: its coverage of
the true mean, at the smallest n it is reported for, is at least nominal.

Each simulation draws independent seeded null data sets and calls the library's statistical
functions directly (no model runs). With S data sets the binomial sd at 0.05 is
sqrt(0.05 * 0.95 / S): 0.0089 at S = 600, so [0.02, 0.08] is 3.4 sd either side.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tl_reward.audit.cascade import cascade
from tl_reward.audit.conflict import pair_disagreement
from tl_reward.audit.covariance import fit_gaussian
from tl_reward.audit.distortion import distortion_floor_test
from tl_reward.audit.divergence import SiteFit
from tl_reward.audit.probes import summarise_dimension
from tl_reward.rl.goodhart import after_peak, after_peak_verdicts, gold_stalled_verdict, peak_step
from tl_reward.stats.multiplicity import benjamini_hochberg
from tl_reward.stats.paired import sign_flip_test
from tl_reward.stats.resampling import bootstrap_indices

ALPHA = 0.05
LOW, HIGH = 0.02, 0.08


@pytest.fixture(autouse=True)
def _one_torch_thread():  # noqa: ANN202 - many tiny fits: threads only contend
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _null_deltas(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Deltas with no effect, as a probe run makes them: every dimension's delta contains the
    shared ``-r(natural)`` plus its own symmetric noise of its own scale; the perturbed side
    is symmetric about the neutral one, so each item's row is symmetric about 0 only after
    the shared part cancels. Here the edit is an identity in distribution: ``delta = e - e'``
    with ``e, e'`` exchangeable (heavy-tailed, t with 3 df)."""
    scale = rng.uniform(0.2, 3.0, k)
    e1 = rng.standard_t(3, (n, k)) * scale
    e2 = rng.standard_t(3, (n, k)) * scale
    nat = rng.normal(0.0, 1.0, n)
    return e1 - e2, nat


# ----------------------------------------------------------------------------- probes


@pytest.mark.parametrize(("n", "k"), [(10, 7), (40, 19), (300, 5)])
def test_probe_significant_is_calibrated(n: int, k: int) -> None:
    """The probe p-value (:func:`sign_flip_test`, exact for n <= 20, else Monte Carlo; 999
    flips here, 5x the bootstrap count in a report: the Monte Carlo test keeps its level at
    any B) and BH over the K dimensions, as :func:`tl_reward.audit.probes.summarise` does."""
    rng = np.random.default_rng(1000 + n + k)
    any_called = []
    for s in range(600):
        d, _ = _null_deltas(rng, n, k)
        p = [sign_flip_test(d[:, j], n_permutations=999, seed=s).p_value for j in range(k)]
        any_called.append(bool((benjamini_hochberg(p) < ALPHA).any()))
    rate = float(np.mean(any_called))
    assert LOW <= rate <= HIGH, rate


def test_probe_verdict_at_tiny_n_is_conservative_and_says_so() -> None:
    """At n = 8 the exact sign-flip p is at least 2 / 2^8 = 0.0078, above alpha / K for K >= 7:
    BH can then call nothing, whatever the data. The rate is 0, not 5 %: a limit of the design
    (too few items for K dimensions), which the report's ``summarise_dimension`` p shows."""
    d = np.full(8, 1.0) + np.linspace(0, 0.1, 8)  # the strongest possible evidence at n = 8
    p = summarise_dimension(d, 1.0, n_permutations=4995).p_value
    assert p == pytest.approx(2 / 2**8)
    assert not (benjamini_hochberg([p] + [1.0] * 6) < ALPHA).any()  # K = 7: nothing called
    assert benjamini_hochberg([p] + [1.0] * 5)[0] < ALPHA  # K = 6: it can be


@pytest.mark.parametrize(("n", "dist"), [(6, "normal"), (6, "t3"), (10, "normal"),
                                         (30, "t3")])
def test_mean_interval_reaches_nominal_coverage(n: int, dist: str) -> None:
    """Issue 28: the percentile bootstrap covered the mean 0.87 of the time at n = 6 (nominal
    0.95). The interval that inverts the sign-flip test covers at least 0.95 (exact at n <= 20:
    [min, max] at n = 6, coverage 1 - 2/64 = 0.969; Monte Carlo at n = 30) on symmetric data,
    normal or heavy-tailed (t, 3 df), where the old rule fails (S = 2000 data sets: binomial
    sd 0.0049, the bar 0.95 - 3 sd). Below n = 6 no interval is reported at 0.95."""
    sims, mu = 2000, 0.7
    rng = np.random.default_rng(n)
    x = mu + (rng.normal(size=(sims, n)) if dist == "normal" else rng.standard_t(3, (sims, n)))
    bar = 0.95 - 3 * np.sqrt(0.95 * 0.05 / sims)
    tests = [sign_flip_test(row, n_permutations=999, seed=s) for s, row in enumerate(x)]
    cover = np.mean([t.ci_low <= mu <= t.ci_high for t in tests])
    assert cover >= bar, cover
    if n <= 10:  # the old rule: percentile interval of 500 resampled means, vectorised
        lo, hi = np.quantile(x[:, bootstrap_indices(n, 500, 0)].mean(-1), [0.025, 0.975], -1)
        old = np.mean((lo <= mu) & (mu <= hi))
        assert old < bar - 0.02, old  # 0.86 (n = 6) to 0.91 (n = 10)
    five = sign_flip_test(x[0, :5])
    assert np.isnan(five.ci_low) and "cannot reach p < 0.05" in five.ci_reason


def _nct_interval(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """95 % interval of mean / sd per row, the noncentral t inverted (exact for normal data):
    vectorised bisection on the noncentrality, scipy's ``nct.cdf`` (its NaN far in the tail
    read as 0 or 1)."""
    from scipy import stats

    n = x.shape[-1]
    t = x.mean(-1) / x.std(-1, ddof=1) * np.sqrt(n)
    out = []
    for q in (0.975, 0.025):
        lo, hi = t - 10 - np.abs(t), t + 10 + np.abs(t)
        for _ in range(50):
            mid = (lo + hi) / 2
            v = stats.nct.cdf(t, n - 1, mid)
            right = np.where(np.isnan(v), mid < t, v > q)  # the cdf falls as nc grows
            lo, hi = np.where(right, mid, lo), np.where(right, hi, mid)
        out.append(lo / np.sqrt(n))
    return out[0], out[1]


@pytest.mark.parametrize("n", [6, 40])
def test_ratio_to_an_estimated_sd_gets_no_interval(n: int) -> None:
    """Issue 28: the effect size (mean / sd) and the standardised mean (mean / natural sd) had
    percentile bootstrap intervals below nominal. No candidate reaches 0.95 without normal data
    (S = 2000 data sets, t(3) scaled to sd 1, true mean / sd = 1): the percentile bootstrap
    covers 0.57 (n = 6) and 0.74 (n = 40), the noncentral-t interval (exact for normal data:
    0.945, 0.951 here) 0.89 and 0.76; the standardised mean's joint bootstrap covered 0.88 at
    n = 40 (normal data). So neither is reported: NaN with the reason."""
    sims, dz = 2000, 1.0
    rng = np.random.default_rng(n)
    bar = 0.95 - 3 * np.sqrt(0.95 * 0.05 / sims)
    lo, hi = _nct_interval(rng.normal(dz, 1.0, (sims, n)))
    assert np.mean((lo <= dz) & (dz <= hi)) >= bar  # exact under normality
    x = dz + rng.standard_t(3, (sims, n)) / np.sqrt(3)
    lo, hi = _nct_interval(x)
    assert np.mean((lo <= dz) & (dz <= hi)) < bar - 0.02  # heavy tails break it
    boot = x[:, bootstrap_indices(n, 500, 0)]
    lo, hi = np.nanquantile(boot.mean(-1) / boot.std(-1, ddof=1), [0.025, 0.975], -1)
    assert np.mean((lo <= dz) & (dz <= hi)) < bar - 0.02  # the old rule
    s = summarise_dimension(x[0], 1.0, n_permutations=4995)
    assert s.effect_size == pytest.approx(x[0].mean() / x[0].std(ddof=1))
    assert np.isnan([s.effect_ci_low, s.effect_ci_high, s.ci_low_std, s.ci_high_std]).all()
    for k in ("effect_size", "mean_std"):
        assert "no interval" in s.estimates[k].method


# ----------------------------------------------------------------------------- conflict


def _null_margins(rng: np.random.Generator, n: int, t: int) -> list[np.ndarray]:
    """Independent terms: each term's margins on n preference pairs, with its own share of
    pairs it prefers chosen on (the independence null keeps the marginals)."""
    return [rng.normal(mu, 1.0, n) for mu in rng.normal(0.0, 0.7, t)]


def _conflict_rate(n: int, t: int, sims: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    called = []
    for s in range(sims):
        rows, family = pair_disagreement(_null_margins(rng, n, t), [f"t{i}" for i in range(t)],
                                         alpha=ALPHA, seed=s)
        called.append(any(r.verdict != "no evidence" for r in rows))
    assert family["tests"] == t * (t - 1) // 2
    return float(np.mean(called))


@pytest.mark.parametrize(("n", "t"), [(60, 2), (100, 3), (300, 2)])
def test_conflict_verdict_is_calibrated(n: int, t: int) -> None:
    rate = _conflict_rate(n, t, 600, seed=n + t)
    assert LOW <= rate <= HIGH, rate


def test_conflict_verdict_is_calibrated_at_19_terms() -> None:
    """K = 19 terms: 171 pair tests in the BH family. The p-values are exact (hypergeometric:
    every permutation), so no permutation count caps the smallest p above alpha / 171 (the
    Monte Carlo test needed >= 3,420 shuffles per pair). Measured over 600 sets: 0.037 at
    n = 200, 0.028 at n = 40 (the discrete p is conservative at small n)."""
    rate = _conflict_rate(200, 19, 300, seed=19)
    assert LOW <= rate <= HIGH, rate


def test_conflict_verdict_at_small_n_is_valid_but_conservative() -> None:
    """At n = 12 pairs the disagreement share takes 13 values; even with the mid-p the rate
    stays below alpha (measured 0.028 at n = 20 and 0.010 at n = 8 over 1,000 sets)."""
    rate = _conflict_rate(12, 2, 600, seed=12)
    assert rate <= HIGH, rate


# ----------------------------------------------------------------------------- cascade


@pytest.mark.parametrize(("n", "k", "control"), [(10, 3, True), (40, 4, True),
                                                 (150, 3, False)])
def test_cascade_link_is_calibrated(n: int, k: int, control: bool) -> None:
    """Matched items whose dimensions share only the neutral baseline ``-r(natural)``
    (controlled: the partial correlation given r(natural), Freedman-Lane permutations) or
    nothing at all (raw); any BH-adjusted pair p < alpha counts. Before Freedman-Lane the
    controlled test permuted fixed residuals: 6.8 % per pair at n = 9."""
    rng = np.random.default_rng(n * 10 + k)
    called = []
    for s in range(600):
        d, nat = _null_deltas(rng, n, k)
        if control:
            d = d - nat[:, None]
        res = cascade(pd.DataFrame(d), control=pd.Series(nat) if control else None,
                      n_permutations=399, seed=s)
        called.append(bool((res.pairs.p_adjusted < ALPHA).any()))
    rate = float(np.mean(called))
    assert LOW <= rate <= HIGH, rate


# ----------------------------------------------------------------------------- divergence


def _clustered(rng: np.random.Generator, inputs: int, tokens: int, mix: np.ndarray
               ) -> torch.Tensor:
    """Activations of ``inputs`` inputs x ``tokens`` tokens: an offset per input (tokens of
    one input are correlated), heavy-tailed noise, a random linear mixing (anisotropic)."""
    d = mix.shape[0]
    x = rng.standard_t(5, (inputs, tokens, d)) + rng.normal(0.0, 0.5, (inputs, 1, d))
    return torch.from_numpy((x @ mix.T).reshape(-1, d))


@pytest.mark.parametrize(("d", "method", "k", "fits", "points"),
                         [(64, "ledoit_wolf", None, 300, 5), (576, "pca", 32, 60, 20)])
def test_divergence_flag_is_calibrated(d: int, method: str, k: int | None, fits: int,
                                       points: int) -> None:
    """A natural activation from a new input, scored against a fit and a held-out reference
    of 20-30 other inputs x 8 tokens (split by input, as fit_divergence does): flagged at
    p < alpha about alpha of the time. The rate's sd combines the binomial over all points
    and the spread of each reference's own rate (about 0.015 over 160-240 distances)."""
    rng = np.random.default_rng(d)
    mix = rng.normal(size=(d, d)) / np.sqrt(d)
    n_in = 20 if method == "ledoit_wolf" else 30
    flags = []
    for _ in range(fits):
        fit = fit_gaussian(_clustered(rng, n_in, 8, mix), method, k)
        ref = np.sort(fit.distance(_clustered(rng, n_in, 8, mix)).numpy())
        site = SiteFit("blocks.0.hook_resid_pre", None, fit, ref)
        fresh = _clustered(rng, points, 8, mix)[np.arange(points) * 8 + rng.integers(0, 8,
                                                                                  points)]
        flags.extend(site.p_value(fresh) < ALPHA)
    rate = float(np.mean(flags))
    assert LOW <= rate <= HIGH, rate


# ----------------------------------------------------------------------------- distortion


@pytest.mark.parametrize(("n", "k"), [(12, 19), (120, 7)])
def test_distortion_above_floor_is_calibrated(n: int, k: int) -> None:
    rng = np.random.default_rng(n + k)
    d = np.stack([_null_deltas(rng, n, k)[0] for _ in range(1000)])
    d[:, : n // 4, 1] = np.nan  # an edit that did not apply to a quarter of the items
    rate = float((distortion_floor_test(d, n_permutations=199, seed=k).p_value < ALPHA).mean())
    assert LOW <= rate <= HIGH, rate


# ----------------------------------------------------------------------------- goodhart


def _goodhart_runs(proxy: np.ndarray, gold: np.ndarray, n: int, sims: int, seed: int,
                   min_gain: float = 0.25) -> np.ndarray:
    """``[sims, 5]``: each simulated run's peak step, ``overoptimised``, ``gold_fell``,
    ``gold_stalled`` at ``min_gain`` and whether that is wrong (gold's true change from the
    peak found to the last step is at least ``min_gain``), from per-step true means and n
    units a step (proxy and gold noise sd 1, correlated 0.5)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(sims):
        z = rng.standard_normal((len(proxy), n, 2))
        z[..., 1] = 0.5 * z[..., 0] + np.sqrt(0.75) * z[..., 1]
        per = list(z + np.stack([proxy, gold], -1)[:, None, :])
        peak = peak_step(list(range(len(per))), [u[:, 1] for u in per], ALPHA, 0.95)
        _, lo, hi = after_peak(per, peak, 0.95)
        stalled = gold_stalled_verdict([lo[0], hi[0]], [lo[1], hi[1]], min_gain)
        out.append((peak, *after_peak_verdicts([lo[0], hi[0]], [lo[1], hi[1]]), stalled,
                    stalled and gold[-1] - gold[peak] >= min_gain))
    return np.array(out, dtype=np.float64)


def test_goodhart_peak_and_verdicts_hold_alpha_on_flat_runs() -> None:
    """Flat proxy and gold over 30 steps of 8 units: the peak stays at the first step (Holm
    over the later steps, and the last step's 95 % interval: a bound of 7.5 %, 3.8 % measured
    over these 600 runs), and neither verdict fires more than alpha of the time. The peak rule that
    scanned the later steps uncorrected moved the peak on 22 % of such runs."""
    runs = _goodhart_runs(np.zeros(30), np.zeros(30), 8, 600, seed=30)
    assert float((runs[:, 0] > 0).mean()) <= HIGH
    assert float(runs[:, 1].mean()) <= HIGH and float(runs[:, 2].mean()) <= HIGH


def test_gold_fell_holds_alpha_while_gold_rises_and_finds_a_fall() -> None:
    """Proxy and gold both rising by 1 sd over 10 steps of 8 units (gold never falls):
    ``gold_fell`` fires at most alpha of the time. Gold rising to the middle (steps 4 and 5)
    and falling back, 64 units a step, is found on most runs (0.91 over these 200), the peak
    at most two steps before the turn (median 3: a last rise of 0.22 sd is not seen)."""
    t = np.linspace(0, 1, 10)
    rising = _goodhart_runs(t, t, 8, 600, seed=10)
    assert float(rising[:, 2].mean()) <= HIGH
    falls = _goodhart_runs(t, 1 - 2 * np.abs(t - 0.5), 64, 200, seed=11)
    assert float(falls[:, 2].mean()) >= 0.8
    assert 2 <= float(np.median(falls[:, 0])) <= 5


def test_gold_stalled_holds_alpha_while_gold_rises_and_finds_a_stall() -> None:
    """``gold_stalled`` (smallest gain that matters 0.25 sd) while proxy and gold both rise by
    1 sd over 10 steps of 64 units: it fires wrongly (gold's true gain after the peak found at
    least 0.25) at most alpha of the time (0 of these 200 runs; testing gold's interval's low
    end against the gain instead fires wrongly on 25 %). With gold flat from the start while
    the proxy rises it fires on most runs at a gain of 0.5 (0.83 of these 200), where
    ``gold_fell``, which needs gold to fall, fires at most alpha of the time."""
    t = np.linspace(0, 1, 10)
    rising = _goodhart_runs(t, t, 64, 200, seed=31)
    assert float(rising[:, 4].mean()) <= HIGH
    flat = _goodhart_runs(t, np.zeros(10), 64, 200, seed=32, min_gain=0.5)
    assert float(flat[:, 3].mean()) >= 0.7 and float(flat[:, 2].mean()) <= HIGH
