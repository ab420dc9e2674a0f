"""circuitsvis views: per-token reward maps and attention patterns of chosen heads.

Views are ``circuitsvis`` ``RenderedHTML`` objects: they display in notebooks and save to
standalone HTML with :func:`tl_reward.viz.html.save_html`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def clean_token(tok: str) -> str:
    """Byte-level BPE markers shown as plain spaces and newlines."""
    return tok.replace("\u0120", " ").replace("\u010a", "\n").replace("\u2581", " ")


def token_reward_map(tokens: Sequence[str], values: torch.Tensor | Sequence[float]) -> Any:
    """Tokens coloured by their contribution, on a scale symmetric around 0."""
    import circuitsvis as cv

    vals = torch.as_tensor(values, dtype=torch.float32)
    lim = float(vals.abs().max()) or 1.0
    return cv.tokens.colored_tokens([clean_token(t) for t in tokens], vals.tolist(),
                                    min_value=-lim, max_value=lim)


def attribution_token_map(dra: Any, index: int = 0, objective: int | str = 0,
                          head: tuple[int, int] | None = None) -> Any:
    """Reward map of input ``index`` from a ``DirectAttribution`` computed with
    ``per_position=True``: every head's direct contribution split over the source tokens it
    read (summed over heads, or one ``(layer, head)``)."""
    if dra.head_positions is None:
        raise ValueError("run direct_reward_attribution(..., per_position=True) for token maps")
    k = dra._obj(objective)
    per = dra.head_positions[index][..., k]
    vals = per.sum((0, 1)) if head is None else per[head[0], head[1]]
    return token_reward_map(dra.tokens[index][: vals.shape[0]], vals)


@torch.no_grad()
def head_attention_view(model: Any, tokens: torch.Tensor | Sequence[int],
                        heads: Sequence[tuple[int, int]]) -> Any:
    """Attention patterns of ``heads`` (``(layer, head)`` pairs) on one unpadded input."""
    import circuitsvis as cv

    toks = torch.as_tensor(tokens).reshape(1, -1).to(model.cfg.device)
    layers = {la for la, _ in heads}
    _, cache = model.run_with_cache(toks, attention_mask=torch.ones_like(toks), return_type=None,
                                    names_filter=lambda n: n in {
                                        f"blocks.{la}.attn.hook_pattern" for la in layers})
    pats = torch.stack([cache[f"blocks.{la}.attn.hook_pattern"][0, h] for la, h in heads])
    strs = [clean_token(t) for t in model.tokenizer.convert_ids_to_tokens(toks[0].tolist())]
    return cv.attention.attention_heads(pats.float().cpu(), strs,
                                        attention_head_names=[f"L{la}H{h}" for la, h in heads])


def top_heads(dra: Any, k: int = 4, index: int = 0, objective: int | str = 0
              ) -> list[tuple[int, int]]:
    """The ``k`` heads with the largest absolute direct contribution for input ``index``."""
    vals = dra.heads[index, ..., dra._obj(objective)]
    flat = vals.abs().flatten().argsort(descending=True)[:k]
    n_heads = vals.shape[1]
    return [(int(i) // n_heads, int(i) % n_heads) for i in flat]
