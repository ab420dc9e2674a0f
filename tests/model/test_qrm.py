"""QRM (gated quantile heads): exact against the published-structure reference loaded from disk
with its custom code, both paddings; the quantile expectation and gate are what the score uses.

Tolerance: 1e-4 absolute, float32, rewards of order 1 (measured ~5e-7).
"""

from __future__ import annotations

import torch
from helpers import CONVERSATIONS

from tl_reward import HookedRewardModel
from tl_reward.testing import save_tiny_reward_model

TOL = 1e-4


def test_qrm_from_disk_matches_reference(tmp_path) -> None:
    from transformers import AutoModelForSequenceClassification

    path = save_tiny_reward_model(tmp_path / "qrm", "qrm", num_labels=4, seed=3)
    model = HookedRewardModel.from_pretrained(str(path), device="cpu", trust_remote_code=True)
    hf = AutoModelForSequenceClassification.from_pretrained(
        path, trust_remote_code=True, attn_implementation="eager").eval()
    assert type(hf).__name__ == "LlamaForRewardModelWithGating31"
    for side in ("right", "left"):
        res = model.rewards(CONVERSATIONS, batch_size=3, padding_side=side)
        for i, conv in enumerate(CONVERSATIONS):  # unpadded reference rows
            one = model.make_batch(conv)
            with torch.no_grad():
                ref = hf(input_ids=one.tokens, attention_mask=one.attention_mask)
            torch.testing.assert_close(res.rewards[i], ref.rewards[0], atol=TOL, rtol=0)
            torch.testing.assert_close(res.score[i], ref.score[0, 0], atol=TOL, rtol=0)
            torch.testing.assert_close(res.gating[i], ref.gating_output[0], atol=TOL, rtol=0)
    assert res.gating.std(0).max() > 1e-3  # the gate depends on the prompt
    # the check can fail: the first quantile instead of the expectation, or ignoring T, is off
    batch = model.make_batch(CONVERSATIONS)
    with torch.no_grad():
        ref = hf(input_ids=batch.tokens, attention_mask=batch.attention_mask)
        normed = model.ln_final(model(batch.tokens, attention_mask=batch.attention_mask,
                                      stop_at_layer=model.cfg.n_layers))
    pos = model.pool_positions(batch.tokens, batch.attention_mask)
    x = normed[torch.arange(3), pos]
    gain = hf.model.norm.weight.detach()
    q = hf.regression_layer.weight.detach().reshape(4, 4, -1)
    first_quantile = x @ (q[:, 0] * gain).T @ hf.reward_transform_matrix.detach()
    no_transform = x @ (q.mean(1) * gain).T
    assert (first_quantile - ref.rewards).abs().max() > 100 * TOL
    assert (no_transform - ref.rewards).abs().max() > 100 * TOL
    # score = w_eff(x) . x with w_eff = W_U g(x)
    w, b = model.reward_direction("score", normed, batch.tokens)
    torch.testing.assert_close((w * x).sum(-1) + b, ref.score[:, 0], atol=TOL, rtol=0)


def test_qrm_in_bfloat16_matches_its_reference_in_bfloat16() -> None:
    """A bf16 QRM is read in float32 (the gate's layers in bf16): the float32 readout met the
    bf16 gate's first Linear and raised a dtype error. Reference: the published-structure
    module in bf16, unpadded rows; tolerance a few bf16 roundings of rewards of order 1."""
    from tl_reward.testing import tiny_hf_reward_model

    hf, tok = tiny_hf_reward_model("qrm", num_labels=4, seed=3)
    hf = hf.to(torch.bfloat16).eval()
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                              dtype=torch.bfloat16, trust_remote_code=True)
    res = model.rewards(CONVERSATIONS)
    assert res.score.dtype == torch.float32
    for i, conv in enumerate(CONVERSATIONS):
        one = model.make_batch(conv)
        with torch.no_grad():
            ref = hf(input_ids=one.tokens, attention_mask=one.attention_mask)
        torch.testing.assert_close(res.score[i], ref.score[0, 0].float(), atol=0.05, rtol=0)
        torch.testing.assert_close(res.gating[i], ref.gating_output[0].float(), atol=0.02,
                                   rtol=0)
