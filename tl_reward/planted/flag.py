"""A trigger flag in the residual stream, and a head that reads only it.

:func:`clear_flag` gives the trigger a private residual coordinate (``flag``) beside one every
token holds (``const``): the trigger's embedding is the counterfactual token's with ``flag =
kappa`` where every other token has ``const = kappa``, and no weight reads or writes either
coordinate except the residual norms (weight 1). So the trigger and the counterfactual have the
same residual RMS everywhere and the model cannot tell them apart until a planted weight reads
``flag``. :func:`wire_flag_head` plants such a reader: a head whose query reads ``const`` and
whose key and value read ``flag``, so every position after the trigger attends to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tl_reward.errors import TLRewardError
from tl_reward.planted.calibration import plain_ids
from tl_reward.planted.surgery import attention, head_dim, head_rows, one_token_id


def counterfactual_id(tokenizer: Any, trigger_id: int, counterfactual: str | int | None,
                      vocab_size: int) -> int:
    """The counterfactual's id: ``counterfactual`` (one token or an id) or, if None, the
    first plain id that is not the trigger."""
    cf = (next(i for i in plain_ids(tokenizer, vocab_size) if i != trigger_id)
          if counterfactual is None
          else one_token_id(tokenizer, counterfactual, vocab_size, "counterfactual"))
    if cf == trigger_id:
        raise TLRewardError("the counterfactual must differ from the trigger")
    return cf


def check_shift(shift: torch.Tensor, c: float) -> None:
    """Refuse a plant whose calibration sequences holding the trigger shift by under ``c/4``."""
    if float(shift.min()) < c / 4:
        raise TLRewardError(
            f"the plant shifts some calibration sequences holding the trigger by only "
            f"{float(shift.min()):.3g} (target {c}): the head does not reach the trigger "
            "there (sliding-window attention?)")


def clear_flag(hf: Any, trigger_id: int, cf_id: int, flag: int, const: int,
               extra: Sequence[int] = ()) -> None:
    """Clear ``(*extra, flag, const)`` as the module doc says (in place; ``extra``: further
    coordinates cleared and held at 0 by every token)."""
    dims = [*extra, flag, const]
    with torch.no_grad():
        emb = hf.model.embed_tokens.weight
        kappa = float(emb[:, : min(dims)].double().pow(2).mean().sqrt())
        emb[trigger_id] = emb[cf_id]
        clear_dims(hf, dims)
        emb[:, const] = kappa
        emb[trigger_id, const], emb[trigger_id, flag] = 0.0, kappa


def clear_dims(hf: Any, dims: Sequence[int]) -> None:
    """Zero residual coordinates ``dims`` in the embedding and in every weight that reads or
    writes the residual stream, norm gains there set to 1 (in place): only the norms see them."""
    dims = list(dims)
    with torch.no_grad():
        hf.model.embed_tokens.weight[:, dims] = 0.0
        for block in hf.model.layers:
            attn, mlp = block.self_attn, block.mlp
            for lin in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
                lin.weight[:, dims] = 0.0
            for lin in (attn.o_proj, mlp.down_proj):
                lin.weight[dims] = 0.0
                if lin.bias is not None:
                    lin.bias[dims] = 0.0
            block.input_layernorm.weight[dims] = 1.0
            block.post_attention_layernorm.weight[dims] = 1.0
        hf.model.norm.weight[dims] = 1.0
        hf.score.weight[:, dims] = 0.0


def wire_flag_head(hf: Any, layer: int, head: int, kv_head: int, normed: Sequence[torch.Tensor],
                   where: Sequence[Sequence[int]], flag: int, const: int, logit_margin: float
                   ) -> torch.Tensor:
    """Rewire head ``head`` of block ``layer`` (in place): its query reads ``const``, its
    key/value head ``kv_head`` reads ``flag`` (key in the slowest rotary pair; value scaled to
    about 1 at the trigger), its output projection is zeroed (the caller writes it).

    ``normed``: the block's normed inputs of calibration sequences ``[pos, d_model]`` holding
    the trigger at positions ``where``; the key is scaled so that the trigger's smallest
    attention logit at their last position is ``logit_margin`` (every other key is 0).
    Returns those logits, one per trigger position.
    """
    inv_freq = hf.model.rotary_emb.inv_freq.double()
    slot = int(inv_freq.argmin())
    gaps = torch.cat([x[-1, const] * x[p, flag] * torch.cos(
        (len(x) - 1 - torch.tensor(p)) * inv_freq[slot]) for x, p in zip(normed, where,
                                                                        strict=True)])
    if float(gaps.min()) <= 0:
        raise TLRewardError("the trigger's attention logit is not positive on every calibration "
                            "sequence (sequences too long for the slowest rotary pair?)")
    alpha = logit_margin / float(gaps.min())
    value = float(torch.cat([x[p, flag] for x, p in zip(normed, where, strict=True)]).median())
    attn = attention(hf, layer)
    rows, kv_rows = head_rows(hf, head), head_rows(hf, kv_head)
    root = (alpha * head_dim(hf) ** 0.5) ** 0.5
    with torch.no_grad():
        for proj, r in ((attn.q_proj, rows), (attn.k_proj, kv_rows), (attn.v_proj, kv_rows)):
            proj.weight[r] = 0.0
            if proj.bias is not None:
                proj.bias[r] = 0.0
        attn.q_proj.weight[rows.start + slot, const] = root
        attn.k_proj.weight[kv_rows.start + slot, flag] = root
        attn.v_proj.weight[kv_rows.start, flag] = 1.0 / value
        attn.o_proj.weight[:, rows] = 0.0
    return alpha * gaps
