"""Reward circuits: a set of edges of the :class:`~tl_reward.circuits.graph.RewardGraph`, and
how much of the metric it alone carries (methods section 10).

Evaluating a circuit ``C`` is one forward in which every destination input reads
``in_v(current) + sum_{u -> v not in C} (a_u(corrupt) - a_u(current))``: every edge outside the
circuit carries its corrupted contribution. With SAE nodes (an attribution's ``features``), a
node's contribution is its share of the hook's activation (feature ``i``:
``enc(x)_i W_dec[i]``; the error node: the rest), and its change is
:func:`~tl_reward.circuits.nodes.sae_changes` at the current activation ``x``, as in the
attribution. Faithfulness is
``(m(C) - m(empty)) / (m(full) - m(empty))`` per item; the full circuit is the clean forward and
the empty one the corrupted forward (the counterfactual's, or every source ablated).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tl_reward.circuits.edges import EdgeAttribution, edge_attribution
from tl_reward.circuits.forward import corrupted_metric, forward, per_item, read_metric
from tl_reward.circuits.graph import RewardGraph, edge_table, named_mask
from tl_reward.circuits.inputs import Inputs, batches, is_pairs, prepare_inputs
from tl_reward.circuits.nodes import edge_mask, lifted_saes, node_names, node_split, sae_split
from tl_reward.data.pairs import as_pair_batch
from tl_reward.errors import TLRewardError, check_choice
from tl_reward.model.inputs import as_items
from tl_reward.model.readout import accumulation_dtype, resolve_objectives
from tl_reward.model.steps import StepSpec
from tl_reward.results import ShortRepr
from tl_reward.stats.estimate import Estimate
from tl_reward.stats.paired import summarise_mean
from tl_reward.stats.resampling import bootstrap_indices


def _ranking(scores: torch.Tensor, absolute: bool) -> torch.Tensor:
    """What edges are ranked by: ``|score|`` (``absolute``) or the score; -inf where no edge."""
    s = scores.nan_to_num(nan=-torch.inf)
    return s.abs().masked_fill(s == -torch.inf, -torch.inf) if absolute else s


@dataclass(repr=False)
class RewardCircuit(ShortRepr):
    """Edges of ``graph`` (``mask``: ``[n_dests, n_sources]`` bool), each on a path
    ``input -> ... -> reward`` of circuit edges: every constructor below prunes dangling
    edges (:func:`prune`). With SAE nodes at ``prefix`` (``m{l}``, ``r{l}``: see
    :class:`~tl_reward.circuits.edges.FeatureEdges`), ``mask`` has a column after the sources
    for each node (``features``, then the error node) and the split sources have no edges
    into destinations after the hook (:func:`edge_mask`); the nodes read the split sources
    whole. An attribution with ``features`` gives such circuits."""

    graph: RewardGraph
    mask: torch.Tensor
    prefix: str | None = None
    features: list[int] = field(default_factory=list)

    @classmethod
    def from_mask(cls, graph: RewardGraph, mask: torch.Tensor, prefix: str | None = None,
                  features: list[int] | None = None) -> RewardCircuit:
        """The circuit of the edges where ``mask`` (``[n_dests, n_sources]``, or with SAE nodes
        ``[n_dests, n_sources + len(features) + 1]``) is True."""
        features = list(features or [])
        full = edge_mask(graph, prefix, len(features) + 1)
        if mask.shape != full.shape:
            raise TLRewardError(f"a circuit mask of {tuple(full.shape)} (dests x sources) is "
                                f"needed, got {tuple(mask.shape)}")
        return cls(graph, prune(graph, mask.bool().cpu() & full, prefix), prefix, features)

    @classmethod
    def _of(cls, attribution: EdgeAttribution, mask: torch.Tensor) -> RewardCircuit:
        fe = attribution.features
        nodes = () if fe is None else (fe.prefix, fe.features)
        return cls.from_mask(attribution.graph, mask.view(len(attribution.graph.dests), -1),
                             *nodes)

    def headline(self) -> dict[str, Any]:
        full = edge_mask(self.graph, self.prefix, len(self.features) + 1)
        return {"edges": self.n_edges, "of": int(full.sum())}

    @property
    def n_edges(self) -> int:
        return int(self.mask.sum())

    def edges(self) -> list[tuple[str, str, str]]:
        """The circuit's ``(src, dst, qkv)``."""
        src, dst = self.graph.sources, self.graph.dests
        src = src if self.prefix is None else src + node_names(self.prefix, self.features)
        return [(src[i], *dst[j]) for j, i in self.mask.nonzero().tolist()]

    def view(self, attribution: EdgeAttribution, title: str | None = None) -> Any:
        """The circuit view (:meth:`EdgeAttribution.view`) of this circuit's edges alone,
        scored by ``attribution`` (of the same graph and SAE nodes), every edge shown."""
        fe = attribution.features
        if (attribution.graph.sources, attribution.graph.dests) != (
                self.graph.sources, self.graph.dests) or (
                None if fe is None else fe.prefix) != self.prefix:
            raise TLRewardError("the attribution scores another graph (or other SAE nodes) "
                                "than this circuit's: pass the one it was selected from")
        col = {s: i for i, s in enumerate(attribution.graph.sources + (
            [] if fe is None else fe.nodes))}
        edges = self.edges()
        if any(e[0] not in col for e in edges):
            raise TLRewardError("the circuit holds SAE features the attribution did not score")
        scores = attribution.circuit_scores()[self.mask.nonzero()[:, 0],
                                              torch.tensor([col[e[0]] for e in edges],
                                                           dtype=torch.long)]
        n = max(len(edges), 1)
        return attribution.view(title or f"Reward circuit: {self.n_edges} edges", n, n,
                                edge_table(edges, scores))

    @classmethod
    def top(cls, attribution: EdgeAttribution, n: int, absolute: bool = True) -> RewardCircuit:
        """The ``n >= 1`` edges of largest ``|score|`` (``absolute=False``: largest score), then
        pruned: edges off every ``input -> reward`` path go, so it may keep fewer (it warns
        then; :meth:`greedy` keeps ``n`` connected edges)."""
        _check_size(n)
        out = cls._top(attribution, n, absolute)
        if out.n_edges < n:
            warnings.warn(
                f"of the top {n} edges, {out.n_edges} lie on a path from the input to the "
                f"reward{' (none: an empty circuit)' if out.n_edges == 0 else ''}; the rest "
                "were pruned. RewardCircuit.greedy(attribution, n) grows a connected circuit "
                "of n edges from the reward", UserWarning, stacklevel=2)
        return out

    @classmethod
    def _top(cls, attribution: EdgeAttribution, n: int, absolute: bool) -> RewardCircuit:
        s = _ranking(attribution.circuit_scores(), absolute).flatten()
        mask = torch.zeros(s.numel(), dtype=torch.bool)
        mask[s.topk(max(0, min(int(n), int((s > -torch.inf).sum())))).indices] = True
        return cls._of(attribution, mask)

    @classmethod
    def fraction(cls, attribution: EdgeAttribution, f: float,
                 absolute: bool = True) -> RewardCircuit:
        """The top ``round(f * n_edges)`` edges (``0 <= f <= 1``; 0 edges: the empty circuit),
        pruned; the size a faithfulness curve reports is its ``n_edges``."""
        if not 0 <= f <= 1:
            raise TLRewardError(f"the fraction of edges must be in [0, 1], got {f}")
        return cls._top(attribution, round(f * int((~attribution.circuit_scores().isnan()).sum())),
                        absolute)

    @classmethod
    def threshold(cls, attribution: EdgeAttribution, t: float,
                  absolute: bool = True) -> RewardCircuit:
        """Every edge with ``|score| >= t`` (``absolute=False``: ``score >= t``)."""
        s = attribution.circuit_scores()
        return cls._of(attribution, ((s.abs() if absolute else s) >= t).nan_to_num(False))

    @classmethod
    def top_nodes(cls, attribution: EdgeAttribution, k: int,
                  absolute: bool = True) -> RewardCircuit:
        """A node circuit (MIB's node level): the ``k`` heads and MLPs of largest ``|node
        score|`` (``absolute=False``: score), a node's score being the sum of its outgoing
        edges' scores (to first order, the effect of corrupting its output everywhere), and
        every edge from ``input`` or a chosen node into a chosen node's input or ``reward``,
        then pruned."""
        _check_size(k)
        if attribution.features is not None:
            raise TLRewardError("node circuits are built from heads and MLPs; this attribution "
                                "has SAE nodes: select its edges (top, greedy, threshold)")
        node = attribution.scores.nan_to_num(0.0).sum(0)[1:]
        rank = node.abs() if absolute else node
        return cls._nodes(attribution, 1 + rank.topk(min(int(k), len(rank))).indices)

    @classmethod
    def _nodes(cls, attribution: EdgeAttribution, nodes: torch.Tensor) -> RewardCircuit:
        """Every edge from ``input`` or a source in ``nodes`` into their inputs or ``reward``,
        pruned."""
        g = attribution.graph
        chosen = torch.zeros(len(g.sources), dtype=torch.bool)
        chosen[0] = True  # input
        chosen[nodes] = True
        reads = torch.zeros(len(g.dests), dtype=torch.bool)
        reads[-1] = True  # reward
        for u, ds in enumerate(_feeds(g)):
            if chosen[u]:
                reads[ds] = True
        return cls._of(attribution, g.edge_mask() & chosen[None] & reads[:, None])

    @classmethod
    def greedy(cls, attribution: EdgeAttribution, n: int, absolute: bool = True
               ) -> RewardCircuit:
        """Grown from ``reward`` backwards: each step adds the edge of largest ``|score|``
        (``absolute=False``: score) into ``reward`` or into an input of a node already in the
        circuit, so every edge reaches ``reward``; the first steps after which :func:`prune`
        (which drops edges from nodes ``input`` does not reach) keeps at least ``n`` edges
        (more when one step connects several), or every step."""
        _check_size(n)
        g, fe = attribution.graph, attribution.features
        s = _ranking(attribution.circuit_scores(), absolute)
        prefix = None if fe is None else fe.prefix
        feeds = _feeds(g, prefix, s.shape[1])
        n = max(0, min(int(n), int((s > -torch.inf).sum())))
        cand = torch.full_like(s, -torch.inf)
        cand[-1] = s[-1]
        alive = torch.zeros(len(s), dtype=torch.bool)
        alive[-1] = True
        order: list[int] = []

        def pruned(steps: int) -> torch.Tensor:
            mask = torch.zeros(s.numel(), dtype=torch.bool)
            mask[order[:steps]] = True
            return prune(g, mask.view_as(s), prefix)

        kept = 0
        while kept < n and cand.max() > -torch.inf:  # rounds of n - kept steps
            for _ in range(n - kept):
                k = int(cand.argmax())
                d, u = divmod(k, s.shape[1])
                if cand[d, u] == -torch.inf:
                    break
                order.append(k)
                cand[d, u] = -torch.inf
                new = [f for f in feeds[u] if not alive[f]]
                if new:
                    alive[new], cand[new] = True, s[new]
            kept = int(pruned(len(order)).sum())
        lo, hi = 0, len(order)  # the fewest steps keeping n (kept grows with the steps)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if int(pruned(mid).sum()) >= n else (mid + 1, hi)
        return cls._of(attribution, pruned(hi))

    @classmethod
    def from_edges(cls, graph: RewardGraph,
                   edges: list[tuple[str, str, str]]) -> RewardCircuit:
        """The circuit of the named ``(src, dst, qkv)`` edges; sources may be the nodes of one
        SAE (``"m1.f7"``, ``"m1.err"``: those features become the circuit's)."""
        found = [m for e in edges if (m := re.fullmatch(r"([mr]\d+)\.(?:f(\d+)|err)", e[0]))]
        prefix = found[0][1] if found else None
        features = sorted({int(m[2]) for m in found if m[2] and m[1] == prefix})
        names = graph.sources + ([] if prefix is None else node_names(prefix, features))
        full = edge_mask(graph, prefix, len(features) + 1)
        mask = named_mask(edges, names, graph.dests, full,
                          "; SAE nodes: those of one SAE, whose edges replace those of the "
                          "sources they split into destinations after the hook")
        return cls.from_mask(graph, mask, prefix, features)


def _check_size(n: int) -> None:
    if int(n) != n or n < 1:
        raise TLRewardError(f"a circuit of n = {n} edges: n must be a whole number of at least "
                            "1 (RewardCircuit.fraction(attribution, f) takes a fraction)")


def _feeds(graph: RewardGraph, prefix: str | None = None, n_cols: int = 0) -> list[list[int]]:
    """Per source, the destinations that are its own inputs (a head's q, its key/value head's
    k and v; an MLP's input); ``input`` has none; then, up to ``n_cols``, per SAE node at
    ``prefix``, those of the sources it splits."""
    out: list[list[int]] = [[]]
    groups = graph.dest_groups()
    g = graph.n_heads // graph.n_kv_heads
    for layer in range(graph.n_layers):
        q, k, v, m = groups[4 * layer : 4 * layer + 4]
        out += [[q[1] + h, k[1] + h // g, v[1] + h // g] for h in range(graph.n_heads)]
        out.append([m[1]])
    if prefix is not None:
        lo, hi = node_split(graph, prefix)
        out += [sum(out[lo:hi], [])] * (n_cols - len(out))
    return out


def prune(graph: RewardGraph, mask: torch.Tensor, prefix: str | None = None) -> torch.Tensor:
    """``mask`` without dangling edges: keep ``u -> v`` only when ``u`` is reached from
    ``input`` and ``v`` reaches ``reward`` along edges of ``mask``. SAE nodes at ``prefix``
    (:func:`edge_mask`) are reached when a source they split is, and make its inputs reach
    ``reward`` when one of their edges does."""
    n_src, n_cols = len(graph.sources), mask.shape[1]
    feeds = _feeds(graph, prefix, n_cols)
    lo, hi = (n_src, n_src) if prefix is None else node_split(graph, prefix)
    order = [*range(hi), *range(n_src, n_cols), *range(hi, n_src)]  # upstream first
    reached = torch.zeros(n_cols, dtype=torch.bool)
    reached[0] = True
    for u in order[1:]:
        reached[u] = bool(reached[lo:hi].any() if u >= n_src
                          else (mask[feeds[u]] & reached).any())
    useful = torch.zeros(n_cols, dtype=torch.bool)
    alive = torch.zeros(len(graph.dests), dtype=torch.bool)
    alive[-1] = True
    for u in reversed(order):
        useful[u] = bool((mask[:, u] & alive).any())
        for d in feeds[u]:
            alive[d] |= useful[u]
    return mask & reached[None] & alive[:, None]


@dataclass(repr=False)
class CircuitEvaluation(ShortRepr):
    """A circuit's metric per item against the full and empty circuits.

    Attributes:
        circuit: the circuit; ``metric``, ``full``, ``empty``: ``[n_items]``;
        per_item: ``[n_items]`` faithfulness ``(metric - empty) / (full - empty)`` (NaN where
        full = empty); faithfulness: their mean with its sign-flip interval.
    """

    circuit: RewardCircuit
    metric: torch.Tensor
    full: torch.Tensor
    empty: torch.Tensor
    per_item: torch.Tensor
    faithfulness: Estimate


def _metrics(model: Any, graph: RewardGraph, inputs: Inputs, obj: str,
             circuits: list[RewardCircuit], batch_size: int, padding_side: str,
             sae: Any = None) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """``(full, empty, [metric of each circuit])``, each ``[n_items]`` on the CPU. A circuit
    with SAE nodes patches every split source's edge after the hook and takes back the
    change of each node edge it holds (the nodes' changes sum to the sources')."""
    from tl_reward.sae.splice import check_affine_sae, check_sae

    acc, dev, n = accumulation_dtype(model), model.cfg.device, inputs.n_items
    full, empty = (torch.zeros(n, dtype=acc, device=dev) for _ in range(2))
    out = [torch.zeros(n, dtype=acc, device=dev) for _ in circuits]
    n_src = len(graph.sources)
    with torch.no_grad(), lifted_saes(model, sae) as saes:  # forwards run the plain model
        if len(saes) > 1:
            raise TLRewardError(f"sae= holds {len(saes)} SAEs; a circuit holds the nodes of "
                                "one (circuits over two SAEs' nodes are not built)")
        sae = saes[0] if saes else None
        kws: list[dict[str, Any]] = []
        for c in circuits:
            kws.append({"patch": (graph.edge_mask() & ~c.mask[:, :n_src]).to(dev)[None]})
            if c.prefix is None:
                continue
            if sae is None or sae_split(graph, check_sae(model, sae))[0] != c.prefix:
                raise TLRewardError(f"this circuit has the nodes of an SAE at {c.prefix} (see "
                                    "FeatureEdges.prefix): pass that SAE as sae= or attach it")
            check_affine_sae(sae)
            kws[-1]["nodes"] = (sae, c.features, -c.mask[None, :, n_src:].to(dev, acc))
        for batch in batches(model, inputs, batch_size, padding_side):
            full += per_item(read_metric(model, forward(model, graph, batch), batch, obj),
                             batch, n)
            empty += per_item(corrupted_metric(model, graph, batch, obj), batch, n)
            for o, kw in zip(out, kws, strict=True):
                r = read_metric(model, forward(model, graph, batch, **kw), batch, obj)
                o += per_item(r, batch, n)
    return full.cpu(), empty.cpu(), [o.cpu() for o in out]


def _faithfulness(m: torch.Tensor, full: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
    den = full - empty
    return torch.where(den != 0, (m - empty) / torch.where(den != 0, den, 1), torch.nan)


def evaluate_circuit(model: Any, circuit: RewardCircuit, clean: Any, corrupt: Any = None,
                     ablation: str | None = None, reference: Any = None,
                     objective: int | str | None = None, batch_size: int = 8,
                     padding_side: str = "right", sae: Any = None,
                     step: StepSpec | None = None) -> CircuitEvaluation:
    """The metric with every edge outside ``circuit`` corrupted, and its faithfulness (inputs,
    corruption and ``step`` as :func:`~tl_reward.circuits.edges.edge_attribution`; ``sae``:
    the SAE whose nodes the circuit holds, default the one attached)."""
    graph = RewardGraph.from_model(model)
    if graph != circuit.graph:
        raise TLRewardError("the circuit was made on another model's graph")
    obj = resolve_objectives(model, objective)[0]
    inputs = prepare_inputs(model, clean, corrupt, ablation, reference, batch_size, step)
    full, empty, (m,) = _metrics(model, graph, inputs, obj, [circuit], batch_size,
                                 padding_side, sae)
    f = _faithfulness(m, full, empty)
    return CircuitEvaluation(circuit, m, full, empty, f,
                             summarise_mean(np.asarray(f.double().numpy())))


#: MIB's circuit sizes, as fractions of all edges.
MIB_SIZES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


@dataclass(repr=False)
class FaithfulnessCurve(ShortRepr):
    """Faithfulness of the top circuits of an attribution over circuit sizes.

    Attributes:
        sizes: the fractions of all edges selected (before pruning).
        n_edges: the pruned circuits' edge counts.
        faithfulness: ``[sizes]`` the mean over items.
        random: ``[sizes]`` the same for seeded random circuits of the same size (edges
            drawn uniformly, then pruned; for node circuits, heads and MLPs drawn uniformly).
        cpr: MIB's area under ``f`` over the edge fraction (trapezoids).
        cmd: MIB's area under ``|1 - f|`` over the edge fraction (trapezoids).
        method: the attribution's method (its label: EAP-IG's rule and steps).
        select: how the circuits were selected (``"top"``, ``"greedy"``, ``"nodes"``: then
            ``sizes`` are fractions of the heads and MLPs, and CPR and CMD are over them).
    """

    sizes: list[float]
    n_edges: list[int]
    faithfulness: torch.Tensor
    random: torch.Tensor
    cpr: float
    cmd: float
    method: str
    select: str = "top"

    def headline(self) -> dict[str, Any]:
        return {"CPR": self.cpr, "CMD": self.cmd}


def faithfulness_curve(model: Any, attribution: EdgeAttribution, clean: Any,
                       corrupt: Any = None, ablation: str | None = None, reference: Any = None,
                       sizes: tuple[float, ...] = MIB_SIZES, seed: int = 0,
                       batch_size: int = 8, padding_side: str = "right",
                       sae: Any = None, select: str = "top",
                       step: StepSpec | None = None) -> FaithfulnessCurve:
    """Faithfulness of circuits of ``attribution`` at ``sizes`` (fractions) against random
    circuits of the same size, with CPR and CMD (objective: the attribution's; with its SAE
    nodes, ``sae`` as :func:`evaluate_circuit`). ``select``: ``"top"``
    (:meth:`RewardCircuit.fraction`: the top fraction of edges, pruned; MIB's), ``"greedy"``
    (:meth:`RewardCircuit.greedy` of that many edges) or ``"nodes"``
    (:meth:`RewardCircuit.top_nodes` of that fraction of the heads and MLPs)."""
    check_choice(select, SELECTIONS, "select")
    graph = RewardGraph.from_model(model)
    if graph != attribution.graph:
        raise TLRewardError("the attribution was made on another model's graph")
    inputs = prepare_inputs(model, clean, corrupt, ablation, reference, batch_size, step)
    gen = torch.Generator().manual_seed(seed)
    top = [_select(attribution, select, f) for f in sizes]
    rand, edges = [], ~attribution.circuit_scores().isnan()
    n_all, n_nodes = int(edges.sum()), len(graph.sources) - 1
    for f in sizes:
        if select == "nodes":  # random heads and MLPs, as many
            perm = torch.randperm(n_nodes, generator=gen)[: round(f * n_nodes)]
            rand.append(RewardCircuit._nodes(attribution, 1 + perm))
            continue
        pick = torch.zeros(n_all, dtype=torch.bool)
        pick[torch.randperm(n_all, generator=gen)[: round(f * n_all)]] = True
        mask = torch.zeros_like(edges)
        mask[edges] = pick
        rand.append(RewardCircuit._of(attribution, mask))
    full, empty, ms = _metrics(model, graph, inputs, attribution.objective, top + rand,
                               batch_size, padding_side, sae)
    f = torch.stack([_faithfulness(m, full, empty).nanmean() for m in ms])
    x = torch.tensor(sizes, dtype=f.dtype)
    cur = f[: len(sizes)]
    return FaithfulnessCurve(list(sizes), [c.n_edges for c in top], cur, f[len(sizes):],
                             float(torch.trapezoid(cur, x)),
                             float(torch.trapezoid((1 - cur).abs(), x)), attribution.label,
                             select)


#: How :func:`faithfulness_curve` selects its circuits.
SELECTIONS = ("top", "greedy", "nodes")


def _select(attribution: EdgeAttribution, select: str, f: float) -> RewardCircuit:
    """The circuit of fraction ``f`` under ``select`` (0: the empty circuit)."""
    if select == "top":
        return RewardCircuit.fraction(attribution, f)
    if not 0 <= f <= 1:
        raise TLRewardError(f"the fraction must be in [0, 1], got {f}")
    g = attribution.graph
    n = round(f * (len(g.sources) - 1 if select == "nodes" else
                   int((~attribution.circuit_scores().isnan()).sum())))
    if n == 0:
        return RewardCircuit._of(attribution, torch.zeros(attribution.circuit_scores().shape,
                                                          dtype=torch.bool))
    return (RewardCircuit.top_nodes if select == "nodes" else RewardCircuit.greedy)(
        attribution, n)


# -- stability and held-out faithfulness --------------------------------------------------------
def _items(model: Any, clean: Any, corrupt: Any) -> tuple[list[Any], list[Any] | None]:
    """``clean`` and ``corrupt`` as lists of single items (a pair or a sequence each)."""
    items = list(as_pair_batch(model, clean)) if is_pairs(clean) else as_items(clean)
    bad = None if corrupt is None else as_items(corrupt)
    if bad is not None and len(bad) != len(items):
        raise TLRewardError(f"corrupt has {len(bad)} sequences for {len(items)} clean ones; "
                            "pass one counterfactual per clean sequence")
    return items, bad


def _top_k(scores: torch.Tensor, k: int) -> set[int]:
    return set(_ranking(scores, True).flatten().topk(k).indices.tolist())


def edge_stability(model: Any, clean: Any, corrupt: Any = None, k: int = 10,
                   n_bootstrap: int = 100, seed: int = 0, **kwargs: Any) -> float:
    """Mean Jaccard index between the top ``k`` edges (by ``|score|``) of all items and those
    of each of ``n_bootstrap`` seeded resamples of the items
    (:func:`~tl_reward.stats.resampling.bootstrap_indices`): 1 when every resample picks the
    same edges. Per-item scores: one :func:`~tl_reward.circuits.edges.edge_attribution` per
    item (``kwargs``: its method, ablation, reference, objective, ...; mean ablation's
    reference defaults to every clean item)."""
    items, bad = _items(model, clean, corrupt)
    if kwargs.get("ablation") == "mean" and kwargs.get("reference") is None:
        kwargs["reference"] = clean
    per = torch.stack([edge_attribution(model, [x], None if bad is None else [bad[i]],
                                        **kwargs).scores for i, x in enumerate(items)])
    ref = _top_k(per.mean(0), k)
    jac = [len(ref & (got := _top_k(per[idx].mean(0), k))) / len(ref | got)
           for idx in bootstrap_indices(len(items), n_bootstrap, seed)]
    return float(np.mean(jac))


def heldout_faithfulness(model: Any, clean: Any, corrupt: Any = None, *,
                         select: Callable[[EdgeAttribution], RewardCircuit],
                         fraction: float = 0.5, seed: int = 0, **kwargs: Any
                         ) -> CircuitEvaluation:
    """The circuit ``select`` picks from the attribution on a seeded random ``fraction`` of the
    items, evaluated (:func:`evaluate_circuit`) on the other items. ``kwargs``: the
    attribution's method, ablation, objective, ... (the evaluation takes those it reads)."""
    items, bad = _items(model, clean, corrupt)
    n_fit = round(fraction * len(items))
    if not 0 < n_fit < len(items):
        raise TLRewardError(f"a fraction of {fraction} of {len(items)} items leaves one side "
                            "empty; pass more items or a fraction nearer 0.5")
    order = np.random.default_rng(seed).permutation(len(items))

    def side(idx: np.ndarray) -> tuple[list[Any], list[Any] | None]:
        return [items[i] for i in idx], None if bad is None else [bad[i] for i in idx]

    circuit = select(edge_attribution(model, *side(order[:n_fit]), **kwargs))
    keep = {k: v for k, v in kwargs.items()
            if k in ("ablation", "reference", "objective", "batch_size", "padding_side", "sae",
                     "step")}
    return evaluate_circuit(model, circuit, *side(order[n_fit:]), **keep)
