"""Edge attribution: how much each edge of the :class:`~tl_reward.circuits.graph.RewardGraph`
carries the reward.

Sign convention (noising): ``score(u -> v) = M(u's contribution to v's input replaced by its
corrupted one) - M(clean)``, or the first-order estimate of it, averaged over items. ``M`` is
one objective read at the pooled token through the library's readout (float32 at least):
``r(x)`` for sequences, the margin ``r(chosen) - r(rejected)`` for preference pairs.

Corruption: ``corrupt`` holds counterfactuals of equal length (a swapped token, a probe's edit),
one per clean sequence; or ``ablation="mean"`` (each source's mean over a reference set per
position class: prompt, reply, pooled reward token) or ``"zero"``, which need no alignment and
are the only corruption of preference pairs (each reply ablated on its own; chosen and
rejected are never aligned by position).

Methods: ``"exact"`` (one patched forward per edge, edges stacked along the batch: the oracle
for small graphs), ``"eap"`` (``(a_u(corrupt) - a_u(clean)) . dM/d(in_v)`` on the clean run,
summed over positions) and ``"eap-ig"`` (the same difference times the mean gradient over
``ig_steps`` points ``k / ig_steps``, ``k = 1..ig_steps``, on the line from the corrupted to the
clean embeddings: MIB's EAP-IG-inputs). A head's output is its ``hook_z`` through its rows of
``W_O``; padding positions never contribute. Source differences are built one chunk of
sources at a time (at most ``chunk_sources``, never crossing a layer), never as the whole
``[batch, pos, sources, d_model]`` tensor. EAP and EAP-IG hold every destination's gradient,
summed over the IG steps, for one batch: ``[n_dests, rows, pos, d_model]`` in the
accumulation dtype (lower ``batch_size`` to shrink it), so each source difference is built
and contracted once per batch.

SAE nodes (Sparse Feature Circuits' construction): with ``sae=`` (or one SAE attached with
SAELens's ``add_sae``) at ``blocks.{l}.hook_mlp_out`` (it splits ``m{l}``) or a residual hook
(``hook_resid_pre``/``hook_resid_post``: it splits the sum of every source before it), each
feature and the error term are sources of edges into every destination after the hook. The
hook's activation ``x`` moves by ``dx``, the sum of its split sources' differences; feature
``i``'s output moves by ``(enc(x + dx)_i - enc(x)_i) W_dec[i]`` and the error node's by the rest
of ``dx`` (the change of ``x - x_hat``), so the nodes' changes sum exactly to ``dx``
and, EAP being linear in them, their edges into a destination sum to the hook's. Nodes are the
features whose activation changes at some real token (every other feature's edges are exactly
0). Forwards run the plain model (an attached SAE is lifted off for the call); the nodes'
changes are taken at the clean run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from tl_reward.circuits.graph import RewardGraph, split_inputs
from tl_reward.data.pairs import PairBatch, TokenizedPair, as_pair_batch
from tl_reward.data.preference import PreferencePair
from tl_reward.errors import TLRewardError
from tl_reward.model.inputs import EncodedInput, RewardBatch, as_items
from tl_reward.model.readout import accumulation_dtype, objective_at_pooled, resolve_objectives
from tl_reward.results import ShortRepr

METHODS = ("exact", "eap", "eap-ig")
ABLATIONS = ("mean", "zero")


# -- inputs -------------------------------------------------------------------------------------
def _is_pairs(x: Any) -> bool:
    def one(p: Any) -> bool:
        return isinstance(p, (PreferencePair, TokenizedPair)) or (
            isinstance(p, tuple) and len(p) == 3 and isinstance(p[1], str))
    return isinstance(x, PairBatch) or one(x) or (
        isinstance(x, (list, tuple)) and len(x) > 0 and one(x[0]))


def _encode(model: Any, inputs: Any) -> tuple[list[EncodedInput], list[float], list[int]]:
    """Encoded rows, each row's sign in the metric and its item: a pair gives two rows."""
    if _is_pairs(inputs):
        rows = []
        for tp in as_pair_batch(model, inputs):
            rows += [EncodedInput(tp.chosen_ids, tp.prompt_len),
                     EncodedInput(tp.rejected_ids, tp.prompt_len)]
        n = len(rows) // 2
        return rows, [1.0, -1.0] * n, [i for i in range(n) for _ in (0, 1)]
    rows = [x if isinstance(x, EncodedInput) else model.encode(x) for x in as_items(inputs)]
    return rows, [1.0] * len(rows), list(range(len(rows)))


@dataclass
class Inputs:
    """Encoded clean rows with their signs and items, and how they are corrupted."""

    rows: list[EncodedInput]
    sign: list[float]
    item: list[int]
    corrupt: list[EncodedInput] | None
    ablation: str | None
    means: dict[str, torch.Tensor] | None = None

    @property
    def n_items(self) -> int:
        return max(self.item) + 1


def prepare_inputs(model: Any, clean: Any, corrupt: Any = None, ablation: str | None = None,
                   reference: Any = None, batch_size: int = 8) -> Inputs:
    """Check and encode ``clean`` and its corruption (see the module doc)."""
    rows, sign, item = _encode(model, clean)
    if ablation is not None and ablation not in ABLATIONS:
        raise TLRewardError(f"ablation must be one of {ABLATIONS} or None, got {ablation!r}")
    if (corrupt is None) == (ablation is None):
        raise TLRewardError(
            "pass exactly one corruption: corrupt= (counterfactual sequences of equal length) "
            "or ablation='mean' / 'zero'")
    if corrupt is not None:
        if _is_pairs(clean) or _is_pairs(corrupt):
            raise TLRewardError(
                "preference pairs are corrupted by ablation (ablation='mean' or 'zero'), each "
                "reply on its own; chosen and rejected are never aligned by position")
        bad, _, _ = _encode(model, corrupt)
        if len(bad) != len(rows):
            raise TLRewardError(f"corrupt has {len(bad)} sequences for {len(rows)} clean ones; "
                                "pass one counterfactual per clean sequence")
        for i, (a, b) in enumerate(zip(rows, bad, strict=True)):
            if len(a.ids) != len(b.ids):
                raise TLRewardError(
                    f"clean sequence {i} has {len(a.ids)} tokens and its counterfactual "
                    f"{len(b.ids)}: edge patching writes position t of one into position t of "
                    "the other, so they must have equal length; use ablation='mean' or 'zero' "
                    "for inputs of different lengths")
        return Inputs(rows, sign, item, bad, None)
    out = Inputs(rows, sign, item, None, ablation)
    if ablation == "mean":
        from tl_reward.analysis.patching import mean_activations

        ref = rows if reference is None else _encode(model, reference)[0]
        out.means = mean_activations(model, ref, source_hooks(model), batch_size, by_class=True)
    return out


def source_hooks(model: Any) -> list[str]:
    """The hooks source outputs are read from: embeddings, each layer's ``hook_z`` and
    ``hook_mlp_out``."""
    out = ["blocks.0.hook_resid_pre"]
    for layer in range(model.cfg.n_layers):
        out.append(f"blocks.{layer}.attn.hook_z")
        if not model.cfg.attn_only:
            out.append(f"blocks.{layer}.hook_mlp_out")
    return out


# -- activations and patched forwards ---------------------------------------------------
@dataclass
class Batch:
    """Padded rows of a batch, their corrupted source activations and signs."""

    tokens: torch.Tensor
    mask: torch.Tensor
    sign: torch.Tensor
    item: torch.Tensor
    corr: dict[str, torch.Tensor] = field(default_factory=dict)
    corr_tokens: torch.Tensor | None = None

    def repeat(self, n: int) -> Batch:
        """The batch stacked ``n`` times (copy-major)."""
        def rep(t: torch.Tensor) -> torch.Tensor:
            return t.repeat(n, *[1] * (t.ndim - 1))
        return Batch(rep(self.tokens), rep(self.mask), rep(self.sign), rep(self.item),
                     {k: rep(v) for k, v in self.corr.items()}, None)


def batches(model: Any, inputs: Inputs, batch_size: int, padding_side: str) -> Iterator[Batch]:
    """Row batches with their corrupted source activations."""
    for s in range(0, len(inputs.rows), batch_size):
        b = model.collate(inputs.rows[s : s + batch_size], padding_side)
        dev = b.tokens.device
        out = Batch(b.tokens, b.attention_mask,
                    torch.tensor(inputs.sign[s : s + batch_size], device=dev),
                    torch.tensor(inputs.item[s : s + batch_size], device=dev))
        if inputs.corrupt is not None:
            c = model.collate(inputs.corrupt[s : s + batch_size], padding_side)
            out.corr_tokens = c.tokens
            out.corr = record(model, c.tokens, c.attention_mask)
        else:
            out.corr = ablated(model, b, inputs)
        yield out


def ablated(model: Any, batch: RewardBatch, inputs: Inputs) -> dict[str, torch.Tensor]:
    """Each source's ablated activation at every position of ``batch`` (class means or 0)."""
    cls = batch.position_classes()
    real = (cls >= 0)
    out = {}
    for hook in source_hooks(model):
        if inputs.means is None:
            shape = model.cfg.n_heads, model.cfg.d_head
            tail = shape if hook.endswith("hook_z") else (model.cfg.d_model,)
            out[hook] = torch.zeros(*cls.shape, *tail, device=cls.device, dtype=model.cfg.dtype)
            continue
        m = inputs.means[hook]
        got = m[cls.clamp(min=0)]
        if bool(got[real].isnan().any()):
            raise TLRewardError(
                "the reference set for mean ablation has no token of a position class "
                "(prompt, reply, reward token) the inputs have; pass reference= inputs with "
                "prompts and replies (e.g. the clean inputs themselves)")
        out[hook] = got * real.reshape(*cls.shape, *[1] * (got.ndim - 2)).to(got.dtype)
    return out


def record(model: Any, tokens: torch.Tensor, mask: torch.Tensor,
           extra: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Source activations (and those of the ``extra`` hooks) of one unpatched forward."""
    hooks = set(source_hooks(model)) | set(extra)
    with torch.no_grad():
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
) -> torch.Tensor:
    """The objective-ready final residual ``[batch, pos, d_model]`` of one forward.

    ``patch`` ``[batch or 1, n_dst, n_src]``: each destination input gets
    ``sum_u patch[v, u] * (a_u(corrupt) - a_u(this forward))``. ``nodes`` ``(sae, features,
    c [batch or 1, n_dst, len(features) + 1])``: destination ``v``'s input of row ``r`` gets
    ``sum_n c[r, v, n]`` times node ``n``'s change (those features', then the error node's;
    :func:`sae_changes` at this forward's activations). ``on_grad(first, count, upstream,
    grad)`` receives the
    gradient of each destination hook's input (the embeddings become a leaf that needs a
    gradient). ``embed`` replaces the embeddings.
    """
    cur: dict[str, torch.Tensor] = {}
    hooks: list[tuple[str, Callable[..., Any]]] = []
    if embed is not None or on_grad is not None:
        def leaf(act: torch.Tensor, hook: Any) -> torch.Tensor:
            e = (act if embed is None else embed).detach().to(act.dtype)
            return e.requires_grad_(on_grad is not None)
        hooks.append(("blocks.0.hook_resid_pre", leaf))
    if patch is not None or nodes is not None:
        def rec(act: torch.Tensor, hook: Any) -> None:
            cur[hook.name] = act
        sae_hook = [] if nodes is None else [nodes[0].cfg.metadata.hook_name]
        hooks += [(h, rec) for h in {*source_hooks(model), *sae_hook}]

    # every edge patched (the empty circuit): each input adds all upstream differences, a
    # running sum over sources that grows layer by layer (each difference built once)
    full = patch is not None and patch.shape[0] == 1 and bool(
        (patch[0] == graph.edge_mask().to(patch.device)).all())
    run: dict[str, Any] = {"upto": 0, "sum": 0.0}

    def edit(act: torch.Tensor, first: int, count: int, up: int) -> torch.Tensor:
        if full:
            for block, s0, s1 in chunks(graph, up, chunk_sources):
                if max(s0, run["upto"]) < s1:
                    d = delta(model, graph, batch.corr, cur, block, max(s0, run["upto"]), s1,
                              batch.mask)
                    run["sum"] = run["sum"] + d.sum(2)
            run["upto"] = up
            if isinstance(run["sum"], torch.Tensor):
                add = run["sum"] if act.ndim == 3 else run["sum"][:, :, None]
                act = act + add.to(act.dtype)
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
        if on_grad is not None:
            act.register_hook(lambda g: on_grad(first, count, up, g))
        return act

    groups = graph.dest_groups()
    for name, first, count, up in groups[:-1]:
        hooks.append((name, lambda act, hook, f=first, c=count, u=up: edit(act, f, c, u)))
    with split_inputs(model), model.hooks(fwd_hooks=hooks):
        resid = model(batch.tokens, attention_mask=batch.mask,
                      stop_at_layer=model.cfg.n_layers)
    _, first, count, up = groups[-1]
    return edit(resid, first, count, up)


def read_metric(model: Any, resid: torch.Tensor, batch: Batch, obj: str) -> torch.Tensor:
    """``[batch]`` the objective at each row's pooled token (the library's readout)."""
    return objective_at_pooled(model, resid, batch.tokens, batch.mask, [obj])[:, 0]


def per_item(values: torch.Tensor, batch: Batch, n_items: int) -> torch.Tensor:
    """Signed row values summed into their items: ``[n_items]``."""
    out = torch.zeros(n_items, dtype=values.dtype, device=values.device)
    return out.index_add(0, batch.item, values * batch.sign.to(values.dtype))


# -- SAE nodes ----------------------------------------------------------------------------
def _table(edges: list[tuple[str, str, str]], scores: torch.Tensor) -> pd.DataFrame:
    """One row per edge (``src``, ``dst``, ``qkv``, ``score``), by ``|score|`` descending."""
    df = pd.DataFrame(edges, columns=["src", "dst", "qkv"])
    df["score"] = scores.double().numpy()
    order = df["score"].abs().sort_values(ascending=False, kind="stable").index
    return df.loc[order].reset_index(drop=True)


@dataclass(repr=False)
class FeatureEdges(ShortRepr):
    """Edges out of the nodes of an SAE at ``hook`` (see the module doc).

    Attributes:
        graph: the edge graph.
        hook: the hook the SAE reads.
        prefix: the nodes' prefix: ``m{l}`` (``hook_mlp_out``) or ``r{l}`` (the residual
            entering layer ``l``); nodes are ``{prefix}.f{i}`` and ``{prefix}.err``.
        features: the features that are nodes (their activation changes at some token).
        scores: ``[n_dests, len(features) + 1]`` (NaN where no edge; the last column is the
            error node's): the mean over items.
    """

    graph: RewardGraph
    hook: str
    prefix: str
    features: list[int]
    scores: torch.Tensor

    def headline(self) -> dict[str, Any]:
        return {"hook": self.hook, "features": len(self.features)}

    @property
    def nodes(self) -> list[str]:
        return node_names(self.prefix, self.features)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per edge out of a node, as :meth:`EdgeAttribution.to_dataframe`."""
        has = ~self.scores.isnan()
        dst, nodes = self.graph.dests, self.nodes
        return _table([(nodes[i], *dst[j]) for j, i in has.nonzero().tolist()],
                      self.scores[has])


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
def lifted_saes(model: Any, sae: Any) -> Iterator[Any]:
    """The SAE to make nodes of (``sae``, else the one attached to ``model``, else None), with
    every attached SAE lifted off for the duration and attached again after, with its
    settings (SAELens keeps them on its wrappers, ``_acts_to_saes``). An SAE attached without
    its error term is refused (the forward would not be the one the graph sums)."""
    attached = dict(getattr(model, "_acts_to_saes", None) or {})
    bare = sorted(h for h, w in attached.items() if not w.use_error_term)
    if bare:  # without it the forward is not the graph's sum of sources
        raise TLRewardError(f"an SAE is attached at {bare[0]} without its error term; edge "
                            "circuits make its features and error term nodes: attach it with "
                            "use_error_term=True")
    if sae is None and len(attached) > 1:
        raise TLRewardError(f"{len(attached)} SAEs are attached ({sorted(attached)}); SAE "
                            "nodes come from one: pass sae= the one to use")
    sae = sae if sae is not None else next((w.sae for w in attached.values()), None)
    if attached:
        model.reset_saes()
    try:
        yield sae
    finally:
        for w in attached.values():
            model.add_sae(w.sae, use_error_term=w.use_error_term,
                          exclude_special_tokens=w.exclude_special_tokens)


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
    x = base[hook].to(acc)
    f0, f1 = (sae.encode(v.to(sae.dtype)).to(acc) for v in (x, x + dx))
    df = (f1 - f0) * batch.mask[:, :, None].to(acc)
    return df, dx - df @ decoder_directions(sae).detach().to(acc)


def node_chunks(df: torch.Tensor, d_err: torch.Tensor, w: torch.Tensor, moved: torch.Tensor,
                size: int = 64) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(columns, changes [rows, pos, n, d_model])`` of the ``moved`` features (column =
    feature id) and then the error node (column ``d_sae``), ``size`` at a time."""
    for s in range(0, len(moved), size):
        i = moved[s : s + size]
        yield i, df[:, :, i, None] * w[i].to(df.dtype)
    yield torch.tensor([w.shape[0]], device=df.device), d_err[:, :, None]


# -- the result ---------------------------------------------------------------------------
@dataclass(repr=False)
class EdgeAttribution(ShortRepr):
    """Edge scores of one model on a set of items (sign convention in the module doc).

    Attributes:
        graph: the edge graph.
        scores: ``[n_dests, n_sources]`` (NaN where no edge): the mean over items.
        method: ``"exact"``, ``"eap"`` or ``"eap-ig"``; objective: the objective read.
        settings: ablation (None for counterfactuals), ig_steps, items.
        clean_metric, corrupt_metric: ``[n_items]`` the metric of each item, clean and with
            every edge corrupted (the counterfactual's own metric, or every source ablated).
        features: the edges out of an SAE's nodes (None without an SAE).
    """

    graph: RewardGraph
    scores: torch.Tensor
    method: str
    objective: str
    settings: dict[str, Any]
    clean_metric: torch.Tensor
    corrupt_metric: torch.Tensor
    features: FeatureEdges | None = None

    def headline(self) -> dict[str, Any]:
        return {"edges": self.graph.n_edges,
                "clean metric": float(self.clean_metric.mean()),
                "corrupt metric": float(self.corrupt_metric.mean())}

    def edge_scores(self) -> torch.Tensor:
        """``[n_edges]`` scores in :meth:`RewardGraph.edges` order."""
        return self.scores[self.graph.edge_mask()]

    def to_dataframe(self) -> pd.DataFrame:
        """One row per edge (``src``, ``dst``, ``qkv``, ``score``), by ``|score|`` descending
        (the SAE nodes' edges: ``features.to_dataframe()``)."""
        return _table(self.graph.edges(), self.edge_scores())

    def circuit_scores(self) -> torch.Tensor:
        """The scores circuits select by, ``[n_dests, n_sources (+ SAE nodes)]``, NaN where
        no edge: with SAE nodes, theirs in place of the edges they split (:func:`edge_mask`)."""
        fe = self.features
        if fe is None:
            return self.scores
        split = edge_mask(self.graph, fe.prefix)
        return torch.cat([self.scores.masked_fill(~split, torch.nan), fe.scores], 1)

    def circuit_table(self) -> pd.DataFrame:
        """:meth:`to_dataframe` of the edges circuits select from: with SAE nodes, theirs in
        place of the edges they split (:meth:`circuit_scores`)."""
        g, s = self.graph, self.circuit_scores()
        src = g.sources + ([] if self.features is None else self.features.nodes)
        has = ~s.isnan()
        return _table([(src[i], *g.dests[j]) for j, i in has.nonzero().tolist()], s[has])

    def view(self, title: str | None = None, max_edges: int = 200, shown: int = 30,
             table: pd.DataFrame | None = None) -> Any:
        """The circuit view (:func:`~tl_reward.viz.circuit.circuit_html`) of the top
        ``max_edges`` edges of ``table`` (default :meth:`circuit_table`), ``shown`` of them at
        first; ``.save(path)`` writes it offline."""
        from tl_reward.viz.circuit import circuit_html

        g, table = self.graph, self.circuit_table() if table is None else table
        return circuit_html(table.head(max_edges), self.node_effects, g.n_layers, g.n_heads,
                            title or f"Reward circuit ({self.method})", max_edges, shown,
                            g.n_kv_heads)

    plot = view

    @property
    def node_effects(self) -> dict[str, float]:
        """Each source's (and SAE node's) direct effect on the metric: the score of its edge
        into ``reward`` (its output on the direct path to the readout, every other path
        clean)."""
        fe = self.features
        nodes = {} if fe is None else dict(zip(fe.nodes, fe.scores[-1].tolist(), strict=True))
        return dict(zip(self.graph.sources, self.scores[-1].tolist(), strict=True)) | nodes


def edge_attribution(
    model: Any,
    clean: Any,
    corrupt: Any = None,
    method: str = "eap-ig",
    ablation: str | None = None,
    reference: Any = None,
    objective: int | str | None = None,
    ig_steps: int = 5,
    batch_size: int = 8,
    chunk_sources: int | None = None,
    padding_side: str = "right",
    sae: Any = None,
) -> EdgeAttribution:
    """Score every edge of ``model``'s graph (methods, corruption and the sign in the module
    doc). ``clean``: sequences (built with the model's own builder) or preference pairs (the
    metric is the margin). ``batch_size`` rows per forward (a pair is two rows; ``"exact"``
    stacks edges so that each forward has about ``batch_size * 8`` rows); ``chunk_sources``
    caps the sources whose differences are held at once (default: one layer's). ``sae``: a
    SAELens SAE whose features and error term become nodes (default: the one attached to
    ``model``, if any); their edges are in ``.features``."""
    if method not in METHODS:
        raise TLRewardError(f"method must be one of {METHODS}, got {method!r}")
    if ig_steps < 1:
        raise TLRewardError(f"ig_steps must be at least 1, got {ig_steps}")
    with lifted_saes(model, sae) as sae:
        graph = RewardGraph.from_model(model)
        obj = resolve_objectives(model, objective)[0]
        inputs = prepare_inputs(model, clean, corrupt, ablation, reference, batch_size)
        acc = accumulation_dtype(model)
        dev = model.cfg.device
        n_items = inputs.n_items
        scores = torch.zeros(len(graph.dests), len(graph.sources), dtype=acc, device=dev)
        clean_m = torch.zeros(n_items, dtype=acc, device=dev)
        corr_m = torch.zeros(n_items, dtype=acc, device=dev)
        hooks: tuple[str, ...] = ()
        if sae is not None:
            from tl_reward.model.hooked_sae_reward_model import HookedSAERewardModel
            from tl_reward.sae.splice import check_affine_sae, decoder_directions

            hooks = (HookedSAERewardModel.check_sae(model, sae),)
            check_affine_sae(sae)
            prefix, _, hi = sae_split(graph, hooks[0])
            dests = after(graph, hi)
            w = decoder_directions(sae).detach()
            fscores = torch.zeros(len(graph.dests), w.shape[0] + 1, dtype=acc, device=dev)
            moved = torch.zeros(w.shape[0], dtype=torch.bool)
        for batch in batches(model, inputs, batch_size, padding_side):
            with torch.no_grad():
                base = record(model, batch.tokens, batch.mask, hooks)
                r0 = read_metric(model, forward(model, graph, batch), batch, obj)
                clean_m += per_item(r0, batch, n_items)
                r1 = corrupted_metric(model, graph, batch, obj, chunk_sources)
                corr_m += per_item(r1, batch, n_items)
            if sae is not None:  # the features that move in this batch
                df, d_err = sae_changes(model, graph, sae, batch, base)
                ids = (df != 0).flatten(0, 1).any(0).nonzero().flatten()
                moved[ids.cpu()] = True
            if method == "exact":
                _exact(model, graph, batch, obj, r0, scores, batch_size, chunk_sources)
                if sae is not None:
                    _exact(model, graph, batch, obj, r0, fscores, batch_size, chunk_sources,
                           (sae, ids.tolist(), dests))
            else:
                steps = 1 if method == "eap" else ig_steps
                grads = _gradient(model, graph, batch, base, obj, scores, steps,
                                  method == "eap-ig", chunk_sources).flatten(1)
                for cols, d in [] if sae is None else node_chunks(df, d_err, w, ids):
                    fscores[:, cols] += grads @ d.permute(2, 0, 1, 3).flatten(1).T / steps
    scores = (scores / n_items).masked_fill(~graph.edge_mask().to(dev), torch.nan)
    settings = {"ablation": inputs.ablation, "items": n_items,
                "ig_steps": ig_steps if method == "eap-ig" else 0}
    features = None
    if sae is not None:
        keep = [*moved.nonzero().flatten().tolist(), w.shape[0]]
        fs = (fscores[:, keep] / n_items).masked_fill(~dests[:, None].to(dev), torch.nan)
        features = FeatureEdges(graph, hooks[0], prefix, keep[:-1], fs.cpu())
    return EdgeAttribution(graph, scores.cpu(), method, obj, settings, clean_m.cpu(),
                           corr_m.cpu(), features)


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


@torch.no_grad()
def _exact(model: Any, graph: RewardGraph, batch: Batch, obj: str, r0: torch.Tensor,
           scores: torch.Tensor, batch_size: int, chunk_sources: int | None,
           nodes: tuple[Any, list[int], torch.Tensor] | None = None) -> None:
    """Add each edge's summed signed effect on this batch's rows to ``scores``; with ``nodes``
    ``(sae, features, dests [n_dests] bool)``, each edge from those features' nodes and the
    error node into those destinations instead, in columns ``features + [d_sae]``."""
    mask = graph.edge_mask() if nodes is None else nodes[2][:, None].expand(
        -1, len(nodes[1]) + 1)
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
        r = read_metric(model, forward(model, graph, big, chunk_sources=chunk_sources, **kw),
                        big, obj)
        eff = ((r.view(len(e), rows) - r0[None]) * batch.sign[None].to(r.dtype)).sum(1)
        scores[e[:, 0], cols] += eff.to(scores.dtype)


def _gradient(model: Any, graph: RewardGraph, batch: Batch, base: dict[str, torch.Tensor],
              obj: str, scores: torch.Tensor, steps: int, interpolate: bool,
              chunk_sources: int | None) -> torch.Tensor:
    """EAP (``steps = 1``, the clean run) or EAP-IG-inputs: add ``sum over rows, positions of
    sign * (a_u(corrupt) - a_u(clean)) . mean_k dM/d(in_v)`` to ``scores``; return the
    destinations' signed gradients summed over the steps, ``[n_dests, rows, pos, d_model]``.

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
    for k in range(1, steps + 1):
        embed = None
        if interpolate:
            a = k / steps
            embed = batch.corr[h].to(acc) + a * (base[h].to(acc) - batch.corr[h].to(acc))
        with frozen_params(model), torch.enable_grad():
            resid = forward(model, graph, batch, on_grad=on_grad, embed=embed)
            m = (read_metric(model, resid, batch, obj) * batch.sign.to(acc)).sum()
            m.backward()
    flat = grads.reshape(len(graph.dests), -1)  # destinations in order: upstream never shrinks
    with torch.no_grad():
        for block, s0, s1 in chunks(graph, int(up_of.max()), chunk_sources):
            j0 = int(torch.searchsorted(up_of, torch.tensor(s0), right=True))  # up > s0
            d = delta(model, graph, batch.corr, base, block, s0, s1, batch.mask)
            d = d.permute(2, 0, 1, 3).reshape(s1 - s0, -1)
            scores[j0:, s0:s1] += (flat[j0:] @ d.T) / steps
    return grads
