"""Plant objectives with known correlations: extra reward rows built from the first one.

For a corpus, let ``n`` be what the head reads (the final norm's output at the pooled token)
and ``C`` its sample covariance. Row ``k`` is ``rho_k w0 + sqrt(1 - rho_k^2) u`` where ``w0`` is
the base row (kept as row 0) and ``u`` has the variance of ``w0 . n``, zero covariance with it
under ``C`` and zero dot product with ``w0`` under the squared norm gain (so the raw head cosine
and every Ledoit-Wolf shrinkage of ``C`` keep the two orthogonal). On that corpus
the Pearson correlation of the base score with objective ``k`` is exactly ``rho_k``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import torch

from tl_reward.audit.conflict import Thresholds, verdict
from tl_reward.errors import check_range
from tl_reward.model.response_template import Prompt
from tl_reward.planted.calibration import DEFAULT_PROMPTS, pooled_normed, random_replies
from tl_reward.planted.surgery import check_llama_like
from tl_reward.planted.trigger import PlantedModel

#: The three planted relations and their correlations with the base objective.
RELATIONS: dict[str, float] = {"aligned": 0.9, "orthogonal": 0.0, "opposed": -0.9}


@dataclass(frozen=True)
class ObjectivesTruth:
    """Planted objective relations.

    Attributes:
        objectives: the head's objective names, the base first.
        correlation: ``(a, b)`` -> the exact score correlation of objectives ``a`` and ``b`` on
            ``corpus``, for every pair in head order (``rho_a rho_b + sqrt((1 - rho_a^2)
            (1 - rho_b^2))``, ``rho = 1`` for the base).
        verdicts: ``(a, b)`` -> the conflict verdict that correlation earns under
            ``thresholds`` (``aligned``, ``orthogonal``, ``conflict`` or ``undetermined``).
        sign: ``(a, b)`` -> the correlation's sign (+1, 0, -1).
        corpus: the token id sequences the correlations hold on.
    """

    objectives: tuple[str, ...]
    correlation: dict[tuple[str, str], float]
    verdicts: dict[tuple[str, str], str]
    sign: dict[tuple[str, str], int]
    corpus: tuple[tuple[int, ...], ...]
    thresholds: Thresholds = Thresholds()


def plant_objectives(
    hf: Any, tokenizer: Any, relations: Mapping[str, float] = RELATIONS, objective: int = 0,
    base_name: str = "base", prompts: Sequence[Prompt] = DEFAULT_PROMPTS, n_per_prompt: int = 64,
    seed: int = 0,
) -> PlantedModel:
    """A model whose head has the base row ``objective`` of ``hf`` and one row per relation,
    correlated with it by the given ``rho`` on a corpus of random replies to ``prompts``."""
    check_llama_like(hf)
    check_range("objective", objective, 0, hf.score.out_features)
    for name, r in relations.items():
        check_range(f"relation {name!r}'s correlation", r, -1, 1, closed=True)
    corpus = random_replies(tokenizer, hf.config.vocab_size, prompts, n_per_prompt, seed=seed)
    n = pooled_normed(hf, corpus)
    cov = torch.cov(n.T)
    gain2 = hf.model.norm.weight.double().pow(2)
    w0 = hf.score.weight[objective].double()
    sd = (w0 @ cov @ w0).sqrt()
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(len(w0), generator=gen, dtype=torch.float64)
    basis = torch.linalg.qr(torch.stack([cov @ w0, gain2 * w0], 1)).Q
    u = u - basis @ (basis.T @ u)
    u = u * sd / (u @ cov @ u).sqrt()
    rows = [w0] + [r * w0 + (1 - r * r) ** 0.5 * u for r in relations.values()]
    names = [base_name, *relations]
    planted = copy.deepcopy(hf)
    head = torch.nn.Linear(len(w0), len(rows), bias=False, dtype=hf.score.weight.dtype)
    with torch.no_grad():
        head.weight.copy_(torch.stack(rows))
    planted.score = head
    planted.config = copy.deepcopy(hf.config)
    planted.config.num_labels = len(rows)
    planted.config.id2label = dict(enumerate(names))
    planted.config.label2id = {k: i for i, k in enumerate(names)}
    planted.num_labels = len(rows)
    t = Thresholds()
    rho = {base_name: 1.0, **relations}
    corr = {(a, b): round(rho[a] * rho[b] + ((1 - rho[a] ** 2) * (1 - rho[b] ** 2)) ** 0.5, 12)
            for a, b in combinations(names, 2)}
    truth = ObjectivesTruth(
        objectives=tuple(names), correlation=corr,
        verdicts={k: verdict(r, r, t) for k, r in corr.items()},
        sign={k: (r > 0) - (r < 0) for k, r in corr.items()},
        corpus=tuple(tuple(s) for s in corpus), thresholds=t)
    return PlantedModel(planted.eval(), hf, tokenizer, truth)
