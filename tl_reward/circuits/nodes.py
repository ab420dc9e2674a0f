"""SAE nodes (Sparse Feature Circuits' construction).

With ``sae=`` (or one SAE attached with SAELens's ``add_sae``) at ``blocks.{l}.hook_mlp_out``
(it splits ``m{l}``) or a residual hook (``hook_resid_pre``/``hook_resid_post``: it splits the
sum of every source before it), each feature and the error term are sources of edges into every
destination after the hook. The hook's activation ``x`` moves by ``dx``, the sum of its split
sources' differences; feature ``i``'s output moves by ``(enc(x + dx)_i - enc(x)_i) W_dec[i]``
and the error node's by the rest of ``dx`` (the change of ``x - x_hat``), so the nodes' changes
sum exactly to ``dx`` and, EAP being linear in them, their edges into a destination sum to the
hook's. Nodes are the features whose activation changes at some real token (every other
feature's edges are exactly 0). Forwards run the plain model (an attached SAE is lifted off for
the call). The nodes as destinations of edges: :mod:`tl_reward.circuits.node_inputs`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from tl_reward.circuits.graph import RewardGraph
from tl_reward.circuits.inputs import Batch
from tl_reward.circuits.sources import chunks, delta
from tl_reward.errors import TLRewardError
from tl_reward.model.readout import accumulation_dtype


def sae_split(graph: RewardGraph, hook: str) -> tuple[str, int, int]:
    """``(prefix, lo, hi)``: the nodes' prefix of an SAE at ``hook``, whose activation is the
    sum of sources ``lo .. hi-1`` (plus constants)."""
    m = re.fullmatch(r"blocks\.(\d+)\.hook_(mlp_out|resid_pre|resid_post)", hook)
    if m is None or int(m[1]) >= graph.n_layers:
        raise TLRewardError(
            f"SAE nodes need an SAE at a hook whose activation is a sum of graph sources: "
            f"blocks.l.hook_mlp_out, hook_resid_pre or hook_resid_post; this SAE reads {hook!r}")
    prefix = f"m{m[1]}" if m[2] == "mlp_out" else f"r{int(m[1]) + (m[2] == 'resid_post')}"
    return (prefix, *node_split(graph, prefix))


def node_split(graph: RewardGraph, prefix: str) -> tuple[int, int]:
    """``(lo, hi)``: the SAE nodes ``{prefix}.*`` split the sum of sources ``lo .. hi-1``."""
    layer = int(prefix[1:])
    if prefix[0] == "m":
        s = graph.layer_start(layer) + graph.n_heads
        return s, s + 1
    return 0, graph.layer_start(layer)


def node_names(prefix: str, features: list[int]) -> list[str]:
    """The SAE nodes ``{prefix}.f{i}`` of ``features``, then the error node ``{prefix}.err``."""
    return [f"{prefix}.f{i}" for i in features] + [f"{prefix}.err"]


def after(graph: RewardGraph, hi: int) -> torch.Tensor:
    """``[n_dests]`` bool: the destinations that read sources ``0 .. hi-1``."""
    return torch.tensor([up >= hi for _, _, count, up in graph.dest_groups()
                         for _ in range(count)])


def edge_mask(graph: RewardGraph, prefix: str | None = None, n_nodes: int = 0) -> torch.Tensor:
    """``[n_dests, n_sources (+ n_nodes)]`` bool: the edges of ``graph``, or with ``n_nodes``
    SAE nodes at ``prefix`` (columns after the sources), whose edges replace those of the
    sources they split into the destinations after the hook."""
    full = graph.edge_mask()
    if prefix is None:
        return full
    lo, hi = node_split(graph, prefix)
    dests = after(graph, hi)
    full[:, lo:hi] &= ~dests[:, None]
    return torch.cat([full, dests[:, None].expand(-1, n_nodes)], 1)


@contextmanager
def lifted_saes(model: Any, sae: Any) -> Iterator[list[Any]]:
    """The SAEs to make nodes of: ``sae`` (one, or a list or tuple of them), else the one
    attached to ``model``, else none; every attached SAE is lifted off for the duration and
    attached again after, with its settings (SAELens keeps them on its wrappers,
    ``_acts_to_saes``). An SAE attached without its error term is refused (the forward would
    not be the one the graph sums)."""
    attached = dict(getattr(model, "_acts_to_saes", None) or {})
    bare = sorted(h for h, w in attached.items() if not w.use_error_term)
    if bare:  # without it the forward is not the graph's sum of sources
        raise TLRewardError(f"an SAE is attached at {bare[0]} without its error term; edge "
                            "circuits make its features and error term nodes: attach it with "
                            "use_error_term=True")
    if sae is None and len(attached) > 1:
        raise TLRewardError(f"{len(attached)} SAEs are attached ({sorted(attached)}); SAE "
                            "nodes come from one: pass sae= the one to use")
    if sae is None:
        saes = [w.sae for w in attached.values()][:1]
    else:
        saes = list(sae) if isinstance(sae, (list, tuple)) else [sae]
    if attached:
        model.reset_saes()
    try:
        yield saes
    finally:
        for w in attached.values():
            model.add_sae(w.sae, use_error_term=w.use_error_term,
                          exclude_special_tokens=w.exclude_special_tokens)


def encode_change(sae: Any, w: torch.Tensor, x: torch.Tensor, dx: torch.Tensor,
                  mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(df, d_err)``: the SAE's feature activations' change (its own encoder on the whole
    input; zero where ``mask`` is 0) and its error term's (the rest of ``dx``, through the
    decoder directions ``w``) when its hook's activation goes from ``x`` to ``x + dx``."""
    f0, f1 = (sae.encode(v.to(sae.dtype)).to(x.dtype) for v in (x, x + dx))
    df = (f1 - f0) * mask[:, :, None].to(x.dtype)
    return df, dx - df @ w.to(x.dtype)


@torch.no_grad()
def sae_changes(model: Any, graph: RewardGraph, sae: Any, batch: Batch,
                base: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(df [rows, pos, d_sae], d_err [rows, pos, d_model])``: each feature's activation
    change and the error node's output change when the sources the hook sums go from their
    activations in ``base`` (the clean run's, or a patched forward's) to the corrupted ones
    (zero at padding)."""
    from tl_reward.sae.splice import decoder_directions

    hook = sae.cfg.metadata.hook_name
    _, lo, hi = sae_split(graph, hook)
    acc = accumulation_dtype(model)
    dx = sum(delta(model, graph, batch.corr, base, b, max(s0, lo), s1, batch.mask).sum(2)
             for b, s0, s1 in chunks(graph, hi, None) if s1 > lo)
    return encode_change(sae, decoder_directions(sae).detach(), base[hook].to(acc), dx,
                         batch.mask)


def moved_features(df: torch.Tensor) -> torch.Tensor:
    """The features whose activation changes at some token of ``df`` ``[rows, pos, d_sae]``:
    the SAE's nodes (every other feature's edges out are exactly 0)."""
    return (df != 0).flatten(0, 1).any(0).nonzero().flatten()


def node_chunks(df: torch.Tensor, d_err: torch.Tensor, w: torch.Tensor, moved: torch.Tensor,
                size: int = 64) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(columns, changes [rows, pos, n, d_model])`` of the ``moved`` features (column =
    feature id) and then the error node (column ``d_sae``), ``size`` at a time."""
    for s in range(0, len(moved), size):
        i = moved[s : s + size]
        yield i, df[:, :, i, None] * w[i].to(df.dtype)
    yield torch.tensor([w.shape[0]], device=df.device), d_err[:, :, None]
