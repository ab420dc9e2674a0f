"""Faithfulness report: its scores are the patching/attribution results, its rhos are scipy's,
its cache resumes without recomputing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy import stats

import tl_reward.analysis.faithfulness as faith
from tl_reward.analysis.attribution import differential_attribution
from tl_reward.analysis.patching import activation_patching
from tl_reward.data import PreferencePair

PAIRS = [PreferencePair.from_prompt("Is the sky blue?", "Yes, the sky is blue.", "No, it is red."),
         PreferencePair.from_prompt("hi", "Hello! How can I help?", "Go away."),
         PreferencePair.from_prompt("What is love?", "Love. Friendship. Music.", "Hate. War.")]


def test_report_scores_rhos_and_cache(tiny, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _, _ = tiny("gpt2", 1)
    rep = faith.faithfulness_report(model, PAIRS, level="sublayer", cache_dir=tmp_path,
                                    progress=False)
    n = model.cfg.n_layers
    assert rep.names == ["embed"] + [f"L{i}.{k}" for i in range(n) for k in ("attn", "mlp")]
    # causal scores are whole-sublayer patching effects on the aligned positions
    for mode in ("noising", "denoising"):
        attn = activation_patching(model, PAIRS[0], "attn_out", mode, positions="all")
        mlp = activation_patching(model, PAIRS[0], "mlp_out", mode, positions="all")
        torch.testing.assert_close(rep.scores[mode][0, 1::2], attn.effect, atol=1e-4, rtol=0)
        torch.testing.assert_close(rep.scores[mode][0, 2::2], mlp.effect, atol=1e-4, rtol=0)
    # observational: DRA difference / margin, summing (with the head bias, 0 here) to 1
    pa = differential_attribution(model, PAIRS[:1])
    diff, names = pa.difference()
    assert names[:2] == ["embed", "pos_embed"]  # gpt2: merged into one "embed" component
    torch.testing.assert_close(rep.scores["dra_diff"][0, 1:], diff[0, 2:, 0] / pa.margin[0, 0],
                               atol=1e-4, rtol=0)
    assert float(rep.scores["dra_diff"][0].sum()) == pytest.approx(1.0, abs=1e-4)
    # per-pair rho is scipy's Spearman; the summary mean is their mean
    rho = rep.rho()
    for i in range(len(PAIRS)):
        a, b = rep.scores["dra_diff"][i].numpy(), rep.scores["noising"][i].numpy()
        assert rho.iloc[i]["dra_diff|noising|signed"] == pytest.approx(
            stats.spearmanr(a, b).statistic, abs=1e-9)
        assert rho.iloc[i]["dra_diff|noising|abs"] == pytest.approx(
            stats.spearmanr(np.abs(a), np.abs(b)).statistic, abs=1e-9)
    summ = rep.summary(n_permutations=500)
    row = summ[(summ.observational == "dra_diff") & (summ.causal == "noising")
               & (summ.kind == "signed")].iloc[0]
    assert row.mean_rho == pytest.approx(rho["dra_diff|noising|signed"].mean())
    assert summ.published_anchor.sum() == 1
    # 3 pairs: the sign-flip test cannot reach p < 0.05 (its smallest p is 0.25), so no interval
    assert np.isnan(summ.ci_low).all() and np.isnan(summ.ci_high).all()
    assert (summ.p_value >= 0.25).all()
    # resuming from the cache recomputes nothing and gives the same report
    monkeypatch.setattr(faith, "pair_scores", lambda *a, **k: pytest.fail("recomputed"))
    again = faith.faithfulness_report(model, PAIRS, level="sublayer", cache_dir=tmp_path,
                                      progress=False)
    torch.testing.assert_close(again.scores["noising"], rep.scores["noising"])
    back = faith.FaithfulnessReport.load(rep.save(tmp_path / "r.tlr"))
    assert back.names == rep.names and back.meta == rep.meta
    assert all(torch.equal(back.scores[k], v) and back.scores[k].dtype == v.dtype
               for k, v in rep.scores.items())
    # a report written as JSON by the old save still loads
    (tmp_path / "old.json").write_text(json.dumps({
        "level": rep.level, "objective": rep.objective, "names": rep.names,
        "deltas": rep.deltas.tolist(), "pair_ids": rep.pair_ids, "meta": rep.meta,
        "scores": {k: v.tolist() for k, v in rep.scores.items()}}))
    old = faith.FaithfulnessReport.load(tmp_path / "old.json")
    torch.testing.assert_close(old.scores["noising"], rep.scores["noising"])


def _tiny(pooling: str = "hf"):
    from tl_reward import HookedRewardModel
    from tl_reward.testing import tiny_hf_reward_model

    hf, tok = tiny_hf_reward_model("gpt2", num_labels=1, seed=0)
    return HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                             pooling=pooling)


def test_cache_never_mixes_models(tmp_path) -> None:
    """Two in-memory models with the same name and depth, differing in one body weight (then
    only in the pooling rule), must not read each other's cached pairs."""
    a, b = _tiny(), _tiny()
    with torch.no_grad():
        b.blocks[0].mlp.W_in[:, 3] *= 5.0  # a body weight: the head and embeddings unchanged
    assert a.cfg.model_name == b.cfg.model_name and a.cfg.n_layers == b.cfg.n_layers
    ra = faith.faithfulness_report(a, PAIRS[:1], cache_dir=tmp_path, progress=False)
    rb = faith.faithfulness_report(b, PAIRS[:1], cache_dir=tmp_path, progress=False)
    rb_fresh = faith.faithfulness_report(b, PAIRS[:1], progress=False)
    assert len(list(tmp_path.glob("*.json"))) == 2  # one entry per model
    assert ra.pair_ids != rb.pair_ids
    assert not torch.allclose(ra.deltas, rb_fresh.deltas, atol=1e-3)  # the models differ
    torch.testing.assert_close(rb.deltas, rb_fresh.deltas)  # B's own values, not A's
    torch.testing.assert_close(rb.scores["noising"], rb_fresh.scores["noising"])
    rc = faith.faithfulness_report(_tiny(pooling="mask"), PAIRS[:1], cache_dir=tmp_path,
                                   progress=False)
    assert rc.pair_ids[0] not in (ra.pair_ids[0], rb.pair_ids[0])
    assert len(list(tmp_path.glob("*.json"))) == 3


def test_only_zero_margins_are_skipped_and_every_other_error_is_raised() -> None:
    """The report used to catch every library error and count the pair as skipped."""
    from tl_reward.errors import ContextLengthError, TLRewardError

    model = _tiny()
    good = PreferencePair.from_prompt("hi", "Hello! How can I help?", "Go away.")
    same = PreferencePair.from_prompt("hi", "Same.", "Same.")  # margin exactly 0
    too_long = PreferencePair.from_prompt("hi", "Yes. " * 200, "No.")  # > n_ctx = 256 tokens
    rep = faith.faithfulness_report(model, [good, same], progress=False)
    assert len(rep) == 1 and [s["pair"] for s in rep.meta["skipped"]] == [1]
    assert "margin is exactly 0" in rep.meta["skipped"][0]["reason"]
    with pytest.raises(ContextLengthError, match="context"):
        faith.faithfulness_report(model, [good, too_long], progress=False)
    with pytest.raises(TLRewardError, match="all 1 pairs have a reward margin of exactly 0"):
        faith.faithfulness_report(model, [same], progress=False)


def test_cache_sees_a_buffer_changed_after_a_first_call(tmp_path) -> None:
    """Issue 17: the fingerprint was memoised on the parameters alone, so ArmoRM's transform
    changed in place after a first report kept the cache keys and the stale pairs were read.
    The reference is a fresh report (no cache) of the changed model."""
    from tl_reward import HookedRewardModel
    from tl_reward.testing import tiny_hf_reward_model

    hf, tok = tiny_hf_reward_model("armorm", num_labels=1, seed=0)
    m = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
    first = faith.faithfulness_report(m, PAIRS[:2], objective="score", cache_dir=tmp_path,
                                       progress=False)
    with torch.no_grad():
        m.reward_head.transform.mul_(-2.0)
    again = faith.faithfulness_report(m, PAIRS[:2], objective="score", cache_dir=tmp_path,
                                       progress=False)
    fresh = faith.faithfulness_report(m, PAIRS[:2], objective="score", progress=False)
    assert not torch.allclose(first.deltas, fresh.deltas)  # the change matters
    torch.testing.assert_close(again.deltas, fresh.deltas, rtol=0, atol=0)  # same code path
    torch.testing.assert_close(again.scores["noising"], fresh.scores["noising"], rtol=0, atol=0)
    assert again.pair_ids != first.pair_ids  # new keys: the stale entries are not read


def test_summary_interval_agrees_with_its_test() -> None:
    """Issue 28: on 6 pairs the summary showed an interval excluding 0 beside p = 0.0625 (a
    percentile bootstrap beside a sign-flip test). Now the interval inverts the same test: it
    excludes 0 exactly when p < 0.05, on the issue's case (rho 1 on five pairs, 0 on one) and
    on random reports of 6 to 12 pairs."""
    names = ["c0", "c1", "c2", "c3"]

    def report(scores: dict[str, torch.Tensor]) -> faith.FaithfulnessReport:
        n = len(next(iter(scores.values())))
        return faith.FaithfulnessReport("sublayer", "score", names, scores, torch.ones(n),
                                        [f"p{i}" for i in range(n)])

    base = torch.arange(1.0, 5.0).repeat(6, 1)
    noising = base.clone()
    noising[5] = torch.tensor([2.0, 4.0, 1.0, 3.0])  # Spearman rho 0 with 1, 2, 3, 4
    scores = {k: base for k in faith.OBSERVATIONAL + faith.CAUSAL} | {"noising": noising}
    row = report(scores).summary().set_index(["observational", "causal", "kind"]).loc[
        ("dra_diff", "noising", "signed")]
    assert row.mean_rho == pytest.approx(5 / 6) and row.p_value == pytest.approx(4 / 64)
    assert row.ci_low <= 0 <= row.ci_high  # the old interval was [0.5, 1]
    gen = torch.Generator().manual_seed(0)
    called = 0
    for n in (6, 7, 8, 12):
        for _ in range(5):
            shared = torch.randn(n, 4, generator=gen, dtype=torch.float64)
            summ = report({k: shared + torch.randn(n, 4, generator=gen, dtype=torch.float64)
                           for k in faith.OBSERVATIONAL + faith.CAUSAL}).summary()
            excludes = (summ.ci_low > 0) | (summ.ci_high < 0)
            assert (excludes == (summ.p_value < 0.05)).all()
            called += int(excludes.sum())
    assert called > 0  # both outcomes occur
