"""Divergence-aware patching: p-values calibrated on natural held-out activations, far-off
activations flagged, effects kept equal to plain patching, an unfitted site is an error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from tl_reward.analysis.patching import activation_patching
from tl_reward.audit.covariance import GaussianFit
from tl_reward.audit.divergence import SiteFit, divergence_patching, fit_divergence
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
    # direct: chosen's own activation at each aligned chosen row after row 0 (position 0 is
    # outside the fit and not scored: see the next test)
    from tl_reward.data.pairs import as_tokenized_pair

    tp = as_tokenized_pair(model, pair)
    _, cache = model.run_with_cache(tp.tokens("chosen"), return_type=None)
    act = cache["blocks.1.hook_resid_pre"][0, tp.aligned[1:, 0]]
    dist, pv = res.distance[0, 1:], res.p_value[0, 1:]
    sf = div.site("blocks.1.hook_resid_pre")
    d = sf.fit.distance(act).cpu().numpy()
    # two float32 forwards of the same tokens (the library's masked one and this one) agree to
    # ~256 eps per layer of each activation's norm (as parity_atol; one block before this
    # site); the whitener W maps that to at most ||W||_2 times as much in the distance
    eps = torch.finfo(torch.float32).eps
    tol = 256 * eps * 1 * torch.linalg.matrix_norm(sf.fit.whitener, ord=2).item() * (
        act.double().norm(dim=-1).cpu().numpy())
    assert np.all(np.abs(dist - d) <= tol)

    def p_at(x: np.ndarray) -> np.ndarray:  # (1 + #{reference >= x}) / (1 + n), by hand
        return (1 + (sf.reference[None] >= x[:, None]).sum(1)) / (1 + len(sf.reference))

    # the p-value of each patch is exactly that of its own distance (ties counted) ...
    np.testing.assert_array_equal(pv, p_at(dist))
    # ... and that of the direct activation up to float-level ties: the prompt's tokens (and a
    # response's first tokens) share their prefix with held-out inputs, so their distances
    # tie held-out distances exactly and rounding can move a tie across (30 ranks at once)
    lo, hi = p_at(d + tol), p_at(d - tol)
    assert np.all((lo <= pv) & (pv <= hi))
    assert (lo == hi).sum() >= 5  # where nothing lies within rounding, the p-value is pinned
    df = res.to_dataframe()
    assert {"distance", "p_value", "off_distribution"} <= set(df.columns)
    assert (df.off_distribution == (df.p_value < 0.05)).all()
    heads = divergence_patching(model, pair, div, site="head", layers=[1], positions="all")
    assert heads.p_value.shape == tuple(heads.patching.effect.shape)
    # a head patched at every scored row: Bonferroni over those rows of the row p-values, whose
    # smallest is the p-value of the largest distance (p falls as distance grows), against
    # that head's own held-out reference
    n_rows = int((tp.aligned[:, 0] != 0).sum())
    sites = sorted((k for k in div.fits if k[1] is not None), key=lambda k: k[1])
    assert heads.p_value.shape[-1] == len(sites) > 1
    for h, key in enumerate(sites):
        ref = div.fits[key].reference
        d = heads.distance[..., h].ravel()
        want = np.minimum(1.0, n_rows * (1 + (ref[None] >= d[:, None]).sum(1)) / (1 + len(ref)))
        np.testing.assert_allclose(heads.p_value[..., h].ravel(), want, rtol=1e-12)


def test_pvalue_counts_ties_as_at_least_as_far():
    fit = GaussianFit(torch.zeros(2, dtype=torch.float64), torch.eye(2, dtype=torch.float64),
                      "ledoit_wolf", 10)
    sf = SiteFit("h", None, fit, np.array([1.0, 5.0, 5.0, 5.0, 7.0]))
    x = torch.tensor([[3.0, 4.0], [0.0, 5.0 + 1e-9], [0.0, 0.5], [8.0, 0.0]],
                     dtype=torch.float64)  # distances 5 (a tie), just above 5, 0.5, 8
    np.testing.assert_array_equal(sf.p_value(x), np.array([5, 2, 6, 1]) / 6)


def test_unfitted_site_is_an_error(tiny):
    model, _, _ = tiny("llama", 1)
    div = fit_divergence(model, _natural(10, 3), sites=[("resid", 1)])
    with pytest.raises(TLRewardError, match="was not fitted"):
        divergence_patching(model, ("Hi.", "love", "war"), div, site="resid", layers=[2])
    with pytest.raises(TLRewardError, match="was not fitted"):
        div.p_value("blocks.0.hook_resid_pre", torch.zeros(1, model.cfg.d_model))


def test_position_zero_outside_the_fit_is_never_scored_or_flagged(tiny):
    # main scored aligned row 0 (BOS) against a fit that had dropped position 0 and flagged it
    # (p = 0.0008 at distance 20.9 vs 0.55-0.76 elsewhere)
    model, _, _ = tiny("llama", 1)
    div = fit_divergence(model, _natural(60, 2), sites=[("resid", 1)])
    pair = ("Tell me something.", "love music sky", "war hate no no")
    from tl_reward.data.pairs import as_tokenized_pair

    assert int(as_tokenized_pair(model, pair).aligned[0, 0]) == 0  # row 0 is position 0
    res = divergence_patching(model, pair, div, site="resid", layers=[1])
    assert np.isnan(res.p_value[0, 0]) and np.isnan(res.distance[0, 0])
    assert not res.off_distribution[0, 0] and "position 0" in res.meta["not_scored"]
    assert np.isfinite(res.p_value[0, 1:]).all()
    # a fit that includes position 0 scores it, and every row then gets a finite p-value
    div0 = fit_divergence(model, _natural(60, 2), sites=[("resid", 1)], skip_first=False)
    res0 = divergence_patching(model, pair, div0, site="resid", layers=[1])
    assert np.isfinite(res0.p_value).all() and res0.meta["not_scored"] is None
    # positions="all": position 0 is left out of the Bonferroni minimum (rows 1.. only)
    allp = divergence_patching(model, pair, div, site="resid", layers=[1], positions="all")
    n_rows = res.p_value.shape[1] - 1
    want = min(1.0, float(np.nanmin(res.p_value[0, 1:])) * n_rows)
    assert float(allp.p_value.ravel()[0]) == pytest.approx(want, rel=1e-12)
