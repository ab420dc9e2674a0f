"""Activation patching on preference pairs: four modes, five kinds of site, batched.

Metric: the reward margin ``Delta = r(chosen) - r(rejected)`` (one objective), and each patch's
``effect`` is normalised by the clean ``Delta``:

* ``denoising``: run rejected, patch in chosen's activation; ``effect = (r' - r_rej) / Delta``
  (the fraction of the margin the site restores);
* ``noising``: run chosen, patch in rejected's activation; ``effect = (r_ch - r') / Delta``
  (the fraction the site destroys);
* ``zero`` / ``mean``: replace the activation in both runs by zero or by its mean over a
  reference set (every real token of it); ``effect = (Delta - Delta') / Delta``.

Sites: ``resid`` (``hook_resid_pre`` of each layer, and the final residual as layer
``n_layers``), ``attn_out``, ``mlp_out``, ``head`` (one query head's ``hook_z``) and ``neuron``
(``mlp.hook_post``), per aligned position (``positions="each"``) or on every aligned position at
once (``positions="all"``). Between chosen and rejected a patch writes only aligned positions
(prompt by index, reply from the end; see :mod:`tl_reward.data.pairs`); the unaligned first
tokens of the longer reply keep their own activations, and the result says how many there were.
Zero and mean ablations with ``positions="all"`` replace every position of both runs.

Every value is read at the pooled token ``t*`` of the model's pooling rule through the shared
readout (:mod:`tl_reward.model.readout`), in float32 whatever the weights' dtype, as
``model.rewards`` and DRA read it. A patch that writes only after ``t*`` cannot change the reward
(causal attention): it is not run and its effect is exactly 0. When the clean margin is exactly
0 (e.g. a pooling rule that reads inside the shared prompt) normalised effects are NaN, with a
warning; the patched values are still reported.

Speed: each pair's clean runs are cached once; the patched variants of a pair are stacked along
the batch (``chunk_size`` at a time) and each chunk starts at its earliest patched layer from the
cached residual (``start_at_layer``), so no layer below a patch is recomputed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float, Int

from tl_reward.analysis.components import _value_bias, require_neurons
from tl_reward.data.pairs import TokenizedPair, as_tokenized_pair
from tl_reward.errors import TLRewardError, check_choice, check_range
from tl_reward.model.inputs import EncodedInput, cached_batches
from tl_reward.model.readout import (
    accumulation_dtype,
    normalised_effect,
    objective_at_pooled,
    resolve_objectives,
)
from tl_reward.model.steps import StepSpec
from tl_reward.results import CleanMargin, ShortRepr
from tl_reward.tl_backend import cache_keys, frozen_kv_cache

MODES = ("denoising", "noising", "zero", "mean")
SITES = ("resid", "attn_out", "mlp_out", "head", "neuron")


@dataclass(frozen=True)
class Site:
    """One patch: activation ``hook`` (first computed in block ``layer``), optionally one
    ``unit`` (head or neuron index) of it, at aligned row ``row`` or every aligned row (None)."""

    hook: str
    layer: int
    unit: int | None = None
    row: int | None = None


def site_hook(model: Any, site: str, layer: int) -> tuple[str, int]:
    """``(hook name, block it is computed in)`` for a site kind at ``layer``."""
    check_choice(site, SITES, "site")
    n = model.cfg.n_layers
    if site == "resid":
        check_range(f"resid layer ({n} = final residual)", layer, 0, n, closed=True)
        return (f"blocks.{n - 1}.hook_resid_post", n - 1) if layer == n else (
            f"blocks.{layer}.hook_resid_pre", layer)
    check_range("layer", layer, 0, n)
    hooks = {"attn_out": "hook_attn_out", "mlp_out": "hook_mlp_out", "head": "attn.hook_z",
             "neuron": "mlp.hook_post"}
    return f"blocks.{layer}.{hooks[site]}", layer


def component_site(model: Any, name: str) -> Site:
    """The whole-sequence site of a component name (``"embed"``, ``"L3.attn"``, ``"L3.mlp"``,
    ``"L3.H2"``) as used by attribution and the faithfulness report."""
    if name in ("embed", "pos_embed"):
        return Site("blocks.0.hook_resid_pre", 0)
    layer_part, _, rest = name.partition(".")
    layer = int(layer_part[1:])
    if rest == "attn":
        return Site(*site_hook(model, "attn_out", layer))
    if rest == "mlp":
        return Site(*site_hook(model, "mlp_out", layer))
    if rest.startswith("H"):
        return Site(*site_hook(model, "head", layer), unit=int(rest[1:]))
    raise TLRewardError(f"component {name!r} has no patching site (attention biases are equal "
                        "in both runs)")


def objective_value(
    model: Any, resid: Float[torch.Tensor, "batch pos d_model"],
    tokens: Int[torch.Tensor, "batch pos"], objective: str,
) -> Float[torch.Tensor, " batch"]:
    """One objective read from final residuals of unpadded rows at the pooled token of the
    model's rule (the shared readout; float32 at least)."""
    mask = torch.ones_like(tokens)
    return objective_at_pooled(model, resid, tokens, mask, [objective])[:, 0].detach()


def clean_hooks(model: Any, sites: Sequence[Site]) -> set[str]:
    """Hooks a clean run must cache for :func:`run_patched` on ``sites``."""
    n = model.cfg.n_layers
    names = {s.hook for s in sites} | {f"blocks.{n - 1}.hook_resid_post"}
    for i in range(n):
        names |= {f"blocks.{i}.hook_resid_pre", f"blocks.{i}.attn.hook_k",
                  f"blocks.{i}.attn.hook_v"}
    return names


@torch.no_grad()
def _clean_pair(model: Any, tp: TokenizedPair, sites: Sequence[Site], objective: str
                ) -> tuple[dict[str, dict[str, torch.Tensor]], float, float]:
    """Each reply's clean run (the hooks of :func:`clean_hooks`) and clean objective."""
    hooks = clean_hooks(model, sites)
    final_hook = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    clean, values = {}, []
    for side in ("chosen", "rejected"):
        tokens = tp.tokens(side).to(model.cfg.device)
        _, cache = model.run_with_cache(tokens, attention_mask=torch.ones_like(tokens),
                                        return_type=None, names_filter=lambda n: n in hooks)
        clean[side] = dict(cache.cache_dict)
        values.append(float(objective_value(model, clean[side][final_hook], tokens, objective)))
    return clean, values[0], values[1]


def _prefix_cache(model: Any, clean: dict[str, torch.Tensor], prefix_len: int,
                  batch: int) -> Any:
    """A frozen key/value cache of the first ``prefix_len`` positions, expanded to ``batch``."""
    layers = range(model.cfg.n_layers)
    keys = [cache_keys(model, i, clean[f"blocks.{i}.attn.hook_k"][:, :prefix_len])
            .expand(batch, -1, -1, -1) for i in layers]
    values = [clean[f"blocks.{i}.attn.hook_v"][:, :prefix_len].expand(batch, -1, -1, -1)
              for i in layers]
    mask = torch.ones((batch, prefix_len), dtype=torch.long, device=model.cfg.device)
    return frozen_kv_cache(keys, values, mask)


@torch.no_grad()
def run_patched(
    model: Any,
    ids: list[int],
    clean: dict[str, torch.Tensor],
    sites: Sequence[Site],
    values: Callable[[Site, torch.Tensor], torch.Tensor],
    positions: Callable[[Site], torch.Tensor],
    objective: str,
    chunk_size: int = 32,
    fraction: float = 1.0,
    prefix_len: int = 0,
    by_layer: bool = False,
) -> Float[torch.Tensor, " n_sites"]:
    """The objective of one sequence under each single-site patch, batched.

    ``clean`` holds the clean run's activations named by :func:`clean_hooks`;
    ``positions(site)`` gives the target positions a site writes and ``values(site, current)``
    the values written there (``current``: the clean activation at those positions and unit).
    ``fraction`` moves only that part of the way (``current + fraction * (value - current)``).

    ``prefix_len``: when every patch writes at or after this position, the first
    ``prefix_len`` positions cannot change (causal attention), so only the rest is recomputed,
    attending to the clean run's cached keys and values of the prefix.

    ``by_layer``: chunks never mix sites of different layers, so no variant recomputes a layer
    below its own patch (chunks of a layer with fewer sites than ``chunk_size`` are smaller).
    """
    n_layers = model.cfg.n_layers
    tokens_1 = torch.tensor([ids], device=model.cfg.device)
    final_hook = f"blocks.{n_layers - 1}.hook_resid_post"
    # patches that write only after the pooled token cannot change the reward: not run
    t_star = int(model.pool_positions(tokens_1, torch.ones_like(tokens_1))[0])
    out = torch.full((len(sites),), float(objective_value(model, clean[final_hook], tokens_1,
                                                          objective)[0]),
                     dtype=accumulation_dtype(model))
    live = [i for i, s in enumerate(sites)
            if (pos := positions(s)).numel() and int(pos.min()) <= t_star]
    order = sorted(live, key=lambda i: sites[i].layer)
    # a model that cannot start at a layer (a bridge runs HF's forward) runs every sequence
    # whole, the patch hooks writing at the same positions: the same values, more compute
    p = prefix_len if model.starts_at_layer else 0
    for idx in _chunks(order, [sites[i].layer for i in order], chunk_size, by_layer):
        chunk = [sites[i] for i in idx]
        b = len(chunk)
        first = min(s.layer for s in chunk)
        by_hook: dict[str, list[tuple[int, Site]]] = {}
        for j, s in enumerate(chunk):
            by_hook.setdefault(s.hook, []).append((j, s))

        def make_hook(items: list[tuple[int, Site]]) -> Callable[..., torch.Tensor]:
            def hook(act: torch.Tensor, hook: Any) -> torch.Tensor:
                act = act.clone()
                for j, s in items:
                    pos = positions(s) - p
                    if p and bool((pos < 0).any()):
                        raise TLRewardError("a patch writes inside the cached prefix")
                    at = (j, pos) if s.unit is None else (j, pos, s.unit)
                    cur = act[at]
                    new = values(s, cur).to(act.dtype)
                    if fraction != 1.0:
                        new = cur + fraction * (new - cur)
                    act[at] = new
                return act
            return hook

        fwd = [(name, make_hook(items)) for name, items in by_hook.items()]
        tokens = tokens_1.expand(b, -1)
        with model.hooks(fwd_hooks=fwd):
            if not model.starts_at_layer:
                final = model.final_residual(tokens, torch.ones_like(tokens))
            else:
                resid = clean[f"blocks.{first}.hook_resid_pre"][:, p:].expand(b, -1, -1)
                kv = _prefix_cache(model, clean, p, b) if p else None
                final = model(resid.contiguous(), start_at_layer=first, stop_at_layer=n_layers,
                              tokens=tokens, attention_mask=torch.ones_like(tokens),
                              past_kv_cache=kv)
        if p:
            final = torch.cat([clean[final_hook][:, :p].expand(b, -1, -1), final], 1)
        out[idx] = objective_value(model, final, tokens, objective).to(out.dtype).cpu()
    return out


def _chunks(order: list[int], layers: list[int], size: int, by_layer: bool
            ) -> list[list[int]]:
    """Consecutive pieces of ``order`` (sorted by layer) of at most ``size``; with
    ``by_layer`` a piece also ends where the layer changes."""
    out: list[list[int]] = []
    for j, i in enumerate(order):
        if not out or len(out[-1]) >= size or (by_layer and layers[j] != layers[j - 1]):
            out.append([])
        out[-1].append(i)
    return out


@dataclass(repr=False)
class PatchingResult(CleanMargin, ShortRepr):
    """Effects of patching every site of one kind on one preference pair.

    Attributes:
        effect: normalised effects, shaped by ``dims`` (e.g. ``["layer", "position"]``).
        patched: the patched target's objective, same shape; for ``zero``/``mean`` a leading
            axis of 2 (chosen, rejected).
        dims: axis names; ``layers`` and ``units`` list the indices along ``layer``/``head``/
            ``neuron``; ``position_labels`` name the aligned rows along ``position``.
        clean_chosen, clean_rejected: the clean objective values; ``delta`` their difference.
        unaligned: number of unaligned (never written) positions in (chosen, rejected).
    """

    mode: str
    site: str
    objective: str
    effect: torch.Tensor
    patched: torch.Tensor
    dims: list[str]
    clean_chosen: float
    clean_rejected: float
    layers: list[int]
    units: list[int] | None = None
    position_labels: list[str] | None = None
    unaligned: tuple[int, int] = (0, 0)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per site: its coordinates, effect and patched value(s)."""
        coords: dict[str, list[Any]] = {}
        grids = torch.meshgrid(*[torch.arange(n) for n in self.effect.shape], indexing="ij")
        for name, g in zip(self.dims, grids, strict=True):
            flat = g.flatten().tolist()
            if name == "layer":
                coords[name] = [self.layers[i] for i in flat]
            elif name in ("head", "neuron") and self.units is not None:
                coords[name] = [self.units[i] for i in flat]
            elif name == "position" and self.position_labels is not None:
                coords["position"] = flat
                coords["token"] = [self.position_labels[i] for i in flat]
            else:
                coords[name] = flat
        df = pd.DataFrame(coords)
        df["effect"] = self.effect.flatten().tolist()
        if self.patched.shape == self.effect.shape:
            df["patched"] = self.patched.flatten().tolist()
        else:
            df["patched_chosen"] = self.patched[0].flatten().tolist()
            df["patched_rejected"] = self.patched[1].flatten().tolist()
        return df

    def plot(self) -> Any:
        """A plotly heatmap (layer x position / head) or line (per layer) of the effects."""
        from tl_reward.viz.patching import patching_figure

        return patching_figure(self)


def mean_activations(model: Any, reference: Sequence[Any], hooks: Sequence[str],
                     batch_size: int = 8, by_class: bool = False) -> dict[str, torch.Tensor]:
    """Mean of each hook's activation over every real token of ``reference`` inputs (encoded
    inputs taken as given); ``by_class``: ``[3, ...]`` means over the prompt, reply and pooled
    tokens (:meth:`~tl_reward.model.inputs.RewardBatch.position_classes`), NaN for a class
    the reference lacks."""
    n_cls = 3 if by_class else 1
    sums: dict[str, torch.Tensor] = {}
    count = torch.zeros(n_cls)
    encoded = [x if isinstance(x, EncodedInput) else model.encode(x) for x in reference]
    for batch, cache in cached_batches(model, encoded, batch_size, hooks):
        cls = (batch.position_classes() if by_class else batch.attention_mask.long() - 1).cpu()
        for h in hooks:
            tot = torch.stack([cache[h][(cls == c).to(cache[h].device)].sum(0)
                               for c in range(n_cls)])
            sums[h] = sums[h] + tot if h in sums else tot
        count += torch.bincount(cls[cls >= 0].flatten(), minlength=n_cls)[:n_cls]
    if count.sum() == 0:
        raise TLRewardError("the reference set for mean ablation is empty")
    out = {}
    for h, v in sums.items():
        c = count.to(v.device, v.dtype).reshape(-1, *[1] * (v.ndim - 1))
        mean = torch.where(c > 0, v / c.clamp(min=1), torch.nan)
        out[h] = mean if by_class else mean[0]
    return out


_Grid = tuple[list[Site], list[int], list[int] | None, list[str], tuple[int, ...]]


def _grid(model: Any, site: str, positions: str, layers: Sequence[int] | None,
          units: Sequence[int] | None, n_rows: int) -> _Grid:
    n = model.cfg.n_layers
    if layers is None:
        layers = list(range(n + 1 if site == "resid" else n))
    layers = list(layers)
    if site == "neuron":
        require_neurons(model, "patching neuron sites")
    if site in ("head", "neuron"):
        size = model.cfg.n_heads if site == "head" else model.cfg.d_mlp
        units = list(range(size)) if units is None else list(units)
    elif units is not None:
        raise TLRewardError(f"units= applies to 'head' and 'neuron' sites, not {site!r}")
    if site == "neuron" and positions == "each":
        raise TLRewardError("neuron sites patch every aligned position (positions='all')")
    rows: list[int | None] = list(range(n_rows)) if positions == "each" else [None]
    sites = [Site(*site_hook(model, site, layer), u, r)
             for layer in layers for u in units or [None] for r in rows]
    dims = ["layer"] + ([("head" if site == "head" else "neuron")] if units else [])
    shape = (len(layers),) + ((len(units),) if units else ())
    if positions == "each":
        dims.append("position")
        shape += (n_rows,)
    return sites, layers, (list(units) if units else None), dims, shape


def activation_patching(
    model: Any,
    pair: Any,
    site: str = "resid",
    mode: str = "denoising",
    positions: str = "each",
    layers: Sequence[int] | None = None,
    units: Sequence[int] | None = None,
    objective: int | str | None = None,
    reference: Sequence[Any] | dict[str, torch.Tensor] | None = None,
    fraction: float = 1.0,
    chunk_size: int = 32,
    reuse_prefix: bool = True,
    step: StepSpec | None = None,
) -> PatchingResult:
    """Patch every site of one kind on one preference pair, batched.

    Args:
        pair: a ``PreferencePair``, ``(prompt, chosen, rejected)`` or ``TokenizedPair``.
        site: ``"resid"``, ``"attn_out"``, ``"mlp_out"``, ``"head"`` or ``"neuron"``.
        mode: ``"denoising"``, ``"noising"``, ``"zero"`` or ``"mean"``.
        positions: ``"each"`` aligned position separately, or ``"all"`` aligned positions at once.
        layers, units: restrict to these layers / heads / neurons (default: all).
        objective: which objective (default: the model's first default objective).
        reference: for ``mode="mean"``, inputs to average over (or :func:`mean_activations`).
        fraction: patch only this fraction of the way (finite differences; 1 = full patch).
        chunk_size: patched variants per forward pass.
        reuse_prefix: for denoising and noising, recompute only the positions after the shared
            prompt (which no swap can change), attending to its cached keys and values.
    """
    check_choice(mode, MODES, "mode")
    check_choice(positions, ("each", "all"), "positions")
    tp: TokenizedPair = as_tokenized_pair(model, pair, step)
    obj = resolve_objectives(model, objective)[0]
    sites, layer_list, unit_list, dims, shape = _grid(model, site, positions, layers, units,
                                                      tp.n_aligned)
    clean, r_c, r_r = _clean_pair(model, tp, sites, obj)
    delta = r_c - r_r
    means: dict[str, torch.Tensor] = {}
    if mode == "mean":
        if reference is None:
            raise TLRewardError("mode='mean' needs reference= (inputs to average over, or "
                                "mean_activations(model, inputs, hooks))")
        hook_names = sorted({s.hook for s in sites})
        means = reference if isinstance(reference, dict) else mean_activations(
            model, reference, hook_names)

    swap = mode in ("denoising", "noising")
    p = tp.prompt_len if swap and reuse_prefix else 0
    active = [i for i, st in enumerate(sites) if st.row is None or st.row >= p]

    def run(target: str) -> torch.Tensor:
        col = 0 if target == "chosen" else 1
        tgt_rows = tp.aligned[:, col].to(model.cfg.device)
        src = clean["rejected" if target == "chosen" else "chosen"]
        src_rows = tp.aligned[:, 1 - col].to(model.cfg.device)
        every = torch.arange(len(tp.ids(target)), device=model.cfg.device)
        whole_t, whole_s = (tgt_rows[p:], src_rows[p:]) if swap else (every, every)

        def pos_of(s: Site) -> torch.Tensor:
            return whole_t if s.row is None else tgt_rows[s.row : s.row + 1]

        def value(s: Site, cur: torch.Tensor) -> torch.Tensor:
            if swap:
                rows = whole_s if s.row is None else src_rows[s.row : s.row + 1]
                act = src[s.hook][0, rows]
                return act if s.unit is None else act[:, s.unit]
            if mode == "zero" and not s.hook.endswith("attn.hook_z"):
                return torch.zeros_like(cur)
            # a head's zero is that of its processed z, the value bias counted with b_O
            # (0 on HookedTransformer, which folds it there; HF's b_V on a bridge)
            m = _value_bias(model, s.layer, cur) if mode == "zero" else means[s.hook]
            return (m if s.unit is None else m[s.unit]).expand_as(cur)

        # a swap inside the shared prompt writes the value already there: the clean reward
        out = torch.full((len(sites),), r_c if target == "chosen" else r_r,
                         dtype=accumulation_dtype(model))
        out[active] = run_patched(model, tp.ids(target), clean[target],
                                  [sites[i] for i in active], value, pos_of, obj, chunk_size,
                                  fraction, prefix_len=p)
        return out.reshape(shape)

    if mode == "denoising":
        patched = run("rejected")
        effect = normalised_effect(patched - r_r, delta)
    elif mode == "noising":
        patched = run("chosen")
        effect = normalised_effect(r_c - patched, delta)
    else:
        pc, pr = run("chosen"), run("rejected")
        patched = torch.stack([pc, pr])
        effect = normalised_effect(delta - (pc - pr), delta)
    labels = tp.position_labels(model.tokenizer) if positions == "each" else None
    return PatchingResult(mode, site, obj, effect, patched, dims, r_c, r_r, layer_list,
                          unit_list, labels, (len(tp.unaligned_chosen), len(tp.unaligned_rejected)),
                          {"positions": positions, "fraction": fraction})


def patch_components(
    model: Any,
    pair: Any,
    names: Sequence[str],
    mode: str = "noising",
    objective: int | str | None = None,
    chunk_size: int = 32,
    reuse_prefix: bool = True,
    by_layer: bool = False,
    step: StepSpec | None = None,
) -> Float[torch.Tensor, " C"]:
    """Whole-sequence denoising or noising of named components (``"embed"``, ``"L3.attn"``,
    ``"L3.mlp"``, ``"L3.H2"``) on the aligned positions, batched; normalised effects ``[C]``.
    Attention biases (equal in both runs) get 0. ``by_layer``: see :func:`run_patched`."""
    check_choice(mode, ("denoising", "noising"), "component patching mode")
    tp = as_tokenized_pair(model, pair, step)
    obj = resolve_objectives(model, objective)[0]
    keep = [i for i, nm in enumerate(names) if not nm.endswith("attn_bias")]
    sites = [component_site(model, names[i]) for i in keep]
    clean, r_c, r_r = _clean_pair(model, tp, sites, obj)
    target, source = ("rejected", "chosen") if mode == "denoising" else ("chosen", "rejected")
    col = 0 if target == "chosen" else 1
    p = tp.prompt_len if reuse_prefix else 0  # the shared prompt is the same in both runs
    tgt_rows = tp.aligned[p:, col].to(model.cfg.device)
    src_rows = tp.aligned[p:, 1 - col].to(model.cfg.device)

    def value(s: Site, cur: torch.Tensor) -> torch.Tensor:
        act = clean[source][s.hook][0, src_rows]
        return act if s.unit is None else act[:, s.unit]

    patched = run_patched(model, tp.ids(target), clean[target], sites, value,
                          lambda s: tgt_rows, obj, chunk_size, prefix_len=p, by_layer=by_layer)
    eff = normalised_effect(patched - r_r if mode == "denoising" else r_c - patched, r_c - r_r)
    out = torch.zeros(len(names), dtype=eff.dtype)
    out[keep] = eff
    return out
