"""Reward-term conflict: whitened cosine by hand (scikit-learn's Ledoit-Wolf), disagreement
against a brute-force count and bootstrap, gradient cosine against autograd on HF's model, null
calibration by simulation, and the published definition's gap-to-sign rule."""

from __future__ import annotations

import warnings
from itertools import permutations

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.covariance import LedoitWolf

from tl_reward.audit.conflict import (
    GramLedoitWolf,
    Thresholds,
    behavioural_conflict,
    disagreement_share,
    geometric_conflict,
    gradient_conflict,
    pair_correlation,
    pair_disagreement,
    score_correlation,
    verdict,
)
from tl_reward.audit.pooled import pooled_residual
from tl_reward.compat.published import published_conflict, published_verdict
from tl_reward.errors import TLRewardError

CORPUS = [("Tell me something.", f"Item {i}: love music war {i % 3} " + "yes " * (i % 5))
          for i in range(24)]


def test_whitened_cosine_by_hand(tiny):
    model, _, _ = tiny("llama", 3)
    res = geometric_conflict(model, CORPUS)
    df = res.to_dataframe()
    h = pooled_residual(model, CORPUS, normed=True).double().numpy()
    cov = LedoitWolf().fit(h).covariance_
    w = model.W_U.detach().double().numpy().T  # [3, d]
    for i, j in [(0, 1), (0, 2), (1, 2)]:
        a, b = model.objectives[i], model.objectives[j]
        row = df[(df.term_a == a) & (df.term_b == b)].set_index("view")
        white = w[i] @ cov @ w[j] / np.sqrt((w[i] @ cov @ w[i]) * (w[j] @ cov @ w[j]))
        raw = w[i] @ w[j] / np.linalg.norm(w[i]) / np.linalg.norm(w[j])
        assert row.loc["whitened cosine", "value"] == pytest.approx(white, abs=1e-9)
        assert row.loc["raw cosine", "value"] == pytest.approx(raw, abs=1e-9)
    # no interval (the shrinkage's bias: tests/stats/test_fisher_interval.py), so no verdict
    white_rows = [s for s in res.stats if s.view == "whitened cosine"]
    assert all(np.isnan(s.ci_low) and s.verdict == "undetermined" for s in white_rows)
    assert res.meta["whitened_ci_reason"].startswith("no interval")
    # the same from precomputed normed activations (e.g. a feature cache)
    again = geometric_conflict(model, normed=torch.from_numpy(h))
    np.testing.assert_allclose(again.matrix("whitened cosine"), res.matrix("whitened cosine"))
    # whitening changes the answer on this anisotropic residual (a no-op metric would not)
    assert np.abs(res.matrix("whitened cosine") - res.matrix("raw cosine")).max() > 0.05
    assert res.meta["n_corpus"] == 24
    assert res.meta["shrinkage"] == pytest.approx(LedoitWolf().fit(h).shrinkage_, abs=1e-12)


@pytest.mark.parametrize("n,d", [(12, 40), (60, 7), (30, 30)])
def test_gram_ledoit_wolf_matches_sklearn_on_resamples(n, d):
    """The O(n^2) per-resample whitened cosines (no d x d matrix) equal scikit-learn's
    Ledoit-Wolf covariance plugged into the cosine, for resamples with repeated rows."""
    rng = np.random.default_rng(n * d)
    h = rng.normal(size=(n, d)) * np.linspace(0.2, 3, d) + rng.normal(size=d)
    h[:, :3] += 2 * rng.normal(size=(n, 1))  # correlated coordinates: shrinkage inside (0, 1)
    w = rng.normal(size=(4, d))
    gram = GramLedoitWolf(torch.from_numpy(h), torch.from_numpy(w))
    for idx in [np.arange(n), rng.integers(0, n, n), rng.integers(0, n, n)]:
        lw = LedoitWolf().fit(h[idx])
        q = w @ lw.covariance_ @ w.T
        ref = q / np.sqrt(np.outer(np.diag(q), np.diag(q)))
        got, a = gram.cosines(idx)
        assert a == pytest.approx(lw.shrinkage_, abs=1e-12)
        np.testing.assert_allclose(got, ref, atol=1e-12, rtol=0)


def test_disagreement_share_brute_force():
    rng = np.random.default_rng(3)
    ma, mb = rng.normal(size=15), rng.normal(size=15) + 0.3
    ma[2] = 0.0  # a tie prefers neither reply: it never disagrees
    d = disagreement_share(ma, mb, n_permutations=300, seed=5)
    count = sum(1 for x, y in zip(ma, mb, strict=True) if (x > 0 and y < 0) or (x < 0 and y > 0))
    assert d.share == count / 15
    pa, qa = np.mean(ma > 0), np.mean(ma < 0)
    pb, qb = np.mean(mb > 0), np.mean(mb < 0)
    assert d.expected == pytest.approx(pa * qb + qa * pb)
    # pairs are independent: the share's interval is Clopper-Pearson (scipy's)
    ci = stats.binomtest(count, 15).proportion_ci(0.95)
    assert (d.ci_low, d.ci_high) == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_permutation_p_against_exact_enumeration():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=7), rng.normal(size=7)
    b = b + 0.8 * a
    r = np.corrcoef(a, b)[0, 1]
    exact = np.mean([abs(np.corrcoef(a, b[list(p)])[0, 1]) >= abs(r) - 1e-12
                     for p in permutations(range(7))])
    got = score_correlation(a, b, n_permutations=20000, seed=1)
    # 7 items: the one permutation-correlation test enumerates all 5040 pairings
    assert got.p_value == pytest.approx(exact, abs=1e-12)
    assert got.value == pytest.approx(r)
    # 12 items: Monte Carlo; sd of p about sqrt(p(1-p)/20000) < 0.004
    a, b = rng.normal(size=12), rng.normal(size=12) + 0.3 * np.arange(12)

    def abs_r(v: np.ndarray) -> float:
        return abs(np.corrcoef(a, v)[0, 1])

    ref = stats.permutation_test((b,), abs_r, permutation_type="pairings", vectorized=False,
                                 n_resamples=20000, alternative="greater",
                                 random_state=0).pvalue
    assert score_correlation(a, b, n_permutations=20000, seed=1).p_value == pytest.approx(
        ref, abs=0.012)


def test_pair_correlation_rows_against_scipy():
    """Every pair of three terms, in order: Pearson r from scipy, the exact permutation p over
    all 5040 pairings of 7 items (scipy's permutation_test); below 10 items no interval, so no
    verdict."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=7)
    scores = [x, 2 * x + 0.05 * rng.normal(size=7), rng.normal(size=7)]
    t = Thresholds(aligned=0.4)
    rows = pair_correlation(scores, ["a", "b", "c"], t, seed=2)
    assert [(r.term_a, r.term_b) for r in rows] == [("a", "b"), ("a", "c"), ("b", "c")]
    for r, (i, j) in zip(rows, [(0, 1), (0, 2), (1, 2)], strict=True):
        ref = stats.permutation_test((scores[j],), lambda v, i=i: abs(
            stats.pearsonr(scores[i], v)[0]), permutation_type="pairings", vectorized=False,
            n_resamples=10_000, alternative="greater")
        assert r.value == pytest.approx(stats.pearsonr(scores[i], scores[j])[0], abs=1e-12)
        assert r.p_value == pytest.approx(ref.pvalue, abs=1e-12)
        assert np.isnan(r.ci_low) and r.verdict == "undetermined"
    assert rows[0].p_value == pytest.approx(1 / 5040)


def test_null_calibration_behavioural():
    """Independent terms (shuffled pairings): false-positive rate at alpha 0.05 over 200
    simulations lies in [0.02, 0.08] for both permutation tests."""
    rng = np.random.default_rng(2024)
    hits_corr = hits_dis = hits_cons = 0
    n_sim = 200
    for s in range(n_sim):
        a = rng.normal(size=40)
        b = rng.standard_t(3, size=40) + 0.2  # a different, heavy-tailed distribution
        hits_corr += score_correlation(a, b, n_permutations=199,
                                       seed=s).p_value < 0.05
        d = disagreement_share(a, b, n_permutations=199, seed=s)
        hits_dis += d.p_value < 0.05
        hits_cons += d.p_value_conservative < 0.05
    assert 0.02 <= hits_corr / n_sim <= 0.08
    assert 0.02 <= hits_dis / n_sim <= 0.08
    # counting ties in full is valid but conservative (the reason the mid-p is the default)
    assert hits_cons <= hits_dis


def test_null_calibration_random_head_shuffled_pairs(tiny):
    """Margins of a tiny model's real objective against a random head's margins on shuffled
    pairs: no relation, so the disagreement test fires at about alpha."""
    model, _, _ = tiny("llama", 2)
    replies = [(f"Yes {'!' * (i % 7)} love {i}", f"No {i} war {'.' * (i % 5)}") for i in range(30)]
    # chosen/rejected swapped on every other pair, so the real margins take both signs
    pairs = [("Is the sky blue?", *(r if i % 2 else r[::-1])) for i, r in enumerate(replies)]
    ch = pooled_residual(model, [(p, c) for p, c, _ in pairs], normed=True).double()
    rj = pooled_residual(model, [(p, r) for p, _, r in pairs], normed=True).double()
    ma = ((ch - rj) @ model.W_U[:, 0].detach().double()).numpy()
    assert 0.2 < (ma > 0).mean() < 0.8  # otherwise the permutation null is degenerate
    rng = np.random.default_rng(7)
    hits, n_sim = 0, 200
    for s in range(n_sim):
        w = torch.from_numpy(rng.normal(size=model.cfg.d_model))
        mb = ((ch - rj) @ w).numpy()[rng.permutation(30)]
        hits += disagreement_share(ma, mb, n_permutations=199,
                                   seed=s).p_value < 0.05
    assert 0.02 <= hits / n_sim <= 0.08


def test_behavioural_conflict_on_model(tiny):
    model, hf, _ = tiny("llama", 2)
    pairs = [("Is the sky blue?", f"Yes {i}", f"No {'!' * i}") for i in range(1, 9)]
    res = behavioural_conflict(model, CORPUS[:12], pairs, n_permutations=99)
    df = res.to_dataframe().set_index("view")
    batch = model.make_batch(CORPUS[:12])
    logits = hf(input_ids=batch.tokens, attention_mask=batch.attention_mask).logits.detach()
    r = np.corrcoef(logits[:, 0].numpy(), logits[:, 1].numpy())[0, 1]
    assert df.loc["score correlation", "value"] == pytest.approx(r, abs=1e-5)
    # the disagreement share from HF's margins, counted by hand
    margins = []
    for k in (1, 2):
        b = model.make_batch([(pair[0], pair[k]) for pair in pairs])
        margins.append(hf(input_ids=b.tokens, attention_mask=b.attention_mask).logits.detach())
    m = (margins[0] - margins[1]).double().numpy()
    count = sum(1 for x, y in m if x * y < 0)
    assert 0 < count < 8  # both kinds of pair occur, so the share below is informative
    assert df.loc["pair disagreement", "value"] == pytest.approx(count / 8)
    t = len(res.terms)
    assert res.meta["pair disagreement family"]["tests"] == t * (t - 1) // 2


def test_gradient_cosine_against_hf_autograd(tiny):
    model, hf, _ = tiny("llama", 2)
    items = CORPUS[:3]
    res = gradient_conflict(model, items, n_permutations=50)
    per_item = res.meta["gradient_cosines"][:, 0, 1]
    for k, item in enumerate(items):
        ids = torch.tensor([model.encode(item).ids])
        emb = hf.model.embed_tokens(ids).detach().requires_grad_(True)
        out = hf(inputs_embeds=emb, attention_mask=torch.ones_like(ids)).logits[0]
        g0 = torch.autograd.grad(out[0], emb, retain_graph=True)[0].flatten().double()
        g1 = torch.autograd.grad(out[1], emb)[0].flatten().double()
        ref = float(g0 @ g1 / (g0.norm() * g1.norm()))
        # float32 backward through 3 layers: cosines agree to ~1e-5
        assert per_item[k] == pytest.approx(ref, abs=1e-4)
    row = res.to_dataframe().iloc[0]
    assert row.value == pytest.approx(per_item.mean())


def test_verdicts_and_published_rule(tiny):
    t = Thresholds()
    assert verdict(-0.6, -0.4, t) == "conflict"
    assert verdict(0.6, 0.9, t) == "aligned"
    assert verdict(-0.1, 0.1, t) == "orthogonal"
    assert verdict(-0.5, 0.6, t) == "undetermined"  # a wide interval decides nothing
    assert verdict(0.3, 0.3, t) == "undetermined"
    # published: the gap (0.2, 0.5] falls to the sign and becomes "aligned"
    assert published_verdict(0.3) == "aligned" and published_verdict(-0.25) == "conflict"
    model, _, _ = tiny("llama", 1)
    terms = {"a": (CORPUS[:4], CORPUS[4:8]), "b": (CORPUS[8:12], CORPUS[12:16])}
    pub = published_conflict(model, terms)
    da = (pooled_residual(model, CORPUS[:4]) - pooled_residual(model, CORPUS[4:8])).mean(0)
    db = (pooled_residual(model, CORPUS[8:12]) - pooled_residual(model, CORPUS[12:16])).mean(0)
    assert pub.cosines[0, 1] == pytest.approx(float(da @ db / (da.norm() * db.norm())), abs=1e-6)
    with pytest.raises(TLRewardError, match="different backbone"):
        from tl_reward.audit.conflict import Term

        other, _, _ = tiny("llama", 1, 1)
        geometric_conflict([Term(model, 0, "x"), Term(other, 0, "y")])


def test_armorm_transformed_directions(tiny):
    model, hf, _ = tiny("armorm", 4)
    res = geometric_conflict(model, transformed=True)
    k = len(model.objectives)
    assert len(res.terms) == 2 * k and res.terms[k].startswith("T:")
    # T-direction j = W_U T[:, j]: check one against the raw regression rows of HF's model
    # (W_reg rows with the final norm's gain folded in, as the head reads the normed state)
    gain = hf.model.norm.weight.detach().float()
    w_reg = hf.regression_layer.weight.detach().float() * gain  # [K, d]
    t = hf.reward_transform_matrix.detach().float()  # published: score = g . (u @ T)
    d0 = w_reg.T @ t[:, 0]
    w1 = w_reg[1]
    ref = float(d0 @ w1 / (d0.norm() * w1.norm()))
    got = res.matrix("raw cosine")[k, 1]
    assert got == pytest.approx(ref, abs=1e-5)


def test_pair_disagreement_family_controls_false_verdicts_under_the_null():
    """Independent terms (K, n) = (3, 500), (6, 100), (19, 40): with Benjamini-Hochberg over the
    K(K-1)/2 pair tests, the share of runs with any "conflict"/"aligned" verdict (under the
    global null that is the FDR and the family-wise rate) stays <= alpha + 2 MC standard errors
    (0.05 + 2 sqrt(.05 * .95 / 660) = 0.067); measured 0.045 pooled (0.04, 0.06, 0).
    The per-test rule of main (p < alpha) gives a false verdict in 0.11, 0.52 and 1.0 of the
    runs (7.9 of 171 at K = 19)."""
    alpha, hits, runs, raw_any_19 = 0.05, 0, 0, 0
    for k, n, n_runs in [(3, 500, 300), (6, 100, 300), (19, 40, 60)]:
        rng = np.random.default_rng(1000 * k + n)
        for s in range(n_runs):
            margins = [rng.normal(size=n) for _ in range(k)]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # K = 19: B = 199 is too few
                rows, family = pair_disagreement(margins, [f"t{i}" for i in range(k)], alpha,
                                                 n_permutations=199, seed=s)
            assert family["tests"] == k * (k - 1) // 2 == len(rows)
            hits += any(r.verdict != "no evidence" for r in rows)
            raw_any_19 += k == 19 and any(r.p_value < alpha for r in rows)
            runs += 1
        if k == 6:  # the adjustment is scipy's BH on the pair tests' p-values
            np.testing.assert_allclose([r.extra["p_adjusted"] for r in rows],
                                       stats.false_discovery_control([r.p_value for r in rows]),
                                       rtol=1e-12)
    assert hits / runs <= alpha + 2 * np.sqrt(alpha * (1 - alpha) / runs)
    assert raw_any_19 / 60 > 0.9


def test_disagreement_p_is_exact_over_every_permutation():
    """Without zero margins the p-values are the hypergeometric ones: equal to the share of
    all 8! shuffles (mid-p: ties counted half), which the Monte Carlo test approaches."""
    rng = np.random.default_rng(4)
    ma, mb = rng.normal(size=8), rng.normal(size=8) + 0.5
    d = disagreement_share(ma, mb)
    obs = abs(d.share - d.expected)
    null = np.array([abs(np.mean(ma * mb[list(p)] < 0) - d.expected)
                     for p in permutations(range(8))])
    greater, ties = np.mean(null > obs + 1e-12), np.mean(np.abs(null - obs) <= 1e-12)
    assert d.p_value == pytest.approx(greater + ties / 2, abs=1e-12)
    assert d.p_value_conservative == pytest.approx(greater + ties, abs=1e-12)
    mb[0] = 0.0  # a zero margin: Monte Carlo shuffles, close to the enumeration
    mc = disagreement_share(ma, mb, n_permutations=20000)
    null = np.array([abs(np.mean(ma * mb[list(p)] < 0) - mc.expected)
                     for p in permutations(range(8))])
    obs = abs(mc.share - mc.expected)
    ref = np.mean(null > obs + 1e-12) + np.mean(np.abs(null - obs) <= 1e-12) / 2
    assert mc.p_value == pytest.approx(ref, abs=0.012)


def test_pair_disagreement_rows_equal_disagreement_share_pair_by_pair():
    """The family computes its exact p-values in one call for all pairs: every row equals
    :func:`disagreement_share` on that pair alone (exact pairs, and Monte Carlo ones where a
    term has a zero margin), and an exact pair's p equals the enumeration of all 8! shuffles
    (a p from the wrong pair's counts, or ties not halved, fails)."""
    rng = np.random.default_rng(11)
    margins = [rng.normal(size=8) + 0.4 * k for k in range(4)]
    margins[3][2] = 0.0  # the pairs with term 3 take Monte Carlo shuffles
    rows, family = pair_disagreement(margins, ["a", "b", "c", "d"], n_permutations=999, seed=3)
    pairs = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert family["tests"] == 6 and [(r.term_a, r.term_b) for r in rows] == [
        ("abcd"[i], "abcd"[j]) for i, j in pairs]
    for r, (i, j) in zip(rows, pairs, strict=True):
        d = disagreement_share(margins[i], margins[j], n_permutations=999, seed=3)
        assert (r.value, r.ci_low, r.ci_high, r.p_value) == (d.share, d.ci_low, d.ci_high,
                                                             d.p_value)
        assert r.extra["excess"] == d.excess
    ps = {round(r.p_value, 12) for r in rows[:2] + rows[3:4]}
    assert len(ps) == 3  # the exact pairs' p-values differ: no pair read another's counts
    ma, mb = margins[1], margins[2]
    obs = abs(rows[3].value - rows[3].extra["expected"])
    null = np.array([abs(np.mean(ma * mb[list(p)] < 0) - rows[3].extra["expected"])
                     for p in permutations(range(8))])
    ref = np.mean(null > obs + 1e-12) + np.mean(np.abs(null - obs) <= 1e-12) / 2
    assert rows[3].p_value == pytest.approx(ref, abs=1e-12)


def test_pair_disagreement_warns_when_permutations_cannot_reach_the_bh_threshold():
    rng = np.random.default_rng(0)
    margins = [rng.normal(size=20) for _ in range(19)]
    margins[0][0] = 0.0  # a zero margin: Monte Carlo p-values, capped at 1 / (1 + B)
    with pytest.warns(RuntimeWarning, match="raise n_permutations above 3420"):
        pair_disagreement(margins, [f"t{i}" for i in range(19)], 0.05,
                          n_permutations=99)
    margins = [rng.normal(size=40) for _ in range(19)]
    margins[0][0], margins[1] = 0.0, -margins[0]  # terms 0 and 1 always disagree
    with warnings.catch_warnings():  # the default scales with the family: 10 * 171 / 0.05
        warnings.simplefilter("error", RuntimeWarning)
        rows, _ = pair_disagreement(margins, [f"t{i}" for i in range(19)], 0.05)
    assert rows[0].p_value == 0.5 / (1 + 34_200)  # no shuffle as extreme: the smallest mid-p
    assert rows[0].verdict == "conflict"
