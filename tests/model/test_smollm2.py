"""The real SmolLM2-135M backbone: parity with HF, and the demo RM by name."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch
from helpers import CONVERSATIONS, parity_atol

from tl_reward import DEMO_MODEL_NAME, HookedRewardModel

pytestmark = pytest.mark.slow


@cache
def smollm2_seq_cls() -> tuple[Any, Any, HookedRewardModel]:
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    from tl_reward.model.demo import smollm2_local_dir

    path = smollm2_local_dir()
    torch.manual_seed(0)
    hf = LlamaForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
    with torch.no_grad():
        hf.score.weight.normal_(0, 1.0)
    tok = AutoTokenizer.from_pretrained(path)
    hf.config.pad_token_id = tok.pad_token_id
    model = HookedRewardModel.from_pretrained(hf_model=hf.eval(), tokenizer=tok, device="cpu")
    return hf, tok, model


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_smollm2_matches_hf(padding_side: str) -> None:
    hf, _, model = smollm2_seq_cls()
    assert model.cfg.n_ctx == 8192 and model.cfg.n_key_value_heads == 3
    batch = model.make_batch(CONVERSATIONS, padding_side=padding_side)
    with torch.no_grad():
        ours = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")[:, 0]
        if padding_side == "right":
            ref = hf(input_ids=batch.tokens, attention_mask=batch.attention_mask).logits[:, 0]
        else:  # HF ignores left padding in its positions: compare with unpadded runs
            ref = torch.stack([hf(input_ids=model.make_batch(c).tokens).logits[0, 0]
                               for c in CONVERSATIONS])
    assert ref.abs().max() > 0.1
    tol = parity_atol(ref, model.cfg.n_layers)  # ~3e-3 for rewards near 3.5 (see parity_atol)
    torch.testing.assert_close(ours, ref, atol=tol, rtol=0)
    # the tolerance still catches real bugs, by orders of magnitude: reading the reward one token
    # early, or a head that skips the final norm's gain (not folded into W_U)
    with torch.no_grad():
        per_pos, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                              names_filter="ln_final.hook_normalized")
    rows = torch.arange(len(CONVERSATIONS))
    pos = model.pool_positions(batch.tokens, batch.attention_mask)
    early = per_pos[rows, pos - 1, 0]
    unfolded = cache["ln_final.hook_normalized"][rows, pos] @ hf.score.weight[0]
    assert (early - ref).abs().max() > 100 * tol
    assert (unfolded - ref).abs().max() > 100 * tol


def test_demo_reward_model_by_name() -> None:
    from tl_reward.model.demo import HEAD_FILE, demo_hf_reward_model, load_demo_head

    if not HEAD_FILE.exists():
        pytest.skip("demo head not trained yet")
    model = HookedRewardModel.from_pretrained(DEMO_MODEL_NAME, device="cpu")
    weight, meta = load_demo_head()
    assert weight.shape == (1, model.cfg.d_model)
    assert 0.55 < float(meta["heldout_accuracy"]) < 0.8
    hf, _ = demo_hf_reward_model()
    batch = model.make_batch(CONVERSATIONS)
    with torch.no_grad():
        ref = hf(input_ids=batch.tokens, attention_mask=batch.attention_mask).logits[:, 0]
    res = model.rewards(CONVERSATIONS)
    torch.testing.assert_close(res.score, ref, atol=parity_atol(ref, model.cfg.n_layers), rtol=0)
