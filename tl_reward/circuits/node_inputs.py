"""SAE nodes as destinations of edges (Sparse Feature Circuits' construction: a feature at one
hook is the destination of components and of the features of an earlier hook).

A node's input is what its encoder reads: for an SAE at a residual hook, the residual there
(the sum of every source before it); for one at ``blocks.l.hook_mlp_out``, the MLP's input
``blocks.l.hook_mlp_in`` (the node reads it through the MLP and the encoder). Its columns
(:attr:`Site.cols`) are the graph sources upstream of that input, less those an earlier SAE
splits, then that SAE's nodes (:func:`~tl_reward.circuits.nodes.sae_changes`: their changes sum
to the split sources'). Edge ``c -> n`` gives node ``n``'s input alone column ``c``'s change:
with ``x`` the hook's activation and ``x'`` what ``n``'s input gives there (``x + dc``; for an
MLP-output SAE, the MLP's output at its input plus ``dc``), feature ``j``'s activation moves by
``enc(x')_j - enc(x)_j`` (the SAE's own encoder on the whole input: TopK is not separable per
feature) and its output by that times its decoder direction; the error node's output by the
rest of ``x' - x``. That output change reaches everything after the hook. EAP's first-order
score is ``dc . dM/d(input_n)``, the gradient by autograd through the MLP and ``sae.encode``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from tl_reward.circuits.graph import RewardGraph
from tl_reward.circuits.inputs import Batch
from tl_reward.circuits.nodes import after, encode_change, node_chunks, sae_changes, sae_split
from tl_reward.circuits.sources import chunks, delta
from tl_reward.errors import TLRewardError
from tl_reward.model.readout import accumulation_dtype

Hook = tuple[str, Callable[..., Any]]


@dataclass(frozen=True)
class Site:
    """Where the nodes of ``sae`` (at ``hook``, prefix ``prefix``, splitting sources ``lo ..
    hi-1``; features ``nodes``, then the error node) write and read: their input is read at
    ``reads`` and fed by the graph sources ``cols`` (upstream of ``reads``), then by the nodes
    of ``upstream``."""

    sae: Any
    hook: str
    prefix: str
    lo: int
    hi: int
    reads: str
    cols: tuple[int, ...]
    nodes: tuple[int, ...] = ()
    upstream: Site | None = None

    @property
    def up(self) -> int:
        """The graph sources ``0 .. up-1`` hold every source column."""
        return max(self.cols, default=-1) + 1

    @property
    def n_cols(self) -> int:
        """Source columns, then the upstream SAE's nodes (features, then its error node)."""
        return len(self.cols) + (0 if self.upstream is None else len(self.upstream.nodes) + 1)

    def dests(self, graph: RewardGraph) -> torch.Tensor:
        """``[n_dests]`` bool: the destinations after the hook (the nodes' edges out)."""
        return after(graph, self.hi)

    def with_nodes(self, nodes: list[int]) -> Site:
        return replace(self, nodes=tuple(nodes))

    def with_upstream(self, upstream: Site) -> Site:
        """This site fed by ``upstream``'s nodes, which replace the sources they split."""
        cols = tuple(c for c in self.cols if not upstream.lo <= c < upstream.hi)
        return replace(self, cols=cols, upstream=upstream)


def node_sites(graph: RewardGraph, saes: list[Any]) -> list[Site]:
    """The :class:`Site` of each SAE: one, or an ordered pair whose first SAE's nodes feed
    the second's inputs (:meth:`Site.with_upstream`, once the nodes are known)."""
    if len(saes) > 2:
        raise TLRewardError(f"sae= takes one SAE or an ordered pair [earlier, later]; got "
                            f"{len(saes)}: score the others in another call")
    out = []
    for sae in saes:
        hook = sae.cfg.metadata.hook_name
        prefix, lo, hi = sae_split(graph, hook)
        if prefix[0] == "m":  # the MLP's input: its dest group's hook and upstream sources
            reads = f"blocks.{prefix[1:]}.hook_mlp_in"
            up = next(u for h, _, _, u in graph.dest_groups() if h == reads)
        else:
            reads, up = hook, hi
        out.append(Site(sae, hook, prefix, lo, hi, reads, tuple(range(up))))
    if len(out) == 2 and (out[0].prefix == out[1].prefix or out[0].hi > out[1].up):
        raise TLRewardError(
            f"sae=[A, B]: A's nodes ({out[0].prefix}, {out[0].hook}) must all lie upstream of "
            f"the input of B's ({out[1].prefix}, {out[1].hook}); pass the earlier SAE first, "
            "at a different hook")
    return out


@dataclass
class Into:
    """Edges into one node of ``site`` per row, patched in one forward (exact attribution:
    nothing else is patched): row ``r`` adds ``sum_c add[r, c]`` times column ``c``'s change
    to the input of node ``node[r]`` (a feature id; ``d_sae``: the error node). ``base``
    ``[rows, pos, d_model]`` (an MLP-output SAE): the MLP's output with nothing patched (the
    clean run's), from which the node's input, run through the MLP, moves the hook's."""

    site: Site
    node: torch.Tensor
    add: torch.Tensor
    base: torch.Tensor | None = None


def column_changes(model: Any, graph: RewardGraph, site: Site, batch: Batch,
                   cur: dict[str, torch.Tensor], coef: torch.Tensor,
                   chunk_sources: int | None = None) -> torch.Tensor:
    """``[rows, pos, d_model]``: ``sum_c coef[r, c]`` times column ``c``'s change (a source's
    corrupted minus ``cur`` output, or an upstream node's change at ``cur``)."""
    from tl_reward.sae.splice import decoder_directions

    full = torch.zeros(coef.shape[0], site.up, dtype=coef.dtype, device=coef.device)
    full[:, list(site.cols)] = coef[:, : len(site.cols)]
    out: torch.Tensor | float = 0.0
    for block, s0, s1 in chunks(graph, site.up, chunk_sources):
        mm = full[:, s0:s1]
        if bool(mm.any()):
            d = delta(model, graph, batch.corr, cur, block, s0, s1, batch.mask)
            out = out + torch.einsum("rpsd,rs->rpd", d, mm.to(d.dtype))
    c = coef[:, len(site.cols):]
    if site.upstream is not None and bool(c.any()):
        df, d_err = sae_changes(model, graph, site.upstream.sae, batch, cur)
        ids = list(site.upstream.nodes)
        w = decoder_directions(site.upstream.sae).detach()[ids].to(df.dtype)
        c = c.to(df.dtype)[:, None]
        out = out + (df[..., ids] * c[..., :-1]) @ w + d_err * c[..., -1:]
    if isinstance(out, float):
        return torch.zeros_like(batch.corr["blocks.0.hook_resid_pre"])
    return out


def into_hooks(model: Any, graph: RewardGraph, batch: Batch, into: Into,
               cur: dict[str, torch.Tensor], chunk_sources: int | None = None) -> list[Hook]:
    """The forward hooks of :class:`Into`: at the node's input, its columns' changes; at the
    hook, the activation plus the node's output change (the module doc)."""
    from tl_reward.sae.splice import decoder_directions

    s, acc = into.site, accumulation_dtype(model)
    w = decoder_directions(s.sae).detach().to(acc)
    d_sae = w.shape[0]
    feat = into.node < d_sae
    j = into.node.clamp(max=d_sae - 1)

    def node_change(x: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
        df, d_err = encode_change(s.sae, w, x, dx, batch.mask)
        one = df.gather(2, j[:, None, None].expand(-1, df.shape[1], 1)) * w[j][:, None]
        return torch.where(feat[:, None, None], one, d_err)

    def dc(act: torch.Tensor) -> torch.Tensor:
        return column_changes(model, graph, s, batch, cur, into.add, chunk_sources)

    if s.reads == s.hook:  # a residual SAE: its input is its hook's activation
        def resid(act: torch.Tensor, hook: Any) -> torch.Tensor:
            x = act.to(acc)
            return (x + node_change(x, dc(act).to(acc))).to(act.dtype)
        return [(s.hook, resid)]

    def feed(act: torch.Tensor, hook: Any) -> torch.Tensor:  # the MLP runs on the new input
        return act + dc(act).to(act.dtype)

    def out(act: torch.Tensor, hook: Any) -> torch.Tensor:  # the clean output, node changed
        if into.base is None:
            raise TLRewardError("an MLP-output SAE's node inputs need base= (the MLP's output)")
        x = into.base.to(acc)
        return (x + node_change(x, act.to(acc) - x)).to(act.dtype)
    return [(s.reads, feed), (s.hook, out)]


def watch_hooks(site: Site, store: dict[str, torch.Tensor]) -> list[Hook]:
    """Hooks keeping, in a forward with gradients, the nodes' input (``"x"``), the hook's
    activation (``"h"``) and, after the backward, the gradient of what the forward reads of
    it (``"g"``). Each hands on a view of its own, so that a backward from ``h`` to ``x``
    (:func:`input_grads`) runs no hook of the forward's."""
    def keep_grad(act: torch.Tensor) -> torch.Tensor:
        out = act.view_as(act)
        out.register_hook(lambda g: store.__setitem__("g", g))
        return out

    if site.reads == site.hook:
        def both(act: torch.Tensor, hook: Any) -> torch.Tensor:
            store["x"] = store["h"] = act
            return keep_grad(act)
        return [(site.hook, both)]

    def read_x(act: torch.Tensor, hook: Any) -> torch.Tensor:
        store["x"] = act.view_as(act)
        return store["x"]

    def read_h(act: torch.Tensor, hook: Any) -> torch.Tensor:
        store["h"] = act
        return keep_grad(act)
    return [(site.reads, read_x), (site.hook, read_h)]


def input_grads(site: Site, store: dict[str, torch.Tensor], dtype: torch.dtype
                ) -> torch.Tensor:
    """``[len(site.nodes) + 1, rows, pos, d_model]``: ``dM/d(input_n)`` of each feature node,
    then the error node, from a :func:`watch_hooks` store after ``M``'s backward (the graph
    retained): feature ``j``'s is ``(g . w_j) df_j/dx`` (``g``: the gradient at the hook), the
    error node's ``g . d(h - f W)/dx``."""
    from tl_reward.sae.splice import decoder_directions

    x, h, g = store["x"], store["h"], store["g"].to(dtype)
    w = decoder_directions(site.sae).detach().to(dtype)
    f = site.sae.encode(h.to(site.sae.dtype)).to(dtype)
    gf = g @ w.T  # dM/df: each feature's output direction read by the gradient
    chunk = max(1, 2**24 // f.numel())  # features whose backward runs batched at once
    out = []
    for s in range(0, len(site.nodes), chunk):
        ids = site.nodes[s : s + chunk]
        go = torch.zeros(len(ids), *f.shape, dtype=dtype, device=f.device)
        for k, i in enumerate(ids):
            go[k, ..., i] = gf[..., i]
        (gx,) = torch.autograd.grad(f, x, go, retain_graph=True, is_grads_batched=True)
        out.append(gx.to(dtype))
    (ge,) = torch.autograd.grad(h.to(dtype) - f @ w, x, g, retain_graph=True)
    return torch.cat([*out, ge.to(dtype)[None]])


@torch.no_grad()
def input_scores(model: Any, graph: RewardGraph, site: Site, batch: Batch,
                 base: dict[str, torch.Tensor], grads: torch.Tensor,
                 chunk_sources: int | None = None) -> torch.Tensor:
    """``[n_nodes, n_cols]``: ``sum over rows, positions`` of each column's change at
    ``base`` (the clean run) times each node's input gradient ``grads`` (:func:`input_grads`,
    signed and summed over EAP-IG's points)."""
    from tl_reward.sae.splice import decoder_directions

    flat = grads.flatten(1)
    out = torch.zeros(len(grads), site.up, dtype=grads.dtype, device=grads.device)
    for block, s0, s1 in chunks(graph, site.up, chunk_sources):
        d = delta(model, graph, batch.corr, base, block, s0, s1, batch.mask)
        out[:, s0:s1] = flat @ d.permute(2, 0, 1, 3).reshape(s1 - s0, -1).T
    parts = [out[:, list(site.cols)]]
    if site.upstream is not None:
        df, d_err = sae_changes(model, graph, site.upstream.sae, batch, base)
        w = decoder_directions(site.upstream.sae).detach()
        ids = torch.tensor(site.upstream.nodes, dtype=torch.long, device=df.device)
        for _, d in node_chunks(df, d_err, w, ids):
            parts.append(flat @ d.permute(2, 0, 1, 3).flatten(1).T)
    return torch.cat(parts, 1)
