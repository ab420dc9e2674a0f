"""ArmoRM (``LlamaForRewardModelWithGating``): 19 objectives, a gating MLP and a transform.

The body is Llama; ``regression_layer`` (``[K, d_model]``, no bias) becomes ``W_U``; the gating
network and ``reward_transform_matrix`` become an :class:`~tl_reward.model.heads.ArmoRMHead`.
Pooling is the legacy first-pad-minus-one rule that ArmoRM's own code uses.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from tl_reward.architectures.common import float_copy
from tl_reward.architectures.llama import llama_config
from tl_reward.architectures.registry import Architecture, register_architecture
from tl_reward.model.heads import ARMORM_OBJECTIVES, ArmoRMHead
from tl_reward.tl_backend import tl_converter

#: ``<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n`` in the Llama-3 tokenizer.
LLAMA3_ASSISTANT_PATTERN: tuple[int, ...] = (128009, 128006, 78191, 128007, 271)


def gating_token_pattern(hf_model: nn.Module) -> list[int]:
    """The gating pattern: config ``gating_token_pattern``, else the modeling module's
    ``token_pattern`` constant (as in the published code), else the Llama-3 default."""
    pattern = getattr(hf_model.config, "gating_token_pattern", None)
    if pattern is None:
        pattern = getattr(sys.modules.get(type(hf_model).__module__), "token_pattern", None)
    return [int(t) for t in (pattern or LLAMA3_ASSISTANT_PATTERN)]


def armorm_head(hf_model: nn.Module, gain: torch.Tensor, objectives: list[str]) -> ArmoRMHead:
    """Copy ArmoRM's gating network, folding the final norm's gain into its first layer."""
    gating: Any = hf_model.gating
    layers = [float_copy(src, gain if i == 0 else None) for i, src in enumerate(gating.layers)]
    return ArmoRMHead(
        objectives,
        layers,
        transform=hf_model.reward_transform_matrix.detach().float(),
        temperature=float(gating.temperature),
        logit_scale=gating.logit_scale.detach().float(),
        token_pattern=gating_token_pattern(hf_model),
    )


ARMORM = register_architecture(
    Architecture(
        hf_class="LlamaForRewardModelWithGating",
        config=llama_config,
        convert=tl_converter("llama"),
        head=lambda m: m.regression_layer,
        reward_head=armorm_head,
        pooling="legacy",
        objective_names=ARMORM_OBJECTIVES,
        description="ArmoRM-Llama3-8B (multi-objective with gating; trust_remote_code=True)",
    )
)
