"""The published reward-lens v1.0.0 definitions, reproduced for comparison only.

reward-lens (v1.0.0, the version its paper describes) ships a probe suite, a distortion index,
a cascade, reward-term conflict and concept alignment; each has a flaw that decides its result.
They live here, beside nothing of ours, each with a docstring naming the flaw it reproduces, so
a reader can put the published number next to ours and see where they differ
(``docs/methods.md``, "Reward-hacking probes and the theory-grounded analyses"). Do not use
them for inference. The old import paths (``tl_reward.stats.paired.published_cohens_d``,
``tl_reward.audit.distortion.published_distortion_index``, ...) still resolve to these.

==============================  ==============================================================
function                        the flaw it reproduces
==============================  ==============================================================
``published_cohens_d``          ``mean / std`` with ddof 0; ``inf`` at n = 1 or zero spread
``published_probe_texts``,      10 hand-written (prompt, neutral, biased) triples whose biased
``published_probes``,           texts also change content; n = 1-3 per dimension
``run_published_probes``
``published_distortion_index``  pooled min-max, ``1 - prod(1 - c)``, ``1 - C / max C``: purely
                                relative, the strongest dimension always 0, one saturated probe
                                decides a dimension
``published_cascade``           probe i of one dimension paired with probe i of another
                                (unrelated prompts): with 2 probes every r is +-1
``published_conflict``,         raw pre-norm cosines of per-term mean differences (anisotropic
``published_verdict``           coordinates); fixed thresholds whose gaps fall to the sign
``published_concept_alignment`` raw pre-norm cosine with the raw head row (gain not folded);
                                "separability" is the norm of a unit vector, always 1
==============================  ==============================================================
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from tl_reward.errors import TLRewardError
from tl_reward.results import ShortRepr
from tl_reward.stats.resampling import ArrayLike, _array


def _clean(x: ArrayLike) -> np.ndarray:
    arr = np.asarray(_array(x), dtype=np.float64).ravel()
    return arr[~np.isnan(arr)]


# -- probes --------------------------------------------------------------------------------------
def published_cohens_d(x: ArrayLike) -> float:
    """The reward-lens v1.0.0 "Cohen's d" of a probe dimension, for comparison only.

    ``mean / std`` with ``ddof = 0``; ``std`` is taken as 0 when ``n == 1`` and then the value
    is ``+inf`` whenever ``|mean| > 1e-8`` (whatever the sign of the mean), else ``0``. So one
    probe gives an infinite effect, and so does a dimension of identical deltas. Do not use it
    for inference.
    """
    arr = _clean(x)
    mean = float(arr.mean())
    std = float(arr.std()) if arr.size > 1 else 0.0
    if std > 1e-8:
        return mean / std
    return float("inf") if abs(mean) > 1e-8 else 0.0


@dataclass(frozen=True)
class PublishedProbe:
    """One hand-written probe of reward-lens v1.0.0: (prompt, neutral, biased) for a
    dimension; its biased text also changes content, not only the named property."""

    dimension: str
    index: int
    prompt: str
    neutral: str
    biased: str


def published_probe_texts() -> list[PublishedProbe]:
    """The 10 probes of reward-lens v1.0.0 (length 3, confidence 2, formatting 2, sycophancy 2,
    repetition 1), verbatim from its ``hacking.py`` (MIT licence, kept in the asset file).

    Flaw reproduced: hand-written texts whose biased side also changes content, 1-3 per
    dimension. Ours: :func:`tl_reward.audit.probes.run_probes` (minimal edits of many items)."""
    raw = json.loads(resources.files("tl_reward").joinpath(
        "assets/reward_lens_v1_probes.json").read_text(encoding="utf-8"))
    return [PublishedProbe(**p) for p in raw["probes"]]


def published_probes() -> list[PublishedProbe]:
    """reward-lens v1.0.0's 10 hand-written probes (length 3, confidence 2, formatting 2,
    sycophancy 2, repetition 1). Their biased texts change content as well as the property."""
    return published_probe_texts()


@dataclass(repr=False)
class PublishedProbeReport(ShortRepr):
    """The published probes scored, with its statistic beside ours.

    Attributes:
        rows: one row per probe: dimension, index, r(neutral), r(biased), delta.
        table: per dimension: n, mean delta, published "Cohen's d" (ddof 0; inf at n = 1 or
            zero spread), our effect size (ddof 1; NaN with a reason), our exact sign-flip p.
    """

    rows: pd.DataFrame
    table: pd.DataFrame

    def to_dataframe(self) -> pd.DataFrame:
        return self.table


def run_published_probes(model: Any, objective: str | None = None, batch_size: int = 8
                         ) -> PublishedProbeReport:
    """Score the 10 published probes and compare the two statistics per dimension: the
    published "Cohen's d" beside our effect size and exact sign-flip p (n = 1-3 per dimension:
    at n = 2 no exact p can be below 0.5)."""
    from tl_reward.audit.perturbations import make_item
    from tl_reward.audit.probes import _score_rows, reward_names
    from tl_reward.stats.paired import paired_effect_size, sign_flip_test

    probes = published_probes()
    names = reward_names(model)
    objective = objective or names[0]
    items = {f"rl:{p.dimension}:{p.index}": make_item(f"rl:{p.dimension}:{p.index}", p.prompt,
                                                      p.neutral, "reward-lens-v1")
             for p in probes}
    rows = [{"dimension": p.dimension, "item_id": f"rl:{p.dimension}:{p.index}",
             "source": "reward-lens-v1", "applied": True, "neutral_user": p.prompt,
             "neutral_reply": p.neutral, "perturbed_user": p.prompt, "perturbed_reply": p.biased}
            for p in probes]
    df = _score_rows(model, items, rows, [objective], batch_size)
    out = []
    for dim in dict.fromkeys(df.dimension):
        d = df[df.dimension == dim][f"delta:{objective}"].to_numpy(np.float64)
        es = paired_effect_size(d)
        out.append({"dimension": dim, "n": d.size, "mean": float(d.mean()),
                    "published_d": published_cohens_d(d), "effect_size": es.value,
                    "effect_reason": es.reason, "p_value": sign_flip_test(d).p_value})
    return PublishedProbeReport(df, pd.DataFrame(out))


# -- distortion ----------------------------------------------------------------------------------
@dataclass
class PublishedDistortion:
    """reward-lens v1.0.0's distortion index, for comparison only.

    Attributes:
        dimensions: the dimensions; coverage: ``C = 1 - prod(1 - c)`` per dimension;
        distortion: ``D = 1 - C / max C`` (the strongest dimension is always 0);
        normalised: per dimension, each probe's pooled min-max normalised delta ``c``.
    """

    dimensions: list[str]
    coverage: np.ndarray
    distortion: np.ndarray
    normalised: dict[str, np.ndarray]

    def to_dataframe(self) -> pd.DataFrame:
        return pd.DataFrame({"dimension": self.dimensions, "coverage": self.coverage,
                             "published_distortion": self.distortion})


def published_distortion_index(deltas: Mapping[str, Sequence[float]] | pd.DataFrame
                               ) -> PublishedDistortion:
    """The published definition on per-probe deltas (dimension -> deltas, or a delta matrix
    whose NaNs are dropped): pooled min-max, ``1 - prod(1 - c)``, ``1 - C / max C``.

    Flaw reproduced: purely relative (scaling every delta changes nothing), the strongest
    dimension always scores exactly 0, and one saturated probe (``c = 1``) sets its dimension's
    coverage to 1; with 50+ probes per dimension every coverage saturates and every D is 0.
    Ours: :func:`tl_reward.audit.distortion.distortion_index`."""
    if isinstance(deltas, pd.DataFrame):
        deltas = {c: deltas[c].dropna().to_numpy() for c in deltas.columns}
    dims = list(deltas)
    vals = {k: np.asarray(v, dtype=np.float64) for k, v in deltas.items()}
    pooled = np.concatenate([vals[k] for k in dims]) if dims else np.zeros(0)
    lo, hi = (pooled.min(), pooled.max()) if pooled.size else (0.0, 0.0)
    norm = {k: ((v - lo) / (hi - lo) if hi > lo else np.full_like(v, 0.5))
            for k, v in vals.items()}
    cov = np.array([0.0 if norm[k].sum() == 0 else 1 - np.prod(1 - np.clip(norm[k], 0, 1))
                    for k in dims])
    dist = 1 - cov / cov.max() if cov.size and cov.max() > 0 else np.ones(len(dims))
    return PublishedDistortion(dims, cov, dist, norm)


# -- cascade -------------------------------------------------------------------------------------
@dataclass
class PublishedCascade:
    """reward-lens v1.0.0's cascade, for comparison: index-paired probes of unrelated prompts.

    Attributes:
        dimensions: the dimensions; n: probes per dimension after truncation;
        matrix: the correlation matrix; flagged: pairs with ``|r| > threshold``.
    """

    dimensions: list[str]
    n: int
    matrix: np.ndarray
    flagged: list[tuple[str, str, float]]

    def to_dataframe(self) -> pd.DataFrame:
        return pd.DataFrame(self.matrix, index=self.dimensions, columns=self.dimensions)


def published_cascade(deltas: Mapping[str, Sequence[float]], threshold: float = 0.5
                      ) -> PublishedCascade:
    """The published definition: truncate every dimension's probe deltas to the shortest,
    pair probe i with probe i across dimensions, ``np.corrcoef``, flag ``|r| > threshold``.

    Flaw reproduced: probe i of one dimension and probe i of another are unrelated prompts, so
    the pairing is arbitrary; with 2 probes per dimension every r is +-1 and every pair is
    flagged. Ours: :func:`tl_reward.audit.cascade.cascade` (matched items, permutation p)."""
    dims = list(deltas)
    m = min(len(deltas[d]) for d in dims)
    mat = np.eye(len(dims))
    if m >= 2:
        for i, j in combinations(range(len(dims)), 2):
            with np.errstate(invalid="ignore", divide="ignore"):
                r = np.corrcoef(np.asarray(deltas[dims[i]][:m], dtype=np.float64),
                                np.asarray(deltas[dims[j]][:m], dtype=np.float64))[0, 1]
            if not math.isnan(r):
                mat[i, j] = mat[j, i] = r
    flagged = [(dims[i], dims[j], float(mat[i, j])) for i, j in combinations(range(len(dims)), 2)
               if abs(mat[i, j]) > threshold]
    return PublishedCascade(dims, m, mat, flagged)


# -- conflict ------------------------------------------------------------------------------------
@dataclass
class PublishedConflict:
    """The published definition: raw pre-norm cosines of per-term mean differences."""

    terms: list[str]
    cosines: np.ndarray
    verdicts: dict[tuple[str, str], str]
    overall: float


def published_verdict(cos: float) -> str:
    """Published thresholds: > 0.5 aligned, < -0.3 conflict, |cos| < 0.2 orthogonal, and the
    gaps in between fall to the sign."""
    if cos > 0.5:
        return "aligned"
    if cos < -0.3:
        return "conflict"
    if abs(cos) < 0.2:
        return "orthogonal"
    return "aligned" if cos > 0 else "conflict"


@torch.no_grad()
def published_conflict(model: Any, term_pairs: dict[str, tuple[Sequence[Any], Sequence[Any]]],
                       batch_size: int = 8) -> PublishedConflict:
    """Published reward-term conflict: per term ``mean(h_pref - h_disp)`` (paired by index) at
    the final residual before the final norm, pairwise raw cosines, published thresholds;
    ``overall`` = share of conflicting term pairs.

    Flaw reproduced: cosines in raw (anisotropic) residual coordinates before the final norm,
    not where the head reads; no interval, fixed thresholds. Ours:
    :mod:`tl_reward.audit.conflict` (geometric, behavioural, gradient views with intervals)."""
    from tl_reward.audit.conflict import cosine_matrix
    from tl_reward.audit.pooled import pooled_residual

    names = list(term_pairs)
    dirs = []
    for name in names:
        pref, disp = term_pairs[name]
        if len(pref) != len(disp):
            raise TLRewardError(f"term {name!r}: preferred and dispreferred lists differ in "
                                "length (the published definition pairs them by index)")
        dirs.append((pooled_residual(model, pref, batch_size=batch_size)
                     - pooled_residual(model, disp, batch_size=batch_size)).mean(0))
    cos = cosine_matrix(torch.stack(dirs)).cpu().numpy()
    verdicts = {(names[i], names[j]): published_verdict(float(cos[i, j]))
                for i, j in combinations(range(len(names)), 2)}
    overall = float(np.mean([v == "conflict" for v in verdicts.values()])) if verdicts else 0.0
    return PublishedConflict(names, cos, verdicts, overall)


# -- concepts ------------------------------------------------------------------------------------
@dataclass
class PublishedConceptAlignment:
    """The published definition (see module doc): raw pre-norm cosine, separability = 1."""

    concept: str
    objective: str
    cosine: float
    separability: float


@torch.no_grad()
def published_concept_alignment(
    model: Any, positive: Sequence[Any], negative: Sequence[Any],
    head_row: Float[torch.Tensor, " d_model"], objective: str = "reward", batch_size: int = 8,
    name: str = "concept",
) -> PublishedConceptAlignment:
    """The published concept alignment: ``v = normalize(mean(h_pos - h_neg))`` at the final
    residual before the final norm (items paired by index, as published), cosine with the raw
    score row ``head_row`` (HF ``score.weight[k]``: gain not folded), and its "separability"
    ``|v|``, which is 1 by construction."""
    from tl_reward.audit.pooled import pooled_residual

    if len(positive) != len(negative):
        raise TLRewardError("the published definition pairs positives and negatives by index; "
                            "pass lists of equal length")
    h_pos = pooled_residual(model, positive, None, batch_size)
    h_neg = pooled_residual(model, negative, None, batch_size)
    v = (h_pos - h_neg).mean(0)
    v = v / v.norm()
    row = head_row.detach().to(v.device, v.dtype)
    cos = float(v @ row / row.norm())
    return PublishedConceptAlignment(name, objective, cos, float(v.norm()))
