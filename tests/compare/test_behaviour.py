"""Behavioural agreement against scipy, brute force, HF's own forward and known R^2 values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

from tl_reward.compare.behaviour import (
    DEFAULT_ALPHAS,
    compare_models,
    preference_agreement,
    rank_agreement,
    ridge_readability,
)
from tl_reward.compare.layers import activations
from tl_reward.data.preference import PreferencePair
from tl_reward.errors import TLRewardError

WORDS = ["Is the sky blue?", "Yes, on a clear day.", "No.", "I cannot help with that.",
         "Love. Friendship. Music.", "Drink water and sleep well.", "Hate. War.", "Sure!",
         "The quick brown fox jumps over the lazy dog.", "Thanks for asking.", "Be kind.",
         "What is love?"]
CORPUS = [[{"role": "user", "content": WORDS[i % 12]},
           {"role": "assistant", "content": f"{WORDS[(5 * i + 1) % 12]} {WORDS[(7 * i) % 12]}"}]
          for i in range(24)]
PAIRS = [PreferencePair.from_prompt(WORDS[i], WORDS[(i + 3) % 12], WORDS[(i + 7) % 12])
         for i in range(12)]


def brute_rbo(a: list, b: list, p: float) -> float:
    """Webber et al. eq. 32 by sets at every depth."""
    k = len(a)
    x = [len(set(a[:d]) & set(b[:d])) for d in range(1, k + 1)]
    return x[-1] / k * p**k + (1 - p) / p * sum(x[d - 1] / d * p**d for d in range(1, k + 1))


def test_rank_agreement_against_scipy_and_brute_force():
    rng = np.random.default_rng(0)
    a = rng.normal(size=40)
    b = 0.6 * a + rng.normal(size=40)
    b[:5] = b[0]  # ties
    res = rank_agreement(a, b)
    assert res.kendall_tau_b.value == pytest.approx(stats.kendalltau(a, b).statistic, abs=1e-12)
    assert res.spearman_rho.value == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)
    # p-values: scipy's (tau-b with ties: asymptotic; rho: t approximation)
    assert res.kendall_tau_b.p_value == pytest.approx(stats.kendalltau(a, b).pvalue, rel=1e-9)
    assert res.spearman_rho.p_value == pytest.approx(stats.spearmanr(a, b).pvalue, rel=1e-9)
    assert np.isnan(res.rbo_top.p_value) and res.kendall_tau_b.n == 40
    order_a = list(np.argsort(-a, kind="stable"))
    order_b = list(np.argsort(-b, kind="stable"))
    assert res.rbo_top.value == pytest.approx(brute_rbo(order_a, order_b, 0.9), abs=1e-12)
    # the CIs: tau-b's and rho's (tests/stats/test_correlation_intervals.py); none for RBO
    assert res.kendall_tau_b.ci_low < res.kendall_tau_b.value < res.kendall_tau_b.ci_high
    assert res.spearman_rho.ci_low < res.spearman_rho.value < res.spearman_rho.ci_high
    assert np.isnan([res.rbo_top.ci_low, res.rbo_top.ci_high]).all()
    assert res.kendall_tau_b.ci_low < res.kendall_tau_b.value < res.kendall_tau_b.ci_high


def test_preference_agreement_brute_force():
    ma = np.array([1.0, -2.0, 0.5, 0.0, 3.0, -1.0])
    mb = np.array([2.0, 1.0, 0.1, 0.0, -3.0, -0.5])
    res = preference_agreement(ma, mb)
    assert res.agreement.value == pytest.approx(4 / 6)  # pairs 0, 2, 3 (both zero), 5
    assert res.accuracy_a == pytest.approx(3 / 6) and res.accuracy_b == pytest.approx(3 / 6)
    # the interval: Clopper-Pearson (statsmodels' beta method) of 4 agreements in 6
    assert (res.agreement.ci_low, res.agreement.ci_high) == pytest.approx(
        proportion_confint(4, 6, 0.05, method="beta"), abs=1e-12)


def test_ridge_readability_recovers_a_known_r2():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 6))
    signal = x @ rng.normal(size=6)
    y = signal + rng.normal(size=300) * np.sqrt(0.25 * signal.var())
    r2, alphas, pred = ridge_readability(x, y)
    # population R^2 = 1 / 1.25 = 0.8; held-out estimate at n = 300 within about +-0.05
    assert abs(r2 - 0.8) < 0.05 and len(alphas) == 5
    assert r2 == pytest.approx(1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum())
    # an unrelated target is not readable (R^2 near or below 0; an in-sample R^2 would be > 0)
    r2_null, _, _ = ridge_readability(x, rng.normal(size=300))
    assert r2_null < 0.05


def _hf_score(hf, tok, conv) -> float:
    ids = tok.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"]
    with torch.no_grad():
        return float(hf(input_ids=torch.tensor([ids])).logits[0, 0])


def _hf_last_block(hf, tok, convs) -> np.ndarray:
    """The last decoder layer's output at the last token, one unpadded sequence at a time."""
    got = []
    handle = hf.model.layers[-1].register_forward_hook(
        lambda mod, inp, out: got.append((out[0] if isinstance(out, tuple) else out)[0, -1]))
    try:
        for c in convs:
            ids = tok.apply_chat_template(c, tokenize=True, return_dict=True)["input_ids"]
            with torch.no_grad():
                hf(input_ids=torch.tensor([ids]))
    finally:
        handle.remove()
    return torch.stack(got).double().numpy()


def _ridge_r2(x: np.ndarray, y: np.ndarray) -> tuple[float, list[float]]:
    """Held-out R^2 of standardised ridge (penalty by RidgeCV's leave-one-out) over 5 shuffled
    folds (seed 0), from the pooled held-out predictions."""
    from sklearn.linear_model import RidgeCV
    from sklearn.model_selection import KFold
    from sklearn.preprocessing import StandardScaler

    pred, alphas = np.zeros_like(y), []
    for tr, te in KFold(5, shuffle=True, random_state=0).split(x):
        sc = StandardScaler().fit(x[tr])
        fit = RidgeCV(alphas=list(DEFAULT_ALPHAS)).fit(sc.transform(x[tr]), y[tr])
        pred[te] = fit.predict(sc.transform(x[te]))
        alphas.append(float(fit.alpha_))
    return 1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum(), alphas


def test_compare_models_against_hf_forward(tiny):
    (a, hf_a, tok), (b, hf_b, _) = tiny("llama", 1, 0), tiny("llama", 1, 1)
    rep = compare_models({"A": a, "B": b}, CORPUS, pairs=PAIRS)
    ra = np.array([_hf_score(hf_a, tok, c) for c in CORPUS])
    rb = np.array([_hf_score(hf_b, tok, c) for c in CORPUS])
    np.testing.assert_allclose(rep.rewards["A"], ra, atol=1e-4)  # float32 parity scale
    assert rep.rank[0].kendall_tau_b.value == pytest.approx(stats.kendalltau(ra, rb).statistic,
                                                            abs=1e-9)
    ma = np.array([_hf_score(hf_a, tok, p.chosen_conversation())
                   - _hf_score(hf_a, tok, p.rejected_conversation()) for p in PAIRS])
    mb = np.array([_hf_score(hf_b, tok, p.chosen_conversation())
                   - _hf_score(hf_b, tok, p.rejected_conversation()) for p in PAIRS])
    assert rep.preference[0].agreement.value == pytest.approx(
        float(np.mean(np.sign(ma) == np.sign(mb))))
    assert rep.preference[0].accuracy_a == pytest.approx(float(np.mean(ma > 0)))
    # readability: A, A->B, B->A and B in every order, each R^2 against HF's last-layer output
    # at the last token and a ridge written out here (scikit-learn, the documented protocol)
    assert {(r.source, r.target) for r in rep.readability} == {
        ("A", "A"), ("B", "B"), ("A", "B"), ("B", "A")}
    hs = {"A": _hf_last_block(hf_a, tok, CORPUS), "B": _hf_last_block(hf_b, tok, CORPUS)}
    ys = {"A": ra, "B": rb}
    for r in rep.readability:
        r2, alphas = _ridge_r2(hs[r.source], ys[r.target])
        # float32 activations (~1e-6 relative) move the held-out R^2 by far less than 1e-3
        assert r.r2 == pytest.approx(r2, abs=1e-3), (r.source, r.target)
        assert r.alphas == alphas
    assert max(r.r2 for r in rep.readability) - min(r.r2 for r in rep.readability) > 0.05
    df = rep.to_dataframe()
    assert {"kendall_tau_b", "spearman_rho", "rbo_top", "preference_agreement"} <= set(
        df["measure"])
    # the figure shows these numbers: bars = the table's values, scatter = HF's rewards
    fig = rep.plot()
    bars = [t for t in fig.data if t.type == "bar"]
    assert bars
    for t in bars:
        a_name, b_name = t.name.split(" / ")
        part = df[(df["model_a"] == a_name) & (df["model_b"] == b_name)]
        assert dict(zip(t.x, t.y, strict=True)) == pytest.approx(
            dict(zip(part["measure"], part["value"], strict=True)), abs=1e-12)
    scatter = next(t for t in fig.data if t.type == "scatter")
    np.testing.assert_allclose(scatter.x, ra, atol=1e-4)
    np.testing.assert_allclose(scatter.y, rb, atol=1e-4)


def test_own_reward_is_readable_from_the_final_norm(tiny):
    """reward = W_U . normed + b exactly, so with more inputs than d_model (96 > 64) the
    held-out R^2 from ln_final's output is ~1; a shuffled target is not readable."""
    a = tiny("llama", 1, 0)[0]
    corpus = [[{"role": "user", "content": WORDS[i % 12]},
               {"role": "assistant", "content": f"{WORDS[(i // 12) % 12]} {WORDS[(5 * i) % 12]}"}]
              for i in range(96)]
    x = activations(a, corpus, "ln_final.hook_normalized", batch_size=32)
    y = a.rewards(corpus, batch_size=32).score.double().numpy()
    r2, _, _ = ridge_readability(x, y)
    assert r2 > 0.99
    r2_shuffled, _, _ = ridge_readability(x, np.random.default_rng(0).permutation(y))
    assert r2_shuffled < 0.3


def test_pairs_as_data_and_bad_input(tiny):
    a, b = tiny("llama", 1, 0)[0], tiny("llama", 1, 1)[0]
    rep = compare_models([a, b], PAIRS, readability_hook=None)
    assert len(rep.models) == 2 and rep.preference and rep.rank and not rep.readability
    with pytest.raises(TLRewardError, match="at least two"):
        compare_models([a], CORPUS)
    with pytest.raises(TLRewardError, match="corpus"):
        compare_models([a, b])


def test_vocabulary_agreement_joins_the_report(tiny):
    from tl_reward.sweep.vocab_sweep import score_vocabulary

    a, b = tiny("llama", 1, 0)[0], tiny("llama", 1, 1)[0]
    prompt = "What is the best thing ever?"
    sweeps = {"A": score_vocabulary(a, prompt, batch_size=64, progress=False),
              "B": score_vocabulary(b, prompt, batch_size=64, progress=False)}
    rep = compare_models({"A": a, "B": b}, sweeps=sweeps)
    row = rep.to_dataframe().set_index("measure").loc["vocabulary_kendall_tau_b"]
    # the same strings, the same ids (one tokenizer): Kendall over every candidate token
    va, vb = sweeps["A"].values(0).double().numpy(), sweeps["B"].values(0).double().numpy()
    keep = ~pd.Index(sweeps["A"].tokens).duplicated(keep=False)
    assert row["value"] == pytest.approx(stats.kendalltau(va[keep], vb[keep]).statistic,
                                         abs=1e-9)
    assert not rep.rank and not rep.preference
    fig = rep.plot()  # the vocabulary rows are the figure's bars
    bars = dict(zip(fig.data[0].x, fig.data[0].y, strict=True))
    assert bars["vocabulary_kendall_tau_b"] == pytest.approx(row["value"], abs=1e-12)
    df = rep.to_dataframe()
    assert bars == pytest.approx(dict(zip(df["measure"], df["value"], strict=True)), abs=1e-12)
