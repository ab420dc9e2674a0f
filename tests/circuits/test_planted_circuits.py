"""Ground truth: on the indirect plant (a head detects the trigger, the last MLP alone turns it
into reward; ``tl_reward.planted.indirect``) the planted edges are the top edges under exact
patching and EAP-IG, the circuit they form carries the whole effect, random circuits of the
same size carry none, and EAP-IG has converged at MIB's 5 steps. On the trigger-head plant the
truth is the head's path through the token's stream at the trigger (``stream_edges``), found
by EAP-IG at 100 steps, not 5."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest
import torch

from tl_reward import HookedRewardModel
from tl_reward.circuits import RewardCircuit, edge_attribution, evaluate_circuit
from tl_reward.planted import plant_indirect, plant_trigger_head
from tl_reward.planted.calibration import rewards
from tl_reward.planted.recovery import trigger_pairs
from tl_reward.testing import tiny_hf_reward_model

PROMPTS = ("Why is water wet?", "Tell me a joke.", "What, in one word, is the best thing ever?")


@cache
def setup() -> tuple[Any, HookedRewardModel, list[list[int]], list[list[int]]]:
    hf, tok = tiny_hf_reward_model("llama")
    p = plant_indirect(hf, tok, " sky", head=1)
    model = HookedRewardModel.from_pretrained(hf_model=p.model, tokenizer=tok, device="cpu")
    tps = trigger_pairs(tok, p.truth.trigger_id, p.model.config.vocab_size, PROMPTS,
                        swap=p.truth.counterfactual_id)
    return p.truth, model, [tp.ids("chosen") for tp in tps], [tp.ids("rejected") for tp in tps]


@cache
def attribution(method: str, steps: int = 5) -> Any:
    _, model, clean, corrupt = setup()
    return edge_attribution(model, clean, corrupt, method=method, ig_steps=steps)


@pytest.mark.parametrize("method", ["exact", "eap-ig"])
def test_planted_edges_are_the_top_edges(method: str) -> None:
    truth = setup()[0]
    df = attribution(method).to_dataframe()
    top = set(df.head(len(truth.edges))[["src", "dst", "qkv"]].itertuples(index=False,
                                                                         name=None))
    assert top == set(truth.edges)
    # every planted edge removes most of the shift (noising: negative), the rest almost none
    scores = df.set_index(["src", "dst", "qkv"])["score"]
    shift = float(setup()[1].rewards(setup()[2]).score.mean()
                  - setup()[1].rewards(setup()[3]).score.mean())
    rest = scores.drop(list(truth.edges)).abs().max()
    if method == "exact":
        assert all(scores[e] < -0.9 * shift for e in truth.edges), scores[list(truth.edges)]
    assert rest < 0.05 * shift


def test_eap_misses_the_saturated_key_edge() -> None:
    """Why EAP-IG: the planted head's attention is saturated at the clean input, so the
    gradient through its key is about 0 and plain EAP ranks the key edge far down."""
    truth = setup()[0]
    df = attribution("eap").to_dataframe()
    rank = {e: i for i, e in enumerate(df[["src", "dst", "qkv"]].itertuples(index=False,
                                                                            name=None))}
    key = next(e for e in truth.edges if e[2] == "k")
    assert rank[key] > 20 and max(rank[e] for e in truth.edges if e != key) < 4


def test_planted_circuit_is_faithful_and_random_circuits_are_not() -> None:
    truth, model, clean, corrupt = setup()
    att = attribution("eap-ig")
    circuit = RewardCircuit.from_edges(att.graph, list(truth.edges))
    assert circuit.n_edges == len(truth.edges)  # nothing dangling: a path input -> reward
    f = evaluate_circuit(model, circuit, clean, corrupt).faithfulness
    assert f.value >= 0.9 and f.ci_low >= 0.9
    edges, gen, values = att.graph.edges(), torch.Generator().manual_seed(0), []
    for _ in range(8):
        pick = torch.randperm(len(edges), generator=gen)[:len(truth.edges)].tolist()
        rc = RewardCircuit.from_edges(att.graph, [edges[i] for i in pick])
        values.append(evaluate_circuit(model, rc, clean, corrupt).faithfulness.value)
    assert max(abs(v) for v in values) < 0.1, values


def test_eap_ig_converges_in_the_step_count() -> None:
    """m vs 2m steps (IG convergence): on the planted value, head -> MLP and MLP -> reward
    edges the gap between m and 2m steps halves with each doubling (a right Riemann sum's
    1/m rate; measured 0.33, 0.15, 0.08 on the value edge for m = 5, 10, 20), and MIB's 5 steps
    are within 15 % of 40. A step count that is ignored gives gaps of 0 and fails."""
    truth = setup()[0]
    s = {m: attribution("eap-ig", m).to_dataframe().set_index(["src", "dst", "qkv"])["score"]
         for m in (5, 10, 20, 40)}
    for e in truth.edges:
        if e[2] == "k":  # saturated attention: a tiny score, converged by 20 steps
            continue
        gaps = [abs(s[m][e] - s[2 * m][e]) for m in (5, 10, 20)]
        assert gaps[1] < 0.6 * gaps[0] and gaps[2] < 0.6 * gaps[1], (e, gaps)
        assert abs(s[5][e] - s[40][e]) < 0.15 * abs(s[40][e]), e


# -- greedy selection, stability, held-out faithfulness ----------------------------------
def _greedy_by_hand(att: Any, n: int) -> list[tuple[str, str, str]]:
    """Greedy from the reward over the dataframe rows: a destination is open once ``reward``
    or a node it is an input of (a key/value head: any query head of its group) is a source of
    a picked edge; picks go on until the pruned circuit has ``n`` edges."""
    g, picked, nodes = att.graph, [], {"reward"}
    rows = list(att.to_dataframe()[["src", "dst", "qkv"]].itertuples(index=False, name=None))

    def opened(dst: str, qkv: str) -> bool:
        if qkv in ("k", "v"):
            layer, j = dst[1:].split(".h")
            return any(f"a{layer}.h{h}" in nodes for h in g.kv_group(int(j)))
        return dst in nodes

    while RewardCircuit.from_edges(g, picked).n_edges < n:
        e = next(e for e in rows if e not in picked and opened(*e[1:]))
        picked.append(e)
        nodes.add(e[0])
    return picked


@pytest.mark.parametrize("method", ["exact", "eap-ig", "eap"])
def test_greedy_grows_connected_circuits_from_the_reward(method: str) -> None:
    """Greedy(4) is the planted path under exact and EAP-IG; under EAP (which ranks the key
    edge far down) greedy still connects, where top(n) loses edges to pruning."""
    truth = setup()[0]
    att = attribution(method)
    if method != "eap":
        assert set(RewardCircuit.greedy(att, 4).edges()) == set(truth.edges)
    for n in (4, 8, 16, 32):
        c = RewardCircuit.greedy(att, n)
        assert set(c.edges()) == set(RewardCircuit.from_edges(att.graph,
                                                               _greedy_by_hand(att, n)).edges())
        assert c.n_edges >= n > RewardCircuit.top(att, n).n_edges or method != "eap"
    # measured: top(n) keeps 3, 6, 12, 20 of n = 4, 8, 16, 32 EAP edges; greedy 5, 8, 16, 32


def test_top_edges_are_stable_over_pairs_on_the_plant_only(tiny) -> None:
    """Bootstrap Jaccard of the top edges: 1 on the plant (every pair carries the same path),
    about 0.25 on random pairs of a random-weight model, and exactly 1 there too when every
    pair is the same pair (each resample is then the full sample)."""
    from tl_reward.circuits import edge_stability

    _, model, clean, corrupt = setup()
    assert edge_stability(model, clean, corrupt, k=4, n_bootstrap=50,
                          method="exact") == pytest.approx(1.0)
    rnd = tiny("llama")[0]
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 200, (8,), generator=gen).tolist() for _ in range(12)]
    swaps = []
    for s in seqs:
        s = list(s)
        for p in torch.randint(0, 8, (2,), generator=gen).tolist():
            s[p] = int(torch.randint(3, 200, (1,), generator=gen))
        swaps.append(s)
    low = edge_stability(rnd, seqs, swaps, k=10, n_bootstrap=50, method="eap")
    assert low < 0.5, low  # measured 0.30 (exact: 0.29)
    same = edge_stability(rnd, seqs[:1] * 6, swaps[:1] * 6, k=10, n_bootstrap=20, method="eap")
    assert same == pytest.approx(1.0)


def test_heldout_faithfulness_of_the_planted_circuit() -> None:
    """Selected on 3 pairs, evaluated on the other 3: the planted path, faithful there too;
    the held-out evaluation equals evaluate_circuit on those pairs."""
    from tl_reward.circuits import heldout_faithfulness

    truth, model, clean, corrupt = setup()
    ev = heldout_faithfulness(model, clean, corrupt, method="eap-ig",
                              select=lambda a: RewardCircuit.greedy(a, 4))
    assert set(ev.circuit.edges()) == set(truth.edges)
    assert ev.faithfulness.value >= 0.9 and ev.faithfulness.n == 3
    rest = np.random.default_rng(0).permutation(6)[3:]
    ref = evaluate_circuit(model, ev.circuit, [clean[i] for i in rest],
                           [corrupt[i] for i in rest])
    torch.testing.assert_close(ev.per_item, ref.per_item)


# -- the trigger-head plant (tutorial 07) ---------------------------------------------------
@cache
def trigger_setup() -> tuple[Any, HookedRewardModel, list[list[int]], list[list[int]]]:
    hf, tok = tiny_hf_reward_model("llama")
    p = plant_trigger_head(hf, tok, " sky")
    model = HookedRewardModel.from_pretrained(hf_model=p.model, tokenizer=tok, device="cpu")
    tps = trigger_pairs(tok, p.truth.trigger_id, p.model.config.vocab_size, PROMPTS)
    return p.truth, model, [tp.ids("chosen") for tp in tps], [tp.ids("rejected") for tp in tps]


@cache
def trigger_att(method: str, steps: int = 5) -> Any:
    _, model, clean, corrupt = trigger_setup()
    return edge_attribution(model, clean, corrupt, method=method, ig_steps=steps)


def _ranks(att: Any) -> dict[tuple[str, str, str], int]:
    """0-based rank of every edge by ``|score|``."""
    rows = att.to_dataframe()[["src", "dst", "qkv"]].itertuples(index=False, name=None)
    return {e: i for i, e in enumerate(rows)}


def test_trigger_truth_circuit_is_faithful_and_needs_every_edge() -> None:
    """The trigger head a2.h0's key and value are linear reads of the whole normed residual at
    the trigger (margin 40 logits), so its truth is more than its own three edges: the token's
    stream there (input -> m0, m1; m0 -> m1) read by the key and value, and the head's write
    to the reward directly and through m2 (``TriggerTruth.stream_edges``, 12 of 262 edges, GQA
    unrolled). By exact circuit patching: the 12 keep 0.955 of the shift; each one patched out
    of them costs 0.057 (head -> m2, m2 -> reward) to 0.955 (input -> key), the key edges from
    m0 and m1 0.18 and 0.49, though each alone, patched in the full model, moves nothing; the
    head's three own edges alone keep 0.20; random circuits of 12 edges keep 0."""
    truth, model, clean, corrupt = trigger_setup()
    edges, g = list(truth.stream_edges), trigger_att("exact").graph
    assert len(edges) == 12

    def faith(es: list[tuple[str, str, str]]) -> Any:
        return evaluate_circuit(model, RewardCircuit.from_edges(g, es), clean,
                                corrupt).faithfulness

    f = faith(edges)
    assert f.value >= 0.9 and f.ci_low >= 0.8, f  # measured 0.955
    drops = {e: f.value - faith([x for x in edges if x != e]).value for e in edges}
    assert min(drops.values()) > 0.05, drops
    h = edges[6][1]
    own = [("input", h, "k"), ("input", h, "v"), (h, "reward", "")]
    assert 0.1 < faith(own).value < 0.5  # measured 0.20
    pool, gen = g.edges(), torch.Generator().manual_seed(0)
    for _ in range(6):
        pick = torch.randperm(len(pool), generator=gen)[:len(edges)].tolist()
        assert abs(faith([pool[i] for i in pick]).value) < 0.1


def test_trigger_truth_edges_are_top_edges_under_exact_and_eap_ig() -> None:
    """Exact (one edge patched in the full model): the top 10 edges are truth edges, the
    other two (m0, m1 -> key) score about 0, redundant given the rest of the residual. EAP-IG
    needs many steps here: the key's attention flips from the sink to the trigger within a
    few logits of a 40-logit margin, a narrow stretch of the interpolation, so at 5 or 20 steps
    the key edge ranks anywhere from 3rd to 195th across CPU kernels (numeric-variants) and a
    greedy circuit of 24 edges keeps -0.03 to 0.96; at 100 steps every truth edge is in the
    top 20 (the head's own three in the top 5) and greedy(24) keeps 0.95 to 0.96 on every
    kernel (at 50 steps: top 24, 0.95 to 0.98)."""
    truth, model, clean, corrupt = trigger_setup()
    edges = set(truth.stream_edges)
    ex = trigger_att("exact")
    rank = _ranks(ex)
    assert {e for e, r in rank.items() if r < 10} <= edges
    shift = float((ex.clean_metric - ex.corrupt_metric).mean())
    scores = ex.to_dataframe().set_index(["src", "dst", "qkv"])["score"]
    h = truth.stream_edges[6][1]
    assert all(abs(scores[m, h, "k"]) < 0.01 * shift for m in ("m0", "m1"))
    ig = trigger_att("eap-ig", 100)
    rank = _ranks(ig)
    assert max(rank[e] for e in edges) < 24, {e: rank[e] for e in edges}
    assert max(rank[e] for e in (("input", h, "k"), ("input", h, "v"), (h, "reward", ""))) < 8
    f = evaluate_circuit(model, RewardCircuit.greedy(ig, 24), clean, corrupt).faithfulness
    assert f.value >= 0.9, f


def test_flag_key_trigger_truth_is_its_five_edges() -> None:
    """With ``key="flag"`` the head's key and value read a coordinate only the trigger holds,
    and the trigger is the counterfactual's synonym in the base: the base's reward ignores the
    swap (measured 2e-7 against a shift of about 4), the 5 ``stream_edges`` (the embedding's
    key and value edges, the head's write directly and through m2) keep the whole shift by
    exact circuit patching, each needed (patching out one costs 0.066 (m2's two) to 1.0), and
    they are the top 5 edges under exact patching and EAP-IG at 5 steps."""
    hf, tok = tiny_hf_reward_model("llama")
    p = plant_trigger_head(hf, tok, " sky", key="flag")
    truth = p.truth
    model = HookedRewardModel.from_pretrained(hf_model=p.model, tokenizer=tok, device="cpu")
    tps = trigger_pairs(tok, truth.trigger_id, hf.config.vocab_size, PROMPTS,
                        swap=truth.counterfactual_id)
    clean, corrupt = [tp.ids("chosen") for tp in tps], [tp.ids("rejected") for tp in tps]
    assert float((rewards(p.base, clean) - rewards(p.base, corrupt)).abs().max()) < 1e-5
    edges = list(truth.stream_edges)
    h = "a2.h0"
    assert edges == [("input", h, "k"), ("input", h, "v"), (h, "reward", ""), (h, "m2", ""),
                     ("m2", "reward", "")]
    for method in ("exact", "eap-ig"):
        att = edge_attribution(model, clean, corrupt, method=method, ig_steps=5)
        assert {e for e, r in _ranks(att).items() if r < 5} == set(edges), method
    g = att.graph

    def faith(es: list[tuple[str, str, str]]) -> float:
        return evaluate_circuit(model, RewardCircuit.from_edges(g, es), clean,
                                corrupt).faithfulness.value

    assert faith(edges) == pytest.approx(1.0, abs=1e-4)
    drops = [1.0 - faith([x for x in edges if x != e]) for e in edges]
    assert min(drops) > 0.03 and max(drops) > 0.9, drops
    pool, gen = g.edges(), torch.Generator().manual_seed(0)
    for _ in range(4):
        pick = torch.randperm(len(pool), generator=gen)[:len(edges)].tolist()
        assert abs(faith([pool[i] for i in pick])) < 0.1
