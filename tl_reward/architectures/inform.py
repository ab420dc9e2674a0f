"""INF-ORM-Llama3.1-70B (``INFORMForSequenceClassification``): a Llama body and a two-layer
ReLU MLP head, ``score = Sequential(Linear(d, d), ReLU, Linear(d, K))`` (custom code).

The head becomes an :class:`~tl_reward.model.mlp_head.MLPRewardHead` (final-norm gain folded
into its first layer); ``W_U`` has no meaning for it and is NaN, so a fixed-direction use of it
fails loudly: objectives are read through ``model.reward_direction`` (the local linearisation
at the pooled input). Pooling is the legacy first-pad-minus-one rule of the published code.
"""

from __future__ import annotations

import torch
from torch import nn

from tl_reward.architectures.common import float_copy
from tl_reward.architectures.llama import llama_config
from tl_reward.architectures.registry import Architecture, register_architecture
from tl_reward.model.mlp_head import MLPRewardHead
from tl_reward.tl_backend import tl_converter


def mlp_layers(hf_model: nn.Module) -> tuple[nn.Linear, nn.Linear]:
    """HF's own two ``Linear`` layers of ``score`` (checked to be ``Linear, ReLU, Linear``)."""
    layers = [m for m in hf_model.score if isinstance(m, nn.Linear)]  # type: ignore[attr-defined]
    acts = [m for m in hf_model.score if not isinstance(m, nn.Linear)]  # type: ignore[attr-defined]
    if len(layers) != 2 or len(acts) != 1 or not isinstance(acts[0], nn.ReLU):
        from tl_reward.errors import UnsupportedArchitectureError

        raise UnsupportedArchitectureError(
            f"expected score = Sequential(Linear, ReLU, Linear), got {hf_model.score}")  # type: ignore[attr-defined]
    return layers[0], layers[1]


def placeholder_head(hf_model: nn.Module) -> nn.Linear:
    """A zero ``[K, d_model]`` layer standing in for ``W_U`` (overwritten with NaN)."""
    first, last = mlp_layers(hf_model)
    layer = nn.Linear(first.in_features, last.out_features, bias=False)
    nn.init.zeros_(layer.weight)
    return layer


def mlp_head(hf_model: nn.Module, gain: torch.Tensor, objectives: list[str],
             weights: torch.Tensor | None = None) -> MLPRewardHead:
    """Copy the MLP head in float32, folding the final norm's gain into its first layer;
    ``weights`` combine its outputs into the score (:class:`MLPRewardHead`)."""
    first, last = mlp_layers(hf_model)
    return MLPRewardHead(objectives, float_copy(first, gain), float_copy(last), weights=weights)


INFORM = register_architecture(
    Architecture(
        hf_class="INFORMForSequenceClassification",
        config=llama_config,
        convert=tl_converter("llama"),
        head=placeholder_head,
        reward_head=mlp_head,
        pooling="legacy",
        description="INF-ORM-Llama3.1-70B (two-layer ReLU MLP head; trust_remote_code=True)",
    )
)
