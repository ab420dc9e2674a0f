"""Qwen2.5-Math-PRM (``Qwen2ForProcessRewardModel``, custom code): a process reward model with
a Qwen2 body and a two-class ReLU MLP head, ``score = Sequential(Linear(d, d), ReLU,
Linear(d, 2))``, applied at every position.

A step's reward is read at the ``<extra_0>`` tag after it (:mod:`tl_reward.model.steps`): the
published probability is ``softmax(logits)[1]`` there, which is ``sigmoid(class_1 - class_0)``,
so the score is the linear reward ``class_1 - class_0`` (head weights ``[-1, 1]``). The head is
INF-ORM's :class:`~tl_reward.model.mlp_head.MLPRewardHead` (final-norm gain folded into its
first layer; ``W_U`` NaN). Each step's input is the prefix ending at its tag, so the pooled
token is the last attended one (``"mask"``), whatever the padding.
"""

from __future__ import annotations

import torch
from torch import nn

from tl_reward.architectures.inform import mlp_head, placeholder_head
from tl_reward.architectures.qwen2 import qwen2_config
from tl_reward.architectures.registry import Architecture, register_architecture
from tl_reward.model.mlp_head import MLPRewardHead
from tl_reward.tl_backend import tl_converter

#: the tag Qwen2.5-Math-PRM reads each step's reward at
STEP_TAG = "<extra_0>"


def prm_head(hf_model: nn.Module, gain: torch.Tensor, objectives: list[str]) -> MLPRewardHead:
    """The two-class MLP head, its score class 1 minus class 0 (the logit of the published
    probability ``softmax(logits)[1]``)."""
    return mlp_head(hf_model, gain, objectives, weights=torch.tensor([-1.0, 1.0]))


QWEN2_PRM = register_architecture(
    Architecture(
        hf_class="Qwen2ForProcessRewardModel",
        config=qwen2_config,
        convert=tl_converter("qwen2"),
        head=placeholder_head,
        reward_head=prm_head,
        pooling="mask",
        objective_names=("class_0", "class_1"),
        step_tag=STEP_TAG,
        description="Qwen2.5-Math-PRM (process RM: two-class MLP head read at each <extra_0>; "
                    "trust_remote_code=True)",
    )
)
