"""Everything that touches TransformerLens internals lives here, so a TransformerBridge
backend can replace this one module.

What it does: builds ``HookedTransformerConfig`` objects, calls TransformerLens's weight
converters with the reward head standing in for ``lm_head``, processes and loads the weights a
block at a time, and exposes the key/value cache classes used by patching and the sweep.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import nn
from transformer_lens import HookedTransformerConfig
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry
from transformer_lens.components import LayerNormPre, RMSNormPre
from transformer_lens.weight_processing import ProcessWeights

_CONVERTERS = {
    "llama": ("transformer_lens.pretrained.weight_conversions.llama", "convert_llama_weights"),
    "mistral": (
        "transformer_lens.pretrained.weight_conversions.mistral",
        "convert_mistral_weights",
    ),
    "gemma": ("transformer_lens.pretrained.weight_conversions.gemma", "convert_gemma_weights"),
    "qwen2": ("transformer_lens.pretrained.weight_conversions.qwen2", "convert_qwen2_weights"),
    "qwen3": ("transformer_lens.pretrained.weight_conversions.qwen3", "convert_qwen3_weights"),
    "gpt2": ("transformer_lens.pretrained.weight_conversions.gpt2", "convert_gpt2_weights"),
}


class _HeadAsLMHead:
    """A view of an HF model whose ``lm_head`` is the reward head (TL converters read it)."""

    def __init__(self, hf_model: nn.Module, head: nn.Linear) -> None:
        self._hf_model = hf_model
        self.lm_head = head

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hf_model, name)


def tl_converter(name: str) -> Callable[[nn.Module, HookedTransformerConfig], dict[str, Any]]:
    """A TransformerLens weight converter by family name, applied with the head as ``lm_head``.

    The returned function takes ``(hf_model, cfg)`` where ``hf_model`` may be wrapped so that
    ``lm_head`` is the reward layer; the ``unembed.*`` entries it writes are replaced by the
    loader afterwards.
    """
    module_name, fn_name = _CONVERTERS[name]
    fn = getattr(importlib.import_module(module_name), fn_name)

    def convert(hf_model: nn.Module, cfg: HookedTransformerConfig) -> dict[str, Any]:
        return fn(hf_model, cfg)

    convert.__name__ = f"convert_{name}"
    return convert


def make_config(**fields: Any) -> HookedTransformerConfig:
    """A ``HookedTransformerConfig`` with reward-model defaults (no weight init)."""
    fields.setdefault("init_weights", False)
    return HookedTransformerConfig(**fields)


def convert_state_dict(
    convert: Callable[[Any, HookedTransformerConfig], dict[str, Any]],
    hf_model: nn.Module,
    head: nn.Linear,
    cfg: HookedTransformerConfig,
) -> dict[str, torch.Tensor]:
    """The TransformerLens state dict of ``hf_model`` with ``unembed`` = the reward head."""
    state_dict = dict(convert(_HeadAsLMHead(hf_model, head), cfg))
    weight = head.weight.detach()
    state_dict["unembed.W_U"] = weight.T.to(cfg.dtype).contiguous()
    bias = head.bias.detach() if head.bias is not None else torch.zeros(weight.shape[0])
    state_dict["unembed.b_U"] = bias.to(device=weight.device, dtype=cfg.dtype)
    return state_dict


PROCESSING = dict(fold_ln=True, center_writing_weights=True, center_unembed=False,
                  fold_value_biases=True, refactor_factored_attn_matrices=False)
"""The folds tl_reward uses: ``fold_ln`` puts the final norm's gain into the head,
``center_writing_weights`` and ``fold_value_biases`` keep TransformerLens's usual conventions.
Centring the unembedding would zero a one-column reward head, so it stays off."""


def process_weights_stock(model: Any, state_dict: dict[str, torch.Tensor],
                          release: Callable[[int], None] | None = None,
                          device: str | torch.device | None = None) -> None:
    """TransformerLens's own ``load_and_process_state_dict`` with :data:`PROCESSING`.

    It upcasts the whole state dict to float32 and clones all of it at every step: the reference
    that :func:`process_weights` is tested against, bit for bit (``release`` and ``device`` are
    accepted for the same signature and ignored: the loader moves the model at the end).
    """
    model.load_and_process_state_dict(state_dict, **PROCESSING)


def _use_pre_norms(model: Any) -> None:
    """Swap the folded norms for their weightless ``*Pre`` forms, as ``fold_ln`` does."""
    cfg = model.cfg
    kinds = {"LN": (LayerNormPre, "LNPre"), "RMS": (RMSNormPre, "RMSPre")}
    if cfg.normalization_type not in kinds:
        return
    norm, cfg.normalization_type = kinds[cfg.normalization_type]
    model.ln_final = norm(cfg)
    for block in model.blocks:
        block.ln1, block.ln2 = norm(cfg), norm(cfg)
        if cfg.is_layer_norm_activation():
            block.mlp.ln = norm(cfg)


def cpu_config(cfg: HookedTransformerConfig) -> HookedTransformerConfig:
    """A copy of ``cfg`` on the CPU: converters and weight processing run there (converters
    create tensors on ``cfg.device``), and each block moves to the model's device once loaded."""
    out = copy.copy(cfg)
    out.device = "cpu"
    return out


def process_weights(
    model: Any,
    state_dict: dict[str, torch.Tensor],
    release: Callable[[int], None] | None = None,
    device: str | torch.device | None = None,
) -> None:
    """Load ``state_dict`` into ``model`` with :data:`PROCESSING`, one block at a time.

    The same result as :func:`process_weights_stock`, bit for bit, but each block's weights are
    processed (TransformerLens's ``ProcessWeights`` on a one-layer view) and loaded before the
    next, so peak memory is the model plus one block (or the embeddings) in float32 instead of
    several float32 copies of the whole model. Entries are popped from ``state_dict``.

    ``device``: each block moves there as soon as it is loaded (so host memory never holds the
    whole converted model when it goes to a GPU). ``release(layer)`` is called after block
    ``layer`` is loaded, to free the source weights it came from.
    """
    cfg = model.cfg
    state_dict = model.fill_missing_keys(state_dict)
    _use_pre_norms(model)
    one_layer = cpu_config(cfg)
    one_layer.n_layers = 1
    shared = {k: v for k, v in state_dict.items() if not k.startswith("blocks.")}
    # later blocks need embedding keys only because centring the writing weights reads them
    # (their outputs are dropped): one row each, not a float32 copy of the whole vocabulary
    embeddings = {k: v[:1] for k, v in shared.items() if k.startswith(("embed.", "pos_embed."))}
    for layer in range(cfg.n_layers):
        prefix = f"blocks.{layer}."
        group = {"blocks.0." + k[len(prefix):]: state_dict.pop(k)
                 for k in [k for k in state_dict if k.startswith(prefix)]}
        # block 0 carries the embeddings and head; later blocks see the embeddings only because
        # centring the writing weights reads them (their outputs are dropped)
        group.update(shared if layer == 0 else embeddings)
        processed = ProcessWeights.process_weights(group, one_layer, **PROCESSING)
        del group
        block = {k[len("blocks.0."):]: processed.pop(k) for k in list(processed)
                 if k.startswith("blocks.0.")}
        # as in TransformerLens, folded norm weights (now ones) have no parameter and are skipped
        model.blocks[layer].load_state_dict(block, strict=False)
        if layer == 0:
            model.load_state_dict(processed, strict=False)
        del block, processed
        if device is not None:
            model.blocks[layer].to(device)
        if release is not None:
            release(layer)
    model.setup()


# -- shared-prefix key/value caches (vocabulary sweep) ----------------------------------------


@dataclass
class FusedQKV:
    """One layer's query, key and value projections as one ``nn.Linear``-layout matrix.

    ``weight``: ``[(n_heads + 2 n_kv) d_head, d_model]`` (query rows, then key, then value rows,
    head-major as TransformerLens's ``simple_attn_linear`` lays them out), ``bias`` likewise.
    """

    weight: torch.Tensor
    bias: torch.Tensor
    n_heads: int
    n_kv: int


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
        out.append(FusedQKV(torch.cat(ws).contiguous(), torch.cat(bs).contiguous(),
                            attn.W_Q.shape[0], w_k.shape[0]))
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
    """

    tokens: Int[torch.Tensor, " pos"]
    resid: Float[torch.Tensor, "pos d_model"]
    method: str
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    stock: TransformerLensKeyValueCache | None = None
    fused: list[FusedQKV] | None = None

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
    allows, see :func:`fast_cache_unsupported`). ``fused``: :func:`fuse_qkv` of the model, to
    share between several prefixes (built here when ``None`` and the method is ``"fast"``).
    """
    if method not in ("auto", "fast", "stock"):
        raise ValueError(f"method must be 'auto', 'fast' or 'stock', got {method!r}")
    reason = fast_cache_unsupported(model.cfg)
    if method == "fast" and reason:
        raise ValueError(f"the fast prefix cache does not support this model ({reason}); "
                         "use method='stock' or 'auto'")
    if method == "auto":
        method = "stock" if reason else "fast"
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


def _suffix_mask(attn: Any, past: int, length: int, device: torch.device) -> torch.Tensor:
    """``[length, past + length]`` True where a continuation query may attend."""
    q = torch.arange(past, past + length, device=device)[:, None]
    k = torch.arange(past + length, device=device)[None, :]
    ok = k <= q
    if attn.attn_type == "local":
        ok = ok & (k > q - attn.cfg.window_size)
    return ok


def _cached_attention(attn: Any, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      past: int, qkv: FusedQKV | None = None) -> torch.Tensor:
    """One attention layer for continuation positions against the prefix's rotated K/V.

    With ``qkv`` (no hooks attached) the projections are one matmul and ``hook_q/k/v`` are
    skipped; otherwise TransformerLens's ``calculate_qkv_matrices`` fires them."""
    if qkv is None:
        q, k, v = attn.calculate_qkv_matrices(x, x, x)  # fires hook_q, hook_k, hook_v
    else:
        q, k, v = _project_qkv(x, qkv)
        if attn.cfg.use_qk_norm:  # as calculate_qkv_matrices does (Qwen3's per-head norms)
            q = attn._apply_qk_norm(q, attn.q_norm)
            k = attn._apply_qk_norm(k, attn.k_norm)
    if attn.cfg.positional_embedding_type == "rotary":
        q = attn.hook_rot_q(attn.apply_rotary(q, past))
        k = attn.hook_rot_k(attn.apply_rotary(k, past))
    b, s, h, d = q.shape
    n_kv = keys.shape[0]
    qg = q.reshape(b, s, n_kv, h // n_kv, d)
    scores = torch.cat([torch.einsum("bsngd,npd->bngsp", qg, keys),
                        torch.einsum("bsngd,btnd->bngst", qg, k)], dim=-1)
    scores = scores.reshape(b, h, s, past + s) / attn.attn_scale
    cap = attn.cfg.attn_scores_soft_cap
    if cap is not None and cap > 0:
        scores = cap * torch.tanh(scores / cap)
    allowed = _suffix_mask(attn, past, s, scores.device)
    scores = attn.hook_attn_scores(scores.masked_fill(~allowed, float("-inf")))
    pattern = attn.hook_pattern(torch.softmax(scores, dim=-1)).to(values.dtype)
    pg = pattern.reshape(b, n_kv, h // n_kv, s, past + s)
    # TransformerLens computes ``pattern @ v`` as one matmul over every key, accumulated in
    # float32 and rounded once; the prefix and new parts are summed in float32 (at least)
    # before that one rounding, so half-precision models match it
    acc = torch.promote_types(values.dtype, torch.float32)
    z = (torch.einsum("bngsp,npd->bsngd", pg[..., :past].to(acc), values.to(acc))
         + torch.einsum("bngst,btnd->bsngd", pg[..., past:].to(acc), v.to(acc)))
    z = attn.hook_z(z.reshape(b, s, h, d).to(values.dtype))
    w = attn.W_O.reshape(h * d, -1).T
    return torch.nn.functional.linear(z.reshape(b, s, h * d), w, attn.b_O)


def _project_qkv(x: torch.Tensor, qkv: FusedQKV
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q, K, V ``[batch, pos, heads, d_head]`` (views into one matmul's output)."""
    b, s, _ = x.shape
    d = qkv.weight.shape[0] // (qkv.n_heads + 2 * qkv.n_kv)
    out = torch.nn.functional.linear(x, qkv.weight, qkv.bias)
    q, k, v = out.split([qkv.n_heads * d, qkv.n_kv * d, qkv.n_kv * d], dim=-1)
    return (q.view(b, s, qkv.n_heads, d), k.view(b, s, qkv.n_kv, d),
            v.view(b, s, qkv.n_kv, d))


def hooks_active(model: Any) -> bool:
    """Whether any forward hook is attached to the model's hook points (or globally)."""
    from torch.nn.modules import module as nn_module

    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return True
    return any(hp._forward_hooks or hp._forward_pre_hooks for hp in model.hook_dict.values())


def _mlp(block: Any, x: torch.Tensor, hooks: bool = True) -> torch.Tensor:
    """``block.apply_mlp``; a gated MLP runs on its weights in place (TransformerLens copies
    each transposed weight on every call, a real cost when only a few positions are new).
    With ``hooks=False`` (nothing attached) the gated MLP works in place on its own
    intermediates, which no hook can have kept."""
    from transformer_lens.components.mlps.gated_mlp import GatedMLP

    mlp = block.mlp
    if type(mlp) is not GatedMLP or mlp.cfg.is_layer_norm_activation():
        return block.apply_mlp(x)
    if hooks:
        pre = mlp.hook_pre(x @ mlp.W_gate)
        post = mlp.hook_post(mlp.act_fn(pre) * mlp.hook_pre_linear(x @ mlp.W_in) + mlp.b_in)
    else:
        post = mlp.act_fn(x @ mlp.W_gate)
        post.mul_(x @ mlp.W_in).add_(mlp.b_in)
    out = torch.nn.functional.linear(post, mlp.W_out.T, mlp.b_out)
    if mlp.cfg.use_normalization_before_and_after:
        out = block.ln2_post(out)
    return block.hook_mlp_out(out) if hooks else out


def _fast_suffix(model: Any, cache: PrefixCache, tokens: torch.Tensor,
                 rows: torch.Tensor | None = None) -> torch.Tensor:
    """Final residual of the new positions ``[batch, pos, d_model]``, or with ``rows``
    (``[batch]`` indices into the new positions) only there, ``[batch, d_model]``.

    With no hook attached, the projections use the fused Q/K/V weights, hook points are not
    called and, given ``rows``, the last block's MLP runs only at those rows (nothing after
    the last attention mixes positions). With hooks every hook fires on every new position."""
    past = cache.length
    lean = cache.fused is not None and not hooks_active(model)
    embed = model.hook_embed(model.embed(tokens))
    resid = model.get_residual(embed, past, tokens=tokens, return_shortformer_pos_embed=False)
    if lean:
        resid = resid.clone()  # updated in place below; never a view of the embeddings
    post_norm = model.cfg.use_normalization_before_and_after
    last = len(model.blocks) - 1
    for i, block in enumerate(model.blocks):
        if not lean:
            resid_pre = block.hook_resid_pre(resid)
            attn_out = _cached_attention(block.attn, block.ln1(resid_pre), cache.keys[i],
                                         cache.values[i], past)
            if post_norm:
                attn_out = block.ln1_post(attn_out)
            resid_mid = block.hook_resid_mid(resid_pre + block.hook_attn_out(attn_out))
            mlp_in = (block.hook_mlp_in(resid_mid.clone()) if model.cfg.use_hook_mlp_in
                      else resid_mid)
            resid = block.hook_resid_post(resid_mid + _mlp(block, block.ln2(mlp_in)))
            continue
        assert cache.fused is not None
        attn_out = _cached_attention(block.attn, block.ln1(resid), cache.keys[i],
                                     cache.values[i], past, cache.fused[i])
        if post_norm:
            attn_out = block.ln1_post(attn_out)
        resid = resid.add_(attn_out) if resid.dtype == attn_out.dtype else resid + attn_out
        if i == last and rows is not None:
            resid = resid[torch.arange(resid.shape[0], device=resid.device), rows][:, None]
        out = _mlp(block, block.ln2(resid), hooks=False)
        resid = resid.add_(out) if resid.dtype == out.dtype else resid + out
    if rows is None:
        return resid
    if lean:
        return resid[:, 0]
    return resid[torch.arange(resid.shape[0], device=resid.device), rows]


@torch.no_grad()
def run_after_prefix(
    model: Any, cache: PrefixCache, tokens: Int[torch.Tensor, "batch pos"]
) -> Float[torch.Tensor, "batch pos d_model"]:
    """Final residual stream (before ``ln_final``) of ``prefix + tokens[i]`` at the new positions.

    Every row continues the same prefix; no padding. Hooks fire on the new positions as in
    TransformerLens's own cached forward (``hook_attn_scores`` and ``hook_pattern`` are
    ``[batch, head, pos, prefix + pos]``).
    """
    tokens = tokens.to(model.cfg.device).long()
    if cache.method == "fast":
        return _fast_suffix(model, cache, tokens)
    assert cache.stock is not None
    stock = expand_stock_cache(cache.stock, tokens.shape[0])
    return model(tokens, attention_mask=torch.ones_like(tokens), past_kv_cache=stock,
                 stop_at_layer=model.cfg.n_layers)


@torch.no_grad()
def final_residual_at(
    model: Any, cache: PrefixCache, tokens: Int[torch.Tensor, "batch pos"],
    rows: Int[torch.Tensor, " batch"],
) -> Float[torch.Tensor, "batch d_model"]:
    """:func:`run_after_prefix` read only at new position ``rows[i]`` of each row: the same
    values, but with no hook attached the last block's MLP runs only there."""
    tokens = tokens.to(model.cfg.device).long()
    rows = rows.to(tokens.device)
    if cache.method == "fast":
        return _fast_suffix(model, cache, tokens, rows)
    resid = run_after_prefix(model, cache, tokens)
    return resid[torch.arange(resid.shape[0], device=resid.device), rows]
