"""The published reward-lens v1.0.0 definitions, for comparison only (never for inference); each
reproduces a flaw that decides its result (``docs/methods.md``):

* ``published_cohens_d``: ``mean / std`` with ddof 0, ``inf`` at n = 1 or zero spread.
* ``published_probe_texts``, ``run_published_probes``: 10 hand-written probes whose biased texts
  also change content, n = 1-3 per dimension.
* ``published_distortion_index``: pooled min-max, ``1 - prod(1 - c)``, ``1 - C / max C``: purely
  relative, the strongest dimension always 0, one saturated probe decides a dimension.
* ``published_cascade``: probe i of one dimension paired with probe i of another (unrelated
  prompts): with 2 probes every r is +-1.
* ``published_conflict``, ``published_verdict``: raw pre-norm cosines (anisotropic coordinates),
  fixed thresholds whose gaps fall to the sign.
* ``published_concept_alignment``: raw pre-norm cosine with the raw head row (gain not folded);
  its "separability" is the norm of a unit vector, always 1.
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

from tl_reward.audit.conflict import cosine_matrix
from tl_reward.audit.perturbations import make_item
from tl_reward.audit.pooled import pooled_residual
from tl_reward.audit.probes import reward_names, score_rows
from tl_reward.compat.effect_size import published_cohens_d
from tl_reward.errors import TLRewardError
from tl_reward.results import ShortRepr
from tl_reward.scale.executors import Executor, LocalExecutor, Spec, Worker, as_spec
from tl_reward.stats.paired import paired_effect_size, sign_flip_test


# -- probes --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PublishedProbe:
    """One hand-written probe: its biased text also changes content."""

    dimension: str
    index: int
    prompt: str
    neutral: str
    biased: str


def published_probe_texts() -> list[PublishedProbe]:
    """The 10 probes verbatim (MIT licence in the asset file): 1-3 per dimension."""
    raw = json.loads(resources.files("tl_reward").joinpath(
        "assets/reward_lens_v1_probes.json").read_text(encoding="utf-8"))
    return [PublishedProbe(**p) for p in raw["probes"]]


@dataclass(repr=False)
class PublishedProbeReport(ShortRepr):
    """``rows``: the scored probes; ``table``: per dimension the published d beside ours."""

    rows: pd.DataFrame
    table: pd.DataFrame

    def to_dataframe(self) -> pd.DataFrame:
        return self.table


def run_published_probes(model: Any, objective: str | None = None, batch_size: int = 8,
                         executor: Executor | None = None) -> PublishedProbeReport:
    """Score the 10 probes: published d beside our effect size and exact p (n = 1-3).
    ``model``: loaded, or a hub name, local directory or
    :class:`~tl_reward.scale.executors.ModelSpec` scored on one of ``executor``'s workers."""
    with (executor or LocalExecutor()).session() as pool:
        return pool.gather(_published_unit, [(as_spec(model), objective, batch_size)])[0]


def _published_unit(worker: Worker, spec: Spec, objective: str | None, batch_size: int
                    ) -> PublishedProbeReport:
    model = worker.model(spec)
    probes = published_probe_texts()
    names = reward_names(model)
    objective = objective or names[0]
    items = {f"rl:{p.dimension}:{p.index}": make_item(f"rl:{p.dimension}:{p.index}", p.prompt,
                                                      p.neutral, "reward-lens-v1")
             for p in probes}
    rows = [{"dimension": p.dimension, "item_id": f"rl:{p.dimension}:{p.index}",
             "source": "reward-lens-v1", "applied": True, "neutral_user": p.prompt,
             "neutral_reply": p.neutral, "perturbed_user": p.prompt, "perturbed_reply": p.biased}
            for p in probes]
    df = score_rows(model, items, rows, [objective], batch_size)
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
    """Coverage ``C``, ``D = 1 - C / max C`` and the min-max deltas ``c`` per dimension."""

    dimensions: list[str]
    coverage: np.ndarray
    distortion: np.ndarray
    normalised: dict[str, np.ndarray]

    def to_dataframe(self) -> pd.DataFrame:
        return pd.DataFrame({"dimension": self.dimensions, "coverage": self.coverage,
                             "published_distortion": self.distortion})


def published_distortion_index(deltas: Mapping[str, Sequence[float]] | pd.DataFrame
                               ) -> PublishedDistortion:
    """Relative only: the strongest dimension is 0, one saturated probe sets ``C = 1``."""
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
    """The correlation ``matrix`` of ``n`` index-paired probes; ``flagged``: ``|r| > t``."""

    dimensions: list[str]
    n: int
    matrix: np.ndarray
    flagged: list[tuple[str, str, float]]

    def to_dataframe(self) -> pd.DataFrame:
        return pd.DataFrame(self.matrix, index=self.dimensions, columns=self.dimensions)


def published_cascade(deltas: Mapping[str, Sequence[float]], threshold: float = 0.5
                      ) -> PublishedCascade:
    """Probe i paired with probe i of unrelated prompts: with 2 probes every r is +-1."""
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
def _mean_difference(model: Any, a: Sequence[Any], b: Sequence[Any], batch_size: int,
                     unequal: str) -> Float[torch.Tensor, " d_model"]:
    """``mean(h_a - h_b)`` of the pre-norm residual at ``t*``, ``a`` and ``b`` paired by index."""
    if len(a) != len(b):
        raise TLRewardError(unequal)
    return (pooled_residual(model, a, None, batch_size)
            - pooled_residual(model, b, None, batch_size)).mean(0)


@dataclass
class PublishedConflict:
    """Raw pre-norm cosines of per-term mean differences, with their verdicts."""

    terms: list[str]
    cosines: np.ndarray
    verdicts: dict[tuple[str, str], str]
    overall: float


def published_verdict(cos: float) -> str:
    """> 0.5 aligned, < -0.3 conflict, |cos| < 0.2 orthogonal; the gaps fall to the sign."""
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
    """Raw pre-norm cosines of ``mean(h_pref - h_disp)``, no interval, fixed thresholds."""
    names = list(term_pairs)
    dirs = [_mean_difference(model, *term_pairs[name], batch_size,
                             f"term {name!r}: preferred and dispreferred lists differ in length "
                             "(the published definition pairs them by index)") for name in names]
    cos = cosine_matrix(torch.stack(dirs)).cpu().numpy()
    verdicts = {(names[i], names[j]): published_verdict(float(cos[i, j]))
                for i, j in combinations(range(len(names)), 2)}
    overall = float(np.mean([v == "conflict" for v in verdicts.values()])) if verdicts else 0.0
    return PublishedConflict(names, cos, verdicts, overall)


# -- concepts ------------------------------------------------------------------------------------
@dataclass
class PublishedConceptAlignment:
    """Raw pre-norm cosine with the raw head row; separability is always 1."""

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
    """Cosine of unit ``mean(h_pos - h_neg)`` (pre-norm) with the raw ``head_row``; ``|v| = 1``."""
    v = _mean_difference(model, positive, negative, batch_size, "the published definition "
                         "pairs positives and negatives by index; pass lists of equal length")
    v = v / v.norm()
    row = head_row.detach().to(v.device, v.dtype)
    cos = float(v @ row / row.norm())
    return PublishedConceptAlignment(name, objective, cos, float(v.norm()))
