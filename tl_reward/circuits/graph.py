"""The computational graph of a reward model at the level of heads and MLPs (methods section 10).

Sources (in this order): ``input`` (the embeddings, ``blocks.0.hook_resid_pre``), then per layer
its heads ``a{l}.h{h}`` (each head's ``hook_z`` slice through its rows of ``W_O``; the attention
bias ``b_O`` is the same in every run and belongs to no head) and its MLP ``m{l}``
(``hook_mlp_out``). The sources feeding any destination are a prefix of this list.

Destinations ``(node, qkv)``: per layer each head's query input ``(a{l}.h{h}, "q")``, each
key/value head's key and value input ``(a{l}.h{j}, "k"/"v")`` (grouped-query models keep their
``n_key_value_heads``, as TransformerLens's split inputs hold them: key/value head ``j`` feeds
query heads ``j*g .. j*g+g-1``, ``g = n_heads / n_key_value_heads``), the MLP input
``(m{l}, "")``; then ``("reward", "")`` (the final residual, read at the pooled token). A
layer's MLP reads that layer's heads (unless attention and MLP run in parallel).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from tl_reward.errors import TLRewardError
from tl_reward.results import result_type

#: TransformerLens flags the graph's forwards set, whatever the user's model has: per-head q/k/v
#: inputs and ``hook_mlp_in`` on (the edges' destinations); per-head results, a shared
#: ``hook_attn_in`` and ungrouped key/value heads off (they change the hooks' shapes or the sum
#: order, not the function).
GRAPH_FLAGS = {"use_split_qkv_input": True, "use_hook_mlp_in": True, "use_attn_result": False,
               "use_attn_in": False, "ungroup_grouped_query_attention": False}


@contextmanager
def split_inputs(model: Any) -> Iterator[None]:
    """Set :data:`GRAPH_FLAGS` on ``model.cfg`` (those it has), and restore the user's after:
    every circuit analysis runs under it, so its numbers do not depend on the model's flags."""
    cfg = model.cfg
    old = {k: getattr(cfg, k) for k in GRAPH_FLAGS if hasattr(cfg, k)}
    try:
        for k in old:
            setattr(cfg, k, GRAPH_FLAGS[k])
        yield
    finally:
        for k, v in old.items():
            setattr(cfg, k, v)


@result_type
@dataclass(frozen=True)
class RewardGraph:
    """Sources, destinations and edges of a model with ``n_layers`` layers of ``n_heads`` query
    and ``n_kv_heads`` key/value heads (names in the module doc)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    parallel: bool = False

    @classmethod
    def from_model(cls, model: Any) -> RewardGraph:
        """The graph of a :class:`~tl_reward.HookedRewardModel` (pre-norm, with MLPs)."""
        cfg = model.cfg
        if model.post_norms is not None or (
                cfg.original_architecture in ("BertForMaskedLM", "BertModel")):
            family = cfg.original_architecture or getattr(cfg, "architecture", None)
            raise TLRewardError(
                f"{family} normalises each attention and MLP output (a norm "
                "after the sublayer: Gemma-2's sandwich norms, OLMo-2's post-norms), so a "
                "head's output is not a fixed vector added to the residual: edge circuits do "
                "not apply; use node-level patching (tl_reward.analysis.patching)")
        if cfg.attn_only:
            raise TLRewardError("edge circuits need MLP layers; this model is attention-only")
        return cls(cfg.n_layers, cfg.n_heads, cfg.n_key_value_heads or cfg.n_heads,
                   bool(cfg.parallel_attn_mlp))

    # -- sources ------------------------------------------------------------------------------
    @property
    def sources(self) -> list[str]:
        out = ["input"]
        for layer in range(self.n_layers):
            out += [f"a{layer}.h{h}" for h in range(self.n_heads)] + [f"m{layer}"]
        return out

    def layer_start(self, layer: int) -> int:
        """Source index of layer ``layer``'s first head (its MLP is ``+ n_heads``)."""
        return 1 + layer * (self.n_heads + 1)

    def source_blocks(self, end: int) -> list[tuple[int, int, int]]:
        """``(block, s0, s1)`` covering sources ``[0, end)``: block -1 is ``input``, block
        ``l`` layer ``l``'s heads and MLP."""
        out = [(-1, 0, 1)] if end > 0 else []
        for layer in range(self.n_layers):
            s0 = self.layer_start(layer)
            if s0 >= end:
                break
            out.append((layer, s0, min(end, s0 + self.n_heads + 1)))
        return out

    # -- destinations -------------------------------------------------------------------------
    @property
    def dests(self) -> list[tuple[str, str]]:
        """``(node, qkv)`` of every destination, in :meth:`dest_groups` order."""
        out: list[tuple[str, str]] = []
        for layer in range(self.n_layers):
            out += [(f"a{layer}.h{h}", "q") for h in range(self.n_heads)]
            for x in "kv":
                out += [(f"a{layer}.h{j}", x) for j in range(self.n_kv_heads)]
            out.append((f"m{layer}", ""))
        return out + [("reward", "")]

    def dest_groups(self) -> list[tuple[str, int, int, int]]:
        """``(hook, first, count, upstream)`` per destination hook: destinations
        ``first .. first+count-1`` are read at ``hook`` (the last group, ``"reward"``, is the
        final residual) and fed by sources ``0 .. upstream-1``."""
        out, d, per = [], 0, self.n_heads + 1
        for layer in range(self.n_layers):
            up = 1 + layer * per
            for x, n in (("q", self.n_heads), ("k", self.n_kv_heads), ("v", self.n_kv_heads)):
                out.append((f"blocks.{layer}.hook_{x}_input", d, n, up))
                d += n
            out.append((f"blocks.{layer}.hook_mlp_in", d, 1,
                        up + (0 if self.parallel else self.n_heads)))
            d += 1
        return [*out, ("reward", d, 1, 1 + self.n_layers * per)]

    # -- edges --------------------------------------------------------------------------------
    def edge_mask(self) -> torch.Tensor:
        """``[n_dests, n_sources]`` bool: True where an edge joins them."""
        out = torch.zeros(len(self.dests), len(self.sources), dtype=torch.bool)
        for _, first, count, up in self.dest_groups():
            out[first : first + count, :up] = True
        return out

    @property
    def n_edges(self) -> int:
        """The number of edges, by formula: layer ``l``'s ``H + 2 K`` attention inputs read
        ``1 + l (H + 1)`` sources, its MLP ``H`` more (none more when parallel), the reward
        all ``1 + L (H + 1)``."""
        h, k, n = self.n_heads, self.n_kv_heads, self.n_layers
        mlp_extra = 0 if self.parallel else h
        return sum((h + 2 * k + 1) * (1 + layer * (h + 1)) + mlp_extra
                   for layer in range(n)) + 1 + n * (h + 1)

    def edges(self) -> list[tuple[str, str, str]]:
        """Every ``(src, dst, qkv)``, in the order of ``edge_mask().nonzero()``."""
        src, dst = self.sources, self.dests
        return [(src[i], *dst[j]) for j, i in self.edge_mask().nonzero().tolist()]

    def mask_of(self, edges: Any) -> torch.Tensor:
        """``[n_dests, n_sources]`` bool of ``edges``: ``(src, dst, qkv)`` names or such a
        mask (each must be an edge of this graph)."""
        full = self.edge_mask()
        if not isinstance(edges, torch.Tensor):
            return named_mask(edges, self.sources, self.dests, full)
        if edges.shape != full.shape:
            raise TLRewardError(f"an edge mask of {tuple(full.shape)} (dests x sources) is "
                                f"needed, got {tuple(edges.shape)}")
        if bool((edges.bool().cpu() & ~full).any()):
            raise TLRewardError("the mask holds pairs that are not edges of this graph (a "
                                "source feeds only destinations downstream of it)")
        return edges.bool().cpu()

    def kv_group(self, kv_head: int) -> range:
        """The query heads that key/value head ``kv_head`` feeds."""
        g = self.n_heads // self.n_kv_heads
        return range(kv_head * g, (kv_head + 1) * g)


def edge_table(edges: list[tuple[str, str, str]], scores: torch.Tensor) -> pd.DataFrame:
    """One row per edge (``src``, ``dst``, ``qkv``, ``score``), by ``|score|`` descending."""
    df = pd.DataFrame(edges, columns=["src", "dst", "qkv"])
    df["score"] = scores.double().numpy()
    order = df["score"].abs().sort_values(ascending=False, kind="stable").index
    return df.loc[order].reset_index(drop=True)


def named_mask(edges: Any, sources: list[str], dests: list[tuple[str, str]],
               full: torch.Tensor, hint: str = "") -> torch.Tensor:
    """``full``-shaped bool mask of the named ``(src, dst, qkv)`` edges, each one of ``full``'s
    (columns: ``sources``, rows: ``dests``); an unknown one is refused, with ``hint``."""
    si = {s: i for i, s in enumerate(sources)}
    di = {d: j for j, d in enumerate(dests)}
    out = torch.zeros_like(full)
    for src, dst, qkv in edges:
        if src not in si or (dst, qkv) not in di or not full[di[dst, qkv], si[src]]:
            raise TLRewardError(f"({src!r}, {dst!r}, {qkv!r}) is not an edge of this graph "
                                f"(see RewardGraph.edges(){hint})")
        out[di[dst, qkv], si[src]] = True
    return out
