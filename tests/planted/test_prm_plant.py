"""Scorecard of the planted process reward model (``tl_reward.planted.prm``).

Two step rules of known mechanism: rule A (a step holding ``a`` drops by ``c``: a block-0
detector and a last-block reader) and rule B (every step from the one holding ``b`` on drops by
``c``: one block-0 head). The truth is measured by exact ablation before any analysis runs;
then each analysis must find it, and each check is shown to fail on a plausible bug (a number
moves beyond the check's tolerance).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import parity_atol

from tl_reward import HookedRewardModel
from tl_reward.analysis.attribution import direct_reward_attribution
from tl_reward.analysis.patching import activation_patching
from tl_reward.circuits import RewardCircuit, edge_attribution, evaluate_circuit
from tl_reward.data.pairs import align_ids
from tl_reward.errors import TLRewardError
from tl_reward.model.inputs import EncodedInput
from tl_reward.planted import plant_prm
from tl_reward.planted.prm import pair_prefixes, step_drops, step_scores
from tl_reward.planted.recovery import rank_of
from tl_reward.planted.store import load_planted, save_planted, truth_from_json, truth_to_json
from tl_reward.process import step_propagation, step_sources
from tl_reward.testing import tiny_hf_reward_model
from tl_reward.testing.prm_plant import (
    A_PAIRS,
    B_PAIRS,
    PROMPTS,
    C,
    K,
    hooked_prm,
    tiny_planted_prm,
)

EXACT = 1e-4  # where no rule fires, a drop is float32 noise (measured ~1e-6)


@pytest.fixture(scope="module")
def planted() -> Any:
    return tiny_planted_prm()


@pytest.fixture(scope="module")
def model(planted: Any) -> HookedRewardModel:
    return hooked_prm(planted)


@pytest.fixture(scope="module")
def outcome(planted: Any) -> HookedRewardModel:
    """The bug "read one position after the tag": the same weights read at the last token."""
    return hooked_prm(planted, steps=False)


def _one_after(model: HookedRewardModel, prefixes: list[EncodedInput], pairs: list[Any],
               side: int) -> list[EncodedInput]:
    """Each prefix of ``side`` (0: the token's, 1: the counterfactual's) with the next id of
    its whole solution: the tag is no longer last."""
    whole = model.encode_steps([p[side] for p in pairs])[0]
    return [EncodedInput(w.ids[: len(p.ids) + 1]) for p, w in zip(prefixes, whole, strict=True)]


def _holds(model: HookedRewardModel, pairs: list[Any], token: int) -> None:
    for x, _, j in pairs:
        e = model.encode_steps([x], j)[0][0]
        assert token in e.ids[(e.read_at[j - 1] if j else e.response_start):], (x, j)


# ----------------------------------------------------------------- the truth, measured first


def test_truth_is_measured_before_any_analysis(planted: Any) -> None:
    t = planted.truth
    assert (t.detector, t.reader, t.b_head) == ((0, 0), (2, 0), (0, 1))
    for spread in (t.drop_a, t.drop_b):
        assert spread[0] == pytest.approx(C, rel=1e-3)
        assert 0.6 * C < spread[1] <= spread[2] < 1.4 * C
    assert 0.6 * C < t.drop_b_own[1] <= t.drop_b_own[2] < 1.4 * C  # b's own step: fires too
    assert max(t.off_target, *t.ablated, t.base_drop) < EXACT  # exact zeros up to float32
    assert t.base_gap < 0.01  # the pads' share of the norms
    assert min(t.margins) == pytest.approx(30.0, abs=1e-6)
    assert truth_from_json(truth_to_json(t)) == t
    base, mine = planted.base.state_dict(), planted.model.state_dict()
    changed = {k for k in mine if not torch.equal(mine[k], base[k])}
    assert changed == {f"model.layers.{i}.self_attn.{x}_proj.weight" for i in (0, 2)
                       for x in "qkvo"} | {"score.weight"}


def test_hooked_step_rewards_are_hf_step_scores(planted: Any, model: HookedRewardModel) -> None:
    sols = [s for x, y, _ in (*A_PAIRS, *B_PAIRS) for s in (x, y)]
    ids = [e.ids for e in model.encode_steps(sols)[0]]
    ref = torch.cat(step_scores(planted.model, ids, planted.truth.tag_id, (-1, 1)))
    got = model.rewards(sols).score.double()
    assert torch.allclose(got, ref, rtol=0, atol=parity_atol(ref, model.cfg.n_layers))


# ------------------------------------------------------------------------ 1. the rules hold


def test_rules_drop_the_right_steps_and_the_base_none(planted: Any, model: HookedRewardModel,
                                                      outcome: HookedRewardModel) -> None:
    t = planted.truth
    _holds(model, A_PAIRS, t.a_id)
    _holds(model, B_PAIRS, t.b_id)
    for pairs, fires in ((A_PAIRS, lambda k, j: k == j), (B_PAIRS, lambda k, j: k >= j)):
        for drop, (x, y, j) in zip(step_drops(model, pairs), pairs, strict=True):
            on = torch.tensor([fires(k, j) for k in range(len(drop))])
            assert bool(((drop[on] > 0.6 * C) & (drop[on] < 1.4 * C)).all()), drop
            assert bool((drop[~on].abs() < EXACT).all()), drop
            prop = step_propagation(model, x, y)  # the same, through the library's API
            assert prop.changed == [j] and torch.allclose(prop.effect, drop, atol=EXACT)
    base = hooked_prm(planted, "base")
    assert float(torch.cat(step_drops(base, A_PAIRS + B_PAIRS)).abs().max()) < EXACT
    # bug: reading the score one position after the tag; no rule holds there
    for pairs, step in ((A_PAIRS, None), (B_PAIRS, K)):
        mine, cf = pair_prefixes(model, pairs, step)
        shifted = (outcome.rewards(_one_after(model, cf, pairs, 1)).score
                   - outcome.rewards(_one_after(model, mine, pairs, 0)).score)
        assert float(shifted.abs().max()) < 0.25 * C, shifted


# ------------------------------------------------------------------ 2. the source of each drop


def test_step_sources_finds_the_step_each_drop_is_read_from(model: HookedRewardModel) -> None:
    n = len(B_PAIRS)
    ss = step_sources(model, [s for i in (0, 1) for s in (p[i] for p in B_PAIRS)], step=K)
    assert torch.allclose(ss.total(), ss.reward, atol=1e-5)
    diff = (ss.values[:n] - ss.values[n:]).nan_to_num(0.0)
    drops = ss.reward[n:] - ss.reward[:n]
    for i, (_, _, j) in enumerate(B_PAIRS):
        assert ss.sources[int(diff[i].argmin())] == f"step {j}"  # the earlier step holding b
        assert float(diff[i, 1 + j]) == pytest.approx(-float(drops[i]), abs=EXACT)
        rest = torch.cat([diff[i, : 1 + j], diff[i, 2 + j:]])
        assert float(rest.abs().max()) < EXACT
        # bug: splitting by where a head reads (the query's step), not where from
        where = torch.zeros_like(diff[i])
        where[1 + K] = diff[i].sum()
        assert ss.sources[int(where.argmin())] != f"step {j}"
    # bug: a split that ignores the prompt no longer sums to the reward
    assert float(ss.values[:, 0].abs().max()) > 0.05
    mine, cf = pair_prefixes(model, A_PAIRS)
    sa = step_sources(model, mine + cf, step="last")
    diff = (sa.values[: len(mine)] - sa.values[len(mine):]).nan_to_num(0.0)
    for i, (_, _, k) in enumerate(A_PAIRS):
        assert sa.sources[int(diff[i].argmin())] == f"step {k}"  # its own step
        assert float(diff[i].min()) < -0.6 * C


# ------------------------------------------------------------- 3. direct reward attribution


def _head_diff(dra: Any, n: int) -> tuple[torch.Tensor, list[str]]:
    vals, names = dra.components("head")
    return vals[:n, :, 0] - vals[n:, :, 0], names


def test_direct_attribution_ranks_the_planted_head_first(planted: Any, model: HookedRewardModel,
                                                         outcome: HookedRewardModel) -> None:
    t = planted.truth
    n = len(B_PAIRS)
    dra = direct_reward_attribution(model, [p[i] for i in (0, 1) for p in B_PAIRS], step=K)
    diff, names = _head_diff(dra, n)
    drops = dra.reward[n:, 0] - dra.reward[:n, 0]
    name_b, name_r = (f"L{x}.H{y}" for x, y in (t.b_head, t.reader))
    for i in range(n):
        assert rank_of(diff[i], names, name_b) == 1
        assert float(diff[i, names.index(name_b)]) == pytest.approx(-float(drops[i]), abs=EXACT)
    mine, cf = pair_prefixes(model, A_PAIRS)
    diff_a, _ = _head_diff(direct_reward_attribution(model, mine + cf), len(mine))
    for i in range(len(mine)):
        assert rank_of(diff_a[i], names, name_r) == 1 and float(
            diff_a[i, names.index(name_r)]) < -0.6 * C
    # bug: attributing the score one position after the tag; the head carries nothing there
    mine, cf = pair_prefixes(model, B_PAIRS, K)
    diff, _ = _head_diff(direct_reward_attribution(
        outcome, _one_after(model, mine, B_PAIRS, 0) + _one_after(model, cf, B_PAIRS, 1)), n)
    assert float(diff[:, names.index(name_b)].abs().max()) < 0.25 * C


# ---------------------------------------------------------------------- 4. activation patching


def test_patching_puts_the_effect_in_the_planted_heads(planted: Any,
                                                       model: HookedRewardModel) -> None:
    t = planted.truth
    for pairs, step, heads in ((B_PAIRS, K, [t.b_head]), (A_PAIRS, None, [t.detector, t.reader])):
        for x, y in zip(*pair_prefixes(model, pairs, step), strict=True):
            res = activation_patching(model, align_ids(x.ids, y.ids), site="head",
                                      positions="all")
            assert res.delta < -0.6 * C
            eff = res.effect.clone()
            for layer, h in heads:
                assert float(eff[layer, h]) > 0.99
                eff[layer, h] = 0.0
            assert float(eff.abs().max()) < 0.01
    # bug: patching the head where b stands rather than at the tag it is read from
    x, y = (side[0] for side in pair_prefixes(model, B_PAIRS, K))
    tp = align_ids(x.ids, y.ids)
    each = activation_patching(model, tp, site="head", layers=[0], units=[t.b_head[1]])
    at_b = x.ids.index(t.b_id)
    assert float(each.effect[0, 0, at_b]) == pytest.approx(0.0, abs=0.01)
    assert float(each.effect[0, 0, len(x.ids) - 1]) > 0.99


# ------------------------------------------------------------------------------- 5. circuits


def test_a_few_edges_carry_each_rule(planted: Any, model: HookedRewardModel) -> None:
    t = planted.truth
    clean, corrupt = pair_prefixes(model, B_PAIRS, K)
    att = edge_attribution(model, clean, corrupt, method="eap-ig")
    circuit = RewardCircuit.greedy(att, len(t.b_edges))
    assert set(circuit.edges()) == set(t.b_edges)
    assert evaluate_circuit(model, circuit, clean, corrupt).faithfulness.value >= 0.9
    # bug: plain EAP (a gradient at the clean input) scores the saturated key edge ~0, so its
    # greedy circuit of the same size lacks it and carries nothing
    eap = RewardCircuit.greedy(edge_attribution(model, clean, corrupt, method="eap"),
                               len(t.b_edges))
    assert ("input", f"a0.h{t.b_head[1]}", "k") not in eap.edges()
    assert abs(evaluate_circuit(model, eap, clean, corrupt).faithfulness.value) < 0.1
    clean, corrupt = pair_prefixes(model, A_PAIRS)
    exact = edge_attribution(model, clean, corrupt, method="exact")
    circuit = RewardCircuit.greedy(exact, len(t.a_edges))
    assert set(circuit.edges()) == set(t.a_edges)
    assert evaluate_circuit(model, circuit, clean, corrupt).faithfulness.value >= 0.9


def test_the_plant_saves_and_reloads(planted: Any, model: HookedRewardModel, tmp_path: Any
                                     ) -> None:
    again = load_planted(save_planted(planted, tmp_path / "prm"))
    assert again.truth == planted.truth
    ids = [e.ids for e in model.encode_steps([x for x, _, _ in B_PAIRS])[0]]
    for which in ("model", "base"):
        got, ref = (torch.cat(step_scores(getattr(p, which), ids, planted.truth.tag_id, (-1, 1)))
                    for p in (again, planted))
        assert torch.allclose(got, ref, rtol=0, atol=parity_atol(ref, model.cfg.n_layers))


# ------------------------------------------------------------------------------- bad inputs


def test_bad_arguments_are_named(planted: Any) -> None:
    hf, tok = tiny_hf_reward_model("llama", num_labels=2, tokenizer=planted.tokenizer)
    with pytest.raises(TLRewardError, match="holds the token"):
        plant_prm(hf, tok, " help", " he", prompts=("Can you help me?",))
    with pytest.raises(TLRewardError, match="both block-0 heads"):
        plant_prm(hf, tok, " help", " he", detector=1, b_head=1, prompts=PROMPTS)
    with pytest.raises(TLRewardError, match="four distinct"):
        plant_prm(hf, tok, " help", " he", a_counterfactual=" he", prompts=PROMPTS)
    with pytest.raises(TLRewardError, match="tokens; add it"):
        plant_prm(hf, tok, " help", " he", tag="<step>", prompts=PROMPTS)
