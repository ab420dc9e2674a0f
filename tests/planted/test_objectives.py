"""Planted objective relations: the truth verified, then recovered by the conflict audit."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest
import torch

from tl_reward import HookedRewardModel
from tl_reward.audit.conflict import behavioural_conflict, geometric_conflict, verdict
from tl_reward.planted.calibration import pooled_normed
from tl_reward.planted.objectives import RELATIONS, plant_objectives
from tl_reward.testing import tiny_hf_reward_model

#: Pearson correlation of float32 scores: each score carries about ``d_model`` float32 roundings.
EPS = torch.finfo(torch.float32).eps


@cache
def planted() -> Any:
    hf, tok = tiny_hf_reward_model("llama")
    p = plant_objectives(hf, tok)
    model = HookedRewardModel.from_pretrained(hf_model=p.model, tokenizer=tok, device="cpu")
    return p, model, [torch.tensor(x) for x in p.truth.corpus]


def _atol(p: Any) -> float:
    return float(EPS * p.model.config.hidden_size)


def test_truth_is_written_down() -> None:
    p, model, _ = planted()
    assert model.objectives == list(p.truth.objectives) == ["base", *RELATIONS]
    by_base = {b: p.truth.verdicts[("base", b)] for b in RELATIONS}
    assert by_base == {"aligned": "aligned", "orthogonal": "orthogonal", "opposed": "conflict"}
    assert [p.truth.sign[("base", b)] for b in RELATIONS] == [1, 0, -1]


def test_backbone_and_base_row_are_untouched() -> None:
    p, _, _ = planted()
    a, b = p.model.state_dict(), p.base.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a if not k.startswith("score."))
    assert torch.equal(a["score.weight"][0], b["score.weight"][0])


def test_score_correlations_are_the_planted_ones() -> None:
    p, _, _ = planted()
    ids = [list(x) for x in p.truth.corpus]
    with torch.no_grad():
        scores = p.model.score(pooled_normed(p.model, ids).float()).double().numpy()
    corr = np.corrcoef(scores.T)
    names = list(p.truth.objectives)
    for (a, b), rho in p.truth.correlation.items():
        assert corr[names.index(a), names.index(b)] == pytest.approx(rho, abs=_atol(p))


def test_behavioural_conflict_recovers_values_and_verdicts() -> None:
    p, model, corpus = planted()
    df = behavioural_conflict(model, corpus, n_permutations=200).to_dataframe()
    for row in df.itertuples():
        key = (row.term_a, row.term_b)
        assert row.value == pytest.approx(p.truth.correlation[key], abs=_atol(p))
        assert row.verdict == p.truth.verdicts[key], key


def test_geometric_conflict_recovers_verdicts() -> None:
    p, model, corpus = planted()
    df = geometric_conflict(model, corpus).to_dataframe()
    white = df[df.view == "whitened cosine"]
    assert len(white) == len(p.truth.verdicts)
    for row in white.itertuples():  # no interval (the shrinkage's bias): the value's region
        key = (row.term_a, row.term_b)
        assert row.verdict == "undetermined" and np.isnan(row.ci_low)
        assert verdict(row.value, row.value, p.truth.thresholds) == p.truth.verdicts[key], key
        assert np.sign(row.value) == p.truth.sign[key] or p.truth.sign[key] == 0
