"""INF-ORM-style MLP head: exact against the published-structure reference, loaded from disk
with its custom code; hooks see the hidden layer; the linearisation is at the pooled input.

Tolerance: 1e-4 absolute on float32 rewards of order 1 (we differ from HF only in summation
order; measured ~5e-7).
"""

from __future__ import annotations

import pytest
import torch
from helpers import CONVERSATIONS, hf_rewards

from tl_reward import HookedRewardModel
from tl_reward.errors import TLRewardError
from tl_reward.testing import save_tiny_reward_model

TOL = 1e-4


@pytest.fixture(scope="module")
def inform(tmp_path_factory):
    from transformers import AutoModelForSequenceClassification

    out = {}
    for k in (1, 2):
        path = save_tiny_reward_model(tmp_path_factory.mktemp("inform") / f"k{k}", "inform",
                                      num_labels=k, seed=3)
        model = HookedRewardModel.from_pretrained(str(path), device="cpu",
                                                  trust_remote_code=True)
        hf = AutoModelForSequenceClassification.from_pretrained(
            path, trust_remote_code=True, attn_implementation="eager").eval()
        out[k] = (model, hf)
    return out


@pytest.mark.parametrize("k", [1, 2])
def test_mlp_head_from_disk_matches_reference(inform, k: int) -> None:
    model, hf = inform[k]
    assert type(hf).__name__ == "INFORMForSequenceClassification"
    assert model.pooling == "legacy" and model.reward_head.nonlinear
    for side in ("right", "left"):
        batch = model.make_batch(CONVERSATIONS, padding_side=side)
        with torch.no_grad():
            ours = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
        for i, conv in enumerate(CONVERSATIONS):
            one = model.make_batch(conv)
            ref = hf_rewards(hf, one.tokens, one.attention_mask)["reward"][0]
            torch.testing.assert_close(ours[i], ref, atol=TOL, rtol=0)
    res = model.rewards(CONVERSATIONS, batch_size=3)
    if k == 1:
        batch = model.make_batch(CONVERSATIONS)
        ref = hf_rewards(hf, batch.tokens, batch.attention_mask)
        torch.testing.assert_close(res.score, ref["score"], atol=TOL, rtol=0)
    else:
        assert res.score is None  # two outputs and no published combination


def test_hooks_see_the_hidden_layer(inform) -> None:
    model, hf = inform[1]
    batch = model.make_batch(CONVERSATIONS)
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    pre, post = cache["reward_head.hook_pre"], cache["reward_head.hook_post"]
    assert pre.shape == (*batch.tokens.shape, hf.config.hidden_size)
    with torch.no_grad():  # HF's own hidden layer on its own final hidden states
        h = hf.model(batch.tokens, attention_mask=batch.attention_mask)[0]
        ref_pre = hf.score[0](h)
    real = batch.attention_mask.bool()
    torch.testing.assert_close(pre[real], ref_pre[real], atol=TOL, rtol=0)
    torch.testing.assert_close(post, pre.clamp(min=0))
    # ablating the hidden layer through its hook changes the reward: the hook is on the path
    with torch.no_grad():
        ablated = model.run_with_hooks(
            batch.tokens, attention_mask=batch.attention_mask, return_type="reward",
            fwd_hooks=[("reward_head.hook_post", lambda a, hook: torch.zeros_like(a))])
    bias = hf.score[2].bias.detach()
    torch.testing.assert_close(ablated, bias.expand(3, -1), atol=TOL, rtol=0)


def test_linearisation_is_exact_at_the_pooled_input_only(inform) -> None:
    """``w_eff(x) . x + b_eff(x) = head(x)`` at the pooled input; the plausible bugs (the
    last position of a padded row instead of the pooled one, another row's input, or the
    average over unit patterns i.e. all units on) give wrong rewards."""
    model, hf = inform[1]
    batch = model.make_batch(CONVERSATIONS, padding_side="right")
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)["score"]
    with torch.no_grad():
        normed = model.ln_final(model(batch.tokens, attention_mask=batch.attention_mask,
                                      stop_at_layer=model.cfg.n_layers))
    rows = torch.arange(3)
    pos = model.pool_positions(batch.tokens, batch.attention_mask)
    x = normed[rows, pos]

    def read(positions: torch.Tensor) -> torch.Tensor:
        w, b = model.reward_direction("score", normed, batch.tokens, positions)
        return (w * x).sum(-1) + b

    torch.testing.assert_close(read(pos), ref, atol=TOL, rtol=0)
    with pytest.raises(TLRewardError, match="positions="):  # never a default position
        read(None)
    last = torch.full_like(pos, batch.tokens.shape[1] - 1)
    assert (pos != last).any()  # padded rows: the last position is padding
    assert (read(last) - ref).abs().max() > 100 * TOL
    assert (read(pos.roll(1)) - ref).abs().max() > 100 * TOL  # wrong row's pattern
    w_all_on = model.reward_head.out.weight @ model.reward_head.hidden.weight
    b_all_on = model.reward_head.out.weight @ model.reward_head.hidden.bias \
        + model.reward_head.out.bias
    assert ((x @ w_all_on.T)[:, 0] + b_all_on[0] - ref).abs().max() > 100 * TOL


def test_w_u_is_nan_and_direction_needs_the_input(inform) -> None:
    model, _ = inform[1]
    assert torch.isnan(model.W_U).all()  # a fixed-direction use fails loudly
    with pytest.raises(TLRewardError, match="nonlinear"):
        model.reward_direction("score")


def test_bfloat16_load_is_close_to_float32(inform, tmp_path) -> None:
    path = save_tiny_reward_model(tmp_path / "bf16", "inform", seed=3)
    model32, _ = inform[1]
    model = HookedRewardModel.from_pretrained(str(path), device="cpu", dtype=torch.bfloat16,
                                              trust_remote_code=True)
    batch = model.make_batch(CONVERSATIONS)
    with torch.no_grad():
        r16 = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
        r32 = model32(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
    assert r16.dtype == torch.float32  # read in float32 from bf16 activations
    # bf16 keeps 8 mantissa bits (rel. 2^-8 ~ 4e-3 per op); 3 layers + head on O(1) rewards
    torch.testing.assert_close(r16.float(), r32, atol=0.1, rtol=0)
