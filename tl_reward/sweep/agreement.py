"""Do reward models agree on which tokens are best? Rank agreement on the shared vocabulary.

Models with different tokenizers are compared on the decoded strings they share. A string that
several ids of one model decode to (``"�"`` byte pieces, duplicates) is dropped from that model,
so every shared string names exactly one token in each model. For every pair of models:
Kendall's tau-b, Spearman's rho, and rank-biased overlap (``p = 0.9``) of the top and of the
bottom of the ranking; an MDS map places the models by ``1 - tau``.

Example:
    >>> agree = model_agreement({"smollm2": sweep_a, "other": sweep_b, "third": sweep_c})
    >>> agree.to_dataframe(); agree.plot()
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from tl_reward.errors import TLRewardError, check_choice
from tl_reward.results import ShortRepr
from tl_reward.stats.ranks import kendall_tau_b, rank_biased_overlap, spearman_rho, top_ranking
from tl_reward.sweep.vocab_sweep import VocabSweep

METRICS = ("kendall_tau_b", "spearman_rho", "rbo_top", "rbo_bottom")


@dataclass(repr=False)
class ModelAgreement(ShortRepr):
    """Pairwise rank agreement between models on their shared decoded vocabulary.

    Attributes:
        models: model names; ``kendall_tau_b``, ``spearman_rho``, ``rbo_top``, ``rbo_bottom``:
            ``[M, M]`` symmetric matrices (diagonal 1).
        n_shared: ``[M, M]`` number of shared strings per pair (diagonal: the model's unique
            strings).
        dropped: per model, how many tokens were dropped as duplicate strings; ``p``: the RBO
            persistence.
    """

    models: list[str]
    kendall_tau_b: Float[torch.Tensor, "model model"]
    spearman_rho: Float[torch.Tensor, "model model"]
    rbo_top: Float[torch.Tensor, "model model"]
    rbo_bottom: Float[torch.Tensor, "model model"]
    n_shared: torch.Tensor
    dropped: dict[str, int]
    p: float

    def to_dataframe(self) -> pd.DataFrame:
        """One row per model pair: the four agreement measures and the shared count."""
        return pd.DataFrame([{"model_a": self.models[i], "model_b": self.models[j],
                              "n_shared": int(self.n_shared[i, j]),
                              **{m: float(getattr(self, m)[i, j]) for m in METRICS}}
                             for i, j in combinations(range(len(self.models)), 2)])

    def mds(self, metric: str = "kendall_tau_b", seed: int = 0) -> pd.DataFrame:
        """2-D metric MDS of the models from the dissimilarity ``1 - metric``."""
        from sklearn.manifold import MDS

        check_choice(metric, METRICS, "metric")
        dist = (1 - getattr(self, metric).double().numpy()).clip(min=0)
        np.fill_diagonal(dist, 0.0)
        if len(self.models) < 3:
            xy = np.zeros((len(self.models), 2))
            if len(self.models) == 2:
                xy[1, 0] = dist[0, 1]
        else:
            if "metric_mds" in inspect.signature(MDS).parameters:  # scikit-learn >= 1.8
                mds = MDS(n_components=2, metric="precomputed", init="classical_mds",
                          random_state=seed, normalized_stress="auto")
            else:
                mds = MDS(n_components=2, dissimilarity="precomputed", random_state=seed,
                          n_init=4, normalized_stress="auto")
            xy = mds.fit_transform(dist)
        return pd.DataFrame({"model": self.models, "x": xy[:, 0], "y": xy[:, 1]})

    def plot(self, metric: str = "kendall_tau_b") -> Any:
        """Heatmap of ``metric`` beside the MDS map of the models (plotly)."""
        from tl_reward.viz.vocab import plot_agreement

        return plot_agreement(self, metric)


def unique_strings(sweep: VocabSweep, prompt: int | str = 0, objective: int | str = "score"
                   ) -> tuple[pd.Series, int]:
    """``decoded string -> value`` with strings that several ids decode to dropped, and how
    many tokens were dropped."""
    s = pd.Series(sweep.values(prompt, objective).double().numpy(), index=sweep.tokens)
    dup = s.index.duplicated(keep=False)
    return s[~dup], int(dup.sum())


def pair_agreement(a: pd.Series, b: pd.Series, p: float = 0.9) -> dict[str, float]:
    """Agreement of two ``string -> value`` series on their shared strings."""
    shared = a.index.intersection(b.index).sort_values()
    if len(shared) < 3:
        raise TLRewardError(f"only {len(shared)} shared tokens; agreement needs at least 3")
    return {"n_shared": len(shared),
            **rank_metrics(list(shared), a[shared].to_numpy(), b[shared].to_numpy(), p)}


def rank_metrics(keys: Sequence[Any], x: np.ndarray, y: np.ndarray, p: float = 0.9
                 ) -> dict[str, float]:
    """:data:`METRICS` of two rankings of the same ``keys`` (values ``x`` and ``y``)."""
    return {"kendall_tau_b": kendall_tau_b(x, y).statistic,
            "spearman_rho": spearman_rho(x, y).statistic,
            "rbo_top": rank_biased_overlap(top_ranking(keys, x), top_ranking(keys, y), p),
            "rbo_bottom": rank_biased_overlap(top_ranking(keys, x, largest=False),
                                              top_ranking(keys, y, largest=False), p)}


def model_agreement(
    sweeps: Mapping[str, VocabSweep] | Sequence[VocabSweep],
    prompt: int | str = 0,
    objective: int | str = "score",
    p: float = 0.9,
) -> ModelAgreement:
    """Rank agreement of every pair of models on one prompt (by label or index)."""
    named = (dict(sweeps) if isinstance(sweeps, Mapping)
             else {s.model_name: s for s in sweeps})
    if len(named) != (len(sweeps) if not isinstance(sweeps, Mapping) else len(named)):
        raise TLRewardError("two sweeps share a model name; pass {name: sweep} instead")
    if len(named) < 2:
        raise TLRewardError("model agreement needs at least two sweeps")
    names = list(named)
    series, dropped = {}, {}
    for name in names:
        series[name], dropped[name] = unique_strings(named[name], prompt, objective)
    m = len(names)
    mats = {k: torch.eye(m, dtype=torch.float64) for k in METRICS}
    n_shared = torch.zeros(m, m, dtype=torch.long)
    for i in range(m):
        n_shared[i, i] = len(series[names[i]])
    for i, j in combinations(range(m), 2):
        res = pair_agreement(series[names[i]], series[names[j]], p)
        n_shared[i, j] = n_shared[j, i] = res["n_shared"]
        for k in METRICS:
            mats[k][i, j] = mats[k][j, i] = res[k]
    return ModelAgreement(names, *(mats[k] for k in METRICS), n_shared, dropped, p)
