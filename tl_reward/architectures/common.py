"""Helpers shared by the architecture files: HF config fields across versions, head layers."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tl_reward.errors import UnsupportedArchitectureError


def float_copy(src: nn.Linear, gain: torch.Tensor | None = None) -> nn.Linear:
    """A float32 copy of ``src``, a final norm's ``gain`` (if given) folded into its inputs."""
    layer = nn.Linear(src.in_features, src.out_features, bias=src.bias is not None)
    with torch.no_grad():
        w = src.weight.detach().float()
        layer.weight.copy_(w if gain is None else w * gain.to(w.device)[None, :])
        if src.bias is not None:
            layer.bias.copy_(src.bias.detach().float())
    return layer


def rope_parameters(hf_config: Any) -> dict[str, Any]:
    """Rotary settings as one dict (transformers 5 ``rope_parameters`` or 4.x fields)."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    legacy = getattr(hf_config, "rope_scaling", None)
    if isinstance(legacy, dict):
        params = {**legacy, **params}
    theta = getattr(hf_config, "rope_theta", None)
    if theta is not None and "rope_theta" not in params:
        params["rope_theta"] = theta
    params.setdefault("rope_theta", 10000.0)
    return params


def rotary_fields(hf_config: Any, d_head: int) -> dict[str, Any]:
    """TransformerLens rotary fields, including Llama-3 NTK-by-parts scaling."""
    params = rope_parameters(hf_config)
    out: dict[str, Any] = {
        "positional_embedding_type": "rotary",
        "rotary_dim": d_head,
        "rotary_adjacent_pairs": False,
        "rotary_base": params["rope_theta"],
    }
    rope_type = str(params.get("rope_type") or params.get("type") or "default").lower()
    if rope_type == "llama3":
        out.update(
            use_NTK_by_parts_rope=True,
            NTK_original_ctx_len=params.get(
                "original_max_position_embeddings", hf_config.max_position_embeddings
            ),
            NTK_by_parts_low_freq_factor=params.get("low_freq_factor", 1.0),
            NTK_by_parts_high_freq_factor=params.get("high_freq_factor", 4.0),
            NTK_by_parts_factor=params.get("factor", 8.0),
        )
    elif rope_type not in ("default", "none"):
        raise UnsupportedArchitectureError(
            f"rotary scaling type {rope_type!r} is not supported yet (supported: default, llama3)"
        )
    return out


def head_dim(hf_config: Any) -> int:
    """The attention head size (``head_dim`` when set, else hidden / heads)."""
    d = getattr(hf_config, "head_dim", None)
    return int(d) if d else hf_config.hidden_size // hf_config.num_attention_heads


def require_false(hf_config: Any, *flags: str) -> None:
    """Reject config flags whose weights the converter would drop."""
    for flag in flags:
        if getattr(hf_config, flag, False):
            raise UnsupportedArchitectureError(
                f"{type(hf_config).__name__}.{flag}=True is not supported by this converter; "
                "register a custom Architecture that maps those weights"
            )


def gated_rms_fields(hf_config: Any, d_head: int | None = None, rope_config: Any = None
                     ) -> dict[str, Any]:
    """The fields every Llama-like body shares (RMSNorm, gated MLP, rotary; grouped-query
    attention only when there are fewer key/value heads than query heads; Gemma's
    ``hidden_activation`` over ``hidden_act``). ``d_head``: default :func:`head_dim`;
    ``rope_config`` overrides where the rotary settings are read from (default ``hf_config``)."""
    d_head = d_head or head_dim(hf_config)
    n_kv = hf_config.num_key_value_heads or hf_config.num_attention_heads
    return {
        "d_model": hf_config.hidden_size,
        "d_head": d_head,
        "n_heads": hf_config.num_attention_heads,
        "n_key_value_heads": n_kv if n_kv != hf_config.num_attention_heads else None,
        "d_mlp": hf_config.intermediate_size,
        "n_layers": hf_config.num_hidden_layers,
        "n_ctx": hf_config.max_position_embeddings,
        "eps": hf_config.rms_norm_eps,
        "d_vocab": hf_config.vocab_size,
        "act_fn": getattr(hf_config, "hidden_activation", None) or hf_config.hidden_act,
        "normalization_type": "RMS",
        "final_rms": True,
        "gated_mlp": True,
        **rotary_fields(rope_config if rope_config is not None else hf_config, d_head),
    }
