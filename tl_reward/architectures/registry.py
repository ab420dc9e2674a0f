"""Registry of HF reward-model architectures, keyed on the HF class name.

A user adds an architecture without editing the library:

    >>> from tl_reward.architectures import Architecture, register_architecture
    >>> register_architecture(Architecture(
    ...     hf_class="MyForSequenceClassification",
    ...     config=my_config_to_tl_dict,          # HF config -> HookedTransformerConfig kwargs
    ...     convert=my_body_converter,            # (hf_model, cfg) -> TransformerLens state dict
    ... ))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from tl_reward.errors import UnsupportedArchitectureError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformerConfig

    from tl_reward.model.heads import RewardHead

ConfigFn = Callable[[Any], dict[str, Any]]
ConvertFn = Callable[[nn.Module, "HookedTransformerConfig"], dict[str, torch.Tensor]]
HeadLayerFn = Callable[[nn.Module], nn.Linear]
RewardHeadFn = Callable[[nn.Module, torch.Tensor, list[str]], "RewardHead"]


def score_layer(hf_model: nn.Module) -> nn.Linear:
    """The ``score`` layer of an HF ``*ForSequenceClassification`` model."""
    return hf_model.score  # type: ignore[return-value]


@dataclass(frozen=True)
class Architecture:
    """How to turn one HF reward-model class into a ``HookedRewardModel``.

    Attributes:
        hf_class: the HF class name, e.g. ``"LlamaForSequenceClassification"``.
        config: maps the HF config to ``HookedTransformerConfig`` keyword arguments
            (``n_ctx`` from the HF config; no soft-cap on the reward head).
        convert: maps the HF model to a TransformerLens state dict for the body
            (embeddings, blocks, final norm); the loader writes ``unembed.*`` from ``head``.
        head: returns the ``nn.Linear`` reward layer (``[K, d_model]`` weight).
        reward_head: optional builder of a non-linear combination head (ArmoRM gating);
            called with the HF model, the final norm's gain and the objective names.
        pooling: default pooling rule (``"hf"``, ``"legacy"`` or ``"mask"``).
        hf_load_kwargs: extra kwargs for ``from_pretrained`` (e.g. eager attention).
        objective_names: optional default names of the K objectives.
        suffix_ids: optional map from the HF config to ids appended after every text or
            conversation input (InternLM2's reward token).
        bridge_body: optional map from the HF model to an HF body a TransformerBridge adapter
            knows, where its own is custom code (InternLM2's, as HF's ``LlamaModel``).
        step_tag: a process reward model's step tag (Qwen2.5-Math-PRM: ``"<extra_0>"``): the
            loaded model reads a reward at each step (:mod:`tl_reward.model.steps`).
    """

    hf_class: str
    config: ConfigFn
    convert: ConvertFn
    head: HeadLayerFn = score_layer
    reward_head: RewardHeadFn | None = None
    pooling: str = "hf"
    hf_load_kwargs: Mapping[str, Any] = field(default_factory=dict)
    objective_names: tuple[str, ...] | None = None
    description: str = ""
    suffix_ids: Callable[[Any], list[int]] | None = None
    bridge_body: Callable[[nn.Module], nn.Module] | None = None
    step_tag: str | None = None

    def suffix(self, hf_config: Any) -> tuple[int, ...]:
        """The ids appended after every text or conversation input (:attr:`suffix_ids`)."""
        return tuple(self.suffix_ids(hf_config)) if self.suffix_ids else ()


_REGISTRY: dict[str, Architecture] = {}


def register_architecture(arch: Architecture, overwrite: bool = False) -> Architecture:
    """Add ``arch`` to the registry (``overwrite=True`` replaces an existing entry)."""
    if arch.hf_class in _REGISTRY and not overwrite:
        raise ValueError(
            f"{arch.hf_class} is already registered; pass overwrite=True to replace it"
        )
    _REGISTRY[arch.hf_class] = arch
    return arch


def supported_architectures() -> list[str]:
    """The registered HF class names, sorted."""
    return sorted(_REGISTRY)


def get_architecture(hf_class: str) -> Architecture:
    """The registered architecture for ``hf_class``, or a clear error listing the supported ones."""
    try:
        return _REGISTRY[hf_class]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"unsupported reward-model architecture {hf_class!r}. Supported: "
            f"{', '.join(supported_architectures())}. To add one, build a "
            "tl_reward.architectures.Architecture (config and weight converters) and call "
            "tl_reward.register_architecture(...)."
        ) from None


def architecture_of(hf_model: nn.Module) -> Architecture:
    """Look up an in-memory HF model by its class name, then by ``config.architectures``."""
    name = type(hf_model).__name__
    if name in _REGISTRY:
        return _REGISTRY[name]
    for alt in getattr(getattr(hf_model, "config", None), "architectures", None) or []:
        if alt in _REGISTRY:
            return _REGISTRY[alt]
    return get_architecture(name)
