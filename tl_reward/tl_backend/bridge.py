"""Reward models on TransformerLens's ``TransformerBridge``: the reward head is its unembed.

The bridge wraps the HF module itself and runs HF's own forward, so a reward bridge computes the
reward exactly as HF does; ``unembed.hook_out`` holds the head's output at every position
(``[batch, pos, K]``) and the reward is read there at the pooled token. Each family's adapter is
TransformerLens's own with two changes: ``unembed`` maps to the head (``score``), and
``prepare_model`` sets ``d_vocab_out`` to the number of objectives and turns off the logit soft
cap (Gemma-2's ``final_logit_softcapping``, which HF's sequence classifier never applies to the
score). They are registered under the HF class names through the
``transformer_lens.architectures`` entry point (and :func:`register_reward_adapters` where entry
points are not read), and the bridge is built with ``build_bridge_from_module``, which consults
that registry (``TransformerBridge.boot_transformers`` maps ``model_type`` to the causal LM).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformer_lens.factories.architecture_adapter_factory import ArchitectureAdapterFactory
from transformer_lens.hook_points import HookPoint
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.model_bridge.generalized_components import (
    PositionEmbeddingsAttentionBridge,
    UnembeddingBridge,
)
from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module
from transformer_lens.model_bridge.supported_architectures import (
    Gemma2ArchitectureAdapter,
    GPT2ArchitectureAdapter,
    LlamaArchitectureAdapter,
    MistralArchitectureAdapter,
    MixtralArchitectureAdapter,
    Olmo2ArchitectureAdapter,
    Phi3ArchitectureAdapter,
    Qwen2ArchitectureAdapter,
    Qwen3ArchitectureAdapter,
    Qwen3MoeArchitectureAdapter,
    StableLmArchitectureAdapter,
)


def reward_adapter(base: type, head: str = "score") -> type:
    """A subclass of TransformerLens adapter ``base`` whose unembed is the HF module ``head``."""

    class RewardAdapter(base):  # type: ignore[valid-type, misc]
        supports_generation = False
        supports_causal_loss = False

        def __init__(self, cfg: Any) -> None:
            super().__init__(cfg)
            self.component_mapping["unembed"] = UnembeddingBridge(name=head, config=self.cfg)
            attn = self.component_mapping["blocks"].submodules.get("attn")
            if isinstance(attn, PositionEmbeddingsAttentionBridge):
                float64_softmax(attn)

        def prepare_model(self, model: Any) -> None:
            super().prepare_model(model)
            self.cfg.d_vocab_out = int(model.config.num_labels)
            self.cfg.output_logits_soft_cap = -1.0  # HF's classifier never caps the score

    RewardAdapter.__name__ = RewardAdapter.__qualname__ = base.__name__.replace(
        "ArchitectureAdapter", "RewardAdapter")
    return RewardAdapter


class _KeptHookPoint(HookPoint):
    """``hook_attn_scores`` keeping what its hooks return, in float64 only, for
    :class:`_Float64Pattern`."""

    kept: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = super().__call__(x)
        self.kept = out if out.dtype == torch.float64 else None
        return out


class _Float64Pattern(HookPoint):
    """``hook_pattern`` whose float64 input is the softmax redone in float64 from the scores
    ``hook_attn_scores`` kept (a fully masked row, NaN, is 0 as TransformerLens makes it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores: _KeptHookPoint = self.__dict__["scores"]
        kept, scores.kept = scores.kept, None
        if kept is None or x.dtype != torch.float64 or kept.shape != x.shape:
            return x
        p = torch.softmax(kept, dim=-1)
        return torch.where(p.isnan(), torch.zeros_like(p), p)


def float64_softmax(attn: PositionEmbeddingsAttentionBridge) -> None:
    """Make ``attn`` compute its softmax in float64 for a float64 model, as HF's SDPA attention
    does: TransformerLens's ``PositionEmbeddingsAttentionBridge`` (Llama, Mistral, Qwen, Gemma-2,
    OLMo-2, StableLM, the MoE families) computes it in float32 whatever the dtype, which moved
    float64 rewards by about 1e-7 relative. Its ``hook_attn_scores`` keeps the (hooked) scores
    and ``hook_pattern`` redoes the softmax from them before its hooks run; other dtypes pass
    through unchanged."""
    attn.hook_attn_scores.__class__ = _KeptHookPoint
    attn.hook_pattern.__class__ = _Float64Pattern
    attn.hook_pattern.__dict__["scores"] = attn.hook_attn_scores  # not a submodule


class _RoundedHookPoint(HookPoint):
    """A hook point that first casts what it is given to ``cast_to`` (``None``: as given)."""

    cast_to: torch.dtype | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.cast_to is None else x.to(self.cast_to)


class Olmo2Attention(PositionEmbeddingsAttentionBridge):
    """OLMo-2's attention bridge with HF's rounding after the rotary: HF's OLMo-2 keeps cos and
    sin in float32 and casts the rotated q and k back to their dtype; TransformerLens applies
    Llama's rotary, which does not cast back, so in bf16 float32 attention weights met bf16
    values ("expected m1 and m2 to have the same dtype"). ``hook_rot_q`` and ``hook_rot_k``
    (fired right after the rotary) cast to the attention input's dtype first, so their hooks
    and the attention see HF's q and k."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("hook_rot_q", "hook_rot_k"):
            getattr(self, name).__class__ = _RoundedHookPoint  # keeps its hook conversion

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        self.hook_rot_q.cast_to = self.hook_rot_k.cast_to = hidden.dtype
        return super().forward(*args, **kwargs)


LlamaRewardAdapter = reward_adapter(LlamaArchitectureAdapter)
MistralRewardAdapter = reward_adapter(MistralArchitectureAdapter)
Qwen2RewardAdapter = reward_adapter(Qwen2ArchitectureAdapter)
Qwen3RewardAdapter = reward_adapter(Qwen3ArchitectureAdapter)
Gemma2RewardAdapter = reward_adapter(Gemma2ArchitectureAdapter)
GPT2RewardAdapter = reward_adapter(GPT2ArchitectureAdapter)
# beyond the HookedTransformer converters: architectures only the bridge loads
MixtralRewardAdapter = reward_adapter(MixtralArchitectureAdapter)


class Olmo2RewardAdapter(reward_adapter(Olmo2ArchitectureAdapter)):  # type: ignore[misc]
    """OLMo-2's reward adapter, its attention :class:`Olmo2Attention`."""

    _attention_bridge_cls = Olmo2Attention


Phi3RewardAdapter = reward_adapter(Phi3ArchitectureAdapter)
Qwen3MoeRewardAdapter = reward_adapter(Qwen3MoeArchitectureAdapter)
StableLmRewardAdapter = reward_adapter(StableLmArchitectureAdapter)

#: HF sequence-classification class -> its reward adapter (the entry points name the same).
REWARD_ADAPTERS: dict[str, type] = {
    "LlamaForSequenceClassification": LlamaRewardAdapter,
    "MistralForSequenceClassification": MistralRewardAdapter,
    "Qwen2ForSequenceClassification": Qwen2RewardAdapter,
    "Qwen3ForSequenceClassification": Qwen3RewardAdapter,
    "Gemma2ForSequenceClassification": Gemma2RewardAdapter,
    "GPT2ForSequenceClassification": GPT2RewardAdapter,
    "MixtralForSequenceClassification": MixtralRewardAdapter,
    "Olmo2ForSequenceClassification": Olmo2RewardAdapter,
    "Phi3ForSequenceClassification": Phi3RewardAdapter,
    "Qwen3MoeForSequenceClassification": Qwen3MoeRewardAdapter,
    "StableLmForSequenceClassification": StableLmRewardAdapter,
}


def head_classifier(hf_model: torch.nn.Module, score: torch.nn.Module, num_labels: int
                    ) -> torch.nn.Module:
    """HF's ``*ForSequenceClassification`` of ``hf_model``'s body with ``score`` as its head, read
    at every position: the reward bridge of a custom head (LM-head rows, ArmoRM's regression
    layer, QRM's expectation rows, INF-ORM's MLP). Built on the meta device, then the body and
    ``score`` are put in, shared (not copied)."""
    import copy

    import transformers

    from tl_reward.errors import UnsupportedArchitectureError

    body = hf_model.base_model
    name = type(body).__name__.removesuffix("Model") + "ForSequenceClassification"
    if name not in REWARD_ADAPTERS or not hasattr(transformers, name):
        raise UnsupportedArchitectureError(
            f"no reward bridge for a {type(body).__name__} body ({type(hf_model).__name__}); "
            f"supported: {sorted(REWARD_ADAPTERS)}. Load it with "
            "HookedRewardModel.from_pretrained (TransformerLens 3)")
    config = copy.deepcopy(hf_model.config)
    config.num_labels, config.architectures = num_labels, [name]
    with torch.device("meta"):
        model = getattr(transformers, name)(config)
    setattr(model, model.base_model_prefix, body)
    model.score = score
    return model.eval()


def register_reward_adapters() -> None:
    """Register every reward adapter not already known to TransformerLens's factory (the
    entry points normally have; this is the fallback, e.g. in a source checkout)."""
    ArchitectureAdapterFactory.discover_entry_points()
    known = ArchitectureAdapterFactory._adapters
    for name, adapter in REWARD_ADAPTERS.items():
        if name not in known:
            ArchitectureAdapterFactory.register_adapter(name, adapter)


class RewardBridge(TransformerBridge):
    """A ``TransformerBridge`` around an HF reward model (see the module docstring)."""

    def enable_compatibility_mode(self, *args: Any, center_unembed: bool = False,
                                  **kwargs: Any) -> None:
        """TransformerLens's compatibility mode without centring the head: centring a one-
        column unembed subtracts its mean and turns every reward into 0."""
        if center_unembed:
            raise ValueError("center_unembed=True would subtract the head's mean over its "
                             "objectives (every single reward becomes 0); a reward bridge "
                             "never centres its head")
        super().enable_compatibility_mode(*args, center_unembed=False, **kwargs)


def build_reward_bridge(hf_model: torch.nn.Module, architecture: str | None = None
                        ) -> RewardBridge:
    """The :class:`RewardBridge` of an in-memory HF reward model (no copy, no cast)."""
    register_reward_adapters()
    arch = architecture or type(hf_model).__name__
    if arch not in ArchitectureAdapterFactory._adapters:
        raise KeyError(arch)
    bridge = build_bridge_from_module(hf_model, arch, hf_config=hf_model.config)
    bridge.__class__ = RewardBridge
    return bridge  # type: ignore[return-value]


def is_bridge(model: object) -> bool:
    """Whether ``model`` runs on TransformerLens's ``TransformerBridge``."""
    return isinstance(model, TransformerBridge)


@functools.cache
def _with_saes(cls: type) -> type:
    """``cls`` with SAELens's ``SAETransformerBridge`` mixed in (one class per ``cls``)."""
    from tl_reward.errors import require_sae_lens

    require_sae_lens()  # imported only here, with a clear refusal: TransformerLens 4 has none
    from sae_lens import SAETransformerBridge
    from sae_lens.analysis.hooked_sae_transformer import set_deep_attr

    class WithSAEs(cls, SAETransformerBridge):  # type: ignore[valid-type, misc]
        @property
        def hook_dict(self) -> dict[str, Any]:
            """SAELens's hooks (an attached SAE's own included) with TransformerLens's aliases,
            which SAELens's bridge drops (and with them the HookedTransformer names)."""
            hooks = SAETransformerBridge.hook_dict.fget(self)
            self._add_aliases_to_hooks(hooks)
            return hooks

        def add_sae(self, sae: Any, use_error_term: bool | None = None) -> None:
            """SAELens's ``add_sae``, keeping the hook point the SAE replaces."""
            meta = sae.cfg.metadata
            where = self._resolve_hook_name(meta.hook_name_out or meta.hook_name)
            if where in self._hook_registry and meta.hook_name not in self._acts_to_saes:
                self._replaced.setdefault(where, self._hook_registry[where])
            super().add_sae(sae, use_error_term=use_error_term)

        def _reset_sae(self, act_name: str, prev_wrapper: Any = None) -> None:
            """SAELens's reset, then the hook point the SAE replaced put back: SAELens puts a
            fresh one there, on which hooks never fire."""
            where = self._transcoder_output_hooks.get(act_name,
                                                      self._resolve_hook_name(act_name))
            super()._reset_sae(act_name, prev_wrapper)
            if prev_wrapper is None and where in self._replaced:
                original = self._replaced.pop(where)
                set_deep_attr(self, where, original)
                original.name = where  # the block renamed it on assignment
                self._hook_registry[where] = original

    WithSAEs.__name__ = WithSAEs.__qualname__ = f"SAE{cls.__name__}"
    return WithSAEs


def sae_bridge(model: TransformerBridge) -> TransformerBridge:
    """``model`` as SAELens's ``SAETransformerBridge`` too (``saes()``, ``add_sae``,
    ``get_sae_hook_name``; an SAE's HookedTransformer hook name resolves as an alias). The
    result shares ``model``'s modules and hook registry (no copy; ``model`` keeps its class):
    an SAE attached to it replaces the hook point in the shared module tree until removed."""
    if hasattr(model, "_acts_to_saes"):  # already one
        return model
    new = object.__new__(_with_saes(type(model)))
    new.__dict__.update(model.__dict__)  # not copy.copy: that would rebind cfg to the copy
    new._acts_to_saes, new._transcoder_output_hooks, new._replaced = {}, {}, {}
    return new


def require_hooked(model: object, analysis: str) -> None:
    """Refuse ``analysis`` on a ``TransformerBridge`` (it needs ``HookedTransformer`` itself:
    its key/value prefix caches), naming the fix."""
    if is_bridge(model):
        from tl_reward.errors import TLRewardError

        raise TLRewardError(
            f"{analysis} does not run on a TransformerBridge ({type(model).__name__}): it "
            "needs HookedTransformer itself. Load the model with "
            "HookedRewardModel.from_pretrained (TransformerLens 3) for it; see docs/bridge.md "
            "for the analyses the bridge runs")
