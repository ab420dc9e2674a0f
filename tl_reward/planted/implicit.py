"""Plant a policy with a known implicit reward: the reference LM plus a logit offset.

The policy's logits are the reference's plus a fixed offset ``o`` on a set of tokens (an LM-head
bias), so ``log pi(v | x) - log pi_ref(v | x) = o_v - log sum_u pi_ref(u | x) exp(o_u)``: the
offset up to a normaliser that depends on the context only. For one-token replies the first
term of the implicit reward therefore ranks the candidates exactly by ``o`` on every prompt;
the template's closing tokens add the normaliser at their own positions, which is small while
the offset tokens are rare there.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from tl_reward.errors import TLRewardError, check_range
from tl_reward.planted.calibration import plain_ids
from tl_reward.planted.trigger import PlantedModel


@dataclass(frozen=True)
class ImplicitTruth:
    """The planted implicit reward.

    Attributes:
        offsets: token id -> logit offset (every other token: 0).
        beta: the DPO temperature the implicit reward is read at.
        ranking: the offset tokens, highest offset first (the truth for an IRM sweep).
    """

    offsets: dict[int, float]
    beta: float
    ranking: tuple[int, ...]


def plant_implicit_reward(lm: Any, tokenizer: Any, n_tokens: int = 16, span: float = 4.0,
                          beta: float = 1.0, seed: int = 0) -> PlantedModel:
    """``PlantedModel(model=policy, base=lm)`` for an HF causal LM ``lm``: offsets evenly spaced
    in ``[-span, span]`` on ``n_tokens`` random plain tokens (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    pool = plain_ids(tokenizer, lm.config.vocab_size)
    check_range("n_tokens", n_tokens, 1, len(pool), closed=True)
    if not (span > 0 and beta > 0):
        raise TLRewardError(f"span and beta must be positive, got {span} and {beta}")
    pick = [pool[i] for i in torch.randperm(len(pool), generator=gen)[:n_tokens].tolist()]
    values = torch.linspace(span, -span, n_tokens, dtype=torch.float64).tolist()
    offsets = dict(zip(pick, values, strict=True))
    truth = ImplicitTruth(offsets=offsets, beta=beta, ranking=tuple(pick))
    return PlantedModel(offset_policy(lm, offsets), lm, tokenizer, truth)


def offset_policy(lm: Any, offsets: dict[int, float]) -> Any:
    """A copy of ``lm`` whose LM head adds ``offsets`` (a bias; HF's Llama has none, so a saved
    copy loses it: rebuild it from the reference, as :func:`~tl_reward.planted.store.load_planted`
    does)."""
    policy = copy.deepcopy(lm)
    old = policy.get_output_embeddings()
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True, dtype=old.weight.dtype)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        for i, o in offsets.items():
            head.bias[i] = o
    policy.config.tie_word_embeddings = False
    policy.set_output_embeddings(head)
    return policy.eval()
