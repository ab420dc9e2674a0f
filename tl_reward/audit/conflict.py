"""Reward-term conflict: do two objectives (or two models' heads) pull the same way?

Three views, each saying which it is:

* **geometric**, in the head's own space: the terms' directions are ``W_U`` columns (gain
  folded, centred for LayerNorm; ArmoRM: ``W_reg`` rows, and with ``transformed=True`` also the
  ``T``-transformed directions ``W_U T[:, j]``). The *raw* cosine compares them in residual
  coordinates, which are anisotropic; the *whitened* cosine
  ``w_i' S w_j / sqrt(w_i' S w_i * w_j' S w_j)`` compares them where the normed final residual at
  ``t*`` is isotropic (``S``: its Ledoit-Wolf covariance over a corpus). It equals the
  correlation the two terms' scores would have under ``S``. It gets no interval (NaN, verdict
  ``undetermined``; :data:`NO_WHITENED_INTERVAL`): the shrinkage biases it at any corpus size
  short of ``d``.
* **behavioural**: Pearson correlation of the terms' scores over a corpus, and on preference
  pairs the share of pairs on which the terms disagree against the share expected if their
  preferences were independent (:func:`disagreement_share`).
* **gradient**: per item, the cosine of the two terms' gradients with respect to the residual
  stream at a layer (default 0: the embeddings), over all positions; mean with the interval
  that inverts the sign-flip test.

Verdicts come from an interval and thresholds that are parameters: ``conflict`` when the whole
interval lies below ``conflict``, ``aligned`` when it lies above ``aligned``, ``orthogonal`` when
it lies inside ``(-orthogonal, orthogonal)``, otherwise ``undetermined``. Every verdict row shows
its interval. The published definition: :mod:`tl_reward.compat.published`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from scipy.stats import hypergeom

from tl_reward.audit.cascade import permutation_correlation
from tl_reward.audit.pooled import pooled_residual, resid_hook
from tl_reward.data.preference import PreferencePair
from tl_reward.errors import TLRewardError
from tl_reward.model.heads import LinearRewardHead
from tl_reward.model.readout import is_layernorm, resolve_objectives
from tl_reward.results import ShortRepr, result_type
from tl_reward.stats.estimate import Estimate
from tl_reward.stats.multiplicity import benjamini_hochberg
from tl_reward.stats.paired import share_interval, sign_flip_test
from tl_reward.stats.ranks import paired_arrays


@result_type
@dataclass(frozen=True)
class Thresholds:
    """Verdict thresholds (parameters, not truths): see the module doc."""

    aligned: float = 0.5
    conflict: float = -0.3
    orthogonal: float = 0.2


def verdict(low: float, high: float, t: Thresholds = Thresholds()) -> str:
    """``conflict`` / ``aligned`` / ``orthogonal`` / ``undetermined`` for an interval."""
    if np.isnan(low) or np.isnan(high):
        return "undetermined"
    if high < t.conflict:
        return "conflict"
    if low > t.aligned:
        return "aligned"
    if -t.orthogonal < low and high < t.orthogonal:
        return "orthogonal"
    return "undetermined"


@dataclass(frozen=True)
class Term:
    """One reward term: an objective (name, index or ``"score"``) of a model."""

    model: Any
    objective: int | str
    label: str | None = None

    @property
    def name(self) -> str:
        obj = self.objective if isinstance(self.objective, str) else self.model.objectives[
            self.objective]
        return self.label or str(obj)


def as_terms(model_or_terms: Any, objectives: Sequence[int | str] | None = None) -> list[Term]:
    """Terms from a model (its objectives, default all K) or a list of :class:`Term`."""
    if isinstance(model_or_terms, Sequence):
        terms = list(model_or_terms)
        if not all(isinstance(t, Term) for t in terms):
            raise TLRewardError("pass a model or a list of Term(model, objective)")
    else:
        names = resolve_objectives(model_or_terms, objectives if objectives is not None
                                   else list(model_or_terms.objectives))
        terms = [Term(model_or_terms, n) for n in names]
    if len(terms) < 2:
        raise TLRewardError("conflict needs at least two terms")
    if len({t.name for t in terms}) < len(terms):
        raise TLRewardError("terms need distinct names; give Term(..., label=...)")
    return terms


def same_backbone(a: Any, b: Any) -> bool:
    """True when two models share every weight except the head (``unembed``)."""
    if a is b:
        return True
    sa, sb = a.state_dict(), b.state_dict()
    keys = [k for k in sa if not k.startswith("unembed")]
    if set(keys) != {k for k in sb if not k.startswith("unembed")}:
        return False
    return all(sa[k].shape == sb[k].shape and torch.equal(sa[k], sb[k].to(sa[k].device))
               for k in keys)


def _check_shared_space(terms: Sequence[Term]) -> None:
    first = terms[0].model
    for t in terms[1:]:
        if not same_backbone(first, t.model):
            raise TLRewardError(
                f"term {t.name!r} comes from a model with a different backbone; geometric and "
                "gradient conflict compare directions in one residual space (use the "
                "behavioural view across different models)"
            )


# ----------------------------------------------------------------------------- geometric


def term_directions(terms: Sequence[Term]) -> Float[torch.Tensor, "T d_model"]:
    """Each term's fixed direction in the final residual (``W_U`` column, centred for
    LayerNorm); a prompt-dependent ``"score"`` has none (use the behavioural view)."""
    rows = []
    for t in terms:
        if t.model.reward_head.nonlinear:
            raise TLRewardError(
                f"{t.name!r}: this model's reward head is an MLP, so no objective has a fixed "
                "direction in the residual; use behavioural_conflict or gradient_conflict "
                "(they read the head's exact local linearisation per input)")
        if t.objective == "score":
            head = t.model.reward_head
            weights = getattr(head, "weights", None) if isinstance(head, LinearRewardHead) \
                else None
            if weights is None:
                raise TLRewardError(f"{t.name!r}: the score has no fixed direction (gated or "
                                    "absent); pick objectives or use the behavioural view")
            w = (t.model.W_U.detach().float() @ weights.float().to(t.model.W_U.device))
        else:
            w = t.model.W_U[:, t.model.objective_index(t.objective)].detach().float()
        if is_layernorm(t.model):
            w = w - w.mean()
        rows.append(w)
    return torch.stack(rows)


def armorm_transformed_directions(model: Any) -> tuple[list[str], torch.Tensor]:
    """ArmoRM's ``T``-transformed directions ``W_U T[:, j]`` (one per gate coordinate j)."""
    transform = getattr(model.reward_head, "transform", None)
    if transform is None:
        raise TLRewardError("transformed=True needs an ArmoRM head (with a transform T)")
    w = model.W_U.detach().float() @ transform.float()  # [d, K]: column j = W_U T[:, j]
    if is_layernorm(model):
        w = w - w.mean(0, keepdim=True)
    return [f"T:{o}" for o in model.objectives], w.T


def cosine_matrix(w: Float[torch.Tensor, "T d"],
                  cov: Float[torch.Tensor, "d d"] | None = None) -> torch.Tensor:
    """Pairwise cosines of the rows of ``w`` (float64), in the metric ``cov`` when given."""
    w = w.double()
    g = w @ w.T if cov is None else w @ cov.double().to(w.device) @ w.T
    d = g.diagonal().sqrt()
    return g / (d[:, None] * d[None, :])


class GramLedoitWolf:
    """Whitened cosines under the Ledoit-Wolf covariance ``S`` of any resample of the rows of
    ``h``, without a ``d x d`` matrix: with ``G = Xc Xc'`` (the resample's centred rows, ``n x
    n``), ``tr S = tr G / n``, ``|S|_F^2 = |G|_F^2 / n^2``, ``w' S w = |Xc w|^2 / n``, and
    ``G = C K[idx][:, idx] C`` from ``K = Y Y'`` computed once (``O(n^2 d)``), then ``O(n^2 +
    n T^2)`` per resample. Float64; :func:`~tl_reward.audit.covariance.ledoit_wolf`'s estimator.
    """

    def __init__(self, h: Float[torch.Tensor, "n d"], w: Float[torch.Tensor, "T d"]) -> None:
        h = h.double()
        w = w.double().to(h.device)
        n, self.d = h.shape
        if n < 2:
            raise TLRewardError("a covariance needs at least 2 samples")
        y = h - h.mean(0)
        self.k = (y @ y.T).cpu().numpy()
        self.p = (y @ w.T).cpu().numpy()  # [n, T]
        self.ww = (w @ w.T).cpu().numpy()

    def cosines(self, idx: np.ndarray) -> tuple[np.ndarray, float]:
        """``[T, T]`` whitened cosines for the rows ``idx`` (with repeats) and the shrinkage."""
        n, d = len(idx), self.d
        k = self.k[np.ix_(idx, idx)]
        rm = k.mean(1)
        g = k - rm[:, None] - rm[None, :] + rm.mean()  # C K C
        pc = self.p[idx] - self.p[idx].mean(0)
        mu = np.trace(g) / (n * d)
        delta_ = (g * g).sum() / n**2  # |S|_F^2
        beta_ = (np.diagonal(g) ** 2).sum()
        beta = (beta_ / n - delta_) / (d * n)
        delta = (delta_ - d * mu**2) / d
        beta = min(beta, delta)
        a = 0.0 if beta == 0 else float(beta / delta)
        q = (1 - a) * (pc.T @ pc) / n + a * mu * self.ww
        sd = np.sqrt(np.diagonal(q))
        return q / (sd[:, None] * sd[None, :]), a


@result_type
@dataclass
class PairStat:
    """One statistic for one pair of terms, with its interval and verdict."""

    term_a: str
    term_b: str
    view: str
    value: float
    ci_low: float
    ci_high: float
    verdict: str
    p_value: float = float("nan")
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def estimate(self) -> Estimate:
        """This statistic as an :class:`Estimate` (``n`` is not recorded here: 0)."""
        return Estimate(self.value, self.ci_low, self.ci_high, self.p_value, 0, self.view)


@dataclass(repr=False)
class ConflictResult(ShortRepr):
    """Pairwise conflict statistics of one or more views.

    Attributes:
        terms: the term names.
        stats: one :class:`PairStat` per (pair of terms, view).
        thresholds: the verdict thresholds used.
        meta: e.g. the covariance shrinkage, the corpus size.
    """

    terms: list[str]
    stats: list[PairStat]
    thresholds: Thresholds
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per (pair, view): value, interval, verdict, p-value."""
        return pd.DataFrame([{k: v for k, v in vars(s).items() if k != "extra"} | s.extra
                             for s in self.stats])

    def matrix(self, view: str) -> np.ndarray:
        """``[T, T]`` values of one view (1 on the diagonal, NaN where absent)."""
        idx = {n: i for i, n in enumerate(self.terms)}
        m = np.full((len(self.terms),) * 2, np.nan)
        np.fill_diagonal(m, 1.0)
        for s in self.stats:
            if s.view == view:
                m[idx[s.term_a], idx[s.term_b]] = m[idx[s.term_b], idx[s.term_a]] = s.value
        return m

    @property
    def views(self) -> list[str]:
        return list(dict.fromkeys(s.view for s in self.stats))

    def plot(self, view: str | None = None) -> Any:
        """A heatmap of one view's matrix (default: the first), verdicts and intervals on hover."""
        from tl_reward.viz.conflict import conflict_matrix_figure

        view = view or self.views[0]
        labels = {(s.term_a, s.term_b): f"{s.verdict} [{s.ci_low:+.3f}, {s.ci_high:+.3f}]"
                  for s in self.stats if s.view == view}
        return conflict_matrix_figure(self.matrix(view), self.terms, view, labels)

    def __add__(self, other: ConflictResult) -> ConflictResult:
        return ConflictResult(self.terms, self.stats + other.stats, self.thresholds,
                              {**self.meta, **other.meta})


#: Why the whitened cosine gets no interval.
NO_WHITENED_INTERVAL = (
    "no interval: the Ledoit-Wolf shrinkage biases the whitened cosine toward the raw one short "
    "of about d items, so none reaches its coverage (docs/statistics.md, One interval rule)")


def geometric_conflict(
    model_or_terms: Any, corpus: Sequence[Any] | None = None,
    objectives: Sequence[int | str] | None = None, transformed: bool = False,
    thresholds: Thresholds = Thresholds(), batch_size: int = 8,
    normed: Float[torch.Tensor, "n d_model"] | None = None,
) -> ConflictResult:
    """Raw cosines of the terms' head directions and, with a ``corpus``, cosines whitened by
    the Ledoit-Wolf covariance of the normed final residual at ``t*`` (no interval:
    :data:`NO_WHITENED_INTERVAL`, in ``meta["whitened_ci_reason"]``). ``normed``: that normed
    residual already computed (``pooled_residual(..., normed=True)``, e.g. from a feature
    cache), instead of a corpus. ``transformed=True`` (ArmoRM) adds the ``T``-transformed
    directions as extra terms. No ``d x d`` covariance is formed (:class:`GramLedoitWolf`)."""
    terms = as_terms(model_or_terms, objectives)
    _check_shared_space(terms)
    names = [t.name for t in terms]
    w = term_directions(terms)
    if transformed:
        t_names, t_dirs = armorm_transformed_directions(terms[0].model)
        names, w = names + t_names, torch.cat([w, t_dirs.to(w.device)])
    raw = cosine_matrix(w).cpu().numpy()
    stats = []
    meta: dict[str, Any] = {}
    white = None
    if corpus is not None or normed is not None:
        h = normed.double() if normed is not None else pooled_residual(
            terms[0].model, corpus, batch_size=batch_size, normed=True).double()
        if is_layernorm(terms[0].model):
            h = h - h.mean(-1, keepdim=True)
        white, a = GramLedoitWolf(h, w).cosines(np.arange(len(h)))
        meta |= {"n_corpus": len(h), "shrinkage": a, "whitened_ci_reason": NO_WHITENED_INTERVAL}
    for i, j in combinations(range(len(names)), 2):
        v = float(raw[i, j])
        stats.append(PairStat(names[i], names[j], "raw cosine", v, v, v,
                              verdict(v, v, thresholds)))
        if white is not None:
            stats.append(PairStat(names[i], names[j], "whitened cosine", float(white[i, j]),
                                  math.nan, math.nan, "undetermined"))
    return ConflictResult(names, stats, thresholds, meta)


# ----------------------------------------------------------------------------- behavioural


def score_correlation(a: Any, b: Any, n_permutations: int = 2000, seed: int = 0) -> Estimate:
    """Pearson correlation of paired scores by the one permutation-correlation test
    (:func:`~tl_reward.audit.cascade.permutation_correlation`: two-sided p exact over every
    pairing up to 8 items, else ``(1 + #{|r*| >= |r|}) / (1 + B)``; jackknife Fisher-z CI
    over items from 10 items)."""
    a, b = paired_arrays(a, b, 3, "score")
    return permutation_correlation(a, b, "pearson", n_permutations, seed=seed)


def pair_correlation(
    scores: Sequence[Any], names: Sequence[str], thresholds: Thresholds = Thresholds(),
    n_permutations: int = 2000, seed: int = 0,
) -> list[PairStat]:
    """:func:`score_correlation` for every pair of terms' scores over one corpus (``scores[k]``:
    term ``k``'s score per item), each with the thresholds' verdict on its CI (no
    p-value enters the verdict, so no multiplicity adjustment; the p is the raw one)."""
    cs = [(i, j, score_correlation(scores[i], scores[j], n_permutations, seed))
          for i, j in combinations(range(len(scores)), 2)]
    return [PairStat(names[i], names[j], "score correlation", c.value, c.ci_low, c.ci_high,
                     verdict(c.ci_low, c.ci_high, thresholds), c.p_value) for i, j, c in cs]


def _disagree(ma: np.ndarray, mb: np.ndarray) -> np.ndarray:
    return ((ma * mb) < 0).mean(-1)


def _expected_disagree(ma: np.ndarray, mb: np.ndarray) -> np.ndarray:
    pa, qa = (ma > 0).mean(-1), (ma < 0).mean(-1)
    pb, qb = (mb > 0).mean(-1), (mb < 0).mean(-1)
    return pa * qb + qa * pb


@dataclass
class Disagreement:
    """Share of pairs on which two terms prefer opposite replies.

    ``share`` with its exact binomial (Clopper-Pearson) CI; ``expected``: the share if the
    terms' preferences were independent (from each term's own share of chosen/rejected
    preferences); ``excess = share - expected``, without an interval (its inference is the
    exact permutation ``p_value`` of ``excess = 0``).
    """

    share: float
    ci_low: float
    ci_high: float
    expected: float
    excess: float
    p_value: float
    p_value_conservative: float
    n: int

    @property
    def estimate(self) -> Estimate:
        """The share as an :class:`Estimate` (p: the mid-p permutation test of no excess)."""
        return Estimate(self.share, self.ci_low, self.ci_high, self.p_value, self.n,
                        "Clopper-Pearson over pairs; mid-p permutation test")


def _exact_p(a_pos: np.ndarray, b_neg: np.ndarray, x_obs: np.ndarray, n: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """Mid and conservative two-sided p-values of ``X = #(a > 0, b < 0)`` for pairs of terms
    without zero margins (fixed sign margins make X hypergeometric), one ``hypergeom.pmf`` call
    for all pairs. The deviation is ``|share - expected| = 2 |X - a_pos b_neg / n| / n``."""
    lo, hi = np.maximum(0, a_pos + b_neg - n), np.minimum(a_pos, b_neg)
    size = hi - lo + 1
    pair = np.repeat(np.arange(len(size)), size)
    x = lo[pair] + np.arange(int(size.sum())) - np.repeat(np.cumsum(size) - size, size)
    weight = hypergeom.pmf(x, n[pair], b_neg[pair], a_pos[pair])
    centre = 2 * a_pos * b_neg / n
    dev = np.abs(2 * x - centre[pair]) / n[pair]
    obs = (np.abs(2 * x_obs - centre) / n)[pair]
    greater = np.bincount(pair, weight * (dev > obs + 1e-12), minlength=len(size))
    ties = np.bincount(pair, weight * (np.abs(dev - obs) <= 1e-12), minlength=len(size))
    return greater + ties / 2, greater + ties


def _disagreement(ma: np.ndarray, mb: np.ndarray, p_mid: float, p_conservative: float
                  ) -> Disagreement:
    share, exp = float(_disagree(ma, mb)), float(_expected_disagree(ma, mb))
    lo, hi = share_interval(int(((ma * mb) < 0).sum()), 0, len(ma))
    return Disagreement(share, lo, hi, exp, share - exp, float(p_mid), float(p_conservative),
                        len(ma))


def disagreement_share(margins_a: Any, margins_b: Any, n_permutations: int = 2000,
                       seed: int = 0) -> Disagreement:
    """Disagreement of two terms over preference pairs from their margins
    ``r(chosen) - r(rejected)`` (a margin of exactly 0 prefers neither reply). The permutation
    test shuffles one term's margins across pairs. Without zero margins the sign table is 2 x 2
    with fixed margins, so ``#(a > 0, b < 0)`` is hypergeometric and the p-values are exact
    (every permutation); with zeros, ``n_permutations`` Monte Carlo shuffles."""
    ma, mb = paired_arrays(margins_a, margins_b, 2, "margin")
    n = len(ma)
    if (ma != 0).all() and (mb != 0).all():
        mid, cons = _exact_p(np.array([(ma > 0).sum()]), np.array([(mb < 0).sum()]),
                             np.array([((ma > 0) & (mb < 0)).sum()]), np.array([n]))
        return _disagreement(ma, mb, mid[0], cons[0])
    exp = float(_expected_disagree(ma, mb))
    perm = np.argsort(np.random.default_rng(seed).random((n_permutations, n)), axis=1)
    dev = np.abs(_disagree(np.broadcast_to(ma, (n_permutations, n)), mb[perm]) - exp)
    dev = np.append(dev, abs(float(_disagree(ma, mb)) - exp))  # the observed counted
    obs = dev[-1]
    greater = float((dev > obs + 1e-12).sum()) / (n_permutations + 1)
    ties = float((np.abs(dev - obs) <= 1e-12).sum()) / (n_permutations + 1)
    return _disagreement(ma, mb, greater + ties / 2, greater + ties)


def _disagreements(margins: Sequence[Any], pairs: Sequence[tuple[int, int]],
                   n_permutations: int, seed: int) -> list[Disagreement]:
    """:func:`disagreement_share` of each pair of ``margins``; the exact p-values of all pairs
    without zero margins in one :func:`_exact_p` call (the same numbers, fewer scipy calls)."""
    arrays = [paired_arrays(margins[i], margins[j], 2, "margin") for i, j in pairs]
    exact = [k for k, (ma, mb) in enumerate(arrays) if (ma != 0).all() and (mb != 0).all()]
    p: dict[int, tuple[float, float]] = {}
    if exact:
        cols = [np.array(v) for v in zip(*[
            ((ma > 0).sum(), (mb < 0).sum(), ((ma > 0) & (mb < 0)).sum(), len(ma))
            for ma, mb in (arrays[k] for k in exact)], strict=True)]
        p = dict(zip(exact, zip(*_exact_p(*cols), strict=True), strict=True))
    return [_disagreement(ma, mb, *p[k]) if k in p
            else disagreement_share(ma, mb, n_permutations, seed)
            for k, (ma, mb) in enumerate(arrays)]


def _term_scores(term: Term, inputs: Sequence[Any], batch_size: int) -> np.ndarray:
    res = term.model.rewards(list(inputs), batch_size=batch_size, progress=False)
    return res.values(term.objective).double().cpu().numpy()


def _pair_inputs(pairs: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    chosen, rejected = [], []
    for p in pairs:
        if isinstance(p, PreferencePair):
            chosen.append(p.chosen_conversation())
            rejected.append(p.rejected_conversation())
        elif isinstance(p, tuple) and len(p) == 3:
            chosen.append((p[0], p[1]))
            rejected.append((p[0], p[2]))
        else:
            raise TLRewardError("pairs must be PreferencePair or (prompt, chosen, rejected)")
    return chosen, rejected


def pair_disagreement(
    margins: Sequence[Any], names: Sequence[str], alpha: float = 0.05,
    n_permutations: int | None = None, seed: int = 0,
) -> tuple[list[PairStat], dict[str, Any]]:
    """:func:`disagreement_share` for every pair of terms' margins, with verdicts controlled
    for multiplicity: the family is all ``T(T-1)/2`` pair tests, the permutation p-values are
    Benjamini-Hochberg adjusted (``extra["p_adjusted"]``; FDR at ``alpha``) and a verdict other
    than ``no evidence`` needs ``p_adjusted < alpha``. The p-values are exact unless a margin is
    0; then ``n_permutations`` (default ``max(2000, 10 T(T-1)/2 / alpha)``, so that BH can pass)
    Monte Carlo shuffles. Returns the rows and the family stated."""
    pairs = list(combinations(range(len(margins)), 2))
    if n_permutations is None:
        n_permutations = max(2000, math.ceil(10 * len(pairs) / alpha))
    elif pairs and 1 / (1 + n_permutations) >= alpha / len(pairs) and any(
            (np.asarray(m) == 0).any() for m in margins):
        warnings.warn(f"{len(pairs)} pair tests with {n_permutations} permutations: the "
                      f"smallest p-value cannot pass Benjamini-Hochberg's first step (alpha / "
                      f"{len(pairs)}); raise n_permutations above {int(len(pairs) / alpha)}",
                      RuntimeWarning, stacklevel=2)
    ds = _disagreements(margins, pairs, n_permutations, seed)
    adjusted = benjamini_hochberg([d.p_value for d in ds]) if ds else np.array([])
    rows = []
    for (i, j), d, q in zip(pairs, ds, adjusted, strict=True):
        v = ("conflict" if d.excess > 0 else "aligned") if q < alpha else "no evidence"
        rows.append(PairStat(names[i], names[j], "pair disagreement", d.share, d.ci_low,
                             d.ci_high, v, d.p_value,
                             {"expected": d.expected, "excess": d.excess,
                              "p_adjusted": float(q)}))
    family = {"tests": len(ds), "adjustment": "Benjamini-Hochberg (FDR)", "alpha": alpha,
              "hypotheses": "no excess disagreement, every pair of terms"}
    return rows, family


def behavioural_conflict(
    model_or_terms: Any, corpus: Sequence[Any] | None = None, pairs: Sequence[Any] | None = None,
    objectives: Sequence[int | str] | None = None, thresholds: Thresholds = Thresholds(),
    alpha: float = 0.05, n_permutations: int | None = None, seed: int = 0,
    batch_size: int = 8,
) -> ConflictResult:
    """Score correlation over ``corpus`` and disagreement over preference ``pairs`` (either or
    both). Terms may come from different models. The correlation's verdict uses the thresholds
    on its CI; the disagreement's verdict is ``conflict`` (more disagreement than independent
    terms would show) or ``aligned`` (less) when its Benjamini-Hochberg adjusted p < ``alpha``
    over the family of all ``T(T-1)/2`` pair tests (see :func:`pair_disagreement`), else
    ``no evidence``; ``meta["pair disagreement family"]`` states the family. ``n_permutations``:
    the correlation's (default 2000) and the disagreement's (see :func:`pair_disagreement`)."""
    if corpus is None and pairs is None:
        raise TLRewardError("pass corpus= (inputs to score) and/or pairs= (preference pairs)")
    terms = as_terms(model_or_terms, objectives)
    names = [t.name for t in terms]
    stats: list[PairStat] = []
    meta: dict[str, Any] = {}
    if corpus is not None:
        scores = [_term_scores(t, corpus, batch_size) for t in terms]
        meta["n_corpus"] = len(corpus)
        stats.extend(pair_correlation(scores, names, thresholds, n_permutations or 2000, seed))
    if pairs is not None:
        chosen, rejected = _pair_inputs(pairs)
        margins = [_term_scores(t, chosen, batch_size) - _term_scores(t, rejected, batch_size)
                   for t in terms]
        meta["n_pairs"] = len(pairs)
        pair_stats, meta["pair disagreement family"] = pair_disagreement(
            margins, names, alpha, n_permutations, seed)
        stats.extend(pair_stats)
    return ConflictResult(names, stats, thresholds, meta)


# ----------------------------------------------------------------------------- gradient


def input_gradients(term: Term, item: Any, layer: int = 0) -> Float[torch.Tensor, "pos d"]:
    """``d term / d resid`` at ``layer`` (all positions) for one unpadded input, float32."""
    model = term.model
    enc = model.encode(item)
    tokens = torch.tensor([enc.ids], device=model.cfg.device)
    mask = torch.ones_like(tokens)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, attention_mask=mask, return_type=None,
                                        names_filter=lambda n: n == resid_hook(model, layer))
    start = cache[resid_hook(model, layer)].detach().clone().requires_grad_(True)
    kind = "score" if term.objective == "score" else "reward"
    out = model(start, start_at_layer=min(layer, model.cfg.n_layers), tokens=tokens,
                attention_mask=mask, return_type=kind)
    value = out[0] if kind == "score" else out[0, model.objective_index(term.objective)]
    (g,) = torch.autograd.grad(value.float(), start)
    return g[0].float()


def gradient_conflict(
    model_or_terms: Any, items: Sequence[Any], objectives: Sequence[int | str] | None = None,
    layer: int = 0, thresholds: Thresholds = Thresholds(), n_permutations: int = 9_999,
    seed: int = 0,
) -> ConflictResult:
    """Per item, cosine of the terms' gradients w.r.t. the residual at ``layer`` (flattened
    over positions); mean over items with the interval that inverts the sign-flip test (none
    below 6 items); per-item cosines in ``meta``."""
    terms = as_terms(model_or_terms, objectives)
    _check_shared_space(terms)
    names = [t.name for t in terms]
    per_item = np.empty((len(items), len(terms), len(terms)))
    for k, item in enumerate(items):
        g = torch.stack([input_gradients(t, item, layer).flatten() for t in terms]).double()
        per_item[k] = cosine_matrix(g).cpu().numpy()
    stats = []
    for i, j in combinations(range(len(terms)), 2):
        x = per_item[:, i, j]
        t = sign_flip_test(x, n_permutations=n_permutations, seed=seed)
        stats.append(PairStat(names[i], names[j], "gradient cosine", t.mean, t.ci_low,
                              t.ci_high, verdict(t.ci_low, t.ci_high, thresholds),
                              extra={"share_negative": float((x < 0).mean())}))
    return ConflictResult(names, stats, thresholds, {"gradient_cosines": per_item,
                                                     "gradient_layer": layer})
