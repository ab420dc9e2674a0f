"""The seed pipeline's parts against direct computations (tiny models, synthetic data)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import scipy.stats
import torch
from sklearn.metrics import r2_score
from statsmodels.stats.proportion import proportion_confint

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
from tl_reward.model.response_template import response_template
from tl_reward.stats.ranks import kendall_interval
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
    res = pair_agreement(c, r)
    wins = int((c > r).sum())
    assert res.share == pytest.approx((wins + 0.5 * 3) / 40)
    # the interval: Clopper-Pearson (statsmodels' beta method), the 3 ties as losses at the low
    # end and as wins at the high end
    assert (res.agreement.ci_low, res.agreement.ci_high) == pytest.approx(
        (proportion_confint(wins, 40, 0.05, method="beta")[0],
         proportion_confint(wins + 3, 40, 0.05, method="beta")[1]), abs=1e-12)
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
    rec = reconstruct_utilities(x, u, words, "signal")
    assert rec.agreement.kendall_tau_b.value > 0.6 and rec.r2 > 0.5
    # noise features, every word twice with identical rows: folds grouped by word cannot
    # memorise the twin, so tau stays near 0 (ungrouped folds would score the twin highly)
    noise = np.abs(rng.normal(size=(n, 100)))
    u2 = rng.normal(size=n)
    rec2 = reconstruct_utilities(np.vstack([noise, noise]), np.r_[u2, u2], words + words,
                                 "noise")
    assert abs(rec2.agreement.kendall_tau_b.value) < 0.2
    assert len(rec2.to_dataframe()) == 2 * n


def _clustered(rng: np.random.Generator, n_words: int, per_word: int, rho: float):
    """Words with bivariate-normal (x, y) of correlation ``rho``, each spelled by ``per_word``
    near-identical tokens (tiny jitter with the same correlation, so every pair of tokens,
    within a word or across words, has Kendall tau (2 / pi) arcsin(rho))."""
    cov = [[1, rho], [rho, 1]]
    word = rng.multivariate_normal([0, 0], cov, size=n_words)
    jitter = 1e-3 * rng.multivariate_normal([0, 0], cov, size=(n_words, per_word))
    xy = (word[:, None, :] + jitter).reshape(-1, 2)
    return xy[:, 0], xy[:, 1], np.repeat([f"w{i}" for i in range(n_words)], per_word)


def test_word_interval_counts_words_as_units():
    """With words as units the interval is kendall_interval's cluster-robust one (brute force:
    tests/stats/test_correlation_intervals.py); one item per unit is the item interval."""
    rng = np.random.default_rng(11)
    x, y, words = _clustered(rng, 12, 3, 0.5)
    got = rank_agreement(x, y, units=words, unit="word").kendall_tau_b
    tau = scipy.stats.kendalltau(x, y).statistic
    assert (got.ci_low, got.ci_high) == kendall_interval(x, y, tau, units=words)[:2]
    assert got.method.startswith("U-statistic variance over words") and got.n == 12
    assert got.value == pytest.approx(tau, abs=1e-12)
    one = rank_agreement(x, y, units=np.arange(len(x))).kendall_tau_b
    item = rank_agreement(x, y).kendall_tau_b
    assert (one.ci_low, one.ci_high) == (item.ci_low, item.ci_high) and item.n == 36
    assert item.method.startswith("U-statistic variance over items")


@pytest.mark.parametrize("stat, truth, seed", [
    ("kendall_tau_b", 2 / np.pi * np.arcsin(0.5), 2025),
    ("spearman_rho", 6 / np.pi * np.arcsin(0.25), 2026)])
def test_word_interval_covers_and_token_interval_does_not(stat: str, truth: float, seed: int):
    """30 words x 4 near-identical tokens, 200 simulations, the true tau (2 / pi) arcsin(0.5) =
    1/3 or rho (6 / pi) arcsin(0.25): the word interval (tau's cluster-robust U-statistic
    variance; rho's jackknife leaving out one word at a time) covers it in 0.95 (tau) and 0.96
    (rho) of runs (measured); counting the 120 near-duplicate tokens as independent units
    covers in 0.71 and 0.69. Monte Carlo sd of a coverage near 0.95 over 200 runs: 0.015."""
    rng = np.random.default_rng(seed)
    cover_word = cover_token = 0
    n_sim = 200
    for _ in range(n_sim):
        x, y, words = _clustered(rng, 30, 4, 0.5)
        w = getattr(rank_agreement(x, y, units=words), stat)
        t = getattr(rank_agreement(x, y), stat)
        cover_word += w.ci_low <= truth <= w.ci_high
        cover_token += t.ci_low <= truth <= t.ci_high
    assert w.n == 30 and t.n == 120
    assert 0.91 <= cover_word / n_sim <= 0.99
    assert cover_token / n_sim < 0.8


def test_reconstruction_resamples_words():
    """reconstruct_utilities' interval counts words as units on its own out-of-fold predictions."""
    rng = np.random.default_rng(5)
    n_words, per = 20, 3
    base = np.abs(rng.normal(size=(n_words, 15)))
    x = np.repeat(base, per, axis=0) + 1e-3 * np.abs(rng.normal(size=(n_words * per, 15)))
    u = np.repeat(base @ rng.normal(size=15), per)
    words = np.repeat([f"w{i}" for i in range(n_words)], per).tolist()
    rec = reconstruct_utilities(x, u, words, "clustered", seed=3)
    want = rank_agreement(rec.reconstructed, u, units=words).kendall_tau_b
    got = rec.agreement.kendall_tau_b
    assert got.method.startswith("U-statistic variance over words")
    assert (got.ci_low, got.ci_high) == (want.ci_low, want.ci_high)
    item = rank_agreement(rec.reconstructed, u).kendall_tau_b
    assert item.ci_high - item.ci_low < got.ci_high - got.ci_low


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
                            batch_size_tokens=128, n_folds=3)
    assert len(res.layers) == 1 and set(res.reconstructions) == {"policy", "reference", "both"}
    df = res.to_dataframe().set_index("features")
    assert (df["n_tokens"] == len(ids)).all() and (df["n_words"] == len(set(words))).all()
    for name, rec in res.reconstructions.items():
        # every statistic against scipy / sklearn on the reconstruction's own predictions
        assert rec.words == words and np.array_equal(rec.utilities, [lex[w] for w in words])
        assert df.loc[name, "kendall_tau_b"] == pytest.approx(
            scipy.stats.kendalltau(rec.reconstructed, rec.utilities).statistic, abs=1e-12)
        assert df.loc[name, "spearman_rho"] == pytest.approx(
            scipy.stats.spearmanr(rec.reconstructed, rec.utilities).statistic, abs=1e-12)
        assert df.loc[name, "r2"] == pytest.approx(r2_score(rec.utilities, rec.reconstructed),
                                                   abs=1e-12)
        want = rank_agreement(rec.reconstructed, rec.utilities, units=words).kendall_tau_b
        assert (df.loc[name, "ci_low"], df.loc[name, "ci_high"]) == (want.ci_low, want.ci_high)
    # "both" concatenates the two feature sets (dead columns dropped from each alike)
    assert df.loc["both", "n_features"] == df.loc["policy", "n_features"] + df.loc[
        "reference", "n_features"]
    assert sorted(map(tuple, res.sae_metrics[["model", "layer"]].values.tolist())) == [
        ("policy", res.layers[0]), ("reference", res.layers[0])]
    assert res.layers == res.layer_change.top(1)
    bar = res.plot().data[0]
    np.testing.assert_allclose(bar.y, df["kendall_tau_b"].to_numpy())
    np.testing.assert_allclose(bar.error_y.array, (df["ci_high"] - df["kendall_tau_b"]).to_numpy())
