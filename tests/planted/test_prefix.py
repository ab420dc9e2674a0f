"""Two models identical up to block k: the truth verified, then recovered by the layer map."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest
import torch

from tl_reward import HookedRewardModel
from tl_reward.compare.layers import compare_layers
from tl_reward.planted.calibration import random_replies
from tl_reward.planted.prefix import plant_shared_prefix
from tl_reward.testing import tiny_hf_reward_model

K = 2
#: Debiased CKA of equal float64 Grams: 1 up to float64 rounding over ``n^2`` sums.
EPS64 = float(np.finfo(np.float64).eps)


@cache
def planted() -> Any:
    hf, tok = tiny_hf_reward_model("llama", seed=3)
    p = plant_shared_prefix(hf, tok, K)
    a = HookedRewardModel.from_pretrained(hf_model=p.base, tokenizer=tok, device="cpu")
    b = HookedRewardModel.from_pretrained(hf_model=p.model, tokenizer=tok, device="cpu")
    inputs = [torch.tensor(x) for x in random_replies(tok, hf.config.vocab_size, per_prompt=12)]
    return p, a, b, inputs


def test_residuals_agree_exactly_before_k_only() -> None:
    p, a, b, inputs = planted()
    hooks = [f"blocks.{i}.hook_resid_post" for i in range(a.cfg.n_layers)]
    with torch.no_grad():
        _, ca = a.run_with_cache(inputs[0][None], names_filter=hooks)
        _, cb = b.run_with_cache(inputs[0][None], names_filter=hooks)
    same = [i for i, h in enumerate(hooks) if torch.equal(ca[h], cb[h])]
    assert tuple(same) == p.truth.identical == tuple(range(K))


@pytest.mark.parametrize("measure", ["debiased_cka", "rv2"])
def test_layer_map_identity_region_is_the_shared_prefix(measure: str) -> None:
    p, a, b, inputs = planted()
    res = compare_layers(a, b, inputs, measure=measure, n_permutations=0)
    diag = res.diagonal(measure).to_numpy()
    tol = EPS64 * len(inputs) ** 2
    region = tuple(int(i) for i in np.flatnonzero(np.abs(diag - 1) <= tol))
    assert region == p.truth.identical
    assert all(diag[i] < 1 - tol for i in p.truth.different)
