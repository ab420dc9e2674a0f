"""A generative judge's expected rating as a reward head: nonlinear, exact where analyses need
it linear.

A judge asked for a rating reads the logits of the rating tokens ("1".."9") at the answer
position, ``l = W x + b`` (``W``: those tokens' LM-head rows, the final norm's gain folded in;
``x = ln_final(h)``), and reports the expected rating under their softmax,
``E(x) = sum_i v_i p_i``, ``p = softmax(l)``. Its gradient is

    ``w_eff(x) = dE/dx = W^T (p * (v - E))``,  ``b_eff(x) = E - w_eff(x) . x``,

so ``w_eff(x) . x + b_eff(x) = E(x)`` exactly and the direction is the head's gradient at ``x``
(the local linearisation every linear analysis reads, as for the MLP head).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import nn
from torch.nn import functional as F
from transformer_lens.hook_points import HookPoint

from tl_reward.model.heads import RewardHead


class RatingHead(RewardHead):
    """The expected rating ``sum_i v_i softmax(W x + b)_i`` on the normed final residual.

    One objective, ``"rating"``, which is also the score. Hooks: ``reward_head.hook_logits``
    (the rating tokens' logits, ``[..., n]``) and ``reward_head.hook_probs`` (their softmax).
    The rating values are kept as Python floats (``rating_values``), so casting the head to
    bfloat16 never rounds them.
    """

    nonlinear = True

    def __init__(self, rows: nn.Linear, values: Sequence[float],
                 tokens: Sequence[str] = ()) -> None:
        super().__init__(["rating"])
        if rows.out_features != len(values) or len(values) < 2:
            raise ValueError(f"{rows.out_features} rating rows for {len(values)} values; "
                             "give one value per row, at least two")
        self.rows = rows
        self.rating_values = tuple(float(v) for v in values)
        self.rating_tokens = tuple(str(t) for t in tokens)
        self.hook_logits = HookPoint()
        self.hook_probs = HookPoint()
        self.register_buffer("weights", torch.ones(1), persistent=False)

    def values(self, like: torch.Tensor) -> torch.Tensor:
        """The rating values ``v`` as a tensor on ``like``'s device and dtype."""
        return torch.tensor(self.rating_values, device=like.device, dtype=like.dtype)

    def outputs(self, normed: Float[torch.Tensor, "... d_model"]) -> Float[torch.Tensor, "... 1"]:
        """The expected rating at every position (softmax in float32 at least)."""
        logits = self.hook_logits(self.rows(normed.to(self.rows.weight.dtype)))
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        p = self.hook_probs(F.softmax(logits, dim=-1))
        return (p * self.values(p)).sum(-1, keepdim=True)

    forward = outputs

    @property
    def weight(self) -> torch.Tensor:
        """``[1, d_model]`` NaN: the expected rating has no fixed direction."""
        return torch.full((1, self.rows.in_features), float("nan"),
                          device=self.rows.weight.device, dtype=self.rows.weight.dtype)

    @property
    def bias(self) -> torch.Tensor:
        """``[1]`` NaN (see :attr:`weight`)."""
        return self.weight[:, 0]

    def linearise(
        self, pooled: Float[torch.Tensor, "batch d_model"]
    ) -> tuple[Float[torch.Tensor, "batch 1 d_model"], Float[torch.Tensor, "batch 1"]]:
        """``(w_eff(x), b_eff(x))`` per row in float32 (float64 for float64 weights or
        input): the gradient ``W^T (p * (v - E))`` and ``E - w_eff . x``."""
        acc = torch.promote_types(torch.promote_types(self.rows.weight.dtype, pooled.dtype),
                                  torch.float32)
        x = pooled.to(acc)
        w = self.rows.weight.to(acc)
        logits = x @ w.T
        if self.rows.bias is not None:
            logits = logits + self.rows.bias.to(acc)
        p = F.softmax(logits, dim=-1)
        v = self.values(p)
        expected = p @ v
        w_eff = (p * (v - expected[:, None])) @ w
        b_eff = expected - (w_eff * x).sum(-1)
        return w_eff[:, None], b_eff[:, None]
