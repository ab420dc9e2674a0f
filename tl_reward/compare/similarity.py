"""Similarity of two representations of the same n items: RV, RV2, linear CKA, debiased CKA.

Inputs are ``X [n, p]`` and ``Y [n, q]`` (numpy arrays or torch tensors, any dtype; float64
inside). Every measure is the cosine ``<T(K), T(L)>_F / (||T(K)|| ||T(L)||)`` of two transformed
``n x n`` Gram matrices ``K = X X'`` and ``L = Y Y'``, so nothing of size ``p x q`` is ever
formed and the cost is ``O(n^2 (p + q))``:

* ``rv``: ``T(K) = H K H`` (``H = I - 11'/n``), the Gram of the **column-centred** data.
* ``linear_cka``: Kornblith et al.'s linear CKA (``H`` applied to the uncentred Gram); equals
  ``rv``.
* ``rv2`` (Smilde et al. 2009, the seeds' coefficient): ``T(K) = XX' - diag(XX')`` on centred
  data (hoggorm's ``RV2coeff`` does not centre); biased upward when p >> n.
* ``debiased_cka``: CKA from Song et al.'s unbiased HSIC (U-centring); about 0 for independent
  data at any n, p.

Set ``centre=False`` on ``rv`` / ``rv2`` to reproduce the uncentred coefficient (1.0 on data
sharing a large mean offset, the trap residual streams fall into).

What a high similarity licenses: the two representations have a similar geometry over these
items (their Gram matrices align), not that the models use the same mechanism.

Example:
    >>> debiased_cka(X, Y)                               # the headline measure
    >>> permutation_test("rv2", X, Y, n_permutations=999, seed=0).p_value
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from tl_reward.errors import TLRewardError, check_choice
from tl_reward.results import ShortRepr
from tl_reward.stats.ranks import as_array

MEASURES: tuple[str, ...] = ("rv", "rv2", "linear_cka", "debiased_cka")
Matrix = np.ndarray | torch.Tensor


def _check_pair(X: Matrix, Y: Matrix) -> tuple[np.ndarray, np.ndarray]:
    """X and Y as 2-D float64 numpy copies (a 1-D input becomes one column), checked."""
    x, y = as_array(X), as_array(Y)
    for name, arr in (("X", x), ("Y", y)):
        if arr.ndim not in (1, 2):
            raise TLRewardError(f"{name} must be a [n, p] matrix, got shape {arr.shape}")
        if not np.isfinite(arr).all():
            raise TLRewardError(f"{name} has NaN or infinite values; drop or fix those rows first")
    x, y = (a[:, None] if a.ndim == 1 else a for a in (x, y))
    if x.shape[0] != y.shape[0]:
        raise TLRewardError(f"X and Y must describe the same items (rows): {x.shape[0]} rows vs "
                            f"{y.shape[0]}")
    if x.shape[0] < 4:
        raise TLRewardError(f"need at least 4 items (rows) to compare, got {x.shape[0]}")
    return x, y


def gram(x: np.ndarray, centre: bool = True) -> np.ndarray:
    """``X X'`` (``[n, n]``, float64) of the column-centred (``centre=True``) or raw rows."""
    if centre:
        x = x - x.mean(0, keepdims=True)
    return x @ x.T


def double_centre(k: np.ndarray) -> np.ndarray:
    """``H K H``: the Gram of column-centred data when ``K = X X'``."""
    k = k - k.mean(0, keepdims=True)
    return k - k.mean(1, keepdims=True)


def zero_diagonal(k: np.ndarray) -> np.ndarray:
    """``K - diag(K)``."""
    k = k.copy()
    np.fill_diagonal(k, 0.0)
    return k


def u_centre(k: np.ndarray) -> np.ndarray:
    """U-centring (Szekely & Rizzo 2014; Kornblith's ``center_gram(unbiased=True)``).

    Off the diagonal ``K~_ij = K_ij - r_i - r_j + s`` with ``r_i = sum_{l != i} K_il / (n - 2)``
    and ``s = sum_{k != l} K_kl / ((n - 1)(n - 2))``; the diagonal is 0. Then
    ``<U(K), U(L)> / (n (n - 3))`` is Song et al.'s unbiased HSIC.
    """
    n = k.shape[0]
    if n < 4:
        raise TLRewardError(f"debiased CKA needs at least 4 items, got {n}")
    k = zero_diagonal(k)
    row = k.sum(0) / (n - 2)
    total = k.sum() / ((n - 1) * (n - 2))
    out = k - row[:, None] - row[None, :] + total
    np.fill_diagonal(out, 0.0)
    return out


def transform_gram(k: np.ndarray, measure: str) -> np.ndarray:
    """The transformed Gram whose cosine is ``measure``; ``k`` is the **centred-data** Gram
    (``gram(x, centre=True)``) for every measure but ``linear_cka``, which centres ``k`` itself
    (idempotent on an already centred Gram)."""
    transforms = {"rv": np.asarray, "rv2": zero_diagonal, "linear_cka": double_centre,
                  "debiased_cka": u_centre}
    check_choice(measure, transforms, "measure")
    return transforms[measure](k)


def gram_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """``<A, B>_F / (||A|| ||B||)``; NaN when either is all zero (a constant representation)."""
    na, nb = float(np.sqrt((a * a).sum())), float(np.sqrt((b * b).sum()))
    if na == 0.0 or nb == 0.0:
        return float("nan")
    return float((a * b).sum() / (na * nb))


def _measure(x: Matrix, y: Matrix, measure: str, centre: bool = True) -> float:
    a, b = _check_pair(x, y)
    centre = centre and measure != "linear_cka"  # linear CKA: HSIC on the raw Gram, with H
    return gram_cosine(transform_gram(gram(a, centre), measure),
                       transform_gram(gram(b, centre), measure))


def rv(X: Float[Matrix, "n p"], Y: Float[Matrix, "n q"], centre: bool = True) -> float:
    """RV coefficient ``tr(XX'YY') / sqrt(tr((XX')^2) tr((YY')^2))`` of column-centred X, Y
    (``centre=False``: of the raw matrices). In [0, 1]."""
    return _measure(X, Y, "rv", centre)


def rv2(X: Float[Matrix, "n p"], Y: Float[Matrix, "n q"], centre: bool = True) -> float:
    """Modified RV (Smilde et al. 2009): RV with ``XX'`` replaced by ``XX' - diag(XX')``, on
    column-centred X, Y (``centre=False``: raw, as hoggorm's ``RV2coeff``). In [-1, 1]; biased
    upward when p >> n (about 0.9 on independent data at n = 20, p = 4096)."""
    return _measure(X, Y, "rv2", centre)


def linear_cka(X: Float[Matrix, "n p"], Y: Float[Matrix, "n q"]) -> float:
    """Linear CKA, ``HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))`` with ``HSIC = tr(KHLH)``;
    centring happens through ``H``, and the value equals ``rv`` of the centred data."""
    return _measure(X, Y, "linear_cka")


def debiased_cka(X: Float[Matrix, "n p"], Y: Float[Matrix, "n q"]) -> float:
    """Debiased linear CKA: CKA with Song et al.'s unbiased HSIC estimator (U-centred Grams).
    About 0 on independent data at any n and p (needs n >= 4); invariant to column means."""
    return _measure(X, Y, "debiased_cka")


SIMILARITIES: dict[str, Callable[[Matrix, Matrix], float]] = {
    "rv": rv, "rv2": rv2, "linear_cka": linear_cka, "debiased_cka": debiased_cka}


@dataclass(repr=False)
class PermutationResult(ShortRepr):
    """A permutation test of a similarity: rows of Y are permuted B times.

    Attributes:
        measure: the statistic's name.
        observed: its value on the paired data.
        null: ``[B]`` its values with Y's rows permuted (the pairing broken).
        p_value: ``(1 + #{null >= observed}) / (1 + B)``, one-sided (similarity above chance).
    """

    measure: str
    observed: float
    null: np.ndarray = field(repr=False)
    p_value: float

    @property
    def null_mean(self) -> float:
        """Mean of the null: the value expected from unpaired data of this n, p, q."""
        return float(np.mean(self.null))

    @property
    def null_sd(self) -> float:
        return float(np.std(self.null, ddof=1)) if len(self.null) > 1 else float("nan")

    @property
    def excess(self) -> float:
        """``observed - null_mean``: similarity beyond what unpaired data gives."""
        return self.observed - self.null_mean

    @property
    def n_permutations(self) -> int:
        return len(self.null)

    def to_dataframe(self) -> pd.DataFrame:
        """One row: measure, observed, null mean and SD, observed minus null mean, p, B."""
        return pd.DataFrame([{"measure": self.measure, "observed": self.observed,
                              "null_mean": self.null_mean, "null_sd": self.null_sd,
                              "excess": self.excess, "p_value": self.p_value,
                              "n_permutations": self.n_permutations}])

    def plot(self) -> Any:
        """Histogram of the null with the observed value marked (plotly)."""
        from tl_reward.viz.compare import plot_permutation_null

        return plot_permutation_null(self.null, self.observed, self.measure, self.p_value)


def permutations(n: int, n_permutations: int, seed: int) -> np.ndarray:
    """``[B, n]`` seeded random row permutations."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(n) for _ in range(n_permutations)]) if n_permutations \
        else np.zeros((0, n), dtype=np.int64)


def permutation_test(
    stat: str | Callable[[np.ndarray, np.ndarray], float], X: Float[Matrix, "n p"],
    Y: Float[Matrix, "n q"], n_permutations: int = 999, seed: int = 0,
) -> PermutationResult:
    """Permutation null of a similarity: permute the rows of Y, B times.

    ``stat`` is a measure name (``"rv"``, ``"rv2"``, ``"linear_cka"``, ``"debiased_cka"``;
    fast path: the Grams are built once and permuted, ``P L P'``) or any callable
    ``(X, Y) -> float`` on float64 arrays. Returns observed, the null, its mean and
    ``p = (1 + #{null >= obs}) / (1 + B)``.
    """
    if n_permutations < 1:
        raise TLRewardError("n_permutations must be at least 1 (999 is usual)")
    x, y = _check_pair(X, Y)
    perms = permutations(x.shape[0], n_permutations, seed)
    if isinstance(stat, str):
        if stat not in MEASURES:
            raise TLRewardError(f"unknown measure {stat!r}; choose one of {MEASURES} or pass a "
                                "callable (X, Y) -> float")
        name = stat
        ta = transform_gram(gram(x), stat)
        tb = transform_gram(gram(y), stat)
        observed = gram_cosine(ta, tb)
        # every transform commutes with a row permutation: T(P L P') = P T(L) P'
        null = np.array([gram_cosine(ta, tb[np.ix_(p, p)]) for p in perms])
    else:
        name = getattr(stat, "__name__", "statistic")
        observed = float(stat(x, y))
        null = np.array([float(stat(x, y[p])) for p in perms])
    tol = 1e-12 * max(1.0, abs(observed))  # ties up to float error count as >= (conservative)
    p = (1 + np.sum(null >= observed - tol)) / (1 + len(null))  # NaN when observed is NaN
    return PermutationResult(name, observed, null, float("nan") if np.isnan(observed) else float(p))
