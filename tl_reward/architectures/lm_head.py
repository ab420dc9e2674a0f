"""LM-head readouts: a causal LM whose reward is one or more rows of its LM head at the last
token (Llama-3.1-Nemotron-70B-Reward-HF reads row 0, the logit of token id 0).

``HookedRewardModel.from_pretrained(path, lm_head_rows=[0])`` loads a ``*ForCausalLM``
checkpoint whose body is a registered sequence-classification architecture (Llama, Mistral,
Qwen2/3, Gemma-2 without a final soft-cap, GPT-2) and sets ``W_U`` to those rows of the LM head
(``K`` = number of rows). The reward is then linear in the normed final residual, exactly like
a ``score`` layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from tl_reward.architectures.registry import Architecture, get_architecture
from tl_reward.errors import TLRewardError, UnsupportedArchitectureError

_SUFFIXES = ("ForCausalLM", "LMHeadModel")


def sequence_classification_name(causal_lm_class: str) -> str | None:
    """``LlamaForCausalLM`` -> ``LlamaForSequenceClassification`` (None if not a causal LM)."""
    for suffix in _SUFFIXES:
        if causal_lm_class.endswith(suffix):
            return causal_lm_class[: -len(suffix)] + "ForSequenceClassification"
    return None


def causal_lm_architecture(hf_model: nn.Module) -> Architecture:
    """The registered architecture whose body matches a causal LM's."""
    names = [type(hf_model).__name__,
             *(getattr(getattr(hf_model, "config", None), "architectures", None) or [])]
    for name in names:
        seq = sequence_classification_name(name)
        if seq is not None:
            arch = get_architecture(seq)
            softcap = getattr(hf_model.config, "final_logit_softcapping", None)
            if softcap:
                raise UnsupportedArchitectureError(
                    f"{name} soft-caps its logits (final_logit_softcapping={softcap}), so an "
                    "LM-head row is not linear in the residual; this readout is not supported"
                )
            return arch
    raise UnsupportedArchitectureError(
        f"lm_head_rows= needs a *ForCausalLM / *LMHeadModel model, got {names[0]}"
    )


def row_objectives(rows: Sequence[int]) -> list[str] | None:
    """The objective names of LM-head rows: ``lm_head_row_<id>`` for several (``None``: one
    row is the reward)."""
    return [f"lm_head_row_{int(r)}" for r in rows] if len(rows) > 1 else None


def lm_head_rows_layer(hf_model: nn.Module, rows: Sequence[int]) -> nn.Linear:
    """An ``nn.Linear`` holding ``rows`` of the LM head (its bias entries when it has one)."""
    head = hf_model.get_output_embeddings()  # type: ignore[operator]
    if head is None:
        raise TLRewardError(f"{type(hf_model).__name__} has no LM head")
    rows = [int(r) for r in rows]
    vocab = int(head.weight.shape[0])
    if not rows or any(not -vocab <= r < vocab for r in rows):
        raise TLRewardError(f"lm_head_rows must be a non-empty list of ids in [0, {vocab}); "
                            f"got {rows}")
    idx = torch.tensor(rows, device=head.weight.device)
    bias = getattr(head, "bias", None)
    layer = nn.Linear(head.weight.shape[1], len(rows), bias=bias is not None,
                      device=head.weight.device, dtype=head.weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(head.weight.detach()[idx])
        if bias is not None:
            layer.bias.copy_(bias.detach()[idx])
    return layer
