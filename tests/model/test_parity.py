"""Rewards equal the HF model's own forward, for every architecture (float32, within
``parity_atol``: 256 float32 eps per layer times the reward's magnitude, about 1e-4 here)."""

from __future__ import annotations

import pytest
import torch
from helpers import CONVERSATIONS, hf_rewards, parity_atol

from tl_reward import HookedRewardModel
from tl_reward.testing import ARCHITECTURES, save_tiny_reward_model


def tol(model: HookedRewardModel, ref: torch.Tensor) -> float:
    return parity_atol(ref, model.cfg.n_layers)

CASES = [(a, k) for a in ARCHITECTURES for k in ((5,) if a == "armorm" else (1, 3))]


@pytest.mark.parametrize(("arch", "k"), CASES)
def test_right_padded_batch_matches_hf(tiny, arch: str, k: int) -> None:
    model, hf, _ = tiny(arch, k)
    batch = model.make_batch(CONVERSATIONS, padding_side="right")
    assert len(set(batch.lengths.tolist())) > 1  # really padded
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)
    with torch.no_grad():
        ours = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
    assert ours.shape == (3, k)
    assert ref["reward"].abs().max() > 0.05  # rewards are not trivially near zero
    torch.testing.assert_close(ours, ref["reward"], atol=tol(model, ref["reward"]), rtol=0)
    if ref["score"] is not None:
        with torch.no_grad():
            score = model(batch.tokens, attention_mask=batch.attention_mask, return_type="score")
        torch.testing.assert_close(score, ref["score"], atol=tol(model, ref["score"]), rtol=0)


@pytest.mark.parametrize(("arch", "k"), CASES)
def test_left_padding_equals_unpadded_hf(tiny, arch: str, k: int) -> None:
    model, hf, _ = tiny(arch, k)
    left = model.make_batch(CONVERSATIONS, padding_side="left")
    with torch.no_grad():
        ours = model(left.tokens, attention_mask=left.attention_mask, return_type="reward")
    for i, conv in enumerate(CONVERSATIONS):
        single = model.make_batch(conv)
        ref = hf_rewards(hf, single.tokens, single.attention_mask)["reward"][0]
        torch.testing.assert_close(ours[i], ref, atol=tol(model, ref), rtol=0)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2", "armorm"])
def test_rewards_api_is_padding_invariant(tiny, arch: str) -> None:
    model, _, _ = tiny(arch, 5 if arch == "armorm" else 1)
    right = model.rewards(CONVERSATIONS, batch_size=3, padding_side="right")
    left = model.rewards(CONVERSATIONS, batch_size=3, padding_side="left")
    one = model.rewards(CONVERSATIONS, batch_size=1)
    torch.testing.assert_close(right.rewards, one.rewards, atol=tol(model, one.rewards), rtol=0)
    torch.testing.assert_close(left.rewards, one.rewards, atol=tol(model, one.rewards), rtol=0)
    assert right.score is not None
    torch.testing.assert_close(left.score, one.score, atol=tol(model, one.score), rtol=0)


def test_armorm_gating_and_effective_direction(tiny) -> None:
    model, hf, _ = tiny("armorm", 5)
    batch = model.make_batch(CONVERSATIONS)
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)
    res = model.rewards(CONVERSATIONS)
    torch.testing.assert_close(res.gating, ref["gating"], atol=tol(model, ref["gating"]), rtol=0)
    torch.testing.assert_close(res.score, ref["score"], atol=tol(model, ref["score"]), rtol=0)
    # score = w_eff(x) . ln_final(h) + b_eff, with w_eff = W_reg^T T g(x); not the mean of rows
    with torch.no_grad():
        resid = model(batch.tokens, attention_mask=batch.attention_mask,
                      stop_at_layer=model.cfg.n_layers)
        normed = model.ln_final(resid)
        w, b = model.reward_direction("score", normed, batch.tokens)
    pos = model.pool_positions(batch.tokens, batch.attention_mask)
    via_direction = (normed[torch.arange(3), pos] * w).sum(-1) + b
    torch.testing.assert_close(via_direction, ref["score"], atol=tol(model, ref["score"]),
                               rtol=0)
    mean_row = normed[torch.arange(3), pos] @ model.W_U.mean(-1)
    assert (mean_row - ref["score"]).abs().max() > 0.1


@pytest.mark.parametrize(("arch", "k"), [("llama", 1), ("gemma2", 3), ("gpt2", 1), ("armorm", 5)])
def test_saved_and_reloaded_from_disk(tmp_path, arch: str, k: int) -> None:
    path = save_tiny_reward_model(tmp_path / arch, arch, num_labels=k, seed=3)
    model = HookedRewardModel.from_pretrained(str(path), device="cpu",
                                              trust_remote_code=arch == "armorm")
    from transformers import AutoModelForSequenceClassification

    hf = AutoModelForSequenceClassification.from_pretrained(
        path, trust_remote_code=arch == "armorm", attn_implementation="eager"
    ).eval()
    batch = model.make_batch(CONVERSATIONS)
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)
    with torch.no_grad():
        ours = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
    torch.testing.assert_close(ours, ref["reward"], atol=tol(model, ref["reward"]), rtol=0)
    if arch == "armorm":
        assert model.reward_head.temperature == 10
        torch.testing.assert_close(model.rewards(CONVERSATIONS).score, ref["score"],
                                   atol=tol(model, ref["score"]), rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_parity_tolerance_catches_real_bugs(tiny, arch: str) -> None:
    """The tolerance is loose enough for any CPU and still fails a real bug by orders of
    magnitude: the reward read one token early (a pooling bug) or a head that skips the final
    RMSNorm's gain (the gain not folded into W_U)."""
    model, hf, _ = tiny(arch, 1)
    batch = model.make_batch(CONVERSATIONS, padding_side="right")
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"][:, 0]
    with torch.no_grad():
        per_pos, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                              names_filter="ln_final.hook_normalized")
    rows = torch.arange(len(CONVERSATIONS))
    pos = model.pool_positions(batch.tokens, batch.attention_mask)
    atol = tol(model, ref)
    torch.testing.assert_close(per_pos[rows, pos, 0], ref, atol=atol, rtol=0)
    early = per_pos[rows, pos - 1, 0]
    unfolded = cache["ln_final.hook_normalized"][rows, pos] @ hf.score.weight[0]
    assert (early - ref).abs().max() > 100 * atol
    assert (unfolded - ref).abs().max() > 100 * atol
