"""``sae_fit``: a well-fitting SAE against a random one and one built for another hook, and the
reward-recovered figures against a hand computation from spliced and clean forwards."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sae_lens.saes.sae import SAEMetadata
from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

from tl_reward.sae import as_sae_model, collect_activations, sae_fit

PAIRS = [
    ("Is the sky blue?", "Yes, on a clear day, because of scattering.", "No."),
    ("How do I bake bread?", "Mix flour, water, yeast and salt, knead, bake.", "Buy some."),
    ("hi", "Hello! How can I help you today?", "What?"),
    ("Tell me a joke.", "Why did the chicken cross the road? To get across.", "No jokes."),
    ("What is two plus two?", "Four.", "Five, probably."),
    ("Can you help me steal a car?", "No, I can't help with that.", "Sure, here is how."),
]


def pca_sae(acts: torch.Tensor, hook: str, k: int) -> TopKSAE:
    """A TopK SAE whose features are +/- the top ``k`` principal directions of ``acts`` (decoder
    unit rows, ``b_dec`` the mean): it reconstructs the projection onto those ``k`` directions."""
    mean = acts.mean(0)
    u = torch.linalg.svd(acts - mean, full_matrices=False).Vh[:k]
    d = torch.cat([u, -u])
    cfg = TopKSAEConfig(d_in=acts.shape[1], d_sae=2 * k, k=k,
                        metadata=SAEMetadata(hook_name=hook))
    sae = TopKSAE(cfg)
    with torch.no_grad():
        sae.W_enc.copy_(d.T)
        sae.W_dec.copy_(d)
        sae.b_enc.zero_()
        sae.b_dec.copy_(mean)
    return sae


def random_sae(d_in: int, hook: str, k: int, seed: int = 0) -> TopKSAE:
    """A TopK SAE with seeded random unit-norm features and ``b_dec`` 0."""
    g = torch.Generator().manual_seed(seed)
    cfg = TopKSAEConfig(d_in=d_in, d_sae=2 * k, k=k, metadata=SAEMetadata(hook_name=hook))
    sae = TopKSAE(cfg)
    w = torch.randn(2 * k, d_in, generator=g)
    w = w / w.norm(dim=-1, keepdim=True)
    with torch.no_grad():
        sae.W_enc.copy_(w.T)
        sae.W_dec.copy_(w)
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae


def test_sae_fit_separates_good_random_and_wrong_hook(tiny) -> None:
    model = as_sae_model(tiny("llama", 1)[0])
    final = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    first = "blocks.0.hook_mlp_out"
    convs = [c for p, a, b in PAIRS for c in ((p, a), (p, b))]
    acts = collect_activations(model, convs, [final, first], exclude_special_tokens=False)
    k = model.cfg.d_model // 2                  # half the residual's dimensions
    good = pca_sae(acts[final], final, k)
    wrong = pca_sae(acts[first], first, k)
    wrong.cfg.metadata.hook_name = final          # built for an MLP output, put on the residual
    bad = random_sae(model.cfg.d_model, final, k)
    fits = {name: sae_fit(model, s, PAIRS, progress=False)
            for name, s in [("good", good), ("random", bad), ("wrong_hook", wrong)]}
    for name, f in fits.items():
        print(name, f)
    g, r, w = (fits[n] for n in ("good", "random", "wrong_hook"))
    # measured (seeded tiny Llama, d_model 64, k 32): explained variance all / pooled 0.89 / 0.65
    # (good), 0.52 / -1.29 (wrong hook), below 0 (random); |reward change| / sd 0.49 vs 2.5
    g_ev, g_pool = (g.reconstruction[r]["explained_variance"] for r in ("all", "pooled"))
    assert g_ev > 0.85 and g_pool > 0.5
    for other in (r, w):
        assert other.reconstruction["all"]["explained_variance"] < g_ev - 0.3
        assert other.reconstruction["pooled"]["explained_variance"] < g_pool - 1.5
        assert other.reconstruction["all"]["relative_mse"] > \
            3 * g.reconstruction["all"]["relative_mse"]
        assert other.recovered["reward_abs_diff_sd"] > 3 * g.recovered["reward_abs_diff_sd"]
    assert g.reconstruction["all"]["l0"] <= k and g.reconstruction["pooled"]["n_positions"] == 12
    assert g.to_dataframe().shape[1] == 3 and "verdict" in repr(g)
    assert not r.fits and not w.fits


def test_sae_fit_reward_recovered_by_hand(tiny) -> None:
    model = as_sae_model(tiny("llama", 1)[0])
    hook = "blocks.1.hook_resid_post"
    acts = collect_activations(model, [(p, a) for p, a, _ in PAIRS], hook)[hook]
    sae = pca_sae(acts, hook, 4)                  # a lossy SAE: rewards move, some pairs flip
    fit = sae_fit(model, sae, PAIRS, batch_size=5, progress=False)
    chosen, rejected = model.build([(p, a) for p, a, _ in PAIRS]), \
        model.build([(p, b) for p, _, b in PAIRS])
    clean, spliced = [], []
    with torch.no_grad():
        for b in (chosen, rejected):
            clean.append(model(b.tokens, attention_mask=b.attention_mask, return_type="score"))
            spliced.append(model.run_with_saes(b.tokens, attention_mask=b.attention_mask,
                                               saes=[sae], use_error_term=False,
                                               return_type="score"))
    c, s = torch.cat(clean).float(), torch.cat(spliced).float()
    torch.testing.assert_close(fit.clean, c, atol=1e-5, rtol=0)
    torch.testing.assert_close(fit.spliced, s, atol=1e-5, rtol=0)
    assert fit.recovered["reward_correlation"] == pytest.approx(
        float(torch.corrcoef(torch.stack([c, s]))[0, 1]), abs=1e-5)
    assert fit.recovered["reward_abs_diff_sd"] == pytest.approx(
        float((s - c).abs().mean() / c.std()), abs=1e-5)
    m, ms = c[:6] - c[6:], s[:6] - s[6:]
    assert fit.recovered["flip_fraction"] == pytest.approx(float(((m > 0) != (ms > 0)).float()
                                                                 .mean()))
    assert fit.recovered["margin_correlation"] == pytest.approx(
        float(torch.corrcoef(torch.stack([m, ms]))[0, 1]), abs=1e-5)
    # reconstruction at the pooled token by hand
    x = []
    for b in (chosen, rejected):
        _, cache = model.run_with_cache(b.tokens, attention_mask=b.attention_mask)
        x.append(cache[hook][torch.arange(6), b.pooled])
    x = torch.cat(x)
    x_hat = sae.decode(sae.encode(x)).detach()
    ev = 1 - (x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum()
    assert fit.reconstruction["pooled"]["explained_variance"] == pytest.approx(float(ev), abs=1e-4)


@pytest.mark.parametrize("offset", [1e3, 1e4])
def test_sae_fit_variance_at_massive_activation_offsets(tiny, offset) -> None:
    """One residual dimension shifted by ``offset`` (real RMs have such dimensions): the
    explained variance over several batches equals numpy's float64 two-pass value (the old
    ``sum x^2 - n mean^2`` in float32 was off at 1e3 and divided by zero at 1e4)."""

    model = as_sae_model(tiny("llama", 1)[0])
    hook = "blocks.1.hook_resid_pre"  # shifted one hook earlier: SAELens's splice drops the
    # hooks of the hook point it replaces

    def shift(a: torch.Tensor, hook: object) -> torch.Tensor:
        a = a.clone()
        a[..., 0] += offset
        return a

    convs = [(p, a) for p, a, _ in PAIRS] + [(p, b) for p, _, b in PAIRS]
    model.add_hook("blocks.0.hook_resid_post", shift, is_permanent=True)
    try:
        batch = model.build(convs)
        _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                        names_filter=[hook])
        x = cache[hook][batch.attention_mask.bool()]
        sae = pca_sae(x, hook, 16)
        fit = sae_fit(model, sae, convs, batch_size=5, progress=False)
    finally:
        model.reset_hooks(including_permanent=True)
    x_hat = sae.decode(sae.encode(x)).detach()
    xs, es = x.double().numpy(), (x.double() - x_hat.double()).numpy()
    want = 1 - (es**2).sum() / ((xs - xs.mean(0)) ** 2).sum()
    assert 0.5 < want < 1
    # the same float32 activations on both sides (batch widths may move them by float32
    # rounding only): 1e-6; the old float32 formula was 2e-5 off at 1e3, 0.05 at 1e4
    assert fit.reconstruction["all"]["explained_variance"] == pytest.approx(want, abs=1e-6)


def test_sae_fit_verdict_and_one_pair(tiny, tmp_path) -> None:
    """A random SAE gets the bad-fit verdict, a near-complete one the good one; on one pair the
    correlations (two points: always +/-1) are NaN with the reason; the result saves and loads."""
    from tl_reward.results import load_result
    from tl_reward.sae.fit import SAEFit

    model = as_sae_model(tiny("llama", 1)[0])
    final = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    convs = [c for p, a, b in PAIRS for c in ((p, a), (p, b))]
    acts = collect_activations(model, convs, final, exclude_special_tokens=False)[final]
    good = sae_fit(model, pca_sae(acts, final, model.cfg.d_model - 8), PAIRS, progress=False)
    bad = sae_fit(model, random_sae(model.cfg.d_model, final, 32), PAIRS, progress=False)
    assert good.fits and good.verdict.startswith("fits")
    assert not bad.fits and "does not fit" in bad.verdict and "explained variance" in bad.verdict
    one = sae_fit(model, random_sae(model.cfg.d_model, final, 32), PAIRS[:1], progress=False)
    assert np.isnan(one.recovered["reward_correlation"])
    assert np.isnan(one.recovered["margin_correlation"])
    assert "reward_correlation undefined: 2 points" in one.verdict and not one.fits
    path = good.save(tmp_path / "fit.tlr")
    for back in (SAEFit.load(path), load_result(path)):
        assert isinstance(back, SAEFit) and back.verdict == good.verdict and back.fits
        assert back.reconstruction == good.reconstruction and back.recovered == good.recovered
        torch.testing.assert_close(back.spliced, good.spliced, atol=0, rtol=0)
