"""Circuits: the full circuit is the clean forward, the empty one the corrupted forward (HF's
own rewards), pruning leaves the metric unchanged, and faithfulness is its definition."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers import CLEAN, CORRUPT, EDGE_ATOL, hf_rewards

from tl_reward.circuits import (
    RewardCircuit,
    RewardGraph,
    edge_attribution,
    evaluate_circuit,
    faithfulness_curve,
    prune,
)
from tl_reward.circuits.forward import forward, read_metric
from tl_reward.circuits.inputs import batches, prepare_inputs
from tl_reward.errors import TLRewardError


def _hf(hf: object, rows: list[list[int]]) -> torch.Tensor:
    return torch.stack([hf_rewards(hf, torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long))
                        ["reward"][0, 0] for r in rows])


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen3", "inform"])
def test_full_circuit_is_clean_and_empty_is_corrupt(tiny, arch: str) -> None:
    """On LayerNorm with biases (gpt2), head_dim != d_model / heads (qwen3), an MLP reward
    head (inform): the model's own rewards of clean and corrupted sequences (HF's forward)."""
    model, hf, _ = tiny(arch)
    g = RewardGraph.from_model(model)
    full = evaluate_circuit(model, RewardCircuit.from_mask(g, g.edge_mask()), CLEAN, CORRUPT)
    empty = evaluate_circuit(model, RewardCircuit.from_mask(g, torch.zeros_like(g.edge_mask())),
                             CLEAN, CORRUPT)
    clean, corrupt = _hf(hf, CLEAN), _hf(hf, CORRUPT)
    assert (clean - corrupt).abs().min() > 1e-3  # far above EDGE_ATOL
    torch.testing.assert_close(full.metric, clean, atol=EDGE_ATOL, rtol=0)
    torch.testing.assert_close(full.empty, corrupt, atol=EDGE_ATOL, rtol=0)
    torch.testing.assert_close(empty.metric, corrupt, atol=EDGE_ATOL, rtol=0)
    torch.testing.assert_close(full.per_item, torch.ones(2), atol=1e-4, rtol=0)
    torch.testing.assert_close(empty.per_item, torch.zeros(2), atol=1e-4, rtol=0)


def test_post_norm_models_refused(tiny) -> None:
    model, _, _ = tiny("gemma2")
    with pytest.raises(TLRewardError, match="node-level patching"):
        RewardGraph.from_model(model)


def test_zero_ablation_empty_circuit_reads_only_the_biases(tiny) -> None:
    """With every source zeroed, each input is the sum of earlier attention biases: run that
    with plain hooks (the GPT-2 tiny model has biases)."""
    model, _, _ = tiny("gpt2")
    g = RewardGraph.from_model(model)
    empty = RewardCircuit.from_mask(g, torch.zeros_like(g.edge_mask()))
    ev = evaluate_circuit(model, empty, CLEAN[:1], ablation="zero")
    b = [model.blocks[lay].attn.b_O.detach() for lay in range(model.cfg.n_layers)]

    def before(lay: int, mlp: bool) -> torch.Tensor:
        return sum(b[: lay + (1 if mlp else 0)], torch.zeros_like(b[0]))

    def const(v: torch.Tensor) -> object:
        return lambda a, hook: torch.zeros_like(a) + v
    n = model.cfg.n_layers
    hooks = [("blocks.0.hook_resid_pre", const(torch.zeros(())))]
    for lay in range(n):
        hooks += [(f"blocks.{lay}.hook_{x}_input", const(before(lay, False))) for x in "qkv"]
        hooks.append((f"blocks.{lay}.hook_mlp_in", const(before(lay, True))))
    hooks.append((f"blocks.{n - 1}.hook_resid_post", const(before(n, False))))
    model.cfg.use_split_qkv_input = model.cfg.use_hook_mlp_in = True
    try:
        with torch.no_grad():
            ref = model.run_with_hooks(torch.tensor(CLEAN[:1]), return_type="reward",
                                       fwd_hooks=hooks)[0, 0]
    finally:
        model.cfg.use_split_qkv_input = model.cfg.use_hook_mlp_in = False
    assert float(ev.metric[0]) == pytest.approx(float(ref), abs=EDGE_ATOL)


def test_pruning_removes_dangling_edges_and_keeps_the_metric(tiny) -> None:
    model, _, _ = tiny("llama")
    g = RewardGraph.from_model(model)
    edges = [("input", "a0.h1", "q"), ("a0.h1", "m1", ""), ("m1", "reward", ""),
             ("a1.h2", "reward", ""),          # a1.h2 reads nothing in the circuit: dangling
             ("input", "a2.h0", "v"),          # kv head 0 feeds a2.h0/h1, neither reaches reward
             ("input", "a1.h0", "k"), ("a1.h2", "m2", ""), ("m0", "a2.h3", "q")]
    c = RewardCircuit.from_edges(g, edges)
    assert sorted(c.edges()) == sorted(edges[:3])
    src = {s: i for i, s in enumerate(g.sources)}
    dst = {d: j for j, d in enumerate(g.dests)}
    raw = torch.zeros_like(g.edge_mask())
    for s, d, q in edges:
        raw[dst[d, q], src[s]] = True
    # the unpruned mask gives the same metric as the pruned circuit
    inputs = prepare_inputs(model, CLEAN, CORRUPT)
    for batch in batches(model, inputs, 8, "right"):
        with torch.no_grad():
            m = [read_metric(model, forward(model, g, batch, patch=(g.edge_mask() & ~k)[None]),
                             batch, "reward") for k in (raw, c.mask)]
        torch.testing.assert_close(m[0], m[1], atol=EDGE_ATOL, rtol=0)
    assert prune(g, c.mask).equal(c.mask)


def test_selection_by_top_fraction_threshold(tiny) -> None:
    model, _, _ = tiny("llama")
    res = edge_attribution(model, CLEAN, CORRUPT, method="eap")
    df = res.to_dataframe()
    top = RewardCircuit.top(res, 10)
    assert set(top.edges()) <= set(map(tuple, df[["src", "dst", "qkv"]].values[:10].tolist()))
    assert RewardCircuit.fraction(res, 1.0).n_edges == res.graph.n_edges
    t = float(df["score"].abs().iloc[5])
    assert RewardCircuit.threshold(res, t).mask.equal(
        prune(res.graph, (res.scores.abs() >= t).nan_to_num(False)))
    with pytest.raises(TLRewardError, match="not an edge"):
        RewardCircuit.from_edges(res.graph, [("m2", "a0.h0", "q")])
    ev = evaluate_circuit(model, top, CLEAN, CORRUPT)
    want = (ev.metric - ev.empty) / (ev.full - ev.empty)
    torch.testing.assert_close(ev.per_item, want)
    assert ev.faithfulness.value == pytest.approx(float(want.mean()), abs=1e-6)


def test_results_save_and_load(tiny, tmp_path) -> None:
    from tl_reward.results import load_result

    model, _, _ = tiny("llama")
    res = edge_attribution(model, CLEAN, CORRUPT, method="eap")
    back = load_result(res.save(tmp_path / "edges"))
    assert back.graph == res.graph and back.settings == res.settings
    torch.testing.assert_close(back.scores, res.scores, equal_nan=True)
    ev = evaluate_circuit(model, RewardCircuit.fraction(res, 0.5), CLEAN, CORRUPT)
    back_ev = load_result(ev.save(tmp_path / "eval"))
    assert back_ev.circuit.mask.equal(ev.circuit.mask)
    torch.testing.assert_close(back_ev.per_item, ev.per_item, equal_nan=True)


def test_faithfulness_curve_points_are_circuit_evaluations(tiny) -> None:
    model, _, _ = tiny("llama")
    res = edge_attribution(model, CLEAN, CORRUPT, method="exact")
    sizes = (0.05, 0.2, 1.0)
    curve = faithfulness_curve(model, res, CLEAN, CORRUPT, sizes=sizes)
    for i, f in enumerate(sizes):
        ev = evaluate_circuit(model, RewardCircuit.fraction(res, f), CLEAN, CORRUPT)
        assert float(curve.faithfulness[i]) == pytest.approx(float(ev.per_item.mean()), abs=1e-5)
        assert curve.n_edges[i] == ev.circuit.n_edges
    assert float(curve.faithfulness[-1]) == pytest.approx(1.0, abs=1e-4)
    assert float(curve.random[-1]) == pytest.approx(1.0, abs=1e-4)
    f = curve.faithfulness.double().numpy()
    x = np.array(sizes)
    assert curve.cpr == pytest.approx(float(np.sum((f[1:] + f[:-1]) / 2 * np.diff(x))), abs=1e-6)
    assert curve.cmd == pytest.approx(
        float(np.sum((abs(1 - f[1:]) + abs(1 - f[:-1])) / 2 * np.diff(x))), abs=1e-6)


def test_selection_sizes_are_checked_and_pruning_warns(tiny) -> None:
    """``top(n)`` refuses n < 1 (and a fraction) and warns when pruning leaves fewer edges
    than asked, or none; ``greedy(n)`` refuses the same and keeps at least n connected."""
    model, _, _ = tiny("llama")
    att = edge_attribution(model, CLEAN, CORRUPT, method="eap")
    for bad in (0, -5, 2.5):
        for select in (RewardCircuit.top, RewardCircuit.greedy):
            with pytest.raises(TLRewardError, match="at least 1"):
                select(att, bad)
    g, scores = att.graph, att.scores.clone()
    scores[g.dests.index(("a1.h2", "q")), g.sources.index("a0.h1")] = 1e3  # alone: no path
    lone = dataclasses.replace(att, scores=scores)
    with pytest.warns(UserWarning, match="of the top 1 edges, 0 lie.*none: an empty circuit"):
        assert RewardCircuit.top(lone, 1).n_edges == 0
    assert RewardCircuit.greedy(lone, 1).n_edges >= 1
    n = 10
    with pytest.warns(UserWarning, match=f"of the top {n} edges, .* lie on a path"):
        top = RewardCircuit.top(att, n)
    assert 0 < top.n_edges < n
    assert RewardCircuit.greedy(att, n).n_edges >= n


def test_one_item_reports_no_p_value(tiny) -> None:
    model, _, _ = tiny("llama")
    att = edge_attribution(model, CLEAN[:1], CORRUPT[:1], method="eap")
    ev = evaluate_circuit(model, RewardCircuit.greedy(att, 6), CLEAN[:1], CORRUPT[:1])
    f = ev.faithfulness
    assert f.n == 1 and np.isnan(f.p_value) and "p =" not in str(f)
    assert f.value == pytest.approx(float(ev.per_item[0]))



def test_node_circuits_by_hand(tiny) -> None:
    """``top_nodes(k)``: the k heads/MLPs of largest |sum of outgoing edge scores| (by hand
    from the edge table), and every edge from the input or a chosen node into a chosen node's
    input (a key/value head's when one query head of its group is chosen) or the reward."""
    model, _, _ = tiny("llama")
    att = edge_attribution(model, CLEAN, CORRUPT, method="eap")
    df = att.to_dataframe()
    node = df.groupby("src")["score"].sum().drop("input")
    for k in (1, 4, 9):
        chosen = set(node.abs().sort_values(ascending=False).index[:k]) | {"input"}

        def reads(dst: str, qkv: str, chosen: set[str] = chosen) -> bool:
            if qkv in ("k", "v"):  # a key/value head feeds its group's query heads
                lay, j = (int(x) for x in dst[1:].split(".h"))
                return any(f"a{lay}.h{h}" in chosen for h in att.graph.kv_group(j))
            return dst == "reward" or dst in chosen
        want = [e for e in att.graph.edges() if e[0] in chosen and reads(e[1], e[2])]
        got = RewardCircuit.top_nodes(att, k)
        assert got.n_edges > 0
        assert set(got.edges()) == set(RewardCircuit.from_edges(att.graph, want).edges())
    g = att.graph
    full = RewardCircuit.top_nodes(att, len(g.sources))
    assert full.n_edges == g.n_edges  # every node: the whole graph
    curve = faithfulness_curve(model, att, CLEAN, CORRUPT, sizes=(0.0, 0.5, 1.0), select="nodes")
    assert curve.select == "nodes" and curve.n_edges[-1] == g.n_edges
    assert float(curve.faithfulness[0]) == pytest.approx(0.0, abs=1e-6)
    assert float(curve.faithfulness[-1]) == pytest.approx(1.0, abs=1e-5)
    k = round(0.5 * (len(g.sources) - 1))
    half = evaluate_circuit(model, RewardCircuit.top_nodes(att, k), CLEAN, CORRUPT)
    assert float(curve.faithfulness[1]) == pytest.approx(float(half.per_item.nanmean()))
    greedy = faithfulness_curve(model, att, CLEAN, CORRUPT, sizes=(0.1,), select="greedy")
    ev = evaluate_circuit(model, RewardCircuit.greedy(att, round(0.1 * g.n_edges)), CLEAN,
                          CORRUPT)
    assert greedy.n_edges[0] >= round(0.1 * g.n_edges)
    assert float(greedy.faithfulness[0]) == pytest.approx(float(ev.per_item.nanmean()))
    with pytest.raises(TLRewardError, match="select must be one of"):
        faithfulness_curve(model, att, CLEAN, CORRUPT, select="best")
