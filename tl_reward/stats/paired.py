"""Paired (one-sample) statistics for per-item differences: sign-flip tests, effect sizes,
Benjamini-Hochberg adjustment.

A probe gives one difference per base item, ``delta_i = r(perturbed_i) - r(neutral_i)``. Under
the null of no effect each delta is symmetric about 0, so its sign is exchangeable: the
sign-flip test enumerates all ``2^n`` sign patterns when ``n <= exact_max_n`` (exact) and
otherwise draws ``B`` random patterns, with ``p = (1 + #{|sum*| >= |sum|}) / (1 + B)`` (the
observed pattern counted, so ``p > 0`` and the test keeps its level).

Example:
    >>> sign_flip_test([0.3, 0.1, -0.05, 0.4]).p_value    # exact, 2^4 patterns
    >>> paired_effect_size([0.3, 0.1, -0.05, 0.4]).value   # mean / sd (ddof 1)
    >>> benjamini_hochberg([0.01, 0.04, 0.3])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from tl_reward.stats.ranks import ArrayLike, as_array

#: Largest ``n`` enumerated exactly by default (2^20 sums, 8 MB).
EXACT_MAX_N = 20


def drop_nan(x: ArrayLike) -> np.ndarray:
    """``x`` flattened to float64, its NaNs dropped."""
    arr = as_array(x).ravel()
    return arr[~np.isnan(arr)]


def sign_flip_null_sums(x: ArrayLike) -> np.ndarray:
    """All ``2^n`` sums ``sum_i s_i x_i`` over sign patterns ``s`` (n <= 26), by doubling."""
    arr = drop_nan(x)
    if arr.size > 26:
        raise ValueError(f"exact enumeration of 2^{arr.size} sign patterns is too large; use "
                         "the Monte Carlo test")
    sums = np.zeros(1)
    for v in arr:
        sums = np.concatenate([sums + v, sums - v])
    return sums


@dataclass(frozen=True)
class SignFlipResult:
    """A two-sided sign-flip test of ``mean(x) != 0``.

    Attributes:
        p_value: two-sided p-value (NaN when ``n == 0``).
        method: ``"exact"`` (all ``2^n`` patterns), ``"monte_carlo"`` or ``"undefined"``.
        n: number of non-NaN values; n_permutations: patterns drawn (Monte Carlo), else
            ``2^n``.
    """

    p_value: float
    method: str
    n: int
    n_permutations: int


def sign_flip_test(x: ArrayLike, exact_max_n: int = EXACT_MAX_N, n_permutations: int = 9_999,
                   seed: int = 0) -> SignFlipResult:
    """The package's one two-sided sign-flip test of ``mean(x) != 0`` (NaNs dropped): exact
    for ``n <= exact_max_n``, else ``n_permutations`` random patterns (see the module doc)."""
    arr = drop_nan(x)
    n = int(arr.size)
    if n == 0:
        return SignFlipResult(float("nan"), "undefined", 0, 0)
    observed = abs(float(arr.sum()))
    tol = 1e-9 * max(float(np.abs(arr).sum()), 1e-300)  # reordered sums differ by a few ulps
    if n <= exact_max_n:
        null = np.abs(sign_flip_null_sums(arr))
        return SignFlipResult(float((null >= observed - tol).mean()), "exact", n, 2**n)
    rng = np.random.default_rng(seed)
    count, done = 0, 0
    step = max(1, min(n_permutations, 4_000_000 // n))  # bound memory to ~32 MB per block
    while done < n_permutations:
        b = min(step, n_permutations - done)
        signs = rng.integers(0, 2, size=(b, n), dtype=np.int8) * 2 - 1
        count += int((np.abs(signs @ arr) >= observed - tol).sum())
        done += b
    return SignFlipResult((1 + count) / (1 + n_permutations), "monte_carlo", n, n_permutations)


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


#: Spread at or below ``SPREAD_ULPS * eps * max|x|`` counts as zero (see paired_effect_size).
SPREAD_ULPS = 64


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
    sd = float(arr.std(ddof=1))
    floor = max(zero_tol, SPREAD_ULPS * np.finfo(np.float64).eps * float(np.abs(arr).max()))
    if not sd > floor:
        what = "all differences are equal" if mean != 0 else "all differences are 0"
        return EffectSize(float("nan"), f"zero spread ({what}): mean/sd is undefined", mean, sd,
                          n)
    return EffectSize(mean / sd, None, mean, sd, n)


def benjamini_hochberg(p_values: ArrayLike) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (``scipy.stats.false_discovery_control``); NaNs kept
    as NaN and not counted among the hypotheses."""
    p = as_array(p_values).ravel()
    out = np.full(p.shape, np.nan)
    if (ok := ~np.isnan(p)).any():
        out[ok] = stats.false_discovery_control(p[ok])
    return out


def standardised_mean_bootstrap(deltas: ArrayLike, natural: ArrayLike, n_bootstrap: int = 2000,
                                seed: int = 0) -> np.ndarray:
    """Bootstrap replicates ``[n_bootstrap, K]`` of ``mean_i(delta_ik) / sd(natural)`` (ddof 1),
    the ratio resampled jointly: each replicate draws ``n`` base items with replacement and
    recomputes both every column's mean delta (NaN deltas, edits that did not apply, are left
    out) and the sd of the same items' natural rewards. ``deltas [n, K]`` (or ``[n]``) and
    ``natural [n]`` are aligned by item. A replicate whose resampled column is empty or whose
    natural sd is 0 is NaN (use ``nanquantile``)."""
    d = as_array(deltas)
    d = d[:, None] if d.ndim == 1 else d
    r = as_array(natural).ravel()
    n = r.size
    if d.shape[0] != n:
        raise ValueError(f"deltas have {d.shape[0]} items, natural rewards {n}")
    from tl_reward.stats.resampling import bootstrap_indices

    idx = bootstrap_indices(n, n_bootstrap, seed)
    # resample counts per item: O(B n) memory instead of the [B, n, K] gather
    w = np.bincount((idx + n * np.arange(n_bootstrap)[:, None]).ravel(),
                    minlength=n_bootstrap * n).reshape(n_bootstrap, n).astype(np.float64)
    present = ~np.isnan(d)
    rc = r - r.mean()
    mean_r = w @ rc / n
    var = (w @ rc**2 - n * mean_r**2) / (n - 1)
    sd = np.sqrt(np.maximum(var, 0.0))
    floor = 1e-9 * float(np.abs(rc).max(initial=0.0))  # a resample of one repeated value
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (w @ np.where(present, d, 0.0)) / (w @ present.astype(np.float64))
        return np.where(sd[:, None] > floor, means / sd[:, None], np.nan)
