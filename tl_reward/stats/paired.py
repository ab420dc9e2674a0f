"""Paired (one-sample) statistics for per-item differences: sign-flip tests and effect sizes
(their Benjamini-Hochberg adjustment: :mod:`tl_reward.stats.multiplicity`).

A probe gives one difference per base item, ``delta_i = r(perturbed_i) - r(neutral_i)``. Under
the null of no effect each delta is symmetric about 0, so its sign is exchangeable: the
sign-flip test enumerates all ``2^n`` sign patterns when ``n <= exact_max_n`` (exact) and
otherwise draws ``B`` random patterns, with ``p = (1 + #{|sum*| >= |sum|}) / (1 + B)`` (the
observed pattern counted, so ``p > 0`` and the test keeps its level).

Example:
    >>> sign_flip_test([0.3, 0.1, -0.05, 0.4]).p_value    # exact, 2^4 patterns
    >>> paired_effect_size([0.3, 0.1, -0.05, 0.4]).value   # mean / sd (ddof 1)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special

from tl_reward.stats.estimate import Estimate
from tl_reward.stats.ranks import ArrayLike, as_array

#: Largest ``n`` enumerated exactly by default (2^20 sums, 8 MB).
EXACT_MAX_N = 20


def drop_nan(x: ArrayLike) -> np.ndarray:
    """``x`` flattened to float64, its NaNs dropped."""
    arr = as_array(x).ravel()
    return arr[~np.isnan(arr)]


def _flipped_sums(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Over all ``2^n`` sign patterns (n <= 26, by doubling): the sum of the flipped values and
    their count."""
    if arr.size > 26:
        raise ValueError(f"exact enumeration of 2^{arr.size} sign patterns is too large; use "
                         "the Monte Carlo test")
    sums, counts = np.zeros(1), np.zeros(1)
    for v in arr:
        sums, counts = np.concatenate([sums, sums + v]), np.concatenate([counts, counts + 1])
    return sums, counts


def sign_flip_null_sums(x: ArrayLike) -> np.ndarray:
    """All ``2^n`` sums ``sum_i s_i x_i`` over sign patterns ``s`` (n <= 26)."""
    arr = drop_nan(x)
    return arr.sum() - 2 * _flipped_sums(arr)[0]


@dataclass(frozen=True)
class SignFlipResult:
    """A two-sided sign-flip test of ``mean(x) != 0`` and the interval that inverts it.

    Attributes:
        p_value: two-sided p-value (NaN when ``n == 0``).
        method: ``"exact"`` (all ``2^n`` patterns), ``"monte_carlo"`` or ``"undefined"``.
        n: number of non-NaN values; n_permutations: patterns drawn (Monte Carlo), else
            ``2^n``.
        mean: the mean of the values.
        ci_low, ci_high: every ``mu`` the same test of ``mean = mu`` (the same patterns) does
            not reject at ``1 - confidence``; NaN when that set is unbounded (``ci_reason``).
    """

    p_value: float
    method: str
    n: int
    n_permutations: int
    mean: float = float("nan")
    ci_low: float = float("nan")
    ci_high: float = float("nan")
    ci_reason: str | None = "no values"


def _inverted_bounds(flipped: np.ndarray, k: np.ndarray, arr: np.ndarray, alpha: float,
                     monte_carlo: bool, tol: float) -> tuple[float, float]:
    """Bounds of ``{mu: p(mu) >= alpha}`` for the sign-flip test of ``mean = mu`` over the
    patterns given by their flipped sums and counts (unbounded: +-inf).

    For ``mu`` below the mean, pattern ``s`` reaches ``|sum s_i (x_i - mu)| >= |sum (x_i - mu)|``
    exactly when the mean of its flipped values or of its kept values is ``<= mu`` (a pattern
    with an empty side always does), so ``p(mu)`` counts the patterns whose smaller side mean
    is ``<= mu``: the lower bound is an order statistic of those side means (above the mean,
    the mirror image). ``p = count / 2^n`` (exact) or ``(1 + count) / (1 + B)``. The test
    counts sums within ``tol`` of the observed one: a side mean within ``tol / (2 size)``.
    """
    n, total = arr.size, float(arr.sum())
    kept = n - k
    with np.errstate(invalid="ignore", divide="ignore"):
        side_f, side_k = flipped / k, (total - flipped) / kept
        slack_f, slack_k = tol / (2 * k), tol / (2 * kept)
        empty = (k == 0) | (kept == 0)
        low = np.where(empty, -np.inf, np.minimum(side_f - slack_f, side_k - slack_k))
        high = np.where(empty, np.inf, np.maximum(side_f + slack_f, side_k + slack_k))
    extra = int(monte_carlo)
    m = int(np.ceil(alpha * (low.size + extra) - extra - 1e-9))  # patterns p(mu) needs
    if m <= 0:
        return -np.inf, np.inf
    return (float(np.partition(low, m - 1)[m - 1]),
            float(-np.partition(-high, m - 1)[m - 1]))


def sign_flip_test(x: ArrayLike, exact_max_n: int = EXACT_MAX_N, n_permutations: int = 9_999,
                   seed: int = 0, confidence: float = 0.95) -> SignFlipResult:
    """The package's one two-sided sign-flip test of ``mean(x) != 0`` (NaNs dropped): exact
    for ``n <= exact_max_n``, else ``n_permutations`` random patterns (see the module doc); and
    the package's one interval of a mean, the ``confidence`` set that inverts the same test
    over the same patterns, so it excludes 0 exactly when ``p < 1 - confidence``."""
    arr = drop_nan(x)
    n = int(arr.size)
    if n == 0:
        return SignFlipResult(float("nan"), "undefined", 0, 0)
    alpha = 1 - confidence
    observed = abs(float(arr.sum()))
    tol = 1e-9 * max(float(np.abs(arr).sum()), 1e-300)  # reordered sums differ by a few ulps
    if n <= exact_max_n:
        flipped, k = _flipped_sums(arr)
        p, method, b = float((np.abs(arr.sum() - 2 * flipped) >= observed - tol).mean()), \
            "exact", 2**n
    else:
        rng = np.random.default_rng(seed)
        count, parts = 0, []
        step = max(1, min(n_permutations, 4_000_000 // n))  # bound memory to ~32 MB per block
        for done in range(0, n_permutations, step):
            flip = rng.integers(0, 2, size=(min(step, n_permutations - done), n),
                                dtype=np.int8) == 0
            parts.append((flip @ arr, flip.sum(1)))
            count += int((np.abs(arr.sum() - 2 * parts[-1][0]) >= observed - tol).sum())
        flipped, k = (np.concatenate(a) for a in zip(*parts, strict=True))
        p, method, b = (1 + count) / (1 + n_permutations), "monte_carlo", n_permutations
    lo, hi = _inverted_bounds(flipped, k.astype(np.float64), arr, alpha, method != "exact",
                              tol)
    if np.isfinite(lo) and np.isfinite(hi):
        return SignFlipResult(p, method, n, b, float(arr.mean()), lo, hi, None)
    return SignFlipResult(p, method, n, b, float(arr.mean()), ci_reason=(
        f"n = {n}: the sign-flip test cannot reach p < {alpha:g} (smallest p "
        f"{2.0 ** (1 - n) if method == 'exact' else 1 / (1 + b):.3g}), so no "
        f"{confidence:.0%} interval"))


def summarise_mean(x: ArrayLike, confidence: float = 0.95, seed: int = 0,
                   n_permutations: int = 9_999, exact_max_n: int = EXACT_MAX_N) -> Estimate:
    """The mean of the non-NaN values of ``x`` as an :class:`Estimate` with the two-sided
    sign-flip p and the interval that inverts it (:func:`sign_flip_test`). One value has no
    p-value (its two sign patterns tie: p would be 1 whatever the value), so ``p`` is NaN."""
    t = sign_flip_test(x, exact_max_n, n_permutations, seed, confidence)
    how = f"mean; {t.method} sign-flip test and its inverted interval"
    if t.n == 1:
        return Estimate(t.mean, t.ci_low, t.ci_high, float("nan"), 1,
                        "one value: no test, no p-value, no interval", confidence)
    return Estimate(t.mean, t.ci_low, t.ci_high, t.p_value, t.n,
                    how if t.ci_reason is None else f"{how} ({t.ci_reason})", confidence)


def share_interval(wins: int, ties: int, n: int, confidence: float = 0.95
                   ) -> tuple[float, float]:
    """The interval of a share ``(wins + ties / 2) / n`` that inverts the exact binomial test
    (Clopper-Pearson: beta quantiles, as ``scipy.stats.binomtest(...).proportion_ci`` without
    its root search): the low end counts ties as losses, the high end as wins, so it covers
    at least ``confidence`` at every ``n`` (NaN when ``n == 0``)."""
    if n == 0:
        return float("nan"), float("nan")
    a, hi = (1 - confidence) / 2, wins + ties
    return (float(special.betaincinv(wins, n - wins + 1, a)) if wins else 0.0,
            float(special.betaincinv(hi + 1, n - hi, 1 - a)) if hi < n else 1.0)


@dataclass(frozen=True)
class EffectSize:
    """Paired standardised effect ``mean / sd`` (sd with ddof 1).

    Attributes:
        value: the effect size, or NaN when undefined (never inf or an invented 0).
        reason: why it is undefined (``None`` when defined).
        mean, sd: the mean and the ddof-1 standard deviation of the values; n: their count.
    """

    value: float
    reason: str | None
    mean: float
    sd: float
    n: int

    @property
    def defined(self) -> bool:
        return self.reason is None


#: Why ratios to an estimated sd (effect size, standardised mean, Gini of those) get no interval.
NO_RATIO_INTERVAL = ("no interval: none of a ratio to an estimated sd reaches its coverage "
                     "without normal data (docs/statistics.md, One interval rule)")

#: Spread at or below ``SPREAD_ULPS * eps * max|x|`` counts as zero (see paired_effect_size).
SPREAD_ULPS = 64


def effect_sizes(x: np.ndarray, zero_tol: float = 0.0) -> np.ndarray:
    """``mean / sd`` (ddof 1) along the last axis, NaN where the spread counts as zero (see
    :func:`paired_effect_size`): one call for an item set or its ``[B, n]`` resamples."""
    mean, sd = x.mean(-1), x.std(-1, ddof=1)
    floor = np.maximum(zero_tol, SPREAD_ULPS * np.finfo(np.float64).eps * np.abs(x).max(-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sd > floor, mean / sd, np.nan)


def paired_effect_size(x: ArrayLike, zero_tol: float = 0.0) -> EffectSize:
    """``mean(x) / sd(x, ddof=1)`` of paired differences; NaN with a reason when undefined.

    Undefined when ``n < 2`` (no spread can be estimated) or when the spread is 0: then
    ``mean / sd`` is ``0/0`` or ``c/0`` and no finite standardised size exists. Zero spread
    means ``sd <= max(zero_tol, SPREAD_ULPS * eps * max|x|)``: equal values give a rounding
    ``sd`` of about one ulp of ``max|x|`` (``[0.1] * 3`` gives 1.7e-17, so ``mean / sd`` would
    be 5.9e15), and a spread below 64 ulps of the data is below their resolution, for any n.
    """
    arr = drop_nan(x)
    n = int(arr.size)
    mean = float(arr.mean()) if n else float("nan")
    if n < 2:
        return EffectSize(float("nan"), f"n = {n}: a spread needs at least 2 items", mean,
                          float("nan"), n)
    sd, value = float(arr.std(ddof=1)), float(effect_sizes(arr, zero_tol))
    if np.isnan(value):
        what = "all differences are equal" if mean != 0 else "all differences are 0"
        return EffectSize(value, f"zero spread ({what}): mean/sd is undefined", mean, sd, n)
    return EffectSize(value, None, mean, sd, n)
