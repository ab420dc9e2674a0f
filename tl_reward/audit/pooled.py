"""Residual-stream activations at the pooled token ``t*``: the input every audit geometry uses.

Layers follow the patching convention: layer ``l`` in ``0..n_layers-1`` is the residual entering
block ``l`` (``hook_resid_pre``; layer 0 is the embedding) and ``n_layers`` is the final
residual (the last block's ``hook_resid_post``), which the final norm and head read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from jaxtyping import Float

from tl_reward.analysis.patching import site_hook
from tl_reward.errors import TLRewardError
from tl_reward.model.inputs import cached_batches, encode_inputs
from tl_reward.model.readout import normalise


def resid_hook(model: Any, layer: int) -> str:
    """Hook name of the residual stream at ``layer`` (``n_layers`` = final residual)."""
    return site_hook(model, "resid", layer)[0]


@torch.no_grad()
def residual_batches(
    model: Any, inputs: Sequence[Any], layer: int, batch_size: int = 8,
) -> Iterator[tuple[Any, Float[torch.Tensor, "batch pos d_model"], torch.Tensor]]:
    """Per batch of ``inputs`` (right-padded): the batch, its residual stream at ``layer`` (the
    model's dtype) and the pooled positions ``t*``."""
    if len(inputs) == 0:
        raise TLRewardError("no inputs: pass at least one text, conversation or (prompt, reply)")
    hook = resid_hook(model, layer)
    encoded = encode_inputs(model, inputs)
    for batch, cache in cached_batches(model, encoded, batch_size, (hook,)):
        yield batch, cache[hook], batch.pooled


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
    layer = model.cfg.n_layers if layer is None else layer
    out = []
    for _, resid, pos in residual_batches(model, inputs, layer, batch_size):
        h = resid[torch.arange(len(pos), device=pos.device), pos].float()
        out.append(normalise(model, h) if normed else h)
    return torch.cat(out)
