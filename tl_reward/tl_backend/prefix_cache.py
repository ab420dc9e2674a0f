"""Prefix key/value caches for many continuations of one prompt (the vocabulary sweep).

A prompt prefix runs once at batch 1; :mod:`.continuation` then runs only the new positions of
each candidate against what is kept here.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry

from tl_reward.model.fingerprint import attachments

if TYPE_CHECKING:  # TransformerLens 4 has no HookedTransformerConfig
    from transformer_lens import HookedTransformerConfig


@dataclass
class FusedQKV:
    """One layer's query, key and value projections as one ``nn.Linear``-layout matrix, and the
    layer's biases as the hook-free path uses them.

    ``weight``: ``[(n_heads + 2 n_kv) d_head, d_model]`` (query rows, then key, then value rows,
    head-major as TransformerLens's ``simple_attn_linear`` lays them out), ``bias`` likewise.
    ``bias``, ``b_O`` and the MLP's ``b_in`` and ``b_out`` are ``None`` where they are all zero
    (as TransformerLens stores a bias-free model's), so no zero is added.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    n_heads: int
    n_kv: int
    b_O: torch.Tensor | None = None
    b_in: torch.Tensor | None = None
    b_out: torch.Tensor | None = None


def _nonzero(b: torch.Tensor | None) -> torch.Tensor | None:
    return None if b is None or not bool(b.detach().any()) else b.detach()


@torch.no_grad()
def fuse_qkv(model: Any) -> list[FusedQKV]:
    """Per layer, the Q/K/V weights concatenated for one matmul (a copy: for a d_model x
    d_model query plus grouped K/V this is about a sixth of the model's weights)."""
    out = []
    ungroup = bool(getattr(model.cfg, "ungroup_grouped_query_attention", False))
    for block in model.blocks:
        attn = block.attn
        w_k = attn.W_K if ungroup or not hasattr(attn, "_W_K") else attn._W_K
        w_v = attn.W_V if ungroup or not hasattr(attn, "_W_V") else attn._W_V
        b_k = attn.b_K if ungroup or not hasattr(attn, "_b_K") else attn._b_K
        b_v = attn.b_V if ungroup or not hasattr(attn, "_b_V") else attn._b_V
        ws = [w.detach().permute(0, 2, 1).reshape(-1, w.shape[1]) for w in (attn.W_Q, w_k, w_v)]
        bs = [b.detach().reshape(-1) for b in (attn.b_Q, b_k, b_v)]
        mlp = block.mlp
        out.append(FusedQKV(torch.cat(ws).contiguous(), _nonzero(torch.cat(bs).contiguous()),
                            attn.W_Q.shape[0], w_k.shape[0], _nonzero(attn.b_O),
                            _nonzero(getattr(mlp, "b_in", None)),
                            _nonzero(getattr(mlp, "b_out", None))))
    return out


@dataclass
class PrefixCache:
    """A prompt prefix run once at batch 1, so many continuations can reuse it.

    Two methods give the same numbers (tests hold both to naive full-sequence scoring):

    * ``"fast"``: per layer the prefix's keys *after* the rotary embedding and its values,
      ``[n_kv_heads, pos, d_head]``. Continuations attend to them by broadcasting over the
      batch: nothing is copied, re-rotated or repeated for grouped-query attention.
    * ``"stock"``: TransformerLens's own ``TransformerLensKeyValueCache``, frozen and expanded
      to each batch as views. TransformerLens re-rotates every cached key and repeats K/V
      heads on every call, so it is slower; it serves configurations ``"fast"`` does not.

    Attributes:
        tokens: the prefix ids.
        resid: the final residual stream (before ``ln_final``) at every prefix position.
        method: ``"fast"`` or ``"stock"``.
        fused: per layer the query, key and value weights as one matrix (:func:`fuse_qkv`),
            used by ``"fast"`` when no hook is attached; share one list between the caches of
            one model. Like the keys and values, it goes stale if the weights change.
        tables: the hook-free path's per-layer rotary tables and masks, by (layer, new
            positions), built on first use.
    """

    tokens: Int[torch.Tensor, " pos"]
    resid: Float[torch.Tensor, "pos d_model"]
    method: str
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    stock: TransformerLensKeyValueCache | None = None
    fused: list[FusedQKV] | None = None
    tables: dict[tuple[int, int], Any] = field(default_factory=dict, repr=False)

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])


def fast_cache_unsupported(cfg: HookedTransformerConfig) -> str | None:
    """Why the ``"fast"`` prefix cache cannot serve ``cfg`` (``None`` when it can)."""
    from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

    checks = {
        "positional embedding other than rotary or standard":
            cfg.positional_embedding_type not in ("rotary", "standard"),
        "use_attn_in / use_split_qkv_input / use_attn_result hooks":
            cfg.use_attn_in or cfg.use_split_qkv_input or cfg.use_attn_result,
        # per-head q/k norms (Qwen3, ``use_qk_norm``) run inside ``calculate_qkv_matrices``,
        # which the fast path calls; OLMo's whole-vector norms and clipping run outside it
        "OLMo query/key norms or clipping": cfg.clip_qkv is not None
            or cfg.original_architecture in ("OlmoeForCausalLM", "Olmo2ForCausalLM",
                                             "Olmo3ForCausalLM"),
        "log-n attention, sinks or dynamic NTK rotary": bool(cfg.use_logn_attn)
            or bool(cfg.use_attention_sinks) or bool(cfg.use_dynamic_ntk_rope),
        "post-norm or parallel blocks": cfg.original_architecture in POST_NORM_ARCHITECTURES
            or cfg.parallel_attn_mlp or cfg.attn_only,
        "4-bit weights or several devices": cfg.load_in_4bit or cfg.n_devices != 1,
        "non-causal attention": cfg.attention_dir != "causal",
    }
    reasons = [name for name, bad in checks.items() if bad]
    return "; ".join(reasons) or None


def _key_hook(model: Any, layer: int) -> str:
    rotary = model.cfg.positional_embedding_type == "rotary"
    return f"blocks.{layer}.attn.hook_rot_k" if rotary else f"blocks.{layer}.attn.hook_k"


@torch.no_grad()
def build_prefix_cache(
    model: Any, prefix: Int[torch.Tensor, " pos"], method: str = "auto",
    fused: list[FusedQKV] | None = None,
) -> PrefixCache:
    """Run ``prefix`` once (batch 1, all-ones mask) and keep what continuations need.

    ``method``: ``"fast"``, ``"stock"`` or ``"auto"`` (``"fast"`` when the configuration
    allows, see :func:`fast_cache_unsupported`); a module tree that is not stock always gets
    ``"stock"`` (:func:`continuation_method`). ``fused``: :func:`fuse_qkv` of the model, to
    share between several prefixes (built here when ``None`` and the method is ``"fast"``).
    """
    method = continuation_method(model, method)
    if method == "none":  # a TransformerBridge: HF's forward keeps no prefix cache
        from tl_reward.tl_backend.bridge import require_hooked

        require_hooked(model, "a key/value prefix cache")  # the IRM and vocabulary sweeps'
    tokens = prefix.to(model.cfg.device).long()[None]
    mask = torch.ones_like(tokens)
    n = model.cfg.n_layers
    if method == "stock":
        cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, 1)
        resid = model(tokens, attention_mask=mask, past_kv_cache=cache, stop_at_layer=n)
        cache.freeze()
        return PrefixCache(prefix.cpu(), resid[0], "stock", stock=cache)
    store: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, hook: Any) -> None:
        store[hook.name] = act[0].transpose(0, 1).contiguous()  # [heads, pos, d_head]

    hooks = [(name, keep) for i in range(n)
             for name in (_key_hook(model, i), f"blocks.{i}.attn.hook_v")]
    with model.hooks(fwd_hooks=hooks):
        resid = model(tokens, attention_mask=mask, stop_at_layer=n)
    return PrefixCache(prefix.cpu(), resid[0], "fast",
                       keys=[store[_key_hook(model, i)] for i in range(n)],
                       values=[store[f"blocks.{i}.attn.hook_v"] for i in range(n)],
                       fused=fused if fused is not None else fuse_qkv(model))


def cache_keys(model: Any, layer: int, keys: torch.Tensor) -> torch.Tensor:
    """Keys as TransformerLens's cache stores them, from ``attn.hook_k`` activations.

    ``hook_k`` fires inside ``calculate_qkv_matrices`` *before* a per-head key norm
    (``use_qk_norm``, Qwen3), while the cache holds the normed keys; apply it here.
    """
    attn = model.blocks[layer].attn
    if getattr(model.cfg, "use_qk_norm", False) and getattr(attn, "k_norm", None) is not None:
        return attn._apply_qk_norm(keys, attn.k_norm)
    return keys


def frozen_kv_cache(keys: list[torch.Tensor], values: list[torch.Tensor], mask: torch.Tensor
                    ) -> TransformerLensKeyValueCache:
    """A frozen TransformerLens cache from per-layer ``[batch, pos, head, d_head]`` keys and
    values (views are fine: a frozen cache never writes to them) and a ``[batch, pos]`` mask."""
    entries = [TransformerLensKeyValueCacheEntry(k, v, frozen=True)
               for k, v in zip(keys, values, strict=True)]
    return TransformerLensKeyValueCache(entries, mask, frozen=True)


def expand_stock_cache(cache: TransformerLensKeyValueCache, batch: int
                       ) -> TransformerLensKeyValueCache:
    """A frozen copy of a batch-1 cache whose entries are ``expand``-ed views at ``batch``."""
    return frozen_kv_cache([e.past_keys.expand(batch, -1, -1, -1) for e in cache.entries],
                           [e.past_values.expand(batch, -1, -1, -1) for e in cache.entries],
                           cache.previous_attention_mask.expand(batch, -1))


def nonstock_module(model: Any) -> str | None:
    """Why the hand-written continuation cannot stand in for this model's forward (it calls
    hook points, never the modules around them): the first of :func:`attachments` in the body
    other than hooks on hook points, or ``None``. The final norm and head are read by
    :func:`~tl_reward.model.readout.read_rewards`, which runs them when anything is attached."""
    found = attachments(model, skip=("reward_head", "ln_final", "unembed"), hook_points=False)
    return found[0] if found else None


def continuation_method(model: Any, requested: str = "auto") -> str:
    """The prefix-cache method that reproduces ``model``'s forward: ``requested`` (``"auto"``
    picks ``"fast"`` where :func:`fast_cache_unsupported` allows), except that a module tree
    that is not stock (:func:`nonstock_module`) always gets TransformerLens's own cached
    forward (``"stock"``), which calls every module. Says so once per model and reason. A
    ``TransformerBridge`` gets ``"none"`` (every sequence run whole) and refuses the others."""
    if requested not in ("auto", "fast", "stock"):
        raise ValueError(f"method must be 'auto', 'fast' or 'stock', got {requested!r}")
    from tl_reward.tl_backend.bridge import is_bridge, require_hooked

    if requested == "auto" and is_bridge(model):
        return "none"  # a bridge runs HF's forward, which has no prefix cache: each sequence
    require_hooked(model, f"the {requested!r} prefix cache")
    if requested == "stock":
        return "stock"
    reason = nonstock_module(model)
    if reason is not None:
        warned = model.__dict__.setdefault("_tl_reward_fast_path_refused", set())
        if reason not in warned:
            warned.add(reason)
            warnings.warn(f"the fast continuation path is off for this model: {reason}; "
                          "using TransformerLens's own cached forward, which runs every "
                          "module (slower, exact)", RuntimeWarning, stacklevel=3)
        return "stock"
    unsupported = fast_cache_unsupported(model.cfg)
    if requested == "fast" and unsupported:
        raise ValueError(f"the fast prefix cache does not support this model ({unsupported}); "
                         "use method='stock' or 'auto'")
    return "stock" if unsupported else "fast"


def hooks_active(model: Any) -> bool:
    """Whether anything is attached to the model (:func:`attachments`): the lean path is off."""
    return bool(attachments(model))
