"""The hook-free continuation path's own pieces against TransformerLens's.

The end-to-end checks (lean path = naive scoring on every architecture, bf16 within one
rounding) are in test_sweep.py and analysis/test_dtype_device.py; the tiny models there all
rotate GPT-NeoX halves over the whole head, so the other rotary layouts are checked here
against ``Attention.apply_rotary`` directly.
"""

from __future__ import annotations

import pytest
import torch
from transformer_lens import HookedTransformerConfig
from transformer_lens.components import Attention

from tl_reward.tl_backend.continuation import _lean_tables, _rotate_into, _swapped


def rotary_attention(adjacent: bool, rotary_dim: int, dtype: torch.dtype) -> Attention:
    cfg = HookedTransformerConfig(n_layers=1, d_model=32, n_heads=4, d_head=16, n_ctx=64,
                                  d_vocab=50, act_fn="silu", positional_embedding_type="rotary",
                                  rotary_dim=rotary_dim, rotary_adjacent_pairs=adjacent,
                                  n_key_value_heads=2, dtype=dtype)
    return Attention(cfg)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim", [16, 8])
@pytest.mark.parametrize("adjacent", [False, True])
def test_rotation_equals_apply_rotary(adjacent: bool, rotary_dim: int, dtype: torch.dtype
                                      ) -> None:
    """Keys: the lean rotation equals ``apply_rotary`` (bit for bit in bf16, where both round
    the same products and sum; float32 fuses the multiply-add: last-bit differences). Queries
    carry ``1 / attn_scale`` in float32 (folded into the tables) and not in bf16."""
    attn = rotary_attention(adjacent, rotary_dim, dtype)
    b, s, past, n_kv, g, d = 5, 3, 11, 2, 2, 16
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(b, s, n_kv * g, d, generator=gen).to(dtype)
    ref = attn.apply_rotary(x, past)
    assert (ref - x).abs().max() > 0.1  # positions 11-13 rotate visibly
    t = _lean_tables(attn, s, torch.zeros(n_kv, past, d, dtype=dtype))
    assert t is not None and t.folded == (dtype == torch.float32)
    # keys: layout [kv head, batch, pos, d_head]
    k = _rotate_into(x.permute(2, 0, 1, 3), t.cos, t.sin, 1.0, attn).permute(1, 2, 0, 3)
    # queries: layout [kv head, batch, pos, group, d_head]
    q = _rotate_into(x.view(b, s, n_kv, g, d).permute(2, 0, 1, 3, 4), t.cos_q, t.sin_q,
                     t.q_scale, attn).permute(1, 2, 0, 3, 4).reshape(b, s, n_kv * g, d)
    if dtype == torch.bfloat16:
        assert torch.equal(k, ref) and torch.equal(q, ref)
    else:
        torch.testing.assert_close(k, ref, atol=4e-6, rtol=0)
        torch.testing.assert_close(q, ref / attn.attn_scale, atol=2e-6, rtol=0)
    # the check tells the two pair layouts apart: the other layout's swap is far off
    wrong = _swapped(x, rotary_dim, not adjacent)
    assert (wrong - _swapped(x, rotary_dim, adjacent)).abs().max() > 0.1


def test_short_rotary_buffers_fall_back_to_apply_rotary() -> None:
    """Where the rotary buffers end before the new positions, there are no lean tables and the
    caller uses TransformerLens's ``apply_rotary`` (which extends them)."""
    attn = rotary_attention(False, 16, torch.float32)
    rows = attn.rotary_cos.shape[0]
    assert _lean_tables(attn, 3, torch.zeros(2, rows - 3, 16)) is not None
    assert _lean_tables(attn, 3, torch.zeros(2, rows - 2, 16)) is None


def test_lean_path_with_short_rotary_buffers_equals_naive(tiny) -> None:
    """End to end: a layer whose rotary buffers end inside the new positions takes the
    fallback (no tables, ``apply_rotary`` extends the buffers) and scores equal naive ones."""
    from tl_reward import tl_backend
    from tl_reward.model.response_template import response_template
    from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, candidate_ids, score_candidates

    model, _, tok = tiny("llama")
    template = response_template(tok, PAPER_PROMPTS["best"])
    ids = torch.tensor(candidate_ids(model)[::9])
    seqs = torch.tensor([template.ids(int(v)) for v in ids])
    with torch.no_grad():
        naive = model(seqs, attention_mask=torch.ones_like(seqs), return_type="score")
    cache = tl_backend.build_prefix_cache(model, torch.tensor(template.prefix), "fast")
    attn = model.blocks[1].attn
    n = cache.length + 1  # the candidate's position is covered, the suffix's are not
    attn.rotary_cos, attn.rotary_sin = attn.rotary_cos[:n].clone(), attn.rotary_sin[:n].clone()
    _, score = score_candidates(model, template, ids, cache)
    s = 1 + len(template.suffix)
    assert cache.tables[(1, s)] is None and cache.tables[(0, s)] is not None
    assert attn.rotary_cos.shape[0] > n  # apply_rotary extended them
    torch.testing.assert_close(score, naive, atol=1e-4, rtol=0)
