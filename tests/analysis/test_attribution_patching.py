"""Attribution patching is the limit of finite differences: patching a fraction eps of the way,
divided by eps, converges to the estimate (error shrinking linearly in eps)."""

from __future__ import annotations

import pytest
import torch

from tl_reward import HookedRewardModel
from tl_reward.analysis.attribution_patching import attribution_patching
from tl_reward.analysis.patching import activation_patching
from tl_reward.data import PreferencePair
from tl_reward.testing import tiny_hf_reward_model

PAIR = PreferencePair.from_prompt("Is the sky blue?", "Yes, the sky is blue.", "No, it is red.")


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2", "armorm"])
def test_attribution_patching_converges_to_finite_differences(arch: str) -> None:
    # float64, so that rounding does not mask the O(eps) convergence at small eps
    hf, tok = tiny_hf_reward_model(arch, 3 if arch == "armorm" else 1)
    model = HookedRewardModel.from_pretrained(hf_model=hf.double(), tokenizer=tok, device="cpu",
                                              dtype=torch.float64)
    ap = attribution_patching(model, PAIR)
    checks = [("resid", "denoising", "each", ap.resid["denoising"]),
              ("head", "noising", "all", ap.head["noising"].sum(-1))]
    for site, mode, positions, estimate in checks:
        errs = []
        for eps in (1e-2, 1e-3):
            fd = activation_patching(model, PAIR, site, mode, positions=positions,
                                     fraction=eps).effect / eps
            errs.append(float((fd - estimate).abs().max()))
        scale = max(1.0, float(estimate.abs().max()))
        assert errs[1] < 0.3 * errs[0], (site, errs)  # O(eps): 10x smaller eps, ~10x error
        assert errs[1] < 1e-2 * scale, (site, errs)
    # components view: embeddings, then per layer attention and MLP, summed over positions
    comps, names = ap.components("sublayer", "denoising")
    assert names[:3] == ["embed", "L0.attn", "L0.mlp"]
    torch.testing.assert_close(comps[1], ap.attn_out["denoising"][0].sum())
    assert list(ap.to_dataframe().columns) == ["component", "denoising", "noising"]
