"""Ground truth: on the indirect plant (a head detects the trigger, the last MLP alone turns it
into reward; ``tl_reward.planted.indirect``) the planted edges are the top edges under exact
patching and EAP-IG, the circuit they form carries the whole effect, random circuits of the
same size carry none, and EAP-IG has converged at MIB's 5 steps."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch

from tl_reward import HookedRewardModel
from tl_reward.circuits import RewardCircuit, edge_attribution, evaluate_circuit
from tl_reward.planted import plant_indirect
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
