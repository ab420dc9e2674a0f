"""Where a reward is read: the last real token, by one of three rules.

* ``"hf"``: HF's current rule, the rightmost token that is not ``pad_token_id``.
* ``"legacy"``: the first pad token minus one (older HF code and custom RMs such as ArmoRM);
  it differs when the pad token also occurs inside the text (e.g. pad = EOS = end of turn).
* ``"mask"``: the rightmost position whose attention mask is 1.
"""

from __future__ import annotations

from typing import Literal

import torch
from jaxtyping import Int

from tl_reward.errors import MissingPadTokenError, TLRewardError

PoolingRule = Literal["hf", "legacy", "mask"]
POOLING_RULES: tuple[str, ...] = ("hf", "legacy", "mask")


def check_rule(rule: str) -> PoolingRule:
    """Validate a pooling rule name."""
    if rule not in POOLING_RULES:
        raise TLRewardError(f"unknown pooling rule {rule!r}; choose one of {POOLING_RULES}")
    return rule  # type: ignore[return-value]


def pool_positions(
    tokens: Int[torch.Tensor, "batch pos"],
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    pad_token_id: int | None = None,
    rule: str = "hf",
) -> Int[torch.Tensor, " batch"]:
    """The position of the token whose head output is the reward, per sequence."""
    check_rule(rule)
    batch, seq = tokens.shape
    idx = torch.arange(seq, device=tokens.device)
    if rule == "mask":
        if attention_mask is None:
            return torch.full((batch,), seq - 1, dtype=torch.long, device=tokens.device)
        return (idx * attention_mask.to(tokens.device).long()).argmax(-1)
    if pad_token_id is None:
        if batch > 1:
            raise MissingPadTokenError(
                "this model defines no pad token, so a batch of several sequences cannot be "
                f"pooled with the {rule!r} rule; set tokenizer.pad_token (and the model's "
                "pad_token_id), score one sequence at a time, or use pooling='mask'"
            )
        return torch.full((batch,), seq - 1, dtype=torch.long, device=tokens.device)
    is_pad = tokens == pad_token_id
    if rule == "hf":
        return (idx * (~is_pad).long()).argmax(-1)
    return (is_pad.long().argmax(-1) - 1) % seq
