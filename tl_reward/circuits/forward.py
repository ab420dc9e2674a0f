"""One forward of the model with edges of its graph patched, and the metric read from it.

Each destination input (a head's q/k/v input, an MLP's input, the final residual) can get the
corrupted-minus-current difference of any of its upstream sources (``patch``) or of SAE nodes
(``nodes``), and report its gradient (``on_grad``); the embeddings can be replaced
(``embed``, EAP-IG's interpolation). The metric is one objective at each row's pooled token,
read by the library's one readout (float32 at least).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from tl_reward.circuits.graph import RewardGraph, split_inputs
from tl_reward.circuits.inputs import Batch
from tl_reward.circuits.node_inputs import Into, into_hooks
from tl_reward.circuits.nodes import sae_changes
from tl_reward.circuits.sources import chunks, delta, source_hooks
from tl_reward.errors import TLRewardError
from tl_reward.model.readout import accumulation_dtype, objective_at_pooled


@contextmanager
def frozen_params(model: Any) -> Iterator[None]:
    """Parameters without gradients for the duration (only destination inputs get them)."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in flags:
            p.requires_grad_(f)


def forward(
    model: Any, graph: RewardGraph, batch: Batch, *,
    patch: torch.Tensor | None = None,
    on_grad: Callable[[int, int, int, torch.Tensor], None] | None = None,
    embed: torch.Tensor | None = None,
    chunk_sources: int | None = None,
    nodes: tuple[Any, list[int], torch.Tensor] | None = None,
    into: Into | None = None,
    watch: Sequence[tuple[str, Callable[..., Any]]] = (),
) -> torch.Tensor:
    """The objective-ready final residual ``[batch, pos, d_model]`` of one forward.

    ``patch`` ``[batch or 1, n_dst, n_src]``: each destination input gets
    ``sum_u patch[v, u] * (a_u(corrupt) - a_u(this forward))``. ``nodes`` ``(sae, features,
    c [batch or 1, n_dst, len(features) + 1])``: destination ``v``'s input of row ``r`` gets
    ``sum_n c[r, v, n]`` times node ``n``'s change (those features', then the error node's;
    :func:`sae_changes` at this forward's activations). ``on_grad(first, count, upstream,
    grad)`` receives the
    gradient of each destination hook's input (the embeddings become a leaf that needs a
    gradient). ``embed`` replaces the embeddings. ``into``: edges into SAE nodes, one node per
    row (:class:`~tl_reward.circuits.node_inputs.Into`; nothing else patched). ``watch``:
    hooks run after every edit (they read activations).
    """
    cur: dict[str, torch.Tensor] = {}
    hooks: list[tuple[str, Callable[..., Any]]] = []
    if embed is not None or on_grad is not None:
        def leaf(act: torch.Tensor, hook: Any) -> torch.Tensor:
            e = (act if embed is None else embed).detach().to(act.dtype)
            return e.requires_grad_(on_grad is not None)
        hooks.append(("blocks.0.hook_resid_pre", leaf))
    if patch is not None or nodes is not None or into is not None:
        def rec(name: str) -> Callable[[torch.Tensor, Any], None]:
            return lambda act, hook: cur.__setitem__(name, act)  # by the name asked for
        sae_hook = [] if nodes is None else [nodes[0].cfg.metadata.hook_name]
        if into is not None and into.site.upstream is not None:
            sae_hook.append(into.site.upstream.hook)
        hooks += [(h, rec(h)) for h in {*source_hooks(model), *sae_hook}]

    # one mask for every row, patching more edges than it keeps (a circuit's complement, the
    # empty circuit): each input adds the running sum of all upstream differences, which grows
    # layer by layer (each difference built once), less those of the edges kept
    kept = None
    if patch is not None and patch.shape[0] == 1:
        every = graph.edge_mask().to(patch.device)
        if bool((patch[0].bool() & ~every).any()):
            raise TLRewardError("patch holds pairs that are not edges of the graph")
        kept = every & ~patch[0].bool()
        if int(kept.sum()) > int(patch[0].bool().sum()):
            kept = None
    run: dict[str, Any] = {"upto": 0, "sum": 0.0}
    own: dict[int, torch.Tensor] = {}  # each kept edge's source difference, once per forward

    def source_delta(u: int) -> torch.Tensor:
        if u not in own:
            block = next(b for b, s0, s1 in graph.source_blocks(u + 1) if s0 <= u < s1)
            own[u] = delta(model, graph, batch.corr, cur, block, u, u + 1, batch.mask)[:, :, 0]
        return own[u]

    def edit(act: torch.Tensor, first: int, count: int, up: int) -> torch.Tensor:
        if kept is not None:
            for block, s0, s1 in chunks(graph, up, chunk_sources):
                if max(s0, run["upto"]) < s1:
                    d = delta(model, graph, batch.corr, cur, block, max(s0, run["upto"]), s1,
                              batch.mask)
                    run["sum"] = run["sum"] + d.sum(2)
            run["upto"] = up
            if isinstance(run["sum"], torch.Tensor):
                add = run["sum"][:, :, None].expand(-1, -1, count, -1)
                rows = kept[first : first + count]
                if bool(rows.any()):
                    add = add.clone()
                    for j, u in rows.nonzero().tolist():
                        add[:, :, j] -= source_delta(u)
                act = act + (add if act.ndim == 4 else add[:, :, 0]).to(act.dtype)
        elif patch is not None:
            m = patch[:, first : first + count]
            if bool(m.any()):
                add: torch.Tensor | float = 0.0
                for block, s0, s1 in chunks(graph, up, chunk_sources):
                    mm = m[..., s0:s1].to(accumulation_dtype(model))
                    if not bool(mm.any()):
                        continue
                    d = delta(model, graph, batch.corr, cur, block, s0, s1, batch.mask)
                    add = add + (torch.einsum("rpsd,js->rpjd", d, mm[0]) if mm.shape[0] == 1
                                 else torch.einsum("rpsd,rjs->rpjd", d, mm))
                if isinstance(add, torch.Tensor):
                    act = act + (add if act.ndim == 4 else add[:, :, 0]).to(act.dtype)
        if nodes is not None and bool(nodes[2][:, first : first + count].any()):
            if "nodes" not in run:  # the nodes' changes, once per forward
                from tl_reward.sae.splice import decoder_directions

                df, d_err = sae_changes(model, graph, nodes[0], batch, cur)
                w = decoder_directions(nodes[0]).detach()[nodes[1]].to(df.dtype)
                run["nodes"] = df[..., nodes[1]], d_err, w
            df, d_err, w = run["nodes"]
            c = nodes[2][:, None, first : first + count].to(df.dtype)
            d = (df[:, :, None] * c[..., :-1]) @ w + d_err[:, :, None] * c[..., -1:]
            act = act + (d if act.ndim == 4 else d[:, :, 0]).to(act.dtype)
        if on_grad is not None:  # on a view: the bridge's hook_mlp_in hands over resid_mid
            act = act.view_as(act)  # itself, whose gradient includes the skip path's
            act.register_hook(lambda g: on_grad(first, count, up, g))
        return act

    groups = graph.dest_groups()
    fired: set[str] = set()

    def dest(name: str, first: int, count: int, up: int) -> Callable[..., torch.Tensor]:
        def fn(act: torch.Tensor, hook: Any) -> torch.Tensor:
            fired.add(name)
            return edit(act, first, count, up)
        return fn
    hooks += [(name, dest(*g)) for g in groups[:-1] for name in [g[0]]]
    if into is not None:
        hooks += into_hooks(model, graph, batch, into, cur, chunk_sources)
    hooks += list(watch)
    with split_inputs(model), model.hooks(fwd_hooks=hooks):
        resid = model.final_residual(batch.tokens, batch.mask)
    missed = [g[0] for g in groups[:-1] if g[0] not in fired]
    if missed:  # an edit that never ran would leave a silently wrong number
        family = model.cfg.original_architecture or getattr(model.cfg, "architecture", None)
        raise TLRewardError(
            f"{family}: the destination input {missed[0]} is never computed in this model's "
            f"forward ({len(missed)} such hooks), so edges into it cannot be patched (on the "
            "TransformerBridge, a block whose attention and MLP read one norm in parallel has "
            "no MLP input of its own); use node-level patching (tl_reward.analysis.patching)")
    _, first, count, up = groups[-1]
    return edit(resid, first, count, up)


def read_metric(model: Any, resid: torch.Tensor, batch: Batch, obj: str) -> torch.Tensor:
    """``[batch]`` the objective at each row's pooled token (the library's readout)."""
    return objective_at_pooled(model, resid, batch.tokens, batch.mask, [obj])[:, 0]


def per_item(values: torch.Tensor, batch: Batch, n_items: int) -> torch.Tensor:
    """Signed row values summed into their items: ``[n_items]``."""
    out = torch.zeros(n_items, dtype=values.dtype, device=values.device)
    return out.index_add(0, batch.item, values * batch.sign.to(values.dtype))


@torch.no_grad()
def corrupted_metric(model: Any, graph: RewardGraph, batch: Batch, obj: str,
                     chunk_sources: int | None = None) -> torch.Tensor:
    """``[rows]`` the objective with every edge corrupted: the counterfactual's own forward,
    or every edge patched to the ablated sources."""
    if batch.corr_tokens is not None:
        cb = Batch(batch.corr_tokens, batch.mask, batch.sign, batch.item)
        return read_metric(model, forward(model, graph, cb), cb, obj)
    everything = graph.edge_mask().to(batch.tokens.device)[None]
    return read_metric(model, forward(model, graph, batch, patch=everything,
                                    chunk_sources=chunk_sources), batch, obj)
