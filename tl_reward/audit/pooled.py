"""Residual-stream activations at the pooled token ``t*``: the input every audit geometry uses.

Layers follow the patching convention: layer ``l`` in ``0..n_layers-1`` is the residual entering
block ``l`` (``hook_resid_pre``; layer 0 is the embedding) and ``n_layers`` is the final
residual (the last block's ``hook_resid_post``), which the final norm and head read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float

from tl_reward.analysis.patching import site_hook
from tl_reward.analysis.readout import normalise
from tl_reward.errors import TLRewardError


def resid_hook(model: Any, layer: int) -> str:
    """Hook name of the residual stream at ``layer`` (``n_layers`` = final residual)."""
    return site_hook(model, "resid", layer)[0]


@torch.no_grad()
def pooled_residual(
    model: Any,
    inputs: Sequence[Any],
    layer: int | None = None,
    batch_size: int = 8,
    normed: bool = False,
) -> Float[torch.Tensor, "n d_model"]:
    """The residual at ``t*`` of each input at ``layer`` (default: the final residual), float32.

    ``normed=True`` applies the final norm afresh (gain folded into ``W_U``, so this is the
    vector the head's columns are dotted with). Returned on the model's device.
    """
    if len(inputs) == 0:
        raise TLRewardError("no inputs: pass at least one text, conversation or (prompt, reply)")
    layer = model.cfg.n_layers if layer is None else layer
    hook = resid_hook(model, layer)
    encoded = [model.encode(x) for x in inputs]
    out = []
    for s in range(0, len(encoded), batch_size):
        batch = model.collate(encoded[s : s + batch_size], "right")
        _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                        return_type=None, names_filter=lambda n: n == hook)
        pos = model.pool_positions(batch.tokens, batch.attention_mask)
        rows = torch.arange(batch.tokens.shape[0], device=batch.tokens.device)
        h = cache[hook][rows, pos].float()
        out.append(normalise(model, h) if normed else h)
    return torch.cat(out)
