"""Streamed loading: an HF model the loader owns has each block's weights freed once converted
(the result is unchanged); a model the user passed in is left intact."""

from __future__ import annotations

import copy

import torch
from helpers import CONVERSATIONS, hf_rewards

from tl_reward import HookedRewardModel
from tl_reward.model.loading import from_hf_model
from tl_reward.testing import tiny_hf_reward_model


def test_owned_hf_weights_are_released_and_rewards_unchanged() -> None:
    hf, tok = tiny_hf_reward_model("qwen3", seed=1)
    reference = copy.deepcopy(hf)
    model = from_hf_model(HookedRewardModel, hf, tok, device="cpu", release_hf=True)
    assert all(p.numel() == 0 for p in hf.model.layers.parameters())  # freed block by block
    assert hf.score.weight.numel() > 0  # the head and embeddings are not block weights
    batch = model.make_batch(CONVERSATIONS)
    with torch.no_grad():
        ours = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
    ref = hf_rewards(reference, batch.tokens, batch.attention_mask)["reward"]
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)


def test_user_hf_model_is_left_intact() -> None:
    hf, tok = tiny_hf_reward_model("llama", seed=1)
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
    after = hf.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
