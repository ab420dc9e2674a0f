"""A two-layer ReLU MLP reward head (INF-ORM-Llama3.1-70B: ``score = Sequential(Linear(d, d),
ReLU, Linear(d, K))``), exact in the forward and linear where the analyses need it.

The head reads the normed final residual ``x = ln_final(h)`` (the final norm's gain is folded
into the first layer, as ``fold_ln`` folds it into ``W_U`` for a linear head). At one input the
ReLU's active units ``D(x) = diag(W1 x + b1 > 0)`` fix a linear map, so

    ``head(x) = W2 D(x) (W1 x + b1) + b2 = w_eff(x) . x + b_eff(x)``,
    ``w_eff(x) = W1^T D(x) w2``,  ``b_eff(x) = w2 . D(x) b1 + b2``

exactly (the same idea as ArmoRM's prompt-dependent direction). Every linear analysis reads the
reward through this local linearisation *at the pooled input of the full run*, so component
contributions still add up to the reward. It is also the exact gradient of the head there.

Caveat: for a residual other than the final one (a lens on layer ``l``) the frozen direction is
only the linearisation at the final layer's activation pattern ``D(x_L)``; the lens offers the
recomputed head, ``head(N(h_l))``, as the other convention (``"head"``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import nn
from torch.nn import functional as F
from transformer_lens.hook_points import HookPoint

from tl_reward.model.heads import RewardHead


class MLPRewardHead(RewardHead):
    """``out(ReLU(hidden(x)))`` on the normed final residual.

    Hooks: ``reward_head.hook_pre`` (the hidden layer before the ReLU, ``[..., d_hidden]``) and
    ``reward_head.hook_post`` (after it). With K = 1 the score is the single output; ``weights``
    combine K outputs into a score (a two-class PRM head: ``[-1, 1]``, class 1 minus class 0).
    """

    nonlinear = True

    def __init__(self, objectives: Sequence[str], hidden: nn.Linear, out: nn.Linear,
                 weights: torch.Tensor | None = None) -> None:
        super().__init__(objectives)
        if out.out_features != len(self.objectives):
            raise ValueError(f"{out.out_features} outputs for {len(self.objectives)} objectives")
        self.hidden = hidden
        self.out = out
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()
        if weights is None and out.out_features == 1:
            weights = torch.ones(1)
        self.register_buffer("weights", weights, persistent=False)

    @property
    def d_hidden(self) -> int:
        return self.hidden.out_features

    def outputs(self, normed: Float[torch.Tensor, "... d_model"]) -> Float[torch.Tensor, "... K"]:
        x = normed.to(self.hidden.weight.dtype)
        post = self.hook_post(F.relu(self.hook_pre(self.hidden(x))))
        return self.out(post)

    forward = outputs  # as a model's own head module (the bridge's unembed)

    @property
    def weight(self) -> torch.Tensor:
        """``[K, d_model]`` NaN: an MLP head has no fixed direction (as a linear layer's weight
        would give ``W_U``), so any use of one fails loudly."""
        return torch.full((self.out.out_features, self.hidden.in_features), float("nan"),
                          device=self.out.weight.device, dtype=self.out.weight.dtype)

    @property
    def bias(self) -> torch.Tensor:
        """``[K]`` NaN (see :attr:`weight`)."""
        return self.weight[:, 0]

    def active(self, pooled: Float[torch.Tensor, "batch d_model"]
               ) -> Float[torch.Tensor, "batch d_hidden"]:
        """``D(x)``: 1 where a hidden unit is active at ``pooled``, else 0."""
        pre = F.linear(pooled.to(self.hidden.weight.dtype), self.hidden.weight, self.hidden.bias)
        return (pre > 0).to(pooled.dtype)

    def linearise(
        self, pooled: Float[torch.Tensor, "batch d_model"]
    ) -> tuple[Float[torch.Tensor, "batch K d_model"], Float[torch.Tensor, "batch K"]]:
        """``(w_eff(x), b_eff(x))`` per row, in float32 (float64 for float64 weights):
        ``W2 D(x) W1`` and ``W2 D(x) b1 + b2``."""
        acc = torch.promote_types(self.hidden.weight.dtype, torch.float32)
        d = self.active(pooled.detach()).to(acc)
        w1, w2 = self.hidden.weight.to(acc), self.out.weight.to(acc)
        gated = w2[None] * d[:, None, :]  # [batch, K, d_hidden]
        w_eff = gated @ w1
        b1 = self.hidden.bias.to(acc) if self.hidden.bias is not None else torch.zeros(
            self.d_hidden, device=w1.device, dtype=acc)
        b2 = self.out.bias.to(acc) if self.out.bias is not None else 0.0
        b_eff = gated @ b1 + b2
        return w_eff, b_eff
