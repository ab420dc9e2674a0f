"""The forward pass of continuation positions after a cached prefix.

Two paths give the same numbers: with hooks attached every hook point fires on the new
positions, as in TransformerLens's own cached forward; with none attached a lean path skips
them, fuses the projections and lays attention out for few new positions against a long
prefix (see :func:`_lean_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from transformer_lens.utilities import apply_softcap

from tl_reward.tl_backend.prefix_cache import (
    FusedQKV,
    PrefixCache,
    expand_stock_cache,
    hooks_active,
    nonstock_module,
)


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
        q, k, v = _project_qkv(attn, x, qkv)
    if attn.cfg.positional_embedding_type == "rotary":
        q = attn.hook_rot_q(attn.apply_rotary(q, past))
        k = attn.hook_rot_k(attn.apply_rotary(k, past))
    b, s, h, d = q.shape
    n_kv = keys.shape[0]
    qg = q.reshape(b, s, n_kv, h // n_kv, d)
    scores = torch.cat([torch.einsum("bsngd,npd->bngsp", qg, keys),
                        torch.einsum("bsngd,btnd->bngst", qg, k)], dim=-1)
    scores = scores.reshape(b, h, s, past + s) / attn.attn_scale
    scores = apply_softcap(scores, attn.cfg.attn_scores_soft_cap)
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


@dataclass
class _LeanTables:
    """One layer's constants for ``s`` new positions after ``past`` cached ones.

    ``cos``/``sin``: ``[s, d_head]`` rotary tables (the keys') with the rotation's sign in
    ``sin`` and ones/zeros on the dimensions rotary leaves alone (``None`` without rotary).
    ``q_scale``: ``1 / attn_scale`` when ``folded`` (float32/float64, where scaling the query
    instead of the scores changes only the last bit), else 1; ``cos_q``/``sin_q``:
    ``[s, 1, d_head]``, the query's tables times ``q_scale``. ``blocked``: ``[s, 1, past + s]``,
    True where a query may not attend; ``prefix_blocked``: whether any prefix key is (a sliding
    window shorter than the prefix), else only new keys are masked. ``values``: the prefix's
    values in the accumulation dtype (float32 at least), converted once.
    """

    cos: torch.Tensor | None
    sin: torch.Tensor | None
    cos_q: torch.Tensor | None
    sin_q: torch.Tensor | None
    blocked: torch.Tensor
    folded: bool
    q_scale: float
    prefix_blocked: bool
    values: torch.Tensor


_FOLDED = (torch.float32, torch.float64)


def _lean_tables(attn: Any, s: int, values: torch.Tensor) -> _LeanTables | None:
    """:class:`_LeanTables` of ``attn`` for ``s`` new positions after the prefix whose values
    are ``values`` ``[n_kv, past, d_head]``, or ``None`` where its rotary buffers are too short
    (TransformerLens's ``apply_rotary`` extends them: the caller falls back to it)."""
    cfg = attn.cfg
    past, dtype, device = values.shape[1], values.dtype, values.device
    blocked = ~_suffix_mask(attn, past, s, device)[:, None, :]
    folded = dtype in _FOLDED
    scale = 1.0 / float(attn.attn_scale) if folded else 1.0
    cut = bool(blocked[..., :past].any())
    acc = values.to(torch.promote_types(dtype, torch.float32))
    if cfg.positional_embedding_type != "rotary":
        return _LeanTables(None, None, None, None, blocked, folded, scale, cut, acc)
    if past + s > attn.rotary_cos.shape[0]:
        return None
    d, rd = cfg.d_head, cfg.rotary_dim
    cos, sin = attn.rotary_cos[past : past + s, :rd], attn.rotary_sin[past : past + s, :rd]
    ones = torch.ones(rd // 2, dtype=cos.dtype, device=device)
    sign = (torch.stack([-ones, ones], -1).flatten() if cfg.rotary_adjacent_pairs
            else torch.cat([-ones, ones]))
    rest = (s, d - rd)
    cos = torch.cat([cos, torch.ones(rest, dtype=cos.dtype, device=device)], -1).to(dtype)
    sin = torch.cat([sin * sign, torch.zeros(rest, dtype=sin.dtype, device=device)], -1
                    ).to(dtype)
    return _LeanTables(cos, sin, (cos * scale)[:, None], (sin * scale)[:, None], blocked, folded,
                       scale, cut, acc)


def _swapped(x: torch.Tensor, rd: int, adjacent: bool) -> torch.Tensor:
    """``x`` with its rotary halves (or adjacent pairs) swapped: times the signed ``sin`` this
    is TransformerLens's ``rotate_every_two``."""
    r = x[..., :rd]
    if adjacent:
        sw = r.unflatten(-1, (rd // 2, 2)).flip(-1).flatten(-2)
    else:
        sw = torch.cat([r[..., rd // 2 :], r[..., : rd // 2]], dim=-1)
    return sw if rd == x.shape[-1] else torch.cat([sw, x[..., rd:]], dim=-1)


def _rotate_into(x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                 scale: float, attn: Any) -> torch.Tensor:
    """``x`` rotated (TransformerLens's ``x * cos + rotate_every_two(x) * sin``), or only
    times ``scale`` without rotary, as a new contiguous tensor in ``x``'s logical layout."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if cos is None or sin is None:
        return torch.mul(x, scale, out=out) if scale != 1.0 else out.copy_(x)
    torch.mul(x, cos, out=out)
    rd = attn.cfg.rotary_dim
    if x.dtype in _FOLDED:  # each half (or pair member) takes its partner's share in place
        if attn.cfg.rotary_adjacent_pairs:
            a, b = slice(0, rd, 2), slice(1, rd, 2)
        else:
            a, b = slice(0, rd // 2), slice(rd // 2, rd)
        out[..., a].addcmul_(x[..., b], sin[..., a])
        out[..., b].addcmul_(x[..., a], sin[..., b])
        return out
    sw = _swapped(x, rd, attn.cfg.rotary_adjacent_pairs)
    return out.add_(sw.mul_(sin))  # two roundings then the sum, as TransformerLens does


def _lean_attention(attn: Any, x: torch.Tensor, keys: torch.Tensor, qkv: FusedQKV,
                    t: _LeanTables) -> torch.Tensor:
    """:func:`_cached_attention` without hook points, laid out for few new positions, up to
    ``z`` ``[batch, pos, n_heads * d_head]`` (the output projection is :func:`_add_out`'s).

    Queries are arranged ``[kv head, batch, pos, group, d_head]`` as they are rotated, so each
    key/value head meets every query of its group in one matmul against the shared prefix
    (nothing is expanded over the batch) and the few new keys in one batched matmul; the
    query carries ``1 / attn_scale`` (float32/float64). ``pattern @ v`` is accumulated in
    float32 (at least) over both parts and rounded once, as in the hooked path.
    """
    b, s, _ = x.shape
    h, n_kv = qkv.n_heads, qkv.n_kv
    g, past, d = h // n_kv, keys.shape[1], keys.shape[-1]
    q, k, v = _project_qkv(attn, x, qkv)
    qr = _rotate_into(q.reshape(b, s, n_kv, g, d).permute(2, 0, 1, 3, 4), t.cos_q, t.sin_q,
                      t.q_scale, attn)
    kr = _rotate_into(k.permute(2, 0, 1, 3), t.cos, t.sin, 1.0, attn)  # [n_kv, b, s, d]
    scores = torch.cat(
        [torch.matmul(qr.view(n_kv, b * s * g, d), keys.transpose(1, 2)
                      ).view(n_kv, b, s, g, past),
         torch.matmul(qr.view(n_kv, b, s * g, d), kr.transpose(2, 3)).view(n_kv, b, s, g, s)],
        dim=-1)
    if not t.folded:
        scores = scores.div_(attn.attn_scale)
    scores = apply_softcap(scores, attn.cfg.attn_scores_soft_cap)
    if t.prefix_blocked:
        scores.masked_fill_(t.blocked, float("-inf"))
    else:  # only the causal triangle of the new keys
        scores[..., past:].masked_fill_(t.blocked[..., past:], float("-inf"))
    pattern = torch.softmax(scores, dim=-1)
    pa = pattern.to(t.values.dtype)  # the model's dtype (softmax of its scores), upcast
    z = torch.matmul(pa.view(n_kv, b * s * g, past + s)[..., :past], t.values)
    z = z.view(n_kv, b, s * g, d)
    z += torch.matmul(pa.view(n_kv, b, s * g, past + s)[..., past:],
                      v.permute(2, 0, 1, 3).to(t.values.dtype))
    return z.view(n_kv, b, s, g, d).permute(1, 2, 0, 3, 4).reshape(b, s, h * d).to(keys.dtype)


def _lean_norm(norm: Any, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` without its hook points: an ``RMSNormPre`` in float32/float64 as
    ``x * rsqrt(|x|^2 / d + eps)`` from one norm reduction (two passes over ``x`` instead of
    four; TransformerLens divides by ``sqrt(mean(x^2) + eps)``, a last-bit difference);
    anything else, including half precision, through the module."""
    from transformer_lens.components import RMSNormPre

    if type(norm) is RMSNormPre and x.dtype in (torch.float32, torch.float64):
        ss = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_()
        return x * ss.div_(x.shape[-1]).add_(norm.eps).rsqrt_()
    return norm(x)


def _add_out(resid: torch.Tensor, h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
             post: Any = None) -> torch.Tensor:
    """``resid + post(h @ w + bias)`` with ``w`` ``[in, out]``, in place: in float32/float64
    without a post-norm one ``addmm_`` into the residual (no output buffer, no separate sum;
    the sum is rounded once less, a last-bit difference); otherwise as TransformerLens adds it.
    """
    if post is None and resid.dtype in _FOLDED and h.dtype == resid.dtype:
        resid.view(-1, resid.shape[-1]).addmm_(h.reshape(-1, h.shape[-1]), w)
        return resid if bias is None else resid.add_(bias)
    out = torch.nn.functional.linear(h, w.T, bias)
    if post is not None:
        out = post(out)
    return resid.add_(out) if resid.dtype == out.dtype else resid + out


def _lean_mlp(block: Any, x: torch.Tensor, f: FusedQKV, resid: torch.Tensor) -> torch.Tensor:
    """``resid`` plus :func:`_mlp` of ``x`` without hook points: a gated MLP works in place on
    its own intermediates, adds no all-zero bias, and its down-projection goes through
    :func:`_add_out`."""
    from transformer_lens.components.mlps.gated_mlp import GatedMLP

    mlp = block.mlp
    if type(mlp) is not GatedMLP or mlp.cfg.is_layer_norm_activation():
        out = block.apply_mlp(x)
        return resid.add_(out) if resid.dtype == out.dtype else resid + out
    gate = x @ mlp.W_gate
    hidden = (torch.nn.functional.silu(gate, inplace=True)
              if mlp.act_fn is torch.nn.functional.silu else mlp.act_fn(gate))
    hidden.mul_(x @ mlp.W_in)
    if f.b_in is not None:
        hidden.add_(f.b_in)
    post = block.ln2_post if mlp.cfg.use_normalization_before_and_after else None
    return _add_out(resid, hidden, mlp.W_out, f.b_out, post)


def _lean_block(block: Any, cache: PrefixCache, i: int, resid: torch.Tensor,
                rows: torch.Tensor | None) -> torch.Tensor:
    """Block ``i`` of the hook-free path on the new positions' residual ``resid`` (updated in
    place where it can be); with ``rows`` its MLP runs only at ``rows`` (the last block)."""
    assert cache.fused is not None
    f, past, attn = cache.fused[i], cache.length, block.attn
    key = (i, resid.shape[1])
    if key not in cache.tables:
        cache.tables[key] = _lean_tables(attn, resid.shape[1], cache.values[i])
    t = cache.tables[key]
    x = _lean_norm(block.ln1, resid)
    post = block.ln1_post if block.cfg.use_normalization_before_and_after else None
    if t is None:  # rotary buffers too short: TransformerLens's apply_rotary extends them
        out = _cached_attention(attn, x, cache.keys[i], cache.values[i], past, f)
        out = post(out) if post is not None else out
        resid = resid.add_(out) if resid.dtype == out.dtype else resid + out
    else:
        z = _lean_attention(attn, x, cache.keys[i], f, t)
        resid = _add_out(resid, z, attn.W_O.reshape(z.shape[-1], -1), f.b_O, post)
    if rows is not None:
        resid = resid[torch.arange(resid.shape[0], device=resid.device), rows][:, None]
    return _lean_mlp(block, _lean_norm(block.ln2, resid), f, resid)


def _project_qkv(attn: Any, x: torch.Tensor, qkv: FusedQKV
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q, K, V ``[batch, pos, heads, d_head]`` (views into one matmul's output), Q and K
    normed per head as ``calculate_qkv_matrices`` does when ``use_qk_norm`` (Qwen3)."""
    b, s, _ = x.shape
    d = qkv.weight.shape[0] // (qkv.n_heads + 2 * qkv.n_kv)
    out = torch.nn.functional.linear(x, qkv.weight, qkv.bias)
    q, k, v = out.split([qkv.n_heads * d, qkv.n_kv * d, qkv.n_kv * d], dim=-1)
    q, k, v = q.view(b, s, qkv.n_heads, d), k.view(b, s, qkv.n_kv, d), v.view(b, s, qkv.n_kv, d)
    if attn.cfg.use_qk_norm:
        return attn._apply_qk_norm(q, attn.q_norm), attn._apply_qk_norm(k, attn.k_norm), v
    return q, k, v


def _mlp(block: Any, x: torch.Tensor) -> torch.Tensor:
    """``block.apply_mlp``, every hook firing; a gated MLP runs on its weights in place
    (TransformerLens copies each transposed weight on every call, a real cost when only a few
    positions are new)."""
    from transformer_lens.components.mlps.gated_mlp import GatedMLP

    mlp = block.mlp
    if type(mlp) is not GatedMLP or mlp.cfg.is_layer_norm_activation():
        return block.apply_mlp(x)
    pre = mlp.hook_pre(x @ mlp.W_gate)
    post = mlp.hook_post(mlp.act_fn(pre) * mlp.hook_pre_linear(x @ mlp.W_in) + mlp.b_in)
    out = torch.nn.functional.linear(post, mlp.W_out.T, mlp.b_out)
    if mlp.cfg.use_normalization_before_and_after:
        out = block.ln2_post(out)
    return block.hook_mlp_out(out)


def _fast_suffix(model: Any, cache: PrefixCache, tokens: torch.Tensor,
                 rows: torch.Tensor | None = None) -> torch.Tensor:
    """Final residual of the new positions ``[batch, pos, d_model]``, or with ``rows``
    (``[batch]`` indices into the new positions) only there, ``[batch, d_model]``.

    With no hook attached, the projections use the fused Q/K/V weights, hook points are not
    called and, given ``rows``, the last block's MLP runs only at those rows (nothing after
    the last attention mixes positions). With hooks every hook fires on every new position."""
    reason = nonstock_module(model)
    if reason is not None:
        raise ValueError(f"this fast prefix cache cannot continue the model as it is now "
                         f"({reason}); build a new cache, which uses TransformerLens's own "
                         "cached forward for such a model")
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
        resid = _lean_block(block, cache, i, resid, rows if i == last else None)
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
