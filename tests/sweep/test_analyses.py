"""Token analyses of a sweep, each checked against an independent computation (scipy,
statsmodels, the afinn and wordfreq packages' own lookups)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from tl_reward.errors import TLRewardError
from tl_reward.stats.ranks import rank_biased_overlap
from tl_reward.sweep.agreement import model_agreement
from tl_reward.sweep.distribution import score_distribution
from tl_reward.sweep.extremes import percentiles, top_bottom_tokens
from tl_reward.sweep.framing import prompt_framing
from tl_reward.sweep.frequency import frequency_bias
from tl_reward.sweep.identity import identity_percentiles
from tl_reward.sweep.valence import valence_asymmetry
from tl_reward.sweep.vocab_sweep import VocabSweep


def make_sweep(tokens: list[str], scores: np.ndarray, labels: list[str], name: str = "m",
               ids: np.ndarray | None = None) -> VocabSweep:
    s = torch.tensor(np.asarray(scores, dtype=np.float32).reshape(len(tokens), len(labels)))
    ids = np.arange(len(tokens)) if ids is None else ids
    return VocabSweep(torch.tensor(ids), list(tokens), s, s[:, :, None].clone(), labels,
                      [[{"role": "user", "content": lab}] for lab in labels], ["reward"], name)


@pytest.fixture(scope="module")
def vocab() -> list[str]:
    """Lexicon words, frequent non-lexicon words, variants and non-words, as tokens."""
    import wordfreq
    from afinn import Afinn

    afinn = Afinn()
    rng = np.random.default_rng(0)
    common = [w for w in wordfreq.top_n_list("en", 3000) if w.isalpha()]
    lexicon = [w for w in common if afinn.score(w) != 0][:250]
    plain = [w for w in common if afinn.score(w) == 0][:400]
    tokens = [" " + w if rng.random() < 0.5 else w for w in lexicon + plain]
    tokens += [" Love", "LOVE", "love", "123", "!!", " ", "\ufffd", "\ufffd", "a-b"]
    return tokens


@pytest.fixture(scope="module")
def sweep(vocab) -> VocabSweep:
    from afinn import Afinn

    afinn = Afinn()
    rng = np.random.default_rng(1)
    v = np.array([afinn.score(t.strip().lower()) for t in vocab], dtype=float)
    base = np.where(v > 0, 0.8 * v, 0.2 * v) + rng.normal(scale=0.5, size=len(vocab))
    scores = np.stack([base, base + rng.normal(scale=0.3, size=len(vocab)),
                       -base + rng.normal(scale=0.5, size=len(vocab))], 1)
    return make_sweep(vocab, scores, ["greatest", "best", "worst"])


def test_top_bottom_match_sorting(sweep) -> None:
    ext = top_bottom_tokens(sweep, k=7)
    for p, lab in enumerate(sweep.labels):
        v = sweep.values(lab).numpy()
        assert ext.top_ids[p].tolist() == np.argsort(-v, kind="stable")[:7].tolist()
        assert ext.bottom_ids[p].tolist() == np.argsort(v, kind="stable")[:7].tolist()
    df = ext.to_dataframe()
    assert len(df) == 3 * 2 * 7 and set(df["side"]) == {"top", "bottom"}
    assert ext.side_by_side("bottom").shape == (7, 3)
    tied = make_sweep(["a", "b", "c"], np.array([1.0, 2.0, 2.0]), ["x"], ids=np.array([9, 4, 7]))
    assert top_bottom_tokens(tied, 2).top_ids[0].tolist() == [4, 7]  # ties: lower id first
    assert ext.plot().data


def test_percentiles_and_identity_audit_match_scipy(sweep) -> None:
    v = sweep.values("best").numpy()
    expected = [stats.percentileofscore(v, x, kind="mean") for x in v[:50]]
    np.testing.assert_allclose(percentiles(sweep, "best")[:50].numpy(), expected)
    audit = identity_percentiles(sweep, {"feelings": ["love", "Hate", "nonexistentterm"],
                                         "other": ["good"]})
    love = audit.matches[(audit.matches["term"] == "love") & (audit.matches["prompt"] == "best")]
    assert sorted(love["token"]) == sorted(t for t in sweep.tokens if t.strip().lower() == "love")
    assert {" Love", "LOVE"} <= set(love["token"])
    for _, row in love.iterrows():
        assert row["percentile"] == pytest.approx(
            stats.percentileofscore(v, v[row["token_id"]], kind="mean"))
    assert ("feelings", "nonexistentterm") in audit.missing
    assert set(audit.summary()["group"]) <= {"feelings", "other"}
    exact = identity_percentiles(sweep, {"g": ["love"]}, case_sensitive=True, prompts=["best"])
    assert set(exact.matches["token"]) == {"love"}
    with pytest.raises(TLRewardError):
        identity_percentiles(sweep, {})
    assert audit.plot().data


def test_distribution_matches_scipy(sweep) -> None:
    dist = score_distribution(sweep)
    for lab in sweep.labels:
        v = sweep.values(lab).double().numpy()
        row = dist.stats.loc[lab]
        assert row["mean"] == pytest.approx(v.mean())
        assert row["var"] == pytest.approx(np.var(v))
        assert row["var_sample"] == pytest.approx(np.var(v, ddof=1))
        assert row["skew"] == pytest.approx(stats.skew(v))
        assert row["kurtosis"] == pytest.approx(stats.kurtosis(v))
        assert row["q95"] == pytest.approx(np.quantile(v, 0.95))
    assert dist.stats.loc["greatest", "skew"] > 0.5 > -0.5 > dist.stats.loc["worst", "skew"]
    assert dist.plot().data


def test_model_agreement_on_shared_strings(vocab) -> None:
    rng = np.random.default_rng(2)
    n = len(vocab)
    a = rng.normal(size=n)
    # model b: another tokenizer (shuffled ids, a few extra tokens), correlated scores
    perm = rng.permutation(n)
    b_tokens = [vocab[i] for i in perm] + ["zzz", "yyy"]
    b_scores = np.r_[a[perm] + rng.normal(scale=0.5, size=n), [0.0, 1.0]]
    c_scores = rng.normal(size=n)
    sweeps = {"a": make_sweep(vocab, a, ["q"]), "b": make_sweep(b_tokens, b_scores, ["q"]),
              "c": make_sweep(vocab, c_scores, ["q"])}
    agree = model_agreement(sweeps)
    n_dup = int(pd.Series(vocab).duplicated(keep=False).sum())  # "\ufffd" twice, ...
    assert n_dup >= 2 and agree.dropped == {"a": n_dup, "b": n_dup, "c": n_dup}
    # independent: join on strings with pandas, drop duplicated strings, scipy statistics
    fa = pd.DataFrame({"t": vocab, "a": a}).drop_duplicates("t", keep=False)
    fb = pd.DataFrame({"t": b_tokens, "b": b_scores}).drop_duplicates("t", keep=False)
    joined = fa.merge(fb, on="t").sort_values("t")
    assert int(agree.n_shared[0, 1]) == len(joined) == n - n_dup
    assert agree.kendall_tau_b[0, 1] == pytest.approx(
        stats.kendalltau(joined["a"], joined["b"]).statistic)
    assert agree.spearman_rho[1, 0] == pytest.approx(
        stats.spearmanr(joined["a"], joined["b"]).statistic)
    top_a = joined.sort_values("a", ascending=False)["t"].tolist()
    top_b = joined.sort_values("b", ascending=False)["t"].tolist()
    assert agree.rbo_top[0, 1] == pytest.approx(rank_biased_overlap(top_a, top_b, 0.9))
    assert agree.kendall_tau_b[0, 1] > 0.5 > abs(float(agree.kendall_tau_b[0, 2]))
    xy = agree.mds()
    d = np.hypot(*(xy[["x", "y"]].to_numpy()[:, None] - xy[["x", "y"]].to_numpy()[None])
                 .transpose(2, 0, 1))
    assert d[0, 1] < d[0, 2] and d[0, 1] < d[1, 2]  # the agreeing pair sits together
    assert len(agree.to_dataframe()) == 3 and agree.plot().data
    with pytest.raises(TLRewardError, match="at least two"):
        model_agreement({"a": sweeps["a"]})


def test_framing_matches_scipy(sweep) -> None:
    fr = prompt_framing(sweep)
    g, b, w = (sweep.values(x).double().numpy() for x in sweep.labels)
    assert fr.kendall_tau_b[0, 1] == pytest.approx(stats.kendalltau(g, b).statistic)
    assert fr.spearman_rho[1, 2] == pytest.approx(stats.spearmanr(b, w).statistic)
    assert fr.kendall_tau_b[0, 1] > 0.5 and fr.kendall_tau_b[1, 2] < -0.3  # worst reverses
    shifts = fr.shifts("best", "worst", k=5)
    change = (percentiles(sweep, "worst") - percentiles(sweep, "best")).numpy()
    assert shifts["change"].iloc[0] == pytest.approx(change.max())
    assert shifts["change"].iloc[-1] == pytest.approx(np.sort(change)[4])
    assert len(fr.to_dataframe()) == 3 and fr.plot("best", "worst").data


def _word_frame(sweep: VocabSweep, label: str) -> pd.DataFrame:
    """Independent word table: afinn's own scorer, scipy's z-score, per-word mean."""
    import re

    from afinn import Afinn

    afinn = Afinn()
    z = stats.zscore(sweep.values(label).double().numpy())
    rows = [(t.strip().lower(), z[i]) for i, t in enumerate(sweep.tokens)
            if re.fullmatch(r"[A-Za-z]+(?:-[A-Za-z]+)*", t.strip())]
    df = pd.DataFrame(rows, columns=["word", "value"]).groupby("word", as_index=False).mean()
    df["valence"] = [afinn.score(w) for w in df["word"]]
    return df


def test_valence_asymmetry_matches_linregress(sweep) -> None:
    asym = valence_asymmetry(sweep, "best")
    words = _word_frame(sweep, "best")
    for side, part in (("positive", words[words.valence > 0]),
                       ("negative", words[words.valence < 0])):
        ref = stats.linregress(part["valence"], part["value"])
        row = asym.to_dataframe().set_index("side").loc[side]
        assert row["n_words"] == len(part)
        assert row["slope"] == pytest.approx(ref.slope, rel=1e-9)
        assert row["slope_se"] == pytest.approx(ref.stderr, rel=1e-9)
        assert row["slope_p"] == pytest.approx(ref.pvalue, rel=1e-6)
    assert asym.slope_ratio < 0.5 and asym.slope_difference_p < 0.01  # built in: 0.2 vs 0.8
    assert asym.plot().data


def test_frequency_bias_matches_statsmodels(sweep) -> None:
    sm = pytest.importorskip("statsmodels.api")
    import wordfreq

    freq = frequency_bias(sweep, "best")
    words = _word_frame(sweep, "best")
    words["zipf"] = [wordfreq.zipf_frequency(w, "en") for w in words["word"]]
    words = words[words["zipf"] > 0]
    x = np.column_stack([words["zipf"], words["valence"].clip(lower=0),
                         words["valence"].clip(upper=0)])
    ref = sm.OLS(words["value"].to_numpy(), sm.add_constant(x)).fit()
    np.testing.assert_allclose(freq.controlled.coef, ref.params, rtol=1e-8)
    np.testing.assert_allclose(freq.controlled.se, ref.bse, rtol=1e-8)
    assert freq.coefficient == pytest.approx(ref.params[1])
    assert freq.controlled.n == len(words)
    assert set(freq.to_dataframe()["model"]) == {"value ~ zipf",
                                                 "value ~ zipf + valence_pos + valence_neg"}
    assert freq.plot().data
