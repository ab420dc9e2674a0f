"""Fused attention for ``HookedRewardModel``: one ``scaled_dot_product_attention`` call where no
hook needs the pattern.

TransformerLens materialises every attention score and pattern (``[batch, head, pos, pos]``) so
that ``hook_attn_scores`` and ``hook_pattern`` can see them. When neither is hooked, cached or
replaced, :class:`FusedAttention` computes ``z`` from the same ``q``, ``k`` and ``v`` with
PyTorch's fused kernel instead; every other hook point (``hook_q/k/v``, ``hook_rot_q/k``,
``hook_z``) still fires on the same tensors. Anything the fused path does not reproduce (a
KV cache, soft-capped scores, ALiBi, attention sinks, OLMo's QK-norm, ``use_attn_result``)
runs TransformerLens's own forward. Set ``model.fused_attention = False`` to always
materialise.
"""

from __future__ import annotations

from typing import Any

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch.nn.modules import module as nn_module
from transformer_lens.components import Attention, GroupedQueryAttention
from transformer_lens.hook_points import HookPoint

#: TransformerLens applies these architectures' QK-norm inside its ``forward``, not in
#: ``calculate_qkv_matrices``; the fused path would skip it.
_QK_NORM_IN_FORWARD = ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM")


def _unhooked(point: Any) -> bool:
    """A stock hook point with nothing attached (a cache or ``run_with_hooks`` attaches)."""
    return type(point) is HookPoint and not point._forward_hooks and not point._forward_pre_hooks


def fused_unsupported(attn: Any, past_kv_cache_entry: Any = None,
                      additive_attention_mask: Any = None, position_bias: Any = None
                      ) -> str | None:
    """Why this call of ``attn`` must materialise its pattern, or ``None`` when it may fuse."""
    cfg = attn.cfg
    checks = [
        (not getattr(attn, "fused", False), "fused attention is off"),
        (not (_unhooked(attn.hook_attn_scores) and _unhooked(attn.hook_pattern)),
         "a hook needs the attention scores or pattern"),
        (bool(nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks),
         "a global module hook would see the pattern's hook point"),
        (past_kv_cache_entry is not None, "a key-value cache"),
        (additive_attention_mask is not None or position_bias is not None, "an additive bias"),
        (cfg.positional_embedding_type not in ("standard", "rotary"),
         f"{cfg.positional_embedding_type} positions"),
        ((attn._attention_dir_override or cfg.attention_dir) != "causal", "bidirectional"),
        ((cfg.attn_scores_soft_cap or 0) > 0, "soft-capped scores"),
        (bool(getattr(cfg, "use_attention_sinks", False)), "attention sinks"),
        (bool(getattr(cfg, "use_logn_attn", False)), "log-n query scaling"),
        (getattr(cfg, "clip_qkv", None) is not None, "clipped q, k, v"),
        (cfg.original_architecture in _QK_NORM_IN_FORWARD, "QK-norm in the forward"),
        (bool(cfg.use_attn_result or cfg.load_in_4bit), "per-head results or 4-bit weights"),
    ]
    return next((why for bad, why in checks if bad), None)


def _forward(
    self: Any,
    query_input: Float[torch.Tensor, "batch pos ..."],
    key_input: Float[torch.Tensor, "batch kv_pos ..."],
    value_input: Float[torch.Tensor, "batch kv_pos ..."],
    past_kv_cache_entry: Any = None,
    additive_attention_mask: Float[torch.Tensor, "batch 1 1 kv_pos"] | None = None,
    attention_mask: Int[torch.Tensor, "batch offset_pos"] | None = None,
    position_bias: Float[torch.Tensor, "1 head_index pos kv_pos"] | None = None,
) -> Float[torch.Tensor, "batch pos d_model"]:
    """The fused classes' ``forward``: fused where :func:`fused_unsupported` allows, else the
    TransformerLens class's own."""
    if fused_unsupported(self, past_kv_cache_entry, additive_attention_mask, position_bias):
        return self._stock.forward(self, query_input, key_input, value_input,
                                   past_kv_cache_entry, additive_attention_mask, attention_mask,
                                   position_bias)
    q, k, v = self.calculate_qkv_matrices(query_input, key_input, value_input)
    if self.cfg.positional_embedding_type == "rotary":
        q = self.hook_rot_q(self.apply_rotary(q, 0, attention_mask))
        k = self.hook_rot_k(self.apply_rotary(k, 0, attention_mask))
    n = q.shape[1]
    allowed, dead = None, None
    if attention_mask is not None or self.attn_type == "local":
        allowed = self._make_causal_mask(n, n, 0, q.device)  # [1, 1, pos, pos]
        if attention_mask is not None:
            allowed = allowed & attention_mask.to(q.device).bool()[:, None, None, :]
            # a query with no key to read (a left pad) gets z = 0, as TransformerLens's zeroed
            # pattern gives; it reads itself in the kernel so no NaN reaches any gradient
            dead = ~allowed.any(-1, keepdim=True)
            allowed = allowed | (dead & torch.eye(n, dtype=torch.bool, device=q.device))
    z = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=allowed,
        is_causal=allowed is None, scale=1.0 / float(self.attn_scale),
        enable_gqa=k.shape[2] != q.shape[2])
    if dead is not None:
        z = z.masked_fill(dead, 0.0)
    z = self.hook_z(z.transpose(1, 2))  # [batch, pos, head, d_head]
    w = einops.rearrange(self.W_O, "head d_head d_model -> d_model (head d_head)")
    return F.linear(z.reshape(*z.shape[:2], -1).to(w.dtype), w, self.b_O)


class FusedAttention(Attention):
    """TransformerLens's ``Attention`` with the fused path."""

    _stock = Attention
    fused: bool = True  # per module; ``HookedRewardModel.fused_attention`` sets every layer's
    forward = _forward


class FusedGroupedQueryAttention(GroupedQueryAttention):
    """TransformerLens's ``GroupedQueryAttention`` with the fused path (keys and values stay
    grouped: the kernel reads each key-value head for its query heads)."""

    _stock = GroupedQueryAttention
    fused: bool = True
    forward = _forward


_FUSED = {Attention: FusedAttention, GroupedQueryAttention: FusedGroupedQueryAttention}
_FUSED_CLASSES = tuple(_FUSED.values())


def install_fused_attention(model: Any) -> None:
    """Give every block's attention of ``model`` (a ``HookedTransformer``) the fused path; its
    parameters, buffers and hook points are untouched. Other attention classes stay as they are."""
    for block in model.blocks:
        fused = _FUSED.get(type(block.attn))
        if fused is not None:
            block.attn.__class__ = fused


def set_fused(model: Any, on: bool) -> None:
    """Turn the fused path of every installed layer on or off."""
    for block in model.blocks:
        if isinstance(block.attn, _FUSED_CLASSES):
            block.attn.fused = bool(on)


def fused_layers(model: Any) -> list[bool]:
    """Per layer, whether its attention has the fused path and it is on."""
    return [isinstance(b.attn, _FUSED_CLASSES) and b.attn.fused for b in model.blocks]
