"""The seed pipeline's parts against direct computations (tiny models, synthetic data)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import scipy.stats
import torch

from tl_reward.irm.agreement import pair_agreement, rank_agreement
from tl_reward.irm.layers import parameter_change
from tl_reward.irm.models import hooked_causal_lm
from tl_reward.irm.pipeline import (
    lexicon_tokens,
    reconstruct_utilities,
    reply_token_activations,
    run_seed_pipeline,
)
from tl_reward.model.inputs import encode
from tl_reward.sweep.response_template import response_template
from tl_reward.testing.causal import tiny_causal_lm, tiny_causal_lm_pair


def test_parameter_change_matches_hand_norms():
    ref, _ = tiny_causal_lm("llama", seed=1)
    pol = copy.deepcopy(ref)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        d1 = torch.randn(pol.model.layers[1].self_attn.q_proj.weight.shape, generator=gen)
        d2 = 0.1 * torch.randn(pol.model.layers[2].mlp.up_proj.weight.shape, generator=gen)
        pol.model.layers[1].self_attn.q_proj.weight.add_(d1)
        pol.model.layers[2].mlp.up_proj.weight.add_(d2)
    ch = parameter_change(pol, ref)
    assert ch.layers == [0, 1, 2]
    np.testing.assert_allclose(ch.change, [0.0, float(d1.norm()), float(d2.norm())], rtol=1e-5)
    assert ch.top(2) == [1, 2]
    assert ch.to_dataframe()["rank"].tolist() == [3, 1, 2]


def test_agreement_against_scipy_and_hand_count():
    rng = np.random.default_rng(0)
    c, r = rng.normal(size=40), rng.normal(size=40)
    r[:3] = c[:3]  # ties count one half
    res = pair_agreement(c, r, n_bootstrap=3000, seed=2)
    score = np.where(c > r, 1.0, np.where(c < r, 0.0, 0.5))
    assert res.share == pytest.approx(((c > r).sum() + 0.5 * 3) / 40)
    # the CI: scipy's percentile bootstrap of the same scores (Monte Carlo: to 3 SE of a quantile)
    ref = scipy.stats.bootstrap((score,), np.mean, n_resamples=3000, method="percentile",
                                random_state=0).confidence_interval
    assert (res.agreement.ci_low, res.agreement.ci_high) == pytest.approx(
        (ref.low, ref.high), abs=0.03)
    x, y = rng.normal(size=60), rng.normal(size=60)
    y = y + x
    ra = rank_agreement(x, y)
    want = scipy.stats.kendalltau(x, y)
    assert ra.kendall_tau_b.value == pytest.approx(want.statistic, abs=1e-12)
    assert ra.kendall_tau_b.p_value == pytest.approx(want.pvalue, rel=1e-9)
    assert ra.spearman_rho.value == pytest.approx(scipy.stats.spearmanr(x, y).statistic,
                                                  abs=1e-12)


def test_reconstruction_recovers_signal_and_does_not_leak_words():
    rng = np.random.default_rng(1)
    n, f = 120, 30
    words = [f"w{i}" for i in range(n)]
    x = np.abs(rng.normal(size=(n, f)))
    w = rng.normal(size=f)
    u = x @ w + 0.3 * rng.normal(size=n)
    rec = reconstruct_utilities(x, u, words, "signal", n_resamples=200)
    assert rec.agreement.kendall_tau_b.value > 0.6 and rec.r2 > 0.5
    # noise features, every word twice with identical rows: folds grouped by word cannot
    # memorise the twin, so tau stays near 0 (ungrouped folds would score the twin highly)
    noise = np.abs(rng.normal(size=(n, 100)))
    u2 = rng.normal(size=n)
    rec2 = reconstruct_utilities(np.vstack([noise, noise]), np.r_[u2, u2], words + words,
                                 "noise", n_resamples=200)
    assert abs(rec2.agreement.kendall_tau_b.value) < 0.2
    assert len(rec2.to_dataframe()) == 2 * n


@pytest.fixture(scope="module")
def tl_pair():
    pol, ref, tok = tiny_causal_lm_pair("llama", seed=4)
    return hooked_causal_lm(pol, tok), hooked_causal_lm(ref, tok), tok


def test_reply_token_activations_equal_full_forward(tl_pair):
    pol, _, tok = tl_pair
    prompt = "Is the sky blue?"
    ids = [30, 41, 77, 150]
    got = reply_token_activations(pol, tok, prompt, ids, [0, 2], batch_size=3)
    tpl = response_template(tok, prompt)
    for j, v in enumerate(ids):
        _, cache = pol.run_with_cache(torch.tensor([tpl.ids(v)]))
        for la in (0, 2):
            want = cache[f"blocks.{la}.hook_mlp_out"][0, tpl.response_position]
            torch.testing.assert_close(got[la][j], want, atol=1e-5, rtol=1e-4)


def test_seed_pipeline_runs_on_tiny_models(tl_pair):
    pol, ref, tok = tl_pair
    # a toy lexicon: every word the tiny vocabulary spells, with seeded utilities
    from tl_reward.sweep.lexicon import token_word

    vocab_words = sorted({w for i in range(len(tok)) if (w := token_word(tok.decode([i])))})
    rng = np.random.default_rng(0)
    lex = {w: float(rng.integers(-4, 5)) for w in vocab_words}
    ids, words, utils = lexicon_tokens(tok, lex)
    assert len(ids) >= 10 and set(words) <= set(lex)
    texts = ["The quick brown fox jumps over the lazy dog.", "Is the sky blue? Yes.",
             "Love. Friendship. Music. Hate. War.", "Drink water, sleep well, be kind."] * 6
    corpus = [encode(tok, t) for t in texts]
    res = run_seed_pipeline(pol, ref, corpus, lex, n_layers=1, d_sae=32, k=4, sae_epochs=1,
                            batch_size_tokens=128, n_folds=3, n_resamples=50)
    assert len(res.layers) == 1 and set(res.reconstructions) == {"policy", "reference", "both"}
    df = res.to_dataframe()
    assert (df["n_tokens"] == len(ids)).all() and df["kendall_tau_b"].between(-1, 1).all()
    assert len(res.sae_metrics) == 2
    assert res.plot().data
