"""QRM-Llama3.1-8B (``LlamaForRewardModelWithGating31``): quantile regression heads per
objective, a gating network and a transform, in the style of ArmoRM (custom code).

The published score is ``g(x) . (E_q[Q(x)] T)``: the expectation over quantiles of each
objective's quantile regression, re-weighted by ``T``, combined by the gate. The expectation is
linear in the pooled state (the mean of each objective's quantile rows), so ``W_U`` holds the
``T``-adjusted expectation directions (final-norm gain folded in), the K objectives are the
published ``rewards`` output, and the head is ArmoRM's with ``T`` already applied:
``score = g(x) . rewards``, ``w_eff(x) = W_U g(x)``. The gating network's
``Linear -> ReLU -> BatchNorm1d`` blocks are copied as they are (inference statistics).

The quantiles themselves are not exposed (only their expectation is the score). QRM-Gemma-2-27B
ships its own modeling code, which could not be read here; it is not registered.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from tl_reward.architectures.armorm import gating_token_pattern
from tl_reward.architectures.llama import llama_config
from tl_reward.architectures.registry import Architecture, register_architecture
from tl_reward.model.heads import ArmoRMHead
from tl_reward.tl_backend import tl_converter


class QRMHead(ArmoRMHead):
    """ArmoRM's combination with QRM's gating network (``Linear``/``ReLU``/``BatchNorm1d``
    modules applied in order) and ``T`` folded into ``W_U`` (``transform`` is the identity)."""

    def gating_logits(self, x: torch.Tensor) -> torch.Tensor:
        """QRM's layers in order (their ``ReLU`` and ``BatchNorm1d`` modules included)."""
        for layer in self.layers:
            x = layer(x)
        return x


def expectation_layer(hf_model: nn.Module) -> nn.Linear:
    """``[K, d_model]`` rows ``(T^T M)``: ``M`` = each objective's mean quantile row."""
    n_obj, n_q = int(hf_model.num_objectives), int(hf_model.num_quantiles)
    w = hf_model.regression_layer.weight.detach()  # [n_obj * n_q, d]
    mean = w.float().reshape(n_obj, n_q, -1).mean(1)
    t = hf_model.reward_transform_matrix.detach().float()
    layer = nn.Linear(w.shape[1], n_obj, bias=False, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        layer.weight.copy_((t.T @ mean).to(w.dtype))
    return layer


def qrm_head(hf_model: nn.Module, gain: torch.Tensor, objectives: Sequence[str]) -> QRMHead:
    """Copy the gating network (float32), folding the final norm's gain into its first layer."""
    layers = copy.deepcopy(hf_model.gating.layers).float()  # type: ignore[union-attr]
    first = layers[0]
    with torch.no_grad():
        first.weight.mul_(gain.to(first.weight.device)[None, :])
    n = len(objectives)
    return QRMHead(objectives, list(layers), transform=torch.eye(n),
                   temperature=float(hf_model.gating.temperature),  # type: ignore[union-attr]
                   logit_scale=hf_model.gating.logit_scale.detach().float(),  # type: ignore[union-attr]
                   token_pattern=gating_token_pattern(hf_model))


QRM = register_architecture(
    Architecture(
        hf_class="LlamaForRewardModelWithGating31",
        config=llama_config,
        convert=tl_converter("llama"),
        head=expectation_layer,
        reward_head=qrm_head,  # type: ignore[arg-type]
        pooling="legacy",
        description="QRM-Llama3.1-8B (quantile heads + gating; trust_remote_code=True)",
    )
)
