"""LM-head readouts (Llama-3.1-Nemotron-70B-Reward-HF style): ``lm_head_rows=`` loads a causal
LM whose reward is rows of its LM head at the last real token; exact against HF's own logits.

Tolerance: 1e-4 absolute, float32, logits of order 1 (measured differences ~1e-6).
"""

from __future__ import annotations

import pytest
import torch
from helpers import CONVERSATIONS

from tl_reward import HookedRewardModel
from tl_reward.errors import TLRewardError, UnsupportedArchitectureError
from tl_reward.testing import save_tiny_reward_model, tiny_hf_reward_model

TOL = 1e-4


def hf_last_token_logits(hf, tokens, mask, rows):
    """The causal LM's logits at the last real token (by the attention mask), ``rows`` only."""
    with torch.no_grad():
        logits = hf(input_ids=tokens, attention_mask=mask).logits
    last = (torch.arange(tokens.shape[1]) * mask).argmax(-1)
    return logits[torch.arange(tokens.shape[0]), last][:, rows]


@pytest.mark.parametrize("rows", [[0], [0, 7]])
def test_lm_head_rows_from_disk_match_causal_lm(tmp_path, rows) -> None:
    from transformers import AutoModelForCausalLM

    path = save_tiny_reward_model(tmp_path / "nemo", "nemotron", seed=2)
    model = HookedRewardModel.from_pretrained(str(path), device="cpu", lm_head_rows=rows)
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    assert model.cfg.d_vocab_out == len(rows)
    assert model.objectives == (["reward"] if len(rows) == 1 else ["lm_head_row_0",
                                                                   "lm_head_row_7"])
    for side in ("right", "left"):
        batch = model.make_batch(CONVERSATIONS, padding_side=side)
        with torch.no_grad():
            ours = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
        for i, conv in enumerate(CONVERSATIONS):  # unpadded HF: the ground truth per row
            one = model.make_batch(conv)
            ref = hf_last_token_logits(hf, one.tokens, one.attention_mask, rows)[0]
            assert ref.abs().max() > 0.05
            torch.testing.assert_close(ours[i], ref, atol=TOL, rtol=0)
    # the check can fail: a neighbouring row is a different reward
    wrong = [r + 1 for r in rows]
    batch = model.make_batch(CONVERSATIONS)
    ref_wrong = hf_last_token_logits(hf, batch.tokens, batch.attention_mask, wrong)
    with torch.no_grad():
        ours = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
    assert (ours - ref_wrong).abs().max() > 100 * TOL


def test_lm_head_rows_errors() -> None:
    hf, tok = tiny_hf_reward_model("nemotron")
    with pytest.raises(TLRewardError, match="lm_head_rows"):
        HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                          lm_head_rows=[10**6])
    seq, tok = tiny_hf_reward_model("llama")
    with pytest.raises(UnsupportedArchitectureError, match="CausalLM"):
        HookedRewardModel.from_pretrained(hf_model=seq, tokenizer=tok, device="cpu",
                                          lm_head_rows=[0])
