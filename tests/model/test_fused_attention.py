"""Fused attention (:mod:`tl_reward.tl_backend.fused_attention`) against TransformerLens's
materialised attention on the same weights, and against HF's own forward.

Both paths compute the same ``softmax(q k^T / scale) v``; they differ only in rounding, so
the tolerances are the dtype's: float32 to 1e-6 of the rewards' size, float64 to 1e-12,
bfloat16 to a few of its ulps at the rewards' size.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import hf_rewards, needs_hooked_transformer

from tl_reward.testing import CONVERSATIONS, tiny_hf_reward_model
from tl_reward.testing.tiny import ARCHITECTURES, CUSTOM_ARCHITECTURES

pytestmark = needs_hooked_transformer

FAMILIES = list(ARCHITECTURES + CUSTOM_ARCHITECTURES)


@cache
def _model(family: str, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    from tl_reward import HookedRewardModel

    hf, tok = tiny_hf_reward_model(family)
    hf = hf.eval().to(dtype)
    kw = {"lm_head_rows": [0]} if family == "nemotron" else {}
    return HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                             dtype=dtype, **kw), hf


def _both(model: Any, fn: Any) -> tuple[Any, Any]:
    """``fn()`` fused, then materialised (the switch restored)."""
    try:
        model.fused_attention = True
        a = fn()
        model.fused_attention = False
        return a, fn()
    finally:
        model.fused_attention = True


def _sdpa_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts calls of the fused kernel from here on."""
    calls: list[int] = []
    real = F.scaled_dot_product_attention

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("side", ["right", "left"])
def test_fused_equals_materialised_and_hf(family: str, side: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-position outputs of every layer's fused attention equal the materialised ones, and
    the pooled rewards equal HF's forward, on padded batches of either side."""
    model, hf = _model(family)
    batch = model.build(CONVERSATIONS[:3], padding_side=side)
    assert (batch.attention_mask == 0).any()  # the batch is padded
    calls = _sdpa_calls(monkeypatch)
    with torch.no_grad():
        fused, mat = _both(model, lambda: model(batch.tokens, attention_mask=batch.attention_mask))
        rewards = model.pooled_outputs(batch.tokens, batch.attention_mask)[0]
    n_fused = sum(1 for b in model.blocks if b.attn.fused and "Fused" in type(b.attn).__name__)
    expect = 0 if family == "gemma2" else model.cfg.n_layers  # Gemma-2 soft-caps its scores
    assert n_fused == model.cfg.n_layers and len(calls) == 2 * expect
    scale = float(mat.abs().max())
    real = batch.attention_mask.bool()
    torch.testing.assert_close(fused[real], mat[real], atol=1e-6 * scale, rtol=0)
    if side == "right" and family != "nemotron":  # HF's own padding; Nemotron reads an LM row
        with torch.no_grad():
            out = hf(input_ids=batch.tokens, attention_mask=batch.attention_mask)
        want = (out.rewards if hasattr(out, "rewards") else out.logits).float()  # ArmoRM: K
        torch.testing.assert_close(rewards, want.reshape(rewards.shape), atol=1e-5 * scale,
                                   rtol=0)


def test_float64_and_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    """float64: the two paths agree to 1e-12; bfloat16 on CPU: fused is within bf16 rounding
    (a few ulps of the rewards' size) of the materialised path and of HF's own bf16 forward.
    (HF's float64 forward keeps its rotary angles in float32: not a float64 reference.)"""
    for dtype, tol in [(torch.float64, 1e-12), (torch.bfloat16, 2 ** -7 * 4)]:
        model, hf = _model("llama", dtype)
        batch = model.build(CONVERSATIONS[:3], padding_side="right")
        with torch.no_grad():
            fused, mat = _both(model, lambda b=batch, m=model: m.pooled_outputs(
                b.tokens, b.attention_mask)[0])
        want = hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"].float()
        scale = float(want.abs().max())
        torch.testing.assert_close(fused, mat, atol=tol * scale, rtol=0)
        if dtype == torch.bfloat16:
            torch.testing.assert_close(fused, want, atol=tol * scale, rtol=0)


def test_hooking_the_pattern_materialises_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache or hook on ``hook_pattern`` / ``hook_attn_scores`` sees the real pattern (rows
    sum to 1 over real keys, causal) and its edits change the reward; hooks elsewhere keep the
    fused kernel and see the same ``hook_z`` as the materialised path."""
    model, _ = _model("llama")
    batch = model.build(CONVERSATIONS[:2], padding_side="left")
    toks, mask = batch.tokens, batch.attention_mask
    calls = _sdpa_calls(monkeypatch)
    with torch.no_grad():
        base = model(toks, attention_mask=mask)
        _, cache_ = model.run_with_cache(toks, attention_mask=mask,
                                         names_filter=lambda n: n.endswith("hook_pattern"))
        assert calls == [1] * model.cfg.n_layers  # only the plain forward fused
        pattern = cache_["pattern", 0]
        real_q = mask.bool()[:, None, :, None]
        sums = pattern.sum(-1, keepdim=True)
        torch.testing.assert_close(sums[real_q.expand_as(sums)],
                                   torch.ones_like(sums[real_q.expand_as(sums)]))
        assert (pattern.triu(1) == 0).all()

        def flatten(p: torch.Tensor, hook: Any) -> torch.Tensor:
            return torch.where(p > 0, torch.ones_like(p), p) / (p > 0).sum(-1, keepdim=True
                                                                           ).clamp(min=1)

        edited = model.run_with_hooks(toks, attention_mask=mask,
                                      fwd_hooks=[("blocks.1.attn.hook_pattern", flatten)])
        assert (edited - base).abs().max() > 1e-3
        calls.clear()
        _, zs = _both(model, lambda: model.run_with_cache(
            toks, attention_mask=mask, names_filter=lambda n: n.endswith("hook_z"))[1])
    assert len(calls) == model.cfg.n_layers  # the fused half of _both
    fz = model.run_with_cache(toks, attention_mask=mask,
                              names_filter=lambda n: n.endswith("hook_z"))[1]
    for name in zs:
        torch.testing.assert_close(fz[name], zs[name], atol=1e-5 * float(zs[name].abs().max()),
                                   rtol=0)


def test_gradients_equal_through_left_padding() -> None:
    """The gradient of the real positions' summed outputs at every ``hook_resid_pre`` (what
    EAP reads) is the same on both paths and finite, left pads included."""
    model, _ = _model("qwen2")
    batch = model.build(CONVERSATIONS[:3], padding_side="left")

    def grads() -> dict[str, torch.Tensor]:
        store: dict[str, torch.Tensor] = {}

        def keep(t: torch.Tensor, hook: Any) -> None:
            t.register_hook(lambda g: store.__setitem__(hook.name, g))

        with model.hooks(fwd_hooks=[(lambda n: n.endswith("hook_resid_pre"), keep)]):
            out = model(batch.tokens, attention_mask=batch.attention_mask)
            out[batch.attention_mask.bool()].sum().backward()
        return store

    fused, mat = _both(model, grads)
    assert set(fused) == set(mat) and len(fused) == model.cfg.n_layers
    for name in fused:
        assert fused[name].isfinite().all()
        scale = float(mat[name].abs().max())
        torch.testing.assert_close(fused[name], mat[name], atol=1e-5 * scale, rtol=0)


def test_unsupported_calls_say_why() -> None:
    """What the fused path cannot reproduce runs TransformerLens's own forward."""
    from tl_reward.tl_backend.fused_attention import fused_unsupported

    gemma, _ = _model("gemma2")
    assert fused_unsupported(gemma.blocks[0].attn) == "soft-capped scores"
    model, _ = _model("llama")
    attn = model.blocks[0].attn
    assert fused_unsupported(attn) is None
    attn.hook_attn_scores.add_hook(lambda t, hook: t)
    assert fused_unsupported(attn) == "a hook needs the attention scores or pattern"
    model.reset_hooks()
    assert fused_unsupported(attn) is None
    model.fused_attention = False
    assert fused_unsupported(attn) == "fused attention is off" and not model.fused_attention
    model.fused_attention = True
    assert fused_unsupported(attn, past_kv_cache_entry=object()) == "a key-value cache"



def test_a_changed_attention_scale_is_followed() -> None:
    """The kernel divides by the module's own ``attn_scale`` (Gemma's and Mistral-era
    configurations set it apart from sqrt(d_head)), as the materialised scores do."""
    model, _ = _model("llama", torch.float64)
    batch = model.build(CONVERSATIONS[:2])
    try:
        for block in model.blocks:
            block.attn.attn_scale = block.attn.attn_scale * 0.37
        with torch.no_grad():
            fused, mat = _both(model, lambda: model(batch.tokens,
                                                    attention_mask=batch.attention_mask))
    finally:
        for block in model.blocks:
            block.attn.attn_scale = block.attn.attn_scale / 0.37
    torch.testing.assert_close(fused, mat, atol=1e-12 * float(mat.abs().max()), rtol=0)


def test_bfloat16_fused_is_as_close_to_float32_as_materialised() -> None:
    """On 120 template sequences, the bf16 rewards' mean distance from the same weights in
    float32 is no more than twice the materialised path's (measured on llama: 0.0091 against
    0.0062 of the reward scale; mistral 0.0074 against 0.0064), and so is the vocabulary
    sweep's default (its prefix run fused). A kernel that dropped a
    rounding-sensitive step (a scale applied twice in bf16, keys not rotated) is 10x off."""
    from tl_reward.model.response_template import response_template
    from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, candidate_ids, score_vocabulary

    exact, _ = _model("llama")
    low, _ = _model("llama", torch.bfloat16)
    template = response_template(low.tokenizer, PAPER_PROMPTS["best"])
    seqs = torch.tensor([template.ids(v) for v in candidate_ids(low)[:120]])
    mask = torch.ones_like(seqs)
    with torch.no_grad():
        want = exact(seqs, attention_mask=mask, return_type="score")
        fused, mat = _both(low, lambda: low(seqs, attention_mask=mask, return_type="score"))
        # the vocabulary sweep's default: the prefix run fused, the continuation's lean path
        swept = score_vocabulary(low, {"b": PAPER_PROMPTS["best"]}, candidate_ids(low)[:120],
                                 batch_size=64, progress=False).values()
    err = [float((x.float().flatten() - want).abs().mean() / want.abs().max())
           for x in (fused, mat, swept)]
    assert max(err[0], err[2]) <= 2 * err[1] and err[0] < 4 * 2 ** -8, err


@pytest.mark.parametrize("family", ["llama", "mistral", "gpt2"])
def test_without_an_attention_mask(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unpadded batch given no mask takes the kernel's causal path (Mistral's sliding
    window an explicit mask) and equals the materialised path in float64 to 1e-12."""
    model, _ = _model(family, torch.float64)
    tokens = model.build(CONVERSATIONS[:1]).tokens.repeat(2, 1)
    calls = _sdpa_calls(monkeypatch)
    with torch.no_grad():
        fused, mat = _both(model, lambda: model(tokens))
    assert len(calls) == model.cfg.n_layers
    torch.testing.assert_close(fused, mat, atol=1e-12 * float(mat.abs().max()), rtol=0)
