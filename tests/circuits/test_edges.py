"""Edge attribution against independent references: hand-written TransformerLens path patches,
direct-path patching, HF-equivalent ungrouped models, and brute-force edge counts."""

from __future__ import annotations

import pytest
import torch
from helpers import CLEAN, CORRUPT, EDGE_ATOL, edge_input_hook, hf_rewards, patch_edge_input

from tl_reward import HookedRewardModel
from tl_reward.analysis.direct_path import direct_path_patching
from tl_reward.circuits import RewardGraph, edge_attribution
from tl_reward.circuits.graph import split_inputs
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
    before = (model.cfg.use_split_qkv_input, model.cfg.use_hook_mlp_in)
    edge_attribution(model, CLEAN[:1], CORRUPT[:1], method="eap")
    assert (model.cfg.use_split_qkv_input, model.cfg.use_hook_mlp_in) == before
    with pytest.raises(RuntimeError), split_inputs(model):
        raise RuntimeError
    assert (model.cfg.use_split_qkv_input, model.cfg.use_hook_mlp_in) == before


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
                   src: str, dst: str, qkv: str, steps: int) -> float:
    """(a_src(corrupt) - a_src(clean)) . dR/d(in_dst), the gradient averaged over ``steps``
    points k/steps on the corrupt -> clean embedding line (steps=0: at the clean run), with
    plain TransformerLens hooks and autograd on a zero added to the destination input."""
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
    for alpha in ([k / steps for k in range(1, steps + 1)] if steps else [1.0]):
        eps = torch.zeros_like(diff, requires_grad=True)

        def add(act: torch.Tensor, hook: object, eps: torch.Tensor = eps) -> torch.Tensor:
            if act.ndim == 4:
                return torch.cat([act[:, :, :h], (act[:, :, h] + eps)[:, :, None],
                                  act[:, :, h + 1 :]], 2)
            return act + eps
        emb = (e1 + alpha * (e0 - e1)).detach()
        model.cfg.use_split_qkv_input = model.cfg.use_hook_mlp_in = True
        try:
            r = model.run_with_hooks(tok, return_type="reward", fwd_hooks=[
                ("blocks.0.hook_resid_pre", lambda act, hook, emb=emb: emb), (hook, add)])[0, 0]
        finally:
            model.cfg.use_split_qkv_input = model.cfg.use_hook_mlp_in = False
        (g,) = torch.autograd.grad(r, eps)
        grads.append(g)
    return float((diff.detach() * torch.stack(grads).mean(0)).sum())


@pytest.mark.parametrize(("method", "steps"), [("eap", 0), ("eap-ig", 3)])
def test_eap_and_eap_ig_equal_hand_gradients(tiny, method: str, steps: int) -> None:
    model, _, _ = tiny("llama")
    res = edge_attribution(model, CLEAN[:1], CORRUPT[:1], method=method, ig_steps=steps or 5)
    for e in [("a0.h1", "a1.h2", "q"), ("input", "a2.h1", "k"), ("a1.h3", "a2.h0", "v"),
              ("input", "m0", ""), ("a0.h2", "m1", ""), ("a2.h3", "reward", "")]:
        ref = _hand_gradient(model, CLEAN[0], CORRUPT[0], *e, steps=steps)
        assert abs(ref) > 1e-4, e
        assert _score(res, *e) == pytest.approx(ref, abs=EDGE_ATOL), e


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
