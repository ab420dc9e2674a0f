"""Divergence-aware patching: p-values calibrated on natural held-out activations, far-off
activations flagged, effects kept equal to plain patching, an unfitted site is an error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from tl_reward.analysis.patching import activation_patching
from tl_reward.audit.divergence import divergence_patching, fit_divergence
from tl_reward.errors import TLRewardError

WORDS = "love music war hate sky blue yes no sure thanks kind water sleep friendship".split()


def _natural(n: int, seed: int) -> list[tuple[str, str]]:
    rng = np.random.default_rng(seed)
    return [("Tell me something.", " ".join(rng.choice(WORDS, size=rng.integers(3, 9))))
            for _ in range(n)]


@pytest.mark.parametrize("method", ["ledoit_wolf", "pca"])
def test_null_pvalues_uniform_and_far_points_flagged(tiny, method):
    model, _, _ = tiny("llama", 1)
    div = fit_divergence(model, _natural(120, 0), sites=[("resid", 2)], method=method, k=8)
    hook = "blocks.2.hook_resid_pre"
    # fresh natural inputs (never used in the fit or the reference), drawn the way the
    # reference was (a real token other than position 0); a random sample of their tokens
    fresh = model.make_batch(_natural(150, 1))
    _, cache = model.run_with_cache(fresh.tokens, attention_mask=fresh.attention_mask,
                                    return_type=None, names_filter=lambda n: n == hook)
    mask = fresh.attention_mask.bool()
    mask[:, 0] = False
    pool = cache[hook][mask]
    pick = torch.randperm(len(pool), generator=torch.Generator().manual_seed(0))[:200]
    acts = pool[pick]
    p = div.p_value(hook, acts)
    # KS against U(0, 1): a fixed "distance > 2" rule or a fit on the same data would fail
    assert stats.kstest(p, "uniform").pvalue > 0.01
    assert 0.0 <= float(np.mean(p < 0.05)) <= 0.12
    if method == "ledoit_wolf":
        # the published fixed threshold (distance > 2) calls nearly every natural activation
        # divergent in 64 dimensions (distances are about sqrt(d))
        assert float(np.mean(div.distance(hook, acts) > 2)) > 0.9
    # the same activations pushed far out along a random direction are flagged
    far = acts + 20 * torch.randn(acts.shape, generator=torch.Generator().manual_seed(0))
    assert float(np.mean(div.p_value(hook, far) < 0.05)) > 0.9


def test_divergence_patching_keeps_effects_and_matches_direct_pvalues(tiny):
    model, _, _ = tiny("llama", 1)
    div = fit_divergence(model, _natural(60, 2), sites=[("resid", 1), ("head", 1)])
    pair = ("Tell me something.", "love music sky", "war hate no no")
    res = divergence_patching(model, pair, div, site="resid", layers=[1])
    plain = activation_patching(model, pair, site="resid", layers=[1])
    torch.testing.assert_close(res.patching.effect, plain.effect)  # flagged, never dropped
    assert res.p_value.shape == tuple(plain.effect.shape)
    # direct: chosen's own activation at each aligned chosen row
    from tl_reward.data.pairs import as_tokenized_pair

    tp = as_tokenized_pair(model, pair)
    _, cache = model.run_with_cache(tp.tokens("chosen"), return_type=None)
    act = cache["blocks.1.hook_resid_pre"][0, tp.aligned[:, 0]]
    np.testing.assert_allclose(res.p_value[0], div.p_value("blocks.1.hook_resid_pre", act))
    df = res.to_dataframe()
    assert {"distance", "p_value", "off_distribution"} <= set(df.columns)
    assert (df.off_distribution == (df.p_value < 0.05)).all()
    heads = divergence_patching(model, pair, div, site="head", layers=[1], positions="all")
    assert heads.p_value.shape == tuple(heads.patching.effect.shape)
    assert (heads.p_value > 0).all() and (heads.p_value <= 1).all()


def test_unfitted_site_is_an_error(tiny):
    model, _, _ = tiny("llama", 1)
    div = fit_divergence(model, _natural(10, 3), sites=[("resid", 1)])
    with pytest.raises(TLRewardError, match="was not fitted"):
        divergence_patching(model, ("Hi.", "love", "war"), div, site="resid", layers=[2])
    with pytest.raises(TLRewardError, match="was not fitted"):
        div.p_value("blocks.0.hook_resid_pre", torch.zeros(1, model.cfg.d_model))
