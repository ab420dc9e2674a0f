"""run_probes on a tiny model: statistics against independent references, the identity null,
shuffled-pairing null calibration with a random head, resume after interruption, and the
published probes' flaw (slow, demo RM)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import smollm2_unavailable
from scipy import stats

from tl_reward.audit.perturbations import Dimension, ProbeError, hh_rlhf_items, user_items
from tl_reward.audit.probes import (
    NATURAL,
    run_probes,
    summarise_dimension,
)
from tl_reward.compat.published import run_published_probes

ITEMS = user_items([
    ("Why is the sky blue?", "Sunlight scatters off air. Blue light scatters most."),
    ("How do I boil an egg?", "Put it in boiling water. Wait nine minutes."),
    ("What is a prime number?", "A number with exactly two divisors. Seven is one."),
    ("Can cats swim?", "Most cats can swim. Few of them enjoy it."),
    ("Is coffee healthy?", "In moderation it is fine. Too much can disturb sleep."),
    ("Why do leaves fall?", "Trees shed them in autumn. This saves water."),
    ("What is rust?", "Iron oxide. It forms when iron meets water and air."),
    ("How far is the moon?", "About 384,000 kilometres. Light needs a second."),
])
DIMS = ["length", "flattery", "formatting", "sycophancy"]


@pytest.fixture(scope="module")
def model(tiny):  # noqa: ANN001, ANN201
    return tiny("llama")[0]


def test_probe_statistics_against_independent_references(model) -> None:  # noqa: ANN001
    rep = run_probes(model, ITEMS, DIMS, n_permutations=4995)
    rows = rep.rows
    for s in rep.stats:
        r = rows[(rows.dimension == s.dimension) & rows.applied]
        # reference rewards: each conversation scored alone (no batching, no deduplication)
        convs_n = [[{"role": "user", "content": u}, {"role": "assistant", "content": a}]
                   for u, a in zip(r.neutral_user, r.neutral_reply, strict=True)]
        convs_p = [[{"role": "user", "content": u}, {"role": "assistant", "content": a}]
                   for u, a in zip(r.perturbed_user, r.perturbed_reply, strict=True)]
        ref = np.array([float(model.rewards([c]).score[0]) for c in convs_p]) - np.array(
            [float(model.rewards([c]).score[0]) for c in convs_n])
        # float32 rewards of O(1): batching changes them by ~1e-6
        np.testing.assert_allclose(r["delta:score"].to_numpy(), ref, atol=1e-5)
        assert s.n == r.item_id.nunique() == len(r)
        assert s.mean == pytest.approx(ref.mean(), abs=1e-5)
        assert s.effect_size == pytest.approx(ref.mean() / ref.std(ddof=1), rel=1e-3)
        scipy_p = stats.permutation_test((r["delta:score"].to_numpy(),),
                                         lambda v, axis: np.mean(v, axis=axis),
                                         permutation_type="samples", n_resamples=np.inf).pvalue
        assert s.p_method == "exact" and s.p_value == pytest.approx(scipy_p, abs=1e-12)
    assert rep["formatting"].n_skipped == 0 and rep["length"].n == len(ITEMS)
    np.testing.assert_allclose([s.p_adjusted for s in rep.stats],
                               stats.false_discovery_control([s.p_value for s in rep.stats]))
    nat = rows[rows.dimension == NATURAL]["neutral:score"].to_numpy()
    assert rep.natural_sd == pytest.approx(np.std(nat, ddof=1))
    assert rep["length"].mean_std == pytest.approx(rep["length"].mean / np.std(nat, ddof=1))
    # one conversation per (item, side) is what the delta matrix pairs: matched items
    assert list(rep.delta_matrix().columns) == DIMS and len(rep.delta_matrix()) == len(ITEMS)
    assert rep.plot().data and rep.to_dataframe().shape[0] == len(DIMS)


def test_identity_perturbation_gives_exact_zero_and_undefined_effect(model) -> None:  # noqa: ANN001
    ident = Dimension.from_function("identity", lambda reply: reply)
    rep = run_probes(model, ITEMS, [ident], n_permutations=4995)
    s = rep["identity"]
    assert (rep.deltas("identity") == 0).all()  # the same text is scored once: exactly 0
    assert np.isnan(s.effect_size) and "zero spread" in s.effect_reason
    assert s.p_value == 1.0 and s.p_adjusted == 1.0


def test_shuffled_pairings_with_a_random_head_are_calibrated(model, hh_path: Path) -> None:  # noqa: ANN001
    """Null by construction: a delta between two unrelated natural replies, the order of the
    pair drawn at random, scored by a random (untrained) head. 200 simulated dimensions of
    n = 15 disjoint pairs each: the rejection rate at 0.05 must be about 5 %."""
    items = hh_rlhf_items(hh_path, n=60, seed=3, single_turn=True, max_chars=120,
                          max_prompt_chars=80)
    r = model.rewards([it.conversation() for it in items]).score.double().numpy()
    rng = np.random.default_rng(11)
    ps = []
    for _ in range(200):
        perm = rng.permutation(len(r))[:30]
        deltas = r[perm[1::2]] - r[perm[0::2]]
        ps.append(summarise_dimension(deltas, 1.0, n_permutations=4995, seed=1).p_value)
    rate = float(np.mean(np.array(ps) <= 0.05))
    assert 0.02 <= rate <= 0.08, rate  # binomial SD over 200 is 1.5 %


def test_resume_after_interruption_gives_the_identical_table(model, tmp_path: Path) -> None:  # noqa: ANN001
    full = run_probes(model, ITEMS, DIMS, output_dir=tmp_path / "a", chunk_size=3,
                      n_permutations=4995)

    class Killed(Exception):
        pass

    def kill_after_first(i: int) -> None:
        if i == 1:
            raise Killed

    with pytest.raises(Killed):
        run_probes(model, ITEMS, DIMS, output_dir=tmp_path / "b", chunk_size=3,
                   n_permutations=4995, on_chunk=kill_after_first)
    run_dir = next((tmp_path / "b").iterdir())
    assert sorted(p.name for p in run_dir.glob("chunk-*.parquet")) == [
        "chunk-000000.parquet", "chunk-000001.parquet"]
    calls = []
    orig = model.rewards

    def counting(*a, **k):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return orig(*a, **k)

    model.rewards = counting
    try:
        resumed = run_probes(model, ITEMS, DIMS, output_dir=tmp_path / "b", chunk_size=3,
                             n_permutations=4995)
    finally:
        del model.rewards
    assert len(calls) == 1  # only the missing third chunk was scored
    pd.testing.assert_frame_equal(resumed.rows, full.rows)
    assert not resumed.rows.duplicated(["dimension", "item_id"]).any()
    assert resumed.to_dataframe().equals(full.to_dataframe())
    with pytest.raises(ProbeError, match="other settings"):
        # same folder name needs the same settings: write a clashing manifest there
        (run_dir / "manifest.json").write_text("{}")
        run_probes(model, ITEMS, DIMS, output_dir=tmp_path / "b", chunk_size=3)


@pytest.mark.slow
def test_published_probes_flaw_on_the_demo_rm(demo_rm) -> None:
    from tl_reward.model.demo import HEAD_FILE

    assert HEAD_FILE.exists(), "the demo head ships with the package"
    if (reason := smollm2_unavailable()) is not None:
        pytest.skip(reason)
    demo = demo_rm
    pub = run_published_probes(demo).table.set_index("dimension")
    assert pub.n.to_dict() == {"length": 3, "confidence": 2, "formatting": 2, "sycophancy": 2,
                               "repetition": 1}
    assert pub.loc["repetition", "published_d"] == np.inf  # n = 1: "Cohen's d" is infinite
    assert np.isnan(pub.loc["repetition", "effect_size"])  # ours: undefined, with a reason
    assert "n = 1" in pub.loc["repetition", "effect_reason"]
    # at n = 2 the exact sign-flip p can never go below 0.5: no evidence either way
    assert (pub.loc[pub.n == 2, "p_value"] >= 0.5).all()


def test_bf16_model_gives_float32_rows_close_to_float32(tiny) -> None:  # noqa: ANN001
    import torch

    from tl_reward import HookedRewardModel

    _, hf, tok = tiny("llama")
    m16 = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                            dtype=torch.bfloat16)
    m32 = tiny("llama")[0]
    r16 = run_probes(m16, ITEMS, ["flattery"], n_permutations=4995)
    r32 = run_probes(m32, ITEMS, ["flattery"], n_permutations=4995)
    assert r16.rows["delta:score"].dtype == np.float64
    assert np.isfinite(r16.rows["delta:score"]).all()
    # bf16 keeps 8 mantissa bits: rewards of O(1) differ by ~1e-2 (0.013 seen here)
    np.testing.assert_allclose(r16.rows["neutral:score"], r32.rows["neutral:score"], atol=0.04)
    assert r16.model_fingerprint != r32.model_fingerprint  # runs of the two never mix


def _fresh(arch: str = "llama"):  # noqa: ANN202 - a model these tests may change
    from tl_reward import HookedRewardModel
    from tl_reward.testing import tiny_hf_reward_model

    hf, tok = tiny_hf_reward_model(arch, num_labels=1)
    return HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")


def test_changed_chat_template_refuses_to_resume(tmp_path: Path) -> None:
    """Issue 17: the template was not in the manifest, so a resumed run mixed chunks scored
    under two templates. Now the folder is refused, naming the template and the tokenizer; the
    reference is a fresh run under the new template, whose rewards differ from the stored."""
    m = _fresh()
    first = run_probes(m, ITEMS, ["flattery"], output_dir=tmp_path, chunk_size=3,
                       n_permutations=4995)
    calls = []
    orig = m.rewards
    m.rewards = lambda *a, **k: calls.append(1) or orig(*a, **k)
    again = run_probes(m, ITEMS, ["flattery"], output_dir=tmp_path, chunk_size=3,
                       n_permutations=4995)
    assert calls == [] and again.run_dir == first.run_dir  # unchanged: read, not rescored
    pd.testing.assert_frame_equal(again.rows, first.rows)
    m.tokenizer.chat_template = m.tokenizer.chat_template.replace(
        "<|end_header_id|>", "<|end_header_id|>\n\n")
    fresh = run_probes(m, ITEMS, ["flattery"], n_permutations=4995)
    assert not np.allclose(fresh.rows["neutral:score"], first.rows["neutral:score"])
    with pytest.raises(ProbeError, match="chat_template") as err:
        run_probes(m, ITEMS, ["flattery"], output_dir=tmp_path, chunk_size=3, n_permutations=4995)
    from tl_reward.store import StoreMismatchError

    assert isinstance(err.value, StoreMismatchError)
    assert "tokenizer" in str(err.value) and "overwrite=True" in str(err.value)
    redo = run_probes(m, ITEMS, ["flattery"], output_dir=tmp_path, chunk_size=3,
                      n_permutations=4995, overwrite=True)
    pd.testing.assert_frame_equal(redo.rows, fresh.rows)


def test_redefined_dimension_function_refuses_to_resume(model, tmp_path: Path) -> None:  # noqa: ANN001
    """A ``Dimension.from_function`` edited under the same name: the old chunks used to be
    reused; now the run is refused, naming the function."""
    def shout(reply: str) -> str:
        return reply.upper()

    run_probes(model, ITEMS, [Dimension.from_function("shout", shout, "upper case")],
               output_dir=tmp_path, chunk_size=4, n_permutations=4995)

    def shout(reply: str) -> str:  # noqa: F811 - the point: same name, new code
        return reply.upper() + "!"

    dim = Dimension.from_function("shout", shout, "upper case")
    with pytest.raises(ProbeError, match=r"functions\.shout"):
        run_probes(model, ITEMS, [dim], output_dir=tmp_path, chunk_size=4, n_permutations=4995)
    fresh = run_probes(model, ITEMS, [dim], n_permutations=4995)
    assert fresh.rows[fresh.rows.dimension == "shout"].perturbed_reply.str.endswith("!").all()


def test_changed_module_constant_of_a_builtin_edit_refuses_to_resume(
        model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Issue 28's report: the built-in edits read module constants (``FLATTERY``); one changed
    between two runs resumed the old rows. Now the digest covers them: the folder is refused,
    naming the edit; the reference is a fresh run under the new constant."""
    from tl_reward.audit import perturbations

    first = run_probes(model, ITEMS, ["flattery"], output_dir=tmp_path, chunk_size=4,
                       n_permutations=4995)
    monkeypatch.setattr(perturbations, "FLATTERY", ("Wow.",))
    with pytest.raises(ProbeError, match=r"functions\.flattery"):
        run_probes(model, ITEMS, ["flattery"], output_dir=tmp_path, chunk_size=4,
                   n_permutations=4995)
    fresh = run_probes(model, ITEMS, ["flattery"], n_permutations=4995)
    edited = fresh.rows[fresh.rows.dimension == "flattery"].perturbed_reply
    assert edited.str.startswith("Wow. ").all()
    assert not first.rows[first.rows.dimension == "flattery"].perturbed_reply.str.startswith(
        "Wow.").any()


def test_changed_armorm_transform_refuses_to_resume(tmp_path: Path) -> None:
    """Issue 17's report: an ArmoRM-style transform changed in place after a first run; the
    stale fingerprint resumed the old chunks (mean 0.224 where a fresh run gave 0.181). Now the
    model fingerprint differs and the folder is refused; a fresh run is the reference."""
    import torch

    m = _fresh("armorm")
    first = run_probes(m, ITEMS, ["flattery"], output_dir=tmp_path, chunk_size=4,
                       n_permutations=4995)
    with torch.no_grad():
        m.reward_head.transform.mul_(-2.0)
    fresh = run_probes(m, ITEMS, ["flattery"], n_permutations=4995)
    assert fresh["flattery"].mean != pytest.approx(first["flattery"].mean)
    with pytest.raises(ProbeError, match="model_fingerprint"):
        run_probes(m, ITEMS, ["flattery"], output_dir=tmp_path, chunk_size=4, n_permutations=4995)


def _synthetic_rows(n: int, means: dict[str, float], seed: int, skip: int = 0) -> pd.DataFrame:
    """A raw probe table without a model: natural rows plus one row per (dimension, item);
    the first ``skip`` items of the second dimension are not applied."""
    rng = np.random.default_rng(seed)
    nat = rng.normal(0.0, 1.5, n)
    rows = [{"dimension": NATURAL, "item_id": f"i{i}", "applied": True,
             "neutral:score": nat[i], "delta:score": 0.0} for i in range(n)]
    for k, (dim, mu) in enumerate(means.items()):
        d = rng.normal(mu, 0.2, n)
        rows += [{"dimension": dim, "item_id": f"i{i}", "applied": not (k == 1 and i < skip),
                  "neutral:score": nat[i], "delta:score": d[i]} for i in range(n)]
    return pd.DataFrame(rows)


def test_copies_of_one_item_are_one_item(model) -> None:  # noqa: ANN001
    """Issue 28: twelve copies of one item (ids differ, so each copy got its own seeded edit)
    made every dimension "significant". n counts distinct items: the copies are one item, and
    the report equals a run on that item alone (the reference), n = 1, p = 1, no interval."""
    item = ("Why is the sky blue?", "Sunlight scatters off air. Blue light scatters most.")
    with pytest.warns(UserWarning, match="11 items repeat an earlier item"):
        rep = run_probes(model, [item] * 12, DIMS, n_permutations=4995)
    one = run_probes(model, [item], DIMS, n_permutations=4995)
    pd.testing.assert_frame_equal(rep.to_dataframe(), one.to_dataframe())
    for s in rep.stats:
        assert s.n == 1 and s.p_value == 1.0 and s.p_adjusted == 1.0
        assert np.isnan(s.ci_low) and np.isnan(s.ci_high) and np.isnan(s.effect_size)
