"""A policy with a known implicit reward: the truth verified, then recovered by the IRM sweep."""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import pytest
import torch
from scipy.stats import kendalltau

from tl_reward.irm import irm_vocab_sweep
from tl_reward.planted.implicit import plant_implicit_reward
from tl_reward.testing import tiny_hf_reward_model

PROMPTS = ["Why is water wet?", "Tell me a joke.", "What, in one word, is the best thing ever?"]


@cache
def planted() -> Any:
    lm, tok = tiny_hf_reward_model("nemotron")  # a tiny LlamaForCausalLM
    p = plant_implicit_reward(lm, tok)
    sweep = irm_vocab_sweep(p.model, p.base, PROMPTS, p.truth.beta, tokenizer=tok,
                            progress=False)
    return p, sweep


def _offset(p: Any, ids: torch.Tensor) -> torch.Tensor:
    return torch.tensor([p.truth.offsets.get(int(i), 0.0) for i in ids])


def test_policy_logits_are_reference_plus_offset() -> None:
    p, _ = planted()
    ids = torch.tensor([[p.tokenizer.bos_token_id, *range(40, 60)]])
    with torch.no_grad():
        ref = p.base(input_ids=ids).logits
        diff = p.model(input_ids=ids).logits - ref
    expect = _offset(p, torch.arange(diff.shape[-1])).to(diff)
    scale = float(ref.abs().max())
    assert torch.allclose(diff, expect.expand_as(diff), rtol=0,
                          atol=8 * torch.finfo(torch.float32).eps * max(1.0, scale))


def test_first_term_is_the_offset_up_to_a_constant() -> None:
    p, sweep = planted()
    o = _offset(p, sweep.token_ids).double()
    # float32 log-softmax: each value rounds at about eps x (its magnitude + log V)
    tol = 64 * torch.finfo(torch.float32).eps * (
        1 + float(sweep.first.abs().max()) + math.log(p.base.config.vocab_size))
    for k in range(len(PROMPTS)):
        centred = sweep.first[:, k].double() - o
        assert float(centred.max() - centred.min()) < tol


def test_irm_sweep_ranks_the_planted_tokens_in_order() -> None:
    p, sweep = planted()
    ids = sweep.token_ids.tolist()
    rows = [ids.index(i) for i in p.truth.ranking]
    for k in range(len(PROMPTS)):
        r = sweep.rewards[rows, k]
        tau = kendalltau(r.numpy(), [p.truth.offsets[i] for i in p.truth.ranking]).statistic
        assert tau == pytest.approx(1.0)
        top = int(sweep.rewards[:, k].argmax())
        assert ids[top] == p.truth.ranking[0]
