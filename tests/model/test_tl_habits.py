"""TransformerLens habits land on the reward (issue 19, items 5-7 and 9): a user coming from
GPT-2 gets the reward ``model.rewards`` gives (itself checked against HF's forward in
``test_parity``), or a clear error, never a silent wrong number."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import CONVERSATIONS, hf_rewards
from transformer_lens import utils as tl_utils

from tl_reward.errors import TLRewardError

PAIRS = [("Is the sky blue?", "Yes."), ("hi", "Hello! How can I help you today?")]
TOL = 1e-5  # float32, rewards of order 1, same kernels: differences are reduction order only


@pytest.fixture(scope="module")
def llama(tiny: Any) -> Any:
    return tiny("llama")


def test_forward_on_pairs_and_conversations_templates_them(llama: Any) -> None:
    """``model([pair])`` tokenised the pair as plain text (2.0136 vs 1.0408)."""
    model, hf, _ = llama
    want = model.rewards(PAIRS).rewards
    batch = model.build(PAIRS)
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"]
    torch.testing.assert_close(want, ref, atol=TOL, rtol=0)
    with torch.no_grad():
        got = model(PAIRS, return_type="reward")
        one = model(CONVERSATIONS[2], return_type="reward")
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    torch.testing.assert_close(one[0], model.rewards(CONVERSATIONS[2]).rewards[0], atol=TOL,
                               rtol=0)
    plain = model.tokenizer(f"{PAIRS[0][0]} {PAIRS[0][1]}", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        as_text = model(plain, return_type="reward")[0]
    assert (as_text - want[0]).abs().max() > 100 * TOL  # the template matters here


def test_last_position_of_to_tokens_is_the_reward(llama: Any) -> None:
    """Right padding made ``logits[:, -1]`` read a pad (1.0125 vs 1.0408); left padding without
    a mask attended to pads (1.1326)."""
    model, _, _ = llama
    want = model.rewards(PAIRS).rewards
    tokens = model.to_tokens(PAIRS)
    assert (tokens[:, 0] == model.pad_token_id).any()  # a padded batch, padded on the left
    with torch.no_grad():
        logits = model(tokens)  # no mask: leading pads are left padding
        reward = model(tokens, return_type="reward")
    torch.testing.assert_close(logits[:, -1].float(), want, atol=TOL, rtol=0)
    torch.testing.assert_close(reward, want, atol=TOL, rtol=0)
    right = model.build(PAIRS, padding_side="right").tokens
    with torch.no_grad():
        at_pad = model(right)[:, -1]
    assert (at_pad.float() - want).abs().max() > 100 * TOL  # the habit the rule protects


def test_to_str_tokens_of_a_conversation(llama: Any) -> None:
    model, _, tok = llama
    ids = model.encode(CONVERSATIONS[0]).ids
    strs = model.to_str_tokens(CONVERSATIONS[0])
    assert strs == [tok.decode([t]) for t in ids]
    assert "".join(strs) == tok.decode(ids)
    assert model.to_str_tokens(PAIRS)[1] == [tok.decode([t]) for t in model.encode(PAIRS[1]).ids]


@pytest.mark.parametrize(("call", "match"), [
    (lambda m: m.generate("Hello", max_new_tokens=3), "cannot generate"),
    (lambda m: m.loss_fn(torch.zeros(1, 2, 1), torch.zeros(1, 2, dtype=torch.long)),
     "no language-modelling loss"),
    (lambda m: m.tokens_to_residual_directions(" Paris"), "reward_direction"),
    (lambda m: tl_utils.test_prompt("Is the sky", "blue", m, print_details=False),
     "test_prompt"),
])
def test_lm_only_methods_say_why(llama: Any, call: Any, match: str) -> None:
    """``generate`` returned the prompt padded with token 0; the others raised IndexError."""
    with pytest.raises(TLRewardError, match=match):
        call(llama[0])
