"""The forward pass of continuation positions after a cached prefix.

Two paths give the same numbers: with hooks attached every hook point fires on the new
positions, as in TransformerLens's own cached forward; with none attached a lean path skips
them, fuses the projections and lays attention out for few new positions against a long
prefix (see :func:`_lean_attention`).
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float, Int

from tl_reward.tl_backend.prefix_cache import (
    FusedQKV,
    PrefixCache,
    expand_stock_cache,
    hooks_active,
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
