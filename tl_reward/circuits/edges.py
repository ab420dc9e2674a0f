"""Edge attribution: how much each edge of the :class:`~tl_reward.circuits.graph.RewardGraph`
carries the reward.

Sign convention (noising): ``score(u -> v) = M(u's contribution to v's input replaced by its
corrupted one) - M(clean)``, or the first-order estimate of it, averaged over items. ``M`` is
one objective read at the pooled token through the library's readout (float32 at least):
``r(x)`` for sequences, the margin ``r(chosen) - r(rejected)`` for preference pairs.
Corruption: :mod:`tl_reward.circuits.inputs`; SAE nodes: :mod:`tl_reward.circuits.nodes`.

Methods: ``"exact"`` (one patched forward per edge, edges stacked along the batch: the oracle
for small graphs), ``"eap"`` (``(a_u(corrupt) - a_u(clean)) . dM/d(in_v)`` on the clean run,
summed over positions) and ``"eap-ig"`` (the same difference times the mean gradient over
``m = ig_steps`` points ``alpha`` on the line ``corrupt + alpha (clean - corrupt)`` between the
corrupted and the clean embeddings). Where the points sit is ``ig_rule`` (:data:`IG_RULES`):
``"left"``, ``alpha = k / m`` for ``k = 0..m-1``, is the rule of the reference implementation
(hannamw/EAP-IG) and of MIB's copy of it; ``"right"``, ``k = 1..m``, the other end;
``"midpoint"``, ``(k + 1/2) / m``. Left and right differ by ``(g(clean) - g(corrupt)) . delta /
m``; at ``m = 1`` left is the gradient at the corrupted input and right is EAP.

A head's output is its ``hook_z`` through its rows of ``W_O``; padding positions never
contribute. Source differences are built one chunk of sources at a time (at most
``chunk_sources``, never crossing a layer). EAP and EAP-IG hold every destination's gradient,
summed over the IG points, for one batch: ``[n_dests, rows, pos, d_model]`` in the accumulation
dtype (lower ``batch_size`` to shrink it), so each source difference is built and contracted
once per batch. With SAE nodes, their changes are taken at the clean run; edges into them:
:mod:`tl_reward.circuits.node_inputs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from tl_reward.circuits.forward import (
    corrupted_metric,
    forward,
    frozen_params,
    per_item,
    read_metric,
)
from tl_reward.circuits.graph import RewardGraph, edge_table
from tl_reward.circuits.inputs import Batch, batches, prepare_inputs
from tl_reward.circuits.node_inputs import (
    Into,
    Site,
    input_grads,
    input_scores,
    node_sites,
    watch_hooks,
)
from tl_reward.circuits.nodes import (
    edge_mask,
    lifted_saes,
    moved_features,
    node_chunks,
    node_names,
    sae_changes,
)
from tl_reward.circuits.sources import chunks, delta, record
from tl_reward.errors import TLRewardError, check_choice
from tl_reward.model.readout import accumulation_dtype, resolve_objectives
from tl_reward.model.steps import StepSpec
from tl_reward.results import ShortRepr

METHODS = ("exact", "eap", "eap-ig")
#: EAP-IG's rules for its points on the corrupted (0) -> clean (1) line (the module doc).
IG_RULES = ("left", "right", "midpoint")
#: The default rule, chosen by agreement with exact edge patching (docs/circuits.md).
DEFAULT_IG_RULE = "right"


def ig_alphas(rule: str, steps: int) -> list[float]:
    """The ``steps`` points of EAP-IG's ``rule`` on the corrupted (0) -> clean (1) line."""
    check_choice(rule, IG_RULES, "ig_rule")
    if steps < 1:
        raise TLRewardError(f"ig_steps must be at least 1, got {steps}")
    shift = {"left": 0.0, "right": 1.0, "midpoint": 0.5}[rule]
    return [(k + shift) / steps for k in range(steps)]


@dataclass(repr=False)
class FeatureEdges(ShortRepr):
    """Edges out of the nodes of an SAE at ``hook`` (see the module doc), and, where scored,
    the edges into them (:mod:`tl_reward.circuits.node_inputs`).

    Attributes:
        graph: the edge graph.
        hook: the hook the SAE reads.
        prefix: the nodes' prefix: ``m{l}`` (``hook_mlp_out``) or ``r{l}`` (the residual
            entering layer ``l``); nodes are ``{prefix}.f{i}`` and ``{prefix}.err``.
        features: the features that are nodes (their activation changes at some token).
        scores: ``[n_dests, len(features) + 1]`` (NaN where no edge; the last column is the
            error node's): the mean over items.
        inputs: ``[len(features) + 1, len(input_sources)]`` the edges into each node (rows as
            ``scores``' columns), the mean over items; None where not scored.
        input_sources: the sources of those edges: the graph sources upstream of the nodes'
            input (less those an earlier SAE splits), then that SAE's nodes.
    """

    graph: RewardGraph
    hook: str
    prefix: str
    features: list[int]
    scores: torch.Tensor
    inputs: torch.Tensor | None = None
    input_sources: list[str] = field(default_factory=list)

    def headline(self) -> dict[str, Any]:
        out = {"hook": self.hook, "features": len(self.features)}
        return out if self.inputs is None else out | {"edges in": self.inputs.numel()}

    @property
    def nodes(self) -> list[str]:
        return node_names(self.prefix, self.features)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per edge out of a node (and into one, where scored: ``dst`` the node's
        name, ``qkv`` empty), as :meth:`EdgeAttribution.to_dataframe`."""
        has = ~self.scores.isnan()
        dst, nodes = self.graph.dests, self.nodes
        edges = [(nodes[i], *dst[j]) for j, i in has.nonzero().tolist()]
        scores = self.scores[has]
        if self.inputs is not None:
            edges += [(src, node, "") for node in nodes for src in self.input_sources]
            scores = torch.cat([scores, self.inputs.flatten()])
        return edge_table(edges, scores)


@dataclass(repr=False)
class EdgeAttribution(ShortRepr):
    """Edge scores of one model on a set of items (sign convention in the module doc).

    Attributes:
        graph: the edge graph.
        scores: ``[n_dests, n_sources]`` (NaN where no edge): the mean over items.
        method: ``"exact"``, ``"eap"`` or ``"eap-ig"``; objective: the objective read.
        settings: ablation (None for counterfactuals), ig_steps and ig_rule (EAP-IG's; 0 and
            None otherwise), items.
        clean_metric, corrupt_metric: ``[n_items]`` the metric of each item, clean and with
            every edge corrupted (the counterfactual's own metric, or every source ablated).
        features: the edges out of an SAE's nodes (None without an SAE); of the first of two.
        downstream: the second of two SAEs' (its ``inputs`` include the first one's nodes).
    """

    graph: RewardGraph
    scores: torch.Tensor
    method: str
    objective: str
    settings: dict[str, Any]
    clean_metric: torch.Tensor
    corrupt_metric: torch.Tensor
    features: FeatureEdges | None = None
    downstream: FeatureEdges | None = None

    @property
    def label(self) -> str:
        """The method as reports name it: ``"eap-ig (right rule, 5 steps)"``."""
        st = self.settings
        return (f"{self.method} ({st.get('ig_rule')} rule, {st['ig_steps']} steps)"
                if self.method == "eap-ig" else self.method)

    def headline(self) -> dict[str, Any]:
        return {"method": self.label, "edges": self.graph.n_edges,
                "clean metric": float(self.clean_metric.mean()),
                "corrupt metric": float(self.corrupt_metric.mean())}

    def edge_scores(self) -> torch.Tensor:
        """``[n_edges]`` scores in :meth:`RewardGraph.edges` order."""
        return self.scores[self.graph.edge_mask()]

    def to_dataframe(self) -> pd.DataFrame:
        """One row per edge (``src``, ``dst``, ``qkv``, ``score``), by ``|score|`` descending
        (the SAE nodes' edges: ``features.to_dataframe()``)."""
        return edge_table(self.graph.edges(), self.edge_scores())

    def circuit_scores(self) -> torch.Tensor:
        """The scores circuits select by, ``[n_dests, n_sources (+ SAE nodes)]``, NaN where
        no edge: with SAE nodes, theirs in place of the edges they split (:func:`edge_mask`).
        Circuits over edges into SAE nodes (two SAEs, or ``feature_inputs=True``) are refused:
        they are not built."""
        fe = self.features
        if self.downstream is not None or (fe is not None and fe.inputs is not None):
            raise TLRewardError(
                "this attribution scores edges into SAE nodes (two SAEs, or feature_inputs="
                "True); circuits over such edges are not built: select and evaluate circuits "
                "on an attribution with one SAE and feature_inputs=False (its nodes read the "
                "sources they split whole), and read these edges in "
                ".features.to_dataframe()")
        if fe is None:
            return self.scores
        split = edge_mask(self.graph, fe.prefix)
        return torch.cat([self.scores.masked_fill(~split, torch.nan), fe.scores], 1)

    def circuitedge_table(self) -> pd.DataFrame:
        """:meth:`to_dataframe` of the edges circuits select from: with SAE nodes, theirs in
        place of the edges they split (:meth:`circuit_scores`)."""
        g, s = self.graph, self.circuit_scores()
        src = g.sources + ([] if self.features is None else self.features.nodes)
        has = ~s.isnan()
        return edge_table([(src[i], *g.dests[j]) for j, i in has.nonzero().tolist()], s[has])

    def view(self, title: str | None = None, max_edges: int = 200, shown: int = 30,
             table: pd.DataFrame | None = None) -> Any:
        """The circuit view (:func:`~tl_reward.viz.circuit.circuit_html`) of the top
        ``max_edges`` edges of ``table`` (default :meth:`circuit_table`), ``shown`` of them at
        first; ``.save(path)`` writes it offline."""
        from tl_reward.viz.circuit import circuit_html

        g, table = self.graph, self.circuitedge_table() if table is None else table
        return circuit_html(table.head(max_edges), self.node_effects, g.n_layers, g.n_heads,
                            title or f"Reward circuit ({self.method})", max_edges, shown,
                            g.n_kv_heads)

    plot = view

    @property
    def node_effects(self) -> dict[str, float]:
        """Each source's (and SAE node's) direct effect on the metric: the score of its edge
        into ``reward`` (its output on the direct path to the readout, every other path
        clean)."""
        out = dict(zip(self.graph.sources, self.scores[-1].tolist(), strict=True))
        for fe in (self.features, self.downstream):
            if fe is not None:
                out |= dict(zip(fe.nodes, fe.scores[-1].tolist(), strict=True))
        return out


def edge_attribution(
    model: Any,
    clean: Any,
    corrupt: Any = None,
    method: str = "eap-ig",
    ablation: str | None = None,
    reference: Any = None,
    objective: int | str | None = None,
    ig_steps: int = 5,
    ig_rule: str = DEFAULT_IG_RULE,
    batch_size: int = 8,
    chunk_sources: int | None = None,
    padding_side: str = "right",
    sae: Any = None,
    edges: Any = None,
    feature_inputs: bool | None = None,
    step: StepSpec | None = None,
) -> EdgeAttribution:
    """Score every edge of ``model``'s graph (methods, corruption and the sign in the module
    doc). ``clean``: sequences (built with the model's own builder) or preference pairs (the
    metric is the margin). ``batch_size`` rows per forward (a pair is two rows; ``"exact"``
    stacks edges so that each forward has about ``batch_size * 8`` rows); ``chunk_sources``
    caps the sources whose differences are held at once (default: one layer's). ``sae``: a
    SAELens SAE whose features and error term become nodes (default: the one attached to
    ``model``, if any); their edges are in ``.features``. ``sae=[A, B]`` (A's hook upstream of
    B's input): both SAEs' nodes, B's in ``.downstream``, whose edges in come from A's nodes.
    ``feature_inputs``: score the edges into the nodes too (``FeatureEdges.inputs``; default:
    with two SAEs only). ``ig_steps`` and ``ig_rule``: EAP-IG's
    points (:func:`ig_alphas`). ``edges`` (``"exact"`` only): score just these edges, ``(src,
    dst, qkv)`` names or a ``[n_dests, n_sources]`` bool mask (the others are NaN), e.g. to
    check a gradient method's top edges on a model too large to patch every edge of.
    ``step``: a process reward model's solutions at that step (the metric is that step's
    linear reward; solution pairs ``(a, b)``: the margin there), corrupt solutions likewise."""
    check_choice(method, METHODS, "method")
    if edges is not None and method != "exact":
        raise TLRewardError("edges= picks the edges exact patching scores; EAP and EAP-IG "
                            "score every edge at once: drop edges= or use method='exact'")
    from tl_reward.sae.splice import decoder_directions

    alphas = ig_alphas(ig_rule, ig_steps) if method == "eap-ig" else None
    with lifted_saes(model, sae) as saes:
        graph = RewardGraph.from_model(model)
        scored = graph.edge_mask() if edges is None else graph.mask_of(edges)
        obj = resolve_objectives(model, objective)[0]
        inputs = prepare_inputs(model, clean, corrupt, ablation, reference, batch_size, step)
        acc = accumulation_dtype(model)
        dev = model.cfg.device
        n_items = inputs.n_items
        scores = torch.zeros(len(graph.dests), len(graph.sources), dtype=acc, device=dev)
        clean_m = torch.zeros(n_items, dtype=acc, device=dev)
        corr_m = torch.zeros(n_items, dtype=acc, device=dev)
        into = len(saes) > 1 if feature_inputs is None else feature_inputs
        if into and not saes:
            raise TLRewardError("feature_inputs=True scores the edges into SAE nodes: pass sae=")
        sites = _checked_sites(model, graph, saes)
        hooks = tuple(s.hook for s in sites)
        ws = [decoder_directions(s.sae).detach() for s in sites]
        fscores = [torch.zeros(len(graph.dests), w.shape[0] + 1, dtype=acc, device=dev)
                   for w in ws]
        moved = [torch.zeros(w.shape[0], dtype=torch.bool) for w in ws]
        if into:  # the nodes (every batch's moved features) first: their inputs are scored
            sites = _with_nodes(model, graph, sites, inputs, batch_size, padding_side, hooks)
            iscores = [torch.zeros(len(s.nodes) + 1, s.n_cols, dtype=acc, device=dev)
                       for s in sites]
        for batch in batches(model, inputs, batch_size, padding_side):
            with torch.no_grad():
                base = record(model, batch.tokens, batch.mask, hooks)
                r0 = read_metric(model, forward(model, graph, batch), batch, obj)
                clean_m += per_item(r0, batch, n_items)
                r1 = corrupted_metric(model, graph, batch, obj, chunk_sources)
                corr_m += per_item(r1, batch, n_items)
            changes = [sae_changes(model, graph, s.sae, batch, base) for s in sites]
            ids = [moved_features(df) for df, _ in changes]  # the features moving here
            for m, i in zip(moved, ids, strict=True):
                m[i.cpu()] = True
            if method == "exact":
                _exact(model, graph, batch, obj, r0, scores, batch_size, chunk_sources,
                       mask=scored)
                for s, fs, i in zip(sites, fscores, ids, strict=True):
                    _exact(model, graph, batch, obj, r0, fs, batch_size, chunk_sources,
                           (s.sae, i.tolist(), s.dests(graph)))
                for k, s in enumerate(sites if into else []):
                    _exact(model, graph, batch, obj, r0, iscores[k], batch_size, chunk_sources,
                           into=(s, base))
                continue
            steps = 1 if alphas is None else len(alphas)
            grads, gin = _gradient(model, graph, batch, base, obj, scores, alphas,
                                   chunk_sources, sites if into else [])
            grads = grads.flatten(1)
            for fs, (df, d_err), w, i in zip(fscores, changes, ws, ids, strict=True):
                for cols, d in node_chunks(df, d_err, w, i):
                    fs[:, cols] += grads @ d.permute(2, 0, 1, 3).flatten(1).T / steps
            for k, g in enumerate(gin):
                iscores[k] += input_scores(model, graph, sites[k], batch, base, g,
                                           chunk_sources) / steps
    scores = (scores / n_items).masked_fill(~scored.to(dev), torch.nan)
    settings = {"ablation": inputs.ablation, "items": n_items,
                "ig_steps": 0 if alphas is None else ig_steps,
                "ig_rule": None if alphas is None else ig_rule}
    fes = []
    for k, s in enumerate(sites):
        nodes = list(s.nodes) if into else moved[k].nonzero().flatten().tolist()
        keep = [*nodes, ws[k].shape[0]]  # with edges in, the same features, found first
        fs = (fscores[k][:, keep] / n_items).masked_fill(~s.dests(graph)[:, None].to(dev),
                                                          torch.nan)
        fe = FeatureEdges(graph, s.hook, s.prefix, keep[:-1], fs.cpu())
        if into:
            fe.inputs = (iscores[k] / n_items).cpu()
            fe.input_sources = [graph.sources[c] for c in s.cols] + (
                [] if s.upstream is None else node_names(s.upstream.prefix,
                                                         list(s.upstream.nodes)))
        fes.append(fe)
    return EdgeAttribution(graph, scores.cpu(), method, obj, settings, clean_m.cpu(),
                           corr_m.cpu(), *fes)


def _checked_sites(model: Any, graph: RewardGraph, saes: list[Any]) -> list[Site]:
    """The :class:`~tl_reward.circuits.node_inputs.Site` of each SAE, each checked to fit
    (none without SAEs: SAELens is imported only when one is given)."""
    if not saes:
        return []
    from tl_reward.model.hooked_sae_reward_model import HookedSAERewardModel
    from tl_reward.sae.splice import check_affine_sae

    for sae in saes:
        HookedSAERewardModel.check_sae(model, sae)
        check_affine_sae(sae)
    return node_sites(graph, saes)


@torch.no_grad()
def _with_nodes(model: Any, graph: RewardGraph, sites: list[Site], inputs: Any,
                batch_size: int, padding_side: str, hooks: tuple[str, ...]) -> list[Site]:
    """``sites`` with their nodes (the features that move in some batch), and the second
    site fed by the first one's nodes."""
    moved: list[torch.Tensor] = [torch.zeros(0, dtype=torch.long) for _ in sites]
    for batch in batches(model, inputs, batch_size, padding_side):
        base = record(model, batch.tokens, batch.mask, hooks)
        for k, s in enumerate(sites):
            i = moved_features(sae_changes(model, graph, s.sae, batch, base)[0]).cpu()
            moved[k] = torch.cat([moved[k], i]).unique()
    out = [s.with_nodes(m.tolist()) for s, m in zip(sites, moved, strict=True)]
    return out[:1] + [s.with_upstream(out[0]) for s in out[1:]]


@torch.no_grad()
def _exact(model: Any, graph: RewardGraph, batch: Batch, obj: str, r0: torch.Tensor,
           scores: torch.Tensor, batch_size: int, chunk_sources: int | None,
           nodes: tuple[Any, list[int], torch.Tensor] | None = None,
           mask: torch.Tensor | None = None,
           into: tuple[Site, dict[str, torch.Tensor]] | None = None) -> None:
    """Add each edge's summed signed effect on this batch's rows to ``scores``; with ``nodes``
    ``(sae, features, dests [n_dests] bool)``, each edge from those features' nodes and the
    error node into those destinations instead, in columns ``features + [d_sae]``; with
    ``into`` ``(site, base)`` (``base``: the clean run's activations), each edge into the
    site's nodes, ``scores`` ``[n_nodes, n_cols]``."""
    if nodes is not None:
        mask = nodes[2][:, None].expand(-1, len(nodes[1]) + 1)
    elif into is not None:
        mask = torch.ones(len(into[0].nodes) + 1, into[0].n_cols, dtype=torch.bool)
    elif mask is None:
        mask = graph.edge_mask()
    idx = mask.nonzero().to(scores.device)
    rows = batch.tokens.shape[0]
    per = max(1, batch_size * 8 // rows)
    for s in range(0, len(idx), per):
        e = idx[s : s + per]
        big = batch.repeat(len(e))
        onehot = torch.zeros(len(e), *mask.shape, dtype=torch.bool, device=scores.device)
        onehot[torch.arange(len(e)), e[:, 0], e[:, 1]] = True
        onehot = onehot.repeat_interleave(rows, 0)
        kw: dict[str, Any] = {"patch": onehot}
        cols = e[:, 1]
        if nodes is not None:
            kw = {"nodes": (nodes[0], nodes[1], onehot)}
            cols = torch.tensor([*nodes[1], scores.shape[1] - 1], device=e.device)[cols]
        if into is not None:
            site, base = into
            node = torch.tensor([*site.nodes, site.sae.cfg.d_sae],
                                device=e.device)[e[:, 0]].repeat_interleave(rows)
            out = None if site.reads == site.hook else base[site.hook].repeat(len(e), 1, 1)
            kw = {"into": Into(site, node, onehot.any(1), out)}
        r = read_metric(model, forward(model, graph, big, chunk_sources=chunk_sources, **kw),
                        big, obj)
        eff = ((r.view(len(e), rows) - r0[None]) * batch.sign[None].to(r.dtype)).sum(1)
        scores[e[:, 0], cols] += eff.to(scores.dtype)


def _gradient(model: Any, graph: RewardGraph, batch: Batch, base: dict[str, torch.Tensor],
              obj: str, scores: torch.Tensor, alphas: list[float] | None,
              chunk_sources: int | None, sites: list[Site] | None = None
              ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """EAP (``alphas`` None: the clean run) or EAP-IG-inputs (the embeddings at each point
    ``alpha`` of :func:`ig_alphas`): add ``sum over rows, positions of sign * (a_u(corrupt) -
    a_u(clean)) . mean_k dM/d(in_v)`` to ``scores``; return the destinations' signed gradients
    summed over the points, ``[n_dests, rows, pos, d_model]``, and those of each site's nodes'
    inputs (:func:`~tl_reward.circuits.node_inputs.input_grads`).

    The score is linear in the gradient, so the ``steps`` gradients of every destination are
    summed first (one ``[n_dests, rows * pos * d_model]`` buffer per batch) and contracted once
    with each chunk of source differences, each built once per batch: the contraction costs
    the same for EAP and EAP-IG, whose extra cost is its forward and backward passes."""
    acc = scores.dtype
    rows, pos = batch.mask.shape
    d_model = model.cfg.d_model
    grads = torch.zeros(len(graph.dests), rows, pos, d_model, dtype=acc, device=scores.device)
    up_of = torch.zeros(len(graph.dests), dtype=torch.long)  # each destination's upstream
    for _, first, count, up in graph.dest_groups():
        up_of[first : first + count] = up

    def on_grad(first: int, count: int, up: int, g: torch.Tensor) -> None:
        g = g.to(acc) if g.ndim == 4 else g.to(acc)[:, :, None]
        grads[first : first + count] += g.permute(2, 0, 1, 3)

    h = "blocks.0.hook_resid_pre"
    steps = 1 if alphas is None else len(alphas)
    sites = sites or []
    gin = [torch.zeros(len(s.nodes) + 1, rows, pos, d_model, dtype=acc, device=scores.device)
           for s in sites]
    for a in [None] if alphas is None else alphas:
        embed = None
        if a is not None:
            embed = batch.corr[h].to(acc) + a * (base[h].to(acc) - batch.corr[h].to(acc))
        stores: list[dict[str, torch.Tensor]] = [{} for _ in sites]
        watch = [w for s, st in zip(sites, stores, strict=True) for w in watch_hooks(s, st)]
        with frozen_params(model), torch.enable_grad():
            resid = forward(model, graph, batch, on_grad=on_grad, embed=embed, watch=watch)
            m = (read_metric(model, resid, batch, obj) * batch.sign.to(acc)).sum()
            m.backward(retain_graph=bool(sites))  # the nodes' inputs' gradients follow
            for g, s, st in zip(gin, sites, stores, strict=True):
                g += input_grads(s, st, acc)
    flat = grads.reshape(len(graph.dests), -1)  # destinations in order: upstream never shrinks
    with torch.no_grad():
        for block, s0, s1 in chunks(graph, int(up_of.max()), chunk_sources):
            j0 = int(torch.searchsorted(up_of, torch.tensor(s0), right=True))  # up > s0
            d = delta(model, graph, batch.corr, base, block, s0, s1, batch.mask)
            d = d.permute(2, 0, 1, 3).reshape(s1 - s0, -1)
            scores[j0:, s0:s1] += (flat[j0:] @ d.T) / steps
    return grads, gin
