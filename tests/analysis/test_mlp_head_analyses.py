"""Linear analyses on a nonlinear (INF-ORM MLP) head read the local linearisation at the pooled
input: DRA components + bias sum to the reference's reward, the lens ends at the reward, and
attribution patching is the limit of finite differences."""

from __future__ import annotations

import torch
from helpers import hf_rewards

from tl_reward import HookedRewardModel
from tl_reward.analysis.attribution import direct_reward_attribution
from tl_reward.analysis.attribution_patching import attribution_patching
from tl_reward.analysis.lens import reward_lens
from tl_reward.analysis.patching import activation_patching
from tl_reward.data import PreferencePair
from tl_reward.testing import tiny_hf_reward_model

INPUTS = [("Is the sky blue?", "Yes, the sky is blue on a clear day."), ("hi", "No.")]
PAIR = PreferencePair.from_prompt("Is the sky blue?", "Yes, the sky is blue.", "No, it is red.")
TOL = 1e-4  # float32, rewards of order 1


def test_components_and_bias_sum_to_reference_reward(tiny) -> None:
    model, hf, _ = tiny("inform", 1)
    dra = direct_reward_attribution(model, INPUTS, neurons=True)
    batch = model.make_batch(INPUTS)
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"]
    torch.testing.assert_close(dra.total(), ref, atol=TOL, rtol=0)
    # the bias term is the input-dependent w2 . D(x) b1 + b2, not the head's b2 alone
    b2 = float(hf.score[2].bias.detach()[0])
    assert (dra.bias[:, 0] - b2).abs().min() > 1e-3
    assert (dra.bias[0, 0] - dra.bias[1, 0]).abs() > 1e-3


def test_lens_last_layer_is_the_reward(tiny) -> None:
    model, hf, _ = tiny("inform", 1)
    lens = reward_lens(model, INPUTS)
    batch = model.make_batch(INPUTS)
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"]
    assert set(lens.values) == {"frozen", "recompute", "head"}
    for convention, values in lens.values.items():
        torch.testing.assert_close(values[:, -1], ref, atol=TOL, rtol=0, msg=convention)
    # frozen increments are the blocks' direct contributions (sum = reward - embed - bias)
    # and the recomputed head differs from the frozen linearisation on early layers
    assert (lens.values["head"][:, 1] - lens.values["recompute"][:, 1]).abs().max() > 1e-3


def test_attribution_patching_converges_to_finite_differences() -> None:
    hf, tok = tiny_hf_reward_model("inform", 1)
    model = HookedRewardModel.from_pretrained(hf_model=hf.double(), tokenizer=tok, device="cpu",
                                              dtype=torch.float64)
    ap = attribution_patching(model, PAIR)
    estimate = ap.resid["denoising"]
    errs = []
    for eps in (1e-2, 1e-3):
        fd = activation_patching(model, PAIR, "resid", "denoising", positions="each",
                                 fraction=eps).effect / eps
        errs.append(float((fd - estimate).abs().max()))
    scale = max(1.0, float(estimate.abs().max()))
    assert errs[1] < 0.3 * errs[0], errs  # O(eps) convergence
    assert errs[1] < 1e-2 * scale, errs


def test_vocabulary_sweep_reads_the_exact_head(tiny) -> None:
    from tl_reward.model.response_template import response_template
    from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, candidate_ids, score_vocabulary

    model, _, tok = tiny("inform", 1)
    ids = candidate_ids(model)[::7]
    template = response_template(tok, PAPER_PROMPTS["best"])
    seqs = torch.tensor([template.ids(v) for v in ids])
    with torch.no_grad():
        naive = model(seqs, attention_mask=torch.ones_like(seqs), return_type="score")
    assert naive.std() > 1e-3
    sweep = score_vocabulary(model, PAPER_PROMPTS["best"], ids, cache="fast", progress=False)
    torch.testing.assert_close(sweep.values(sweep.labels[0]), naive, atol=TOL, rtol=0)
