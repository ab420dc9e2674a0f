"""Source outputs of the :class:`~tl_reward.circuits.graph.RewardGraph`: the hooks they are read
from, one recorded forward, and their differences between two runs.

A source's output is ``blocks.0.hook_resid_pre`` (``input``), a head's ``hook_z`` slice through
its rows of ``W_O`` (``a{l}.h{h}``; the attention bias ``b_O`` is the same in every run and
belongs to no head) or ``hook_mlp_out`` (``m{l}``). Differences are built one chunk of sources
at a time (never crossing a layer), never as the whole ``[batch, pos, sources, d_model]``
tensor; padding positions never contribute.
"""

from __future__ import annotations

from typing import Any

import torch

from tl_reward.circuits.graph import RewardGraph, split_inputs
from tl_reward.model.readout import accumulation_dtype


def source_hooks(model: Any) -> list[str]:
    """The hooks source outputs are read from: embeddings, each layer's ``hook_z`` and
    ``hook_mlp_out``."""
    out = ["blocks.0.hook_resid_pre"]
    for layer in range(model.cfg.n_layers):
        out.append(f"blocks.{layer}.attn.hook_z")
        if not model.cfg.attn_only:
            out.append(f"blocks.{layer}.hook_mlp_out")
    return out


def record(model: Any, tokens: torch.Tensor, mask: torch.Tensor,
           extra: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Source activations (and those of the ``extra`` hooks) of one unpatched forward."""
    hooks = set(source_hooks(model)) | set(extra)
    with torch.no_grad(), split_inputs(model):
        _, cache = model.run_with_cache(tokens, attention_mask=mask, return_type=None,
                                        names_filter=lambda n: n in hooks)
    return dict(cache.cache_dict)


def delta(model: Any, graph: RewardGraph, a: dict[str, torch.Tensor],
          b: dict[str, torch.Tensor], block: int, s0: int, s1: int,
          mask: torch.Tensor) -> torch.Tensor:
    """``[batch, pos, s1 - s0, d_model]``: outputs of sources ``s0 .. s1`` (one block) under
    ``a`` minus under ``b``, zero at padding, in the accumulation dtype."""
    acc = accumulation_dtype(model)
    if block < 0:
        h = "blocks.0.hook_resid_pre"
        d = (a[h].to(acc) - b[h].to(acc))[:, :, None]
    else:
        start, n_heads = graph.layer_start(block), graph.n_heads
        h0, h1 = s0 - start, s1 - start
        parts = []
        if h0 < min(h1, n_heads):
            z = f"blocks.{block}.attn.hook_z"
            dz = a[z][:, :, h0:h1].to(acc) - b[z][:, :, h0:h1].to(acc)
            w_o = model.blocks[block].attn.W_O[h0:min(h1, n_heads)].to(acc)
            parts.append(torch.einsum("rphe,hed->rphd", dz, w_o))
        if h1 > n_heads:
            m = f"blocks.{block}.hook_mlp_out"
            parts.append((a[m].to(acc) - b[m].to(acc))[:, :, None])
        d = torch.cat(parts, 2)
    return d * mask[:, :, None, None].to(acc)


def chunks(graph: RewardGraph, end: int, size: int | None) -> list[tuple[int, int, int]]:
    """Source ranges covering ``[0, end)``, each inside one block, at most ``size`` long."""
    out = []
    for block, s0, s1 in graph.source_blocks(end):
        step = size or (s1 - s0)
        out += [(block, a, min(s1, a + step)) for a in range(s0, s1, step)]
    return out
