"""Plant two reward models identical up to block ``k``: every later block is redrawn.

Blocks ``< k``, the embeddings, the final norm and the head are copied; each parameter of
blocks ``>= k`` is redrawn as ``mean + std * noise`` of its own values (seeded), so the two
models compute the same residual stream up to block ``k`` and different ones after.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from tl_reward.errors import check_range
from tl_reward.planted.surgery import check_llama_like
from tl_reward.planted.trigger import PlantedModel


@dataclass(frozen=True)
class PrefixTruth:
    """Where two models agree.

    Attributes:
        k: the first redrawn block.
        identical: the blocks whose output (``blocks.{i}.hook_resid_post``) is the same in both
            models on every input: ``0 .. k - 1``.
        different: the blocks redrawn: ``k .. n_layers - 1``.
        seed: the redraw's seed.
    """

    k: int
    identical: tuple[int, ...]
    different: tuple[int, ...]
    seed: int


def plant_shared_prefix(hf: Any, tokenizer: Any, k: int, seed: int = 1) -> PlantedModel:
    """``PlantedModel(model=B, base=hf)`` with B equal to ``hf`` in blocks ``< k`` only."""
    check_llama_like(hf)
    n_layers = hf.config.num_hidden_layers
    check_range("k", k, 0, n_layers)
    other = copy.deepcopy(hf)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in other.model.layers[k:]:
            for p in block.parameters():
                flat = p.double().flatten()
                std = float(flat.std()) if flat.numel() > 1 else 0.0
                noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
                p.copy_((flat.mean() + std * noise).to(p.dtype))
    truth = PrefixTruth(k=k, identical=tuple(range(k)), different=tuple(range(k, n_layers)),
                        seed=seed)
    return PlantedModel(other.eval(), hf, tokenizer, truth)
