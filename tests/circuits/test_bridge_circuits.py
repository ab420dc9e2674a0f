"""Reward circuits on the TransformerBridge, on every family it loads.

Against an independent reference under any TransformerLens (no HookedTransformer needed, so
these run under TransformerLens 4.3 in CI too): edge patching and edge gradients by hand on the
HF model's own modules (:mod:`tests.circuits.hand_edges`), on a fresh copy of the same seeded
model. Under TransformerLens 3 also: the bridge's scores, metrics, circuits, faithfulness and
SAE nodes equal :class:`~tl_reward.HookedRewardModel`'s (float32, 1e-5 of the largest score).
Families whose sublayer outputs pass through a norm (Gemma-2's sandwich norms, OLMo-2's
post-norms) have no edge graph, and a parallel block's MLP input has no hook on the bridge: they
refuse, naming the family.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch
from helpers import needs_hooked_transformer, needs_sae_lens

from tests.circuits import hand_edges
from tl_reward.circuits import (
    RewardCircuit,
    RewardGraph,
    edge_attribution,
    evaluate_circuit,
    faithfulness_curve,
)
from tl_reward.errors import TLRewardError
from tl_reward.model.bridge_reward_model import BridgeRewardModel
from tl_reward.testing import CONVERSATIONS, tiny_hf_reward_model
from tl_reward.testing.tiny import BRIDGE_ARCHITECTURES

#: Families with a HookedRewardModel converter (tl_reward.testing's tiny architectures).
HOOKED = ["llama", "mistral", "qwen2", "qwen3", "gpt2", "armorm", "qrm", "inform", "internlm2",
          "nemotron"]
#: HF sequence classifiers only the bridge loads. OLMo-2 refuses (its norms follow the
#: sublayers), and so does StableLM with parallel attention and MLP on the bridge (the bridge
#: has no hook on the MLP's own input there: one norm feeds both).
BRIDGE_ONLY = [a for a in BRIDGE_ARCHITECTURES if a not in ("olmo2", "stablelm_parallel")]
#: Families whose every edge is patched exactly against HookedRewardModel (grouped heads, a
#: GPT-2 block with biases, a multi-objective head); the others patch :data:`EDGES`.
FULL_EXACT = ("llama", "gpt2", "armorm")
#: Edges into every kind of destination (q, key/value head, MLP, reward) from every kind of
#: source (embeddings, heads, MLPs); layer 1 exists in every tiny model.
EDGES = [("input", "a1.h1", "q"), ("a0.h1", "a1.h1", "k"), ("a0.h3", "a1.h0", "v"),
         ("m0", "m1", ""), ("a0.h2", "m0", ""), ("m1", "reward", ""), ("a1.h3", "reward", ""),
         ("input", "reward", "")]


def build(family: str) -> tuple[Any, Any]:
    """A fresh seeded tiny HF reward model of ``family`` and its tokenizer."""
    hf, tok = tiny_hf_reward_model(family)
    return hf.eval(), tok


def _kw(family: str) -> dict[str, Any]:
    return {"lm_head_rows": [0]} if family == "nemotron" else {}


def _swapped(model: Any) -> tuple[list[list[int]], list[list[int]]]:
    """Two conversations as the model builds them, and each with its first reply token and the
    third from the end swapped (Mistral's tiny sliding window reaches back only a few tokens)."""
    clean, corrupt = [], []
    for i, conv in enumerate(CONVERSATIONS[:2]):
        e = model.encode(conv)
        ids = list(e.ids)
        bad = list(ids)
        for at in {e.response_start, max(e.response_start, len(ids) - 3)}:
            bad[at] = 5 + (ids[at] + 7 + i) % 40
            assert bad[at] != ids[at]
        clean.append(ids)
        corrupt.append(bad)
    return clean, corrupt


@cache
def bridge(family: str) -> tuple[BridgeRewardModel, list[list[int]], list[list[int]]]:
    hf, tok = build(family)
    model = BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, **_kw(family))
    return (model, *_swapped(model))


def _at(att: Any, src: str, dst: str, qkv: str) -> float:
    g = att.graph
    return float(att.scores[g.dests.index((dst, qkv)), g.sources.index(src)])


@pytest.mark.parametrize("family", HOOKED + BRIDGE_ONLY)
def test_bridge_edges_equal_hand_patching_on_hf_modules(family: str) -> None:
    """Exact scores against edge patching by hand on HF's modules; EAP and EAP-IG (the
    reference's left rule, 2 steps) against hand gradients at the same points: to 1e-5 of the
    reward's size (float32 rewards through two implementations of attention)."""
    model, clean, corrupt = bridge(family)
    ref = build(family)[0]
    row = _kw(family).get("lm_head_rows", [None])[0]
    edges = [e for e in EDGES if e in set(RewardGraph.from_model(model).edges())]  # parallel:
    assert len(edges) >= len(EDGES) - 1  # a layer's MLP does not read its heads
    ex = edge_attribution(model, clean[:1], corrupt[:1], method="exact", edges=edges)
    eap = edge_attribution(model, clean[:1], corrupt[:1], method="eap")
    ig = edge_attribution(model, clean[:1], corrupt[:1], method="eap-ig", ig_steps=2,
                          ig_rule="left")
    tol = 1e-5 * max(1.0, float(ex.clean_metric.abs().max()))
    moved = 0
    for e in edges:
        want = hand_edges.edge_score(ref, clean[0], corrupt[0], *e, row=row)
        assert _at(ex, *e) == pytest.approx(want, abs=tol), e
        moved += abs(want) > 10 * tol
        for att, alphas in [(eap, None), (ig, [0.0, 0.5])]:
            want = hand_edges.edge_gradient(ref, clean[0], corrupt[0], *e, alphas, row=row)
            assert _at(att, *e) == pytest.approx(want, abs=tol), (e, att.label)
    assert moved >= 4  # the edges carry the swap: a misrouted patch would show
    assert ex.scores.isnan().sum() == ex.graph.edge_mask().numel() - len(edges)


@pytest.mark.parametrize("family", ["gemma2", "olmo2", "stablelm_parallel"])
def test_families_without_edge_inputs_refuse_by_name(family: str) -> None:
    model = bridge(family)[0]
    for method in ("eap", "exact"):
        with pytest.raises(TLRewardError, match=f"(?i)^{family[:5]}.*node-level patching"):
            edge_attribution(model, [[5, 6, 7]], [[5, 8, 7]], method=method)


@cache
def hooked(family: str) -> Any:
    from tl_reward import HookedRewardModel

    hf, tok = build(family)
    return HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                             **_kw(family))


def _close(a: torch.Tensor, b: torch.Tensor, what: str, scale: float) -> None:
    """Equal to 1e-5 of ``scale``, the size of the rewards both forwards round."""
    tol = 1e-5 * max(scale, 1.0)
    torch.testing.assert_close(a, b, atol=tol, rtol=0, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


@needs_hooked_transformer
@pytest.mark.parametrize("family", HOOKED)
def test_bridge_circuits_equal_hooked_circuits(family: str) -> None:
    """Edges under exact patching, EAP and EAP-IG (counterfactuals; mean ablation),
    both metrics, the greedy circuit, its metric and the faithfulness curve. Scores and metrics
    to 1e-5 of the rewards' size; faithfulness, a ratio over the shift ``full - empty``, to that
    over the smallest shift."""
    model, clean, corrupt = bridge(family)
    ht = hooked(family)
    # exact patching of every edge on three families (one forward per edge), of EDGES on the rest
    some = None if family in FULL_EXACT else EDGES
    for kw in [{"method": "exact", "edges": some}, {"method": "eap-ig", "ig_steps": 2}]:
        a, b = (edge_attribution(m, clean, corrupt, **kw) for m in (model, ht))
        r = float(torch.cat([b.clean_metric, b.corrupt_metric]).abs().max())
        _close(a.scores, b.scores, f"{family} {kw}", r)
        _close(a.clean_metric, b.clean_metric, "clean", r)
        _close(a.corrupt_metric, b.corrupt_metric, "corrupt", r)
    circuit = RewardCircuit.greedy(b, 12)
    assert torch.equal(RewardCircuit.greedy(a, 12).mask, circuit.mask)
    ev = [evaluate_circuit(m, circuit, clean, corrupt) for m in (model, ht)]
    _close(ev[0].metric, ev[1].metric, "circuit metric", r)
    mean = [edge_attribution(m, clean, ablation="mean", method="eap") for m in (model, ht)]
    r = float(mean[1].clean_metric.abs().max())
    _close(mean[0].scores, mean[1].scores, "mean ablation", r)
    curves = [faithfulness_curve(m, mean[1], clean, ablation="mean", sizes=(0.05, 0.2, 1.0))
              for m in (model, ht)]
    shift = float((mean[1].clean_metric - mean[1].corrupt_metric).abs().min())
    _close(curves[0].faithfulness, curves[1].faithfulness, "curve", r / shift)


@needs_hooked_transformer
@needs_sae_lens
@pytest.mark.parametrize("hook", ["blocks.1.hook_mlp_out", "blocks.1.hook_resid_post"])
def test_sae_nodes_on_the_bridge_equal_hooked(hook: str) -> None:
    from tests.circuits.test_sae_nodes import make_sae

    model, clean, corrupt = bridge("llama")
    ht = hooked("llama")
    sae = make_sae(model.cfg.d_model, hook)
    for method in ("exact", "eap"):
        a, b = (edge_attribution(m, clean, corrupt, method=method, sae=sae) for m in (model, ht))
        assert a.features.features == b.features.features
        r = float(b.clean_metric.abs().max())
        _close(a.features.scores, b.features.scores, f"{hook} {method}", r)
    circuit = RewardCircuit.top(b, 20)
    assert any(".f" in e[0] or ".err" in e[0] for e in circuit.edges())
    ev = [evaluate_circuit(m, circuit, clean, corrupt, sae=sae) for m in (model, ht)]
    _close(ev[0].metric, ev[1].metric, "feature circuit", r)
