"""Weight surgery on HF Llama-style models (``model.model.layers[i].self_attn.{q,k,v,o}_proj``).

Each function returns a new model and leaves its argument untouched.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from tl_reward.errors import TLRewardError, check_range


def attention(hf: Any, layer: int) -> Any:
    """The attention module of block ``layer`` (negative counts from the end)."""
    return hf.model.layers[layer].self_attn


def head_dim(hf: Any) -> int:
    """Per-head width (``config.head_dim`` or ``hidden / heads``)."""
    cfg = hf.config
    return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


def expand_kv_heads(hf: Any) -> Any:
    """The same function with one key/value head per query head (grouped-query attention
    unrolled the way HF's ``repeat_kv`` does), so one head's K and V can change alone."""
    cfg = copy.deepcopy(hf.config)
    n_heads = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    new = copy.deepcopy(hf)
    if n_kv == n_heads:
        return new
    rep, hd = n_heads // n_kv, head_dim(hf)
    cfg.num_key_value_heads = n_heads
    for module in new.modules():
        if hasattr(module, "config"):
            module.config = cfg
    for block in new.model.layers:
        attn = block.self_attn
        for name in ("k_proj", "v_proj"):
            old = getattr(attn, name)
            lin = torch.nn.Linear(old.in_features, n_heads * hd, bias=old.bias is not None,
                                  dtype=old.weight.dtype, device=old.weight.device)
            with torch.no_grad():
                w = old.weight.view(n_kv, hd, -1).repeat_interleave(rep, 0)
                lin.weight.copy_(w.reshape(n_heads * hd, -1))
                if old.bias is not None:
                    lin.bias.copy_(old.bias.view(n_kv, hd).repeat_interleave(rep, 0).flatten())
            setattr(attn, name, lin)
        if hasattr(attn, "num_key_value_groups"):
            attn.num_key_value_groups = 1
        if hasattr(attn, "num_key_value_heads"):
            attn.num_key_value_heads = n_heads
    return new


def head_rows(hf: Any, head: int) -> slice:
    """Rows of ``q_proj`` (and, after :func:`expand_kv_heads`, ``k_proj``/``v_proj``) and
    columns of ``o_proj`` that belong to ``head``."""
    hd = head_dim(hf)
    return slice(head * hd, (head + 1) * hd)


def silence_heads(hf: Any, heads: Sequence[tuple[int, int]]) -> Any:
    """A copy with the output projection of each ``(layer, head)`` zeroed: those heads write
    nothing to the residual stream."""
    new = copy.deepcopy(hf)
    with torch.no_grad():
        for layer, head in heads:
            attention(new, layer).o_proj.weight[:, head_rows(new, head)] = 0.0
    return new


def one_token_id(tokenizer: Any, token: str | int, vocab_size: int, name: str = "trigger") -> int:
    """The id of ``token``: a one-token string or an id below ``vocab_size``."""
    if isinstance(token, str):
        ids = tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise TLRewardError(f"{name} {token!r} is {len(ids)} tokens; pass one token")
        return int(ids[0])
    check_range(f"{name} id", int(token), 0, vocab_size)
    return int(token)


def check_llama_like(hf: Any) -> None:
    """Raise unless ``hf`` has the module layout this package edits."""
    try:
        attn = attention(hf, 0)
        _ = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, hf.model.norm, hf.score)
    except AttributeError as err:
        raise TLRewardError(
            f"{type(hf).__name__} is not a Llama-style sequence classifier "
            "(model.layers[i].self_attn.{q,k,v,o}_proj, model.norm, score)") from err
