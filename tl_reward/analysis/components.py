"""The final residual at chosen positions, split into what each component wrote there.

``h_L[t] = embed[t] (+ pos_embed[t]) + sum_l (attn_out_l[t] + mlp_out_l[t])``, and
``attn_out_l[t] = sum_h z_h[t] W_O[h] + b_O`` (one term per query head; grouped-query models
share values, not outputs), ``mlp_out_l[t] = sum_n post_n[t] W_out[n] + b_out``.

A model whose blocks apply a norm after attention and after the MLP (``model.post_norms``:
Gemma-2's sandwich norms ``ln1_post``, ``ln2_post``; OLMo-2's ``ln1``, ``ln2`` on the bridge,
with no norm before) writes ``attn_out = w_post * (sum_h ... + b_O) / s_post``. The per-head
(and per-neuron) split holds exactly only with that post-norm's scale ``s_post`` frozen at its
value in the run, which is what this module does; the heads then still sum to ``attn_out``.

Every split is computed in float32 (float64 for a float64 model) from the cached activations,
whatever the weights' dtype.

The names used here (``"embed"``, ``"L3.attn"``, ``"L3.H2"``, ``"L3.mlp"``) are shared by
attribution, patching and the faithfulness report.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from transformer_lens import ActivationCache

from tl_reward.errors import TLRewardError
from tl_reward.model.readout import accumulation_dtype
from tl_reward.results import ShortRepr

SUBLAYER_LEVELS = ("sublayer", "head", "neuron")


def has_neurons(model: Any) -> bool:
    """Whether each MLP is one layer of neurons (``mlp.hook_post``) written through ``W_out``;
    a mixture of experts (Mixtral, Qwen3-MoE) is not."""
    return hasattr(model.blocks[0].mlp, "W_out")


def require_neurons(model: Any, analysis: str) -> None:
    """Refuse ``analysis`` where :func:`has_neurons` is false, naming the family and what
    still applies."""
    if not has_neurons(model):
        family = getattr(model.cfg, "architecture", None) or model.cfg.original_architecture
        raise TLRewardError(
            f"{analysis} needs one set of MLP neurons, and {family}'s MLP is a mixture of "
            "experts (no single W_out): use the sublayer or head level (the whole MLP as one "
            "component)")


def component_hooks(model: object, per_position: bool = False, neurons: bool = False) -> list[str]:
    """Names of the hooks a decomposition reads (for ``run_with_cache(names_filter=...)``):
    nothing else is cached."""
    cfg = model.cfg  # type: ignore[attr-defined]
    if neurons:
        require_neurons(model, "a per-neuron split (neurons=True)")
    post_norms = model.post_norms or ()  # type: ignore[attr-defined]
    names = ["hook_embed", f"blocks.{cfg.n_layers - 1}.hook_resid_post"]
    if cfg.positional_embedding_type == "standard":
        names.append("hook_pos_embed")
    for layer in range(cfg.n_layers):
        names += [f"blocks.{layer}.attn.hook_z", f"blocks.{layer}.hook_mlp_out"]
        names += [f"blocks.{layer}.{norm}.hook_scale" for norm in post_norms]
        if per_position:
            names += [f"blocks.{layer}.attn.hook_pattern", f"blocks.{layer}.attn.hook_v"]
        if neurons:
            names.append(f"blocks.{layer}.mlp.hook_post")
    return names


class PooledActivations(dict):  # type: ignore[type-arg]
    """Activations of a batch taken at each row's pooled position while the model runs
    (``[batch, ...]``; an attention pattern keeps its query row at ``t*``: ``[batch, head,
    src]``); ``full`` holds the few read at every position (the final residual, values for
    per-position maps). Memory per layer is then O(batch x d_model), not O(batch x pos^2)."""

    def __init__(self, pooled: dict[str, torch.Tensor], full: dict[str, torch.Tensor]) -> None:
        super().__init__(pooled)
        self.full = full


@torch.no_grad()
def pooled_run(
    model: Any, tokens: Int[torch.Tensor, "batch pos"], mask: Int[torch.Tensor, "batch pos"],
    positions: Int[torch.Tensor, " batch"], per_position: bool = False, neurons: bool = False,
) -> PooledActivations:
    """Run ``model`` once and keep only what :func:`final_components` (and the per-neuron and
    per-position splits) read: each hook of :func:`component_hooks` at ``positions``, inside
    the hook, so no layer's full activations (or attention pattern) outlive its block."""
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    positions = positions.to(tokens.device)
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    pooled: dict[str, torch.Tensor] = {}
    full: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, hook: Any, name: str) -> None:  # name as asked: a bridge
        # calls the hook with its own name for an alias (blocks.{l}.hook_out)
        if name == last or name.endswith("attn.hook_v"):
            full[name] = act
        elif name.endswith("hook_pattern"):
            pooled[name] = act[rows, :, positions]
        else:
            pooled[name] = act[rows, positions]

    hooks = [(n, functools.partial(keep, name=n))
             for n in component_hooks(model, per_position, neurons)]
    with model.hooks(fwd_hooks=hooks):
        model(tokens, attention_mask=mask, return_type=None)
    if last in full:
        pooled[last] = full[last][rows, positions]
    return PooledActivations(pooled, full)


def _at(acts: Any, name: str, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``name`` at each row's position from a full cache or :class:`PooledActivations`."""
    if isinstance(acts, PooledActivations):
        return acts[name]
    t = acts[name]
    return t[rows, :, positions] if name.endswith("hook_pattern") else t[rows, positions]


def _bias(b: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """A writing bias as ``[1, d_model]`` in ``like``'s dtype (a bridge has ``None``: no bias)."""
    d = like.shape[-1]
    return (torch.zeros(d, device=like.device) if b is None else b).to(like.dtype)[None]


def _value_bias(model: Any, layer: int, like: torch.Tensor) -> torch.Tensor:
    """The value bias ``[n_heads, d_head]`` of ``layer`` in ``like``'s dtype
    (``model.value_bias``), which every head writes whatever it attends to: the decompositions
    count it in the attention bias, as HookedTransformer's processed weights do."""
    b = model.value_bias(layer)
    if b is None:
        return torch.zeros(like.shape[-2:], dtype=like.dtype, device=like.device)
    return torch.repeat_interleave(b, model.cfg.n_heads // b.shape[0], dim=0).to(like.dtype)


def _post_factor(
    model: object, cache: ActivationCache | PooledActivations, layer: int, which: int,
    rows: torch.Tensor, positions: torch.Tensor,
) -> Float[torch.Tensor, "batch d_model"] | None:
    """``w_post / s_post`` at each row's position for the norm after attention (``which=0``)
    or after the MLP (``1``) of ``model.post_norms``, else ``None`` (float32 at least:
    TransformerLens computes ``hook_scale`` in float32)."""
    post_norms = model.post_norms  # type: ignore[attr-defined]
    if post_norms is None:
        return None
    name = post_norms[which]
    acc = accumulation_dtype(model)
    scale = _at(cache, f"blocks.{layer}.{name}.hook_scale", rows, positions).to(acc)  # [b, 1]
    w = model.norm_gain(getattr(model.blocks[layer], name))  # type: ignore[attr-defined]
    gain = torch.ones_like(scale) if w is None else w[None].to(acc)
    return gain / scale


@dataclass(repr=False)
class FinalComponents(ShortRepr):
    """Vectors each component wrote into the residual stream at one position per row.

    Attributes:
        embed: ``[batch, E, d_model]`` token embedding (and positional embedding, if any).
        embed_names: names of the E embedding terms.
        heads: ``[batch, layer, head, d_model]`` each attention head's output.
        attn_bias: ``[batch, layer, d_model]`` each attention layer's output bias.
        mlp: ``[batch, layer, d_model]`` each MLP's whole output (bias included).
        resid: ``[batch, d_model]`` the final residual at those positions (their sum).
    """

    embed: Float[torch.Tensor, "batch E d_model"]
    embed_names: list[str]
    heads: Float[torch.Tensor, "batch layer head d_model"]
    attn_bias: Float[torch.Tensor, "batch layer d_model"]
    mlp: Float[torch.Tensor, "batch layer d_model"]
    resid: Float[torch.Tensor, "batch d_model"]

    @property
    def attn(self) -> Float[torch.Tensor, "batch layer d_model"]:
        """Each attention layer's whole output (heads plus bias)."""
        return self.heads.sum(2) + self.attn_bias

    def stack(self, level: str = "sublayer") -> tuple[torch.Tensor, list[str]]:
        """All components as ``[batch, C, d_model]`` with their names; they sum to ``resid``.

        ``level="sublayer"``: embeddings, then each layer's attention and MLP output.
        ``level="head"``: embeddings, then per layer each head, the attention bias and the MLP.
        """
        return stack_components(self, level)


def stack_components(parts: object, level: str = "sublayer") -> tuple[torch.Tensor, list[str]]:
    """Concatenate ``parts.embed``, ``.heads``/``.attn``, ``.attn_bias`` and ``.mlp`` (any
    trailing shape) along dim 1 in layer order, with their names, at ``level``; ``"neuron"``
    is the head level with each MLP split into ``.neurons`` and its ``.mlp_bias``."""
    if level not in SUBLAYER_LEVELS:
        raise ValueError(f"level must be one of {SUBLAYER_LEVELS}, got {level!r}")
    p: Any = parts
    if level == "neuron" and getattr(p, "neurons", None) is None:
        raise ValueError("level='neuron' needs per-neuron terms: run the attribution with "
                         "neurons=True")
    n_layers, n_heads = p.heads.shape[1], p.heads.shape[2]
    tensors, names = [p.embed], list(p.embed_names)
    for layer in range(n_layers):
        if level == "sublayer":
            tensors.append(p.attn[:, layer, None])
            names.append(f"L{layer}.attn")
        else:
            tensors += [p.heads[:, layer], p.attn_bias[:, layer, None]]
            names += [f"L{layer}.H{h}" for h in range(n_heads)] + [f"L{layer}.attn_bias"]
        if level == "neuron":
            tensors += [p.neurons[:, layer], p.mlp_bias[:, layer, None]]
            names += [f"L{layer}.N{i}" for i in range(p.neurons.shape[2])] + [f"L{layer}.mlp_bias"]
        else:
            tensors.append(p.mlp[:, layer, None])
            names.append(f"L{layer}.mlp")
    return torch.cat(tensors, 1), names


def merge_embed(vals: torch.Tensor, names: list[str], n_embed: int
                ) -> tuple[torch.Tensor, list[str]]:
    """The first ``n_embed`` terms of ``vals`` (dim 0) summed into one named ``"embed"``."""
    return torch.cat([vals[:n_embed].sum(0, keepdim=True), vals[n_embed:]]), [
        "embed", *names[n_embed:]]


def final_components(
    model: object, cache: ActivationCache | PooledActivations,
    positions: Int[torch.Tensor, " batch"],
) -> FinalComponents:
    """Split the final residual at ``positions`` (one per row) into component outputs."""
    cfg = model.cfg  # type: ignore[attr-defined]
    acc = accumulation_dtype(model)
    rows = torch.arange(positions.shape[0], device=positions.device)
    embed = [_at(cache, "hook_embed", rows, positions).to(acc)]
    names = ["embed"]
    if "hook_pos_embed" in (cache if isinstance(cache, PooledActivations) else cache.cache_dict):
        embed.append(_at(cache, "hook_pos_embed", rows, positions).to(acc))
        names.append("pos_embed")
    heads, biases, mlps = [], [], []
    for layer in range(cfg.n_layers):
        attn = model.blocks[layer].attn  # type: ignore[attr-defined]
        z = _at(cache, f"blocks.{layer}.attn.hook_z", rows, positions).to(acc)  # [b, h, d_head]
        b_v, w_o = _value_bias(model, layer, z), attn.W_O.to(acc)
        out = torch.einsum("bhe,hed->bhd", z - b_v, w_o)
        bias = (_bias(attn.b_O, out) + torch.einsum("he,hed->d", b_v, w_o)).expand(z.shape[0], -1)
        post = _post_factor(model, cache, layer, 0, rows, positions)
        if post is not None:
            out, bias = out * post[:, None], bias * post
        heads.append(out)
        biases.append(bias)
        mlps.append(_at(cache, f"blocks.{layer}.hook_mlp_out", rows, positions).to(acc))
    resid = _at(cache, f"blocks.{cfg.n_layers - 1}.hook_resid_post", rows, positions).to(acc)
    return FinalComponents(torch.stack(embed, 1), names, torch.stack(heads, 1),
                           torch.stack(biases, 1), torch.stack(mlps, 1), resid)


def neuron_projections(
    model: object, cache: ActivationCache | PooledActivations,
    positions: Int[torch.Tensor, " batch"], directions: Float[torch.Tensor, "batch n_obj d_model"],
) -> tuple[Float[torch.Tensor, "batch layer d_mlp n_obj"],
           Float[torch.Tensor, "batch layer n_obj"]]:
    """``(post_n W_out[n] . u, b_out . u)`` per layer: each neuron's and the MLP bias's output
    projected on ``directions`` (a post-norm's scale frozen). Sums to the MLP's."""
    rows = torch.arange(positions.shape[0], device=positions.device)
    neurons, biases = [], []
    for layer in range(model.cfg.n_layers):  # type: ignore[attr-defined]
        mlp = model.blocks[layer].mlp  # type: ignore[attr-defined]
        post = _post_factor(model, cache, layer, 1, rows, positions)
        u = directions if post is None else directions * post[:, None]
        acts = _at(cache, f"blocks.{layer}.mlp.hook_post", rows, positions).to(u.dtype)
        w_u = torch.einsum("nd,bkd->bnk", mlp.W_out.to(u.dtype), u)
        neurons.append(acts[..., None] * w_u)
        biases.append(torch.einsum("d,bkd->bk", _bias(mlp.b_out, u)[0], u))
    return torch.stack(neurons, 1), torch.stack(biases, 1)


def head_position_projections(
    model: object, cache: ActivationCache | PooledActivations,
    positions: Int[torch.Tensor, " batch"], directions: Float[torch.Tensor, "batch n_obj d_model"],
) -> Float[torch.Tensor, "batch layer head src n_obj"]:
    """Each head's output at ``positions`` split over source positions and projected:
    ``A[h, t, j] (v_j W_O[h]) . u``. Sums over ``src`` to the head's projected output."""
    cfg = model.cfg  # type: ignore[attr-defined]
    rows = torch.arange(positions.shape[0], device=positions.device)
    out = []
    for layer in range(cfg.n_layers):
        attn = model.blocks[layer].attn  # type: ignore[attr-defined]
        post = _post_factor(model, cache, layer, 0, rows, positions)
        u = directions if post is None else directions * post[:, None]
        pattern = _at(cache, f"blocks.{layer}.attn.hook_pattern", rows, positions).to(u.dtype)
        full = cache.full if isinstance(cache, PooledActivations) else cache
        v = full[f"blocks.{layer}.attn.hook_v"].to(u.dtype)  # [b, src, kv, d_head]
        if v.shape[2] != cfg.n_heads:
            v = torch.repeat_interleave(v, cfg.n_heads // v.shape[2], dim=2)
        v = v - _value_bias(model, layer, v)
        ou = torch.einsum("hed,bkd->bhek", attn.W_O.to(u.dtype), u)  # [b, head, d_head, n_obj]
        vu = torch.einsum("bshe,bhek->bhsk", v, ou)
        out.append(pattern[..., None] * vu)
    return torch.stack(out, 1)
