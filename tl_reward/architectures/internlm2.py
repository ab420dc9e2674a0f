"""InternLM2 reward models (internlm/internlm2-1_8b/7b/20b-reward, ``InternLM2ForRewardModel``,
custom code): a Llama-like body with a fused ``wqkv`` projection, ``v_head`` on the final
hidden state, read at a reward token appended after the conversation.

The fused projection's output is laid out ``(kv_head, group + 2, head_dim)``: each key/value
head's group of queries, then its key, then its value; it is split here into TransformerLens's
``W_Q``/``W_K``/``W_V``. ``config.reward_token_id`` is appended to every text or conversation
input (:attr:`HookedRewardModel.suffix_ids`), and the reward is read at it (the last real
token: HF's pooling rule, which equals the published last-mask-position rule because the reward
token is never the pad token). InternLM2's ``dynamic`` rotary scaling only changes positions
beyond ``max_position_embeddings``, which is also our ``n_ctx``: within it the plain rotary is
exact.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import einops
import torch
from torch import nn

if TYPE_CHECKING:  # TransformerLens 4 has none
    from transformer_lens import HookedTransformerConfig

from tl_reward.architectures.common import gated_rms_fields, require_false
from tl_reward.architectures.registry import Architecture, register_architecture


def internlm2_config(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig fields for an InternLM2 config."""
    require_false(hf_config, "bias")
    d_head = hf_config.hidden_size // hf_config.num_attention_heads
    scaling = dict(getattr(hf_config, "rope_scaling", None) or {})
    rope_src = hf_config
    if str(scaling.get("type", scaling.get("rope_type", ""))).lower() == "dynamic":
        rope_src = SimpleNamespace(rope_theta=hf_config.rope_theta, rope_scaling=None,
                                   max_position_embeddings=hf_config.max_position_embeddings)
    return gated_rms_fields(hf_config, d_head, rope_config=rope_src)


def convert_internlm2(hf_model: nn.Module, cfg: HookedTransformerConfig) -> dict[str, Any]:
    """TransformerLens state dict of an InternLM2 body (``unembed`` is written by the loader)."""
    body: Any = hf_model.model
    n_kv = cfg.n_key_value_heads or cfg.n_heads
    group = cfg.n_heads // n_kv
    kv = "_" if cfg.n_key_value_heads is not None else ""
    sd: dict[str, Any] = {"embed.W_E": body.tok_embeddings.weight, "ln_final.w": body.norm.weight}
    for i, layer in enumerate(body.layers):
        p = f"blocks.{i}."
        attn, mlp = layer.attention, layer.feed_forward
        w = attn.wqkv.weight.reshape(n_kv, group + 2, cfg.d_head, cfg.d_model)
        sd[p + "ln1.w"] = layer.attention_norm.weight
        sd[p + "attn.W_Q"] = einops.rearrange(w[:, :group], "h g d m -> (h g) m d")
        sd[p + f"attn.{kv}W_K"] = einops.rearrange(w[:, -2], "h d m -> h m d")
        sd[p + f"attn.{kv}W_V"] = einops.rearrange(w[:, -1], "h d m -> h m d")
        sd[p + "attn.b_Q"] = torch.zeros(cfg.n_heads, cfg.d_head, dtype=cfg.dtype)
        sd[p + f"attn.{kv}b_K"] = torch.zeros(n_kv, cfg.d_head, dtype=cfg.dtype)
        sd[p + f"attn.{kv}b_V"] = torch.zeros(n_kv, cfg.d_head, dtype=cfg.dtype)
        sd[p + "attn.W_O"] = einops.rearrange(attn.wo.weight, "m (n d) -> n d m", n=cfg.n_heads)
        sd[p + "attn.b_O"] = torch.zeros(cfg.d_model, dtype=cfg.dtype)
        sd[p + "ln2.w"] = layer.ffn_norm.weight
        sd[p + "mlp.W_gate"] = mlp.w1.weight.T
        sd[p + "mlp.W_in"] = mlp.w3.weight.T
        sd[p + "mlp.W_out"] = mlp.w2.weight.T
        sd[p + "mlp.b_in"] = torch.zeros(cfg.d_mlp, dtype=cfg.dtype)  # type: ignore[arg-type]
        sd[p + "mlp.b_out"] = torch.zeros(cfg.d_model, dtype=cfg.dtype)
    return sd


INTERNLM2 = register_architecture(
    Architecture(
        hf_class="InternLM2ForRewardModel",
        config=internlm2_config,
        convert=convert_internlm2,
        head=lambda m: m.v_head,
        suffix_ids=lambda c: [int(c.reward_token_id)],
        description="InternLM2 reward models (v_head at an appended reward token; "
                    "trust_remote_code=True)",
    )
)
