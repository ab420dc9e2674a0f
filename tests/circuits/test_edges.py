"""Edge attribution against independent references: hand-written TransformerLens path patches,
direct-path patching, HF-equivalent ungrouped models, and brute-force edge counts."""

from __future__ import annotations

import pytest
import torch
from helpers import CLEAN, CORRUPT, EDGE_ATOL, edge_input_hook, hf_rewards, patch_edge_input

from tl_reward import HookedRewardModel
from tl_reward.analysis.direct_path import direct_path_patching
from tl_reward.circuits import RewardGraph, edge_attribution
from tl_reward.circuits.graph import GRAPH_FLAGS, split_inputs
from tl_reward.data.pairs import TokenizedPair
from tl_reward.errors import TLRewardError
from tl_reward.planted.surgery import expand_kv_heads


def test_edge_count_formula_matches_brute_count() -> None:
    """The formula and the mask against an independent enumeration: a source at depth
    (layer, 0 head / 1 MLP) feeds a head input of a later layer, an MLP of its own or a later
    layer, and the reward; the issue's SmolLM2-135M numbers."""
    def brute(n_layers: int, n_heads: int, n_kv: int, parallel: bool) -> int:
        srcs = [(-1, 1)] + [(lay, k) for lay in range(n_layers) for k in [0] * n_heads + [1]]
        count = 0
        for lay in range(n_layers):
            count += (n_heads + 2 * n_kv) * sum(s < lay for s, _ in srcs)
            count += sum(s < lay or (s == lay and k == 0 and not parallel) for s, k in srcs)
        return count + len(srcs)

    for shape in [(3, 4, 2, False), (2, 3, 3, True), (5, 6, 1, False)]:
        g = RewardGraph(*shape)
        assert g.n_edges == int(g.edge_mask().sum()) == len(g.edges()) == brute(*shape)
    assert RewardGraph(30, 9, 3).n_edges == 70_651
    assert RewardGraph(30, 9, 9).n_edges == 123_211


def test_from_model_names_and_flags_restored(tiny) -> None:
    model, _, _ = tiny("llama")
    g = RewardGraph.from_model(model)
    assert (g.n_layers, g.n_heads, g.n_kv_heads) == (3, 4, 2)
    assert ("a1.h1", "k") in g.dests and ("a1.h2", "k") not in g.dests
    assert ("a1.h3", "q") in g.dests and g.dests[-1] == ("reward", "")
    before = {f: getattr(model.cfg, f) for f in GRAPH_FLAGS}
    assert any(before[f] != v for f, v in GRAPH_FLAGS.items())  # the forward changes some
    edge_attribution(model, CLEAN[:1], CORRUPT[:1], method="eap")
    assert {f: getattr(model.cfg, f) for f in GRAPH_FLAGS} == before
    with pytest.raises(RuntimeError), split_inputs(model):
        assert {f: getattr(model.cfg, f) for f in GRAPH_FLAGS} == GRAPH_FLAGS
        raise RuntimeError
    assert {f: getattr(model.cfg, f) for f in GRAPH_FLAGS} == before


#: TransformerLens flags a user may have on, and their setters (HookedTransformer's own).
USER_FLAGS = {"use_attn_result": "set_use_attn_result",
              "use_split_qkv_input": "set_use_split_qkv_input",
              "use_hook_mlp_in": "set_use_hook_mlp_in",
              "ungroup_grouped_query_attention": "set_ungroup_grouped_query_attention"}


@pytest.mark.parametrize("flags", [[f] for f in USER_FLAGS] + [list(USER_FLAGS)],
                         ids=[*USER_FLAGS, "all"])
def test_model_flags_do_not_change_results(tiny, flags: list[str]) -> None:
    """Scores, metrics and a circuit's faithfulness are the same, to the bit, with the user's
    TransformerLens flags on (the grouped tiny Llama: ungrouping changes the k/v inputs' shape,
    per-head results the residual's sum order), and the flags are the user's again after."""
    from tl_reward.circuits import RewardCircuit, evaluate_circuit

    model, hf, tok = tiny("llama")
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")

    def run() -> list[torch.Tensor]:
        ig = edge_attribution(model, CLEAN, CORRUPT, method="eap-ig", ig_steps=2)
        ex = edge_attribution(model, CLEAN[:1], CORRUPT[:1], method="exact")
        mean = edge_attribution(model, CLEAN, ablation="mean", method="eap")
        ev = evaluate_circuit(model, RewardCircuit.greedy(ig, 12), CLEAN, CORRUPT)
        return [ig.scores, ig.clean_metric, ig.corrupt_metric, ex.scores, mean.scores,
                ev.per_item]

    ref = run()
    for f in flags:
        getattr(model, USER_FLAGS[f])(True)
    got = run()
    assert all(getattr(model.cfg, f) for f in flags)
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a.nan_to_num(), b.nan_to_num())


def _hand_patch(model: HookedRewardModel, clean: list[int], corrupt: list[int],
                src: str, dst: str, qkv: str) -> float:
    """reward(clean with src's corrupted-minus-clean output added to dst's input only) -
    reward(clean), with plain TransformerLens hooks and the model's own forward."""
    tok = torch.tensor([clean])
    _, c0 = model.run_with_cache(tok, return_type=None)
    _, c1 = model.run_with_cache(torch.tensor([corrupt]), return_type=None)
    if src == "input":
        diff = c1["blocks.0.hook_resid_pre"] - c0["blocks.0.hook_resid_pre"]
    elif src.startswith("m"):
        name = f"blocks.{src[1:]}.hook_mlp_out"
        diff = c1[name] - c0[name]
    else:
        lay, h = (int(x) for x in src[1:].split(".h"))
        name = f"blocks.{lay}.attn.hook_z"
        diff = (c1[name][:, :, h] - c0[name][:, :, h]) @ model.blocks[lay].attn.W_O[h]
    return patch_edge_input(model, clean, diff, dst, qkv)


def _score(res, src: str, dst: str, qkv: str) -> float:
    g = res.graph
    return float(res.scores[g.dests.index((dst, qkv)), g.sources.index(src)])


def test_exact_equals_hand_path_patch(tiny) -> None:
    model, _, _ = tiny("llama")
    res = edge_attribution(model, CLEAN[:1], CORRUPT[:1], method="exact")
    picks = [("a0.h1", "a1.h2", "q"), ("input", "a2.h1", "k"), ("a1.h3", "a2.h0", "v"),
             ("m0", "m1", ""), ("a1.h0", "m1", ""), ("a2.h3", "reward", ""),
             ("input", "m0", "")]
    for e in picks:
        ref = _hand_patch(model, CLEAN[0], CORRUPT[0], *e)
        assert abs(ref) > 1e-4, e  # the edge matters, so a misrouted patch shows
        assert _score(res, *e) == pytest.approx(ref, abs=EDGE_ATOL), e
    df = res.to_dataframe()
    assert list(df.columns) == ["src", "dst", "qkv", "score"]
    assert len(df) == res.graph.n_edges
    assert df["score"].abs().is_monotonic_decreasing


def test_reward_edges_equal_direct_path_patching(tiny) -> None:
    """An edge into ``reward`` is its source's direct path: direct-path noising with the final
    norm recomputed, the clean sequence as chosen and its counterfactual as rejected."""
    model, _, _ = tiny("llama")
    res = edge_attribution(model, CLEAN[:1], CORRUPT[:1], method="exact")
    n = len(CLEAN[0])
    tp = TokenizedPair(CLEAN[0], CORRUPT[0], 0, torch.stack([torch.arange(n)] * 2, 1), [], [])
    dp = direct_path_patching(model, tp, level="head", mode="noising", scale="recompute")
    r_chosen = dp.clean_chosen
    names = {"embed": "input", **{f"L{lay}.mlp": f"m{lay}" for lay in range(3)},
             **{f"L{lay}.H{h}": f"a{lay}.h{h}" for lay in range(3) for h in range(4)}}
    assert set(names) <= set(dp.names)
    for name, patched in zip(dp.names, dp.patched.tolist(), strict=True):
        if name in names:
            src = names[name]
            assert res.node_effects[src] == pytest.approx(patched - r_chosen, abs=EDGE_ATOL), name


def _frozen_final_scale(model: HookedRewardModel, tokens: torch.Tensor) -> object:
    """A hook pinning the final norm's scale to its clean value (any stacking of the rows)."""
    _, cache = model.run_with_cache(tokens, return_type=None)
    scale = cache["ln_final.hook_scale"]

    def fn(act: torch.Tensor, hook: object) -> torch.Tensor:
        return scale.repeat(act.shape[0] // scale.shape[0], 1, 1).to(act.dtype)
    return fn


def test_eap_equals_exact_on_reward_edges_with_frozen_final_scale(tiny) -> None:
    """With the final norm's scale frozen, the reward is linear in the final residual, so the
    first-order EAP score of every edge into ``reward`` is exact (other edges pass through
    attention and MLP nonlinearities and are not expected to match)."""
    model, _, _ = tiny("llama")
    fn = _frozen_final_scale(model, torch.tensor(CLEAN[:1]))
    with model.hooks(fwd_hooks=[("ln_final.hook_scale", fn)]):
        eap = edge_attribution(model, CLEAN[:1], CORRUPT[:1], method="eap")
        exact = edge_attribution(model, CLEAN[:1], CORRUPT[:1], method="exact")
    assert exact.scores[-1].abs().max() > 1e-2
    torch.testing.assert_close(eap.scores[-1], exact.scores[-1], atol=EDGE_ATOL, rtol=0)
    # and without the freeze they differ: the test can see a wrong gradient
    free = edge_attribution(model, CLEAN[:1], CORRUPT[:1], method="eap")
    assert (free.scores[-1] - exact.scores[-1]).abs().max() > 1e-3


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_grouped_equals_ungrouped_after_summing_query_heads(tiny, method: str) -> None:
    model, hf, tok = tiny("llama")
    wide = HookedRewardModel.from_pretrained(hf_model=expand_kv_heads(hf), tokenizer=tok,
                                             device="cpu")
    a = edge_attribution(model, CLEAN, CORRUPT, method=method)
    b = edge_attribution(wide, CLEAN, CORRUPT, method=method)
    ga, gb = a.graph, b.graph
    assert gb.n_kv_heads == 4 and gb.n_edges > ga.n_edges
    torch.testing.assert_close(a.clean_metric, b.clean_metric, atol=EDGE_ATOL, rtol=0)
    for j, (dst, qkv) in enumerate(ga.dests):
        if qkv in "kv" and qkv:
            lay, kv = (int(x) for x in dst[1:].split(".h"))
            rows = [gb.dests.index((f"a{lay}.h{h}", qkv)) for h in ga.kv_group(kv)]
            want = b.scores[rows].sum(0)
        else:
            want = b.scores[gb.dests.index((dst, qkv))]
        torch.testing.assert_close(a.scores[j], want, atol=EDGE_ATOL, rtol=0, equal_nan=True)


def test_padding_side_and_batch_size_do_not_change_scores(tiny) -> None:
    model, _, _ = tiny("llama")
    clean = [*CLEAN, [7, 8, 9, 10]]
    corrupt = [*CORRUPT, [7, 8, 11, 10]]
    ref = edge_attribution(model, clean, corrupt, method="eap-ig", batch_size=1)
    for kw in [dict(batch_size=3, padding_side="left"), dict(batch_size=2, padding_side="right")]:
        got = edge_attribution(model, clean, corrupt, method="eap-ig", **kw)
        torch.testing.assert_close(got.scores, ref.scores, atol=EDGE_ATOL, rtol=0, equal_nan=True)
        torch.testing.assert_close(got.clean_metric, ref.clean_metric, atol=EDGE_ATOL, rtol=0)
    ab = [edge_attribution(model, clean, ablation="mean", method="exact", batch_size=b,
                           padding_side=s) for b, s in [(1, "right"), (3, "left")]]
    torch.testing.assert_close(ab[0].scores, ab[1].scores, atol=EDGE_ATOL, rtol=0, equal_nan=True)


def test_clean_and_corrupt_metrics_are_the_models_rewards(tiny) -> None:
    model, hf, _ = tiny("llama")
    res = edge_attribution(model, CLEAN[:1], CORRUPT[:1], method="eap")
    for ids, got in [(CLEAN[0], res.clean_metric), (CORRUPT[0], res.corrupt_metric)]:
        t = torch.tensor([ids])
        ref = hf_rewards(hf, t, torch.ones_like(t))["reward"][0, 0]
        assert float(got[0]) == pytest.approx(float(ref), abs=EDGE_ATOL)


def test_unequal_lengths_refused_with_the_fix(tiny) -> None:
    model, _, _ = tiny("llama")
    with pytest.raises(TLRewardError, match="ablation='mean'"):
        edge_attribution(model, CLEAN[:1], [CORRUPT[0][:-1]], method="eap")
    with pytest.raises(TLRewardError, match="exactly one corruption"):
        edge_attribution(model, CLEAN[:1], method="eap")


def _hand_gradient(model: HookedRewardModel, clean: list[int], corrupt: list[int],
                   src: str, dst: str, qkv: str, alphas: list[float] | None) -> float:
    """(a_src(corrupt) - a_src(clean)) . dR/d(in_dst), the gradient averaged over the points
    ``alphas`` on the line ``corrupt + alpha (clean - corrupt)`` of the embeddings (None: at
    the clean run), with plain TransformerLens hooks and autograd on a zero added to the
    destination input."""
    tok = torch.tensor([clean])
    _, c0 = model.run_with_cache(tok, return_type=None)
    _, c1 = model.run_with_cache(torch.tensor([corrupt]), return_type=None)
    if src == "input":
        diff = c1["blocks.0.hook_resid_pre"] - c0["blocks.0.hook_resid_pre"]
    else:
        lay, h = (int(x) for x in src[1:].split(".h"))
        name = f"blocks.{lay}.attn.hook_z"
        diff = (c1[name][:, :, h] - c0[name][:, :, h]) @ model.blocks[lay].attn.W_O[h]
    e0, e1 = c0["blocks.0.hook_resid_pre"], c1["blocks.0.hook_resid_pre"]
    hook = edge_input_hook(model, dst, qkv)
    h = int(dst.split(".h")[1]) if ".h" in dst else 0
    grads = []
    for alpha in [None] if alphas is None else alphas:
        eps = torch.zeros_like(diff, requires_grad=True)

        def add(act: torch.Tensor, hook: object, eps: torch.Tensor = eps) -> torch.Tensor:
            if act.ndim == 4:
                return torch.cat([act[:, :, :h], (act[:, :, h] + eps)[:, :, None],
                                  act[:, :, h + 1 :]], 2)
            return act + eps
        emb = e0 if alpha is None else (e1 + alpha * (e0 - e1)).detach()
        model.cfg.use_split_qkv_input = model.cfg.use_hook_mlp_in = True
        try:
            r = model.run_with_hooks(tok, return_type="reward", fwd_hooks=[
                ("blocks.0.hook_resid_pre", lambda act, hook, emb=emb: emb), (hook, add)])[0, 0]
        finally:
            model.cfg.use_split_qkv_input = model.cfg.use_hook_mlp_in = False
        (g,) = torch.autograd.grad(r, eps)
        grads.append(g)
    return float((diff.detach() * torch.stack(grads).mean(0)).sum())


def _reference_points(rule: str, steps: int) -> list[float]:
    """Where each rule puts EAP-IG's points, written independently of the library: ``"left"``
    as hannamw/EAP-IG's ``get_scores_eap_ig`` (and MIB's copy) does, ``for step in range(0,
    steps)``, interpolating ``corrupted + (step / steps) * (clean - corrupted)``; ``"right"``
    takes ``step`` in ``1..steps``; ``"midpoint"`` the centres ``(step + 1/2) / steps``."""
    if rule == "left":
        return [step / steps for step in range(0, steps)]
    if rule == "right":
        return [step / steps for step in range(1, steps + 1)]
    return [(step + 0.5) / steps for step in range(0, steps)]


#: Edges of every kind of destination (q, k, v, MLP, reward) from inputs and heads.
GRADIENT_EDGES = [("a0.h1", "a1.h2", "q"), ("input", "a2.h1", "k"), ("a1.h3", "a2.h0", "v"),
                  ("input", "m0", ""), ("a0.h2", "m1", ""), ("a2.h3", "reward", "")]


@pytest.fixture(scope="module")
def tiny64() -> HookedRewardModel:
    """The tiny Llama RM in float64: the library and the hand gradients agree to ~1e-12, so
    the rules (which move scores by ~10 %) are held to 1e-6 relative."""
    from tl_reward.testing import tiny_hf_reward_model

    hf, tok = tiny_hf_reward_model("llama")
    return HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                             dtype=torch.float64)


@pytest.mark.parametrize(("rule", "steps"), [("left", 3), ("right", 3), ("midpoint", 3),
                                             ("left", 1), ("right", 1)])
def test_eap_ig_rules_equal_their_formula_by_hand(tiny64, rule: str, steps: int) -> None:
    """Each rule's scores against the hand gradients at the reference's points: to 1e-6
    relative (float64), and the rules differ (at m = 1 left is the corrupted input's gradient
    and right is EAP at the clean run)."""
    res = edge_attribution(tiny64, CLEAN[:1], CORRUPT[:1], method="eap-ig", ig_steps=steps,
                           ig_rule=rule)
    assert res.settings["ig_rule"] == rule and res.label == f"eap-ig ({rule} rule, {steps} steps)"
    other = {"left": "right"}.get(rule, "left")
    for e in GRADIENT_EDGES:
        ref = _hand_gradient(tiny64, CLEAN[0], CORRUPT[0], *e, _reference_points(rule, steps))
        assert abs(ref) > 1e-4, e
        assert _score(res, *e) == pytest.approx(ref, rel=1e-6, abs=1e-12), e
        wrong = _hand_gradient(tiny64, CLEAN[0], CORRUPT[0], *e, _reference_points(other, steps))
        assert abs(wrong - ref) > 1e-4 * abs(ref), e  # the rules are told apart
    if (rule, steps) == ("right", 1):
        eap = edge_attribution(tiny64, CLEAN[:1], CORRUPT[:1], method="eap")
        torch.testing.assert_close(res.scores, eap.scores, rtol=1e-9, atol=1e-12,
                                   equal_nan=True)


def test_eap_equals_hand_gradient_and_bad_rule_refused(tiny) -> None:
    model, _, _ = tiny("llama")
    res = edge_attribution(model, CLEAN[:1], CORRUPT[:1], method="eap")
    assert res.settings["ig_rule"] is None and res.label == "eap"
    for e in GRADIENT_EDGES:
        ref = _hand_gradient(model, CLEAN[0], CORRUPT[0], *e, None)
        assert abs(ref) > 1e-4, e
        assert _score(res, *e) == pytest.approx(ref, abs=EDGE_ATOL), e
    with pytest.raises(TLRewardError, match="ig_rule must be one of"):
        edge_attribution(model, CLEAN[:1], CORRUPT[:1], method="eap-ig", ig_rule="trapezoid")
    with pytest.raises(TLRewardError, match="ig_steps must be at least 1"):
        edge_attribution(model, CLEAN[:1], CORRUPT[:1], method="eap-ig", ig_steps=0)


@pytest.mark.parametrize("method", ["exact", "eap"])
def test_chunking_sources_does_not_change_scores(tiny, method: str) -> None:
    """Chunks of 2 and 3 sources split a layer's heads and its MLP differently."""
    model, _, _ = tiny("llama")
    ref = edge_attribution(model, CLEAN, CORRUPT, method=method)
    for n in (2, 3):
        got = edge_attribution(model, CLEAN, CORRUPT, method=method, chunk_sources=n)
        torch.testing.assert_close(got.scores, ref.scores, atol=1e-6, rtol=0, equal_nan=True)


def test_edges_on_device(tiny, device: str) -> None:
    """On ``device`` (cuda where available): exact edges still equal the hand path patch, the
    clean and corrupted metrics are HF's rewards, and EAP-IG and the circuit's faithfulness
    equal the CPU's (results come back on the CPU, like every result object)."""
    from tl_reward.circuits import RewardCircuit, evaluate_circuit

    cpu, hf, tok = tiny("llama")
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device=device)
    res = edge_attribution(model, CLEAN[:1], CORRUPT[:1], method="exact")
    assert res.scores.device.type == "cpu" and model.W_U.device.type == device
    e = ("a1.h3", "a2.h0", "v")
    ref = _hand_patch(cpu, CLEAN[0], CORRUPT[0], *e)
    assert _score(res, *e) == pytest.approx(ref, abs=EDGE_ATOL)
    for ids, got in [(CLEAN[0], res.clean_metric), (CORRUPT[0], res.corrupt_metric)]:
        t = torch.tensor([ids])
        ref = hf_rewards(hf, t, torch.ones_like(t))["reward"][0, 0]
        assert float(got[0]) == pytest.approx(float(ref), abs=EDGE_ATOL)
    ig = edge_attribution(model, CLEAN, CORRUPT, method="eap-ig", ig_steps=3)
    ref = edge_attribution(cpu, CLEAN, CORRUPT, method="eap-ig", ig_steps=3)
    torch.testing.assert_close(ig.scores.cpu(), ref.scores, atol=EDGE_ATOL, rtol=0, equal_nan=True)
    circ = [RewardCircuit.top(r, 40) for r in (ig, ref)]
    got, want = (evaluate_circuit(m, c, CLEAN, CORRUPT)
                 for m, c in zip((model, cpu), circ, strict=True))
    assert got.faithfulness.value == pytest.approx(want.faithfulness.value, abs=1e-4)
