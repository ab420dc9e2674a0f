"""SAE features and the error term as nodes of the edge graph (Sparse Feature Circuits'
construction), against independent references: the hook-level edge scores (EAP is linear, so
feature and error edges into a destination sum to the hook's), hand-written TransformerLens
path patches of one feature's decoded change, and a feature's direct effect on the reward by
hand (activation change x decoder row . HF's head row through the frozen final norm)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import CLEAN, CORRUPT, EDGE_ATOL, hf_readout, patch_edge_input
from sae_lens.saes.topk_sae import TopKSAE

from tests.sae.test_sae_attribution import make_sae as seeded_sae
from tl_reward import HookedRewardModel
from tl_reward.circuits import (
    RewardCircuit,
    RewardGraph,
    edge_attribution,
    evaluate_circuit,
    faithfulness_curve,
)
from tl_reward.circuits.circuit import edge_mask
from tl_reward.circuits.mib import to_mib_json
from tl_reward.circuits.nodes import after, node_split, sae_split
from tl_reward.errors import TLRewardError
from tl_reward.results import load_result
from tl_reward.sae import as_sae_model


def make_sae(d_in: int, hook: str, seed: int = 0) -> TopKSAE:
    """A seeded TopK SAE (32 features, 4 active) with a decoder bias and unequal row norms."""
    return seeded_sae(d_in, hook, seed, d_sae=32, k=4)


def _layer(src: str) -> int:
    return -1 if src == "input" else int(src[1:].split(".")[0])


def _hand_changes(model, sae, clean: list[int], corrupt: list[int]) -> tuple[torch.Tensor, ...]:
    """By hand at the SAE's hook (one unpadded sequence and its counterfactual): the feature
    activations' change ``[pos, d_sae]`` and the error's ``x - f W_dec`` change ``[pos, d]``
    (the decoder bias cancels)."""
    hook = sae.cfg.metadata.hook_name
    with torch.no_grad():
        x = [model.run_with_cache(torch.tensor([t]), names_filter=hook)[1][hook][0]
             for t in (clean, corrupt)]
        f = [sae.encode(v) for v in x]
        df = f[1] - f[0]
        return df, (x[1] - x[0]) - df @ sae.W_dec


@pytest.mark.parametrize(("hook", "method", "ablation"), [
    ("blocks.1.hook_mlp_out", "eap", None), ("blocks.1.hook_mlp_out", "eap-ig", "mean"),
    ("blocks.1.hook_resid_post", "eap", None), ("blocks.0.hook_mlp_out", "eap", "zero")])
def test_feature_and_error_edges_sum_to_the_hooks_edges(tiny, hook: str, method: str,
                                                        ablation: str | None) -> None:
    """Into every destination after the hook, feature edges plus the error edge equal the
    hook's edge (``m{l}``), or for a residual hook the sum of the edges of every source before
    it; destinations before the hook have no edge."""
    model, _, _ = tiny("llama")
    sae = make_sae(model.cfg.d_model, hook)
    kw = dict(corrupt=CORRUPT) if ablation is None else dict(ablation=ablation)
    res = edge_attribution(model, CLEAN, method=method, ig_steps=2, sae=sae, **kw)
    fe, g = res.features, res.graph
    lay = int(hook.split(".")[1])
    split = ([g.sources.index(f"m{lay}")] if hook.endswith("mlp_out")
             else [i for i, s in enumerate(g.sources) if _layer(s) <= lay])
    assert fe.scores.shape == (len(g.dests), len(fe.features) + 1)
    checked = 0
    for j, (dst, _) in enumerate(g.dests):
        if dst != "reward" and _layer(dst) <= lay:
            assert fe.scores[j].isnan().all(), dst
            continue
        want = res.scores[j, split].sum()
        assert float(fe.scores[j].sum()) == pytest.approx(float(want), abs=EDGE_ATOL), dst
        checked += 1
    assert checked == sum(1 for d, _ in g.dests if d == "reward" or _layer(d) > lay)
    # the split is not trivial: features and the error both carry something
    live = fe.scores[~fe.scores[:, 0].isnan()]
    assert live[:, :-1].abs().max() > 1e-3 and live[:, -1].abs().max() > 1e-4
    df = fe.to_dataframe()
    assert list(df.columns) == ["src", "dst", "qkv", "score"] and len(df) == live.numel()
    assert df["src"].str.endswith(".err").sum() == len(live)


def test_feature_nodes_are_the_features_that_move(tiny) -> None:
    """The nodes are exactly the features whose activation changes at some token (by hand),
    named after the hook."""
    model, _, _ = tiny("llama")
    sae = make_sae(model.cfg.d_model, "blocks.1.hook_mlp_out")
    res = edge_attribution(model, CLEAN, CORRUPT, method="eap", sae=sae)
    moved = torch.zeros(32, dtype=torch.bool)
    for c, k in zip(CLEAN, CORRUPT, strict=True):
        moved |= (_hand_changes(model, sae, c, k)[0] != 0).any(0)
    assert 0 < int(moved.sum()) < 32
    assert res.features.features == moved.nonzero().flatten().tolist()
    assert res.features.nodes[-1] == "m1.err" and res.features.nodes[0].startswith("m1.f")


def test_exact_feature_edges_equal_hand_path_patches(tiny) -> None:
    model, _, _ = tiny("llama")
    sae = make_sae(model.cfg.d_model, "blocks.1.hook_mlp_out")
    res = edge_attribution(model, CLEAN[:1], CORRUPT[:1], method="exact", sae=sae)
    fe, g = res.features, res.graph
    df, derr = _hand_changes(model, sae, CLEAN[0], CORRUPT[0])
    top = fe.features[int(fe.scores[-1, :-1].abs().argmax())]
    other = fe.features[0] if fe.features[0] != top else fe.features[1]
    for node, diff in [(top, df[:, top, None] * sae.W_dec[top]),
                       (other, df[:, other, None] * sae.W_dec[other]), ("err", derr)]:
        col = len(fe.features) if node == "err" else fe.features.index(node)
        for dst, qkv in [("reward", ""), ("m2", ""), ("a2.h1", "q"), ("a2.h0", "k"),
                         ("a2.h1", "v")]:
            ref = patch_edge_input(model, CLEAN[0], diff, dst, qkv)
            got = float(fe.scores[g.dests.index((dst, qkv)), col])
            assert got == pytest.approx(ref, abs=EDGE_ATOL), (node, dst, qkv)
    assert abs(patch_edge_input(model, CLEAN[0], df[:, top, None] * sae.W_dec[top], "reward", "")
               ) > 1e-3


def test_direct_effect_is_activation_change_times_decoder_row_through_frozen_norm(tiny) -> None:
    """With the final norm's scale frozen at its clean value the reward is linear in the final
    residual: a feature's edge into ``reward`` is ``df_i(t) (W_dec[i] . w) / s`` at the pooled
    token (HF's head row times its norm gain), under exact and EAP alike, and the feature and
    error edges sum to the hook's edge under exact patching too."""
    model, hf, _ = tiny("llama")
    sae = make_sae(model.cfg.d_model, "blocks.1.hook_mlp_out")
    tok = torch.tensor(CLEAN[:1])
    _, cache = model.run_with_cache(tok, return_type=None)
    scale = cache["ln_final.hook_scale"]
    freeze = ("ln_final.hook_scale",
              lambda act, hook: scale.repeat(act.shape[0], 1, 1).to(act.dtype))
    with model.hooks(fwd_hooks=[freeze]):
        got = {m: edge_attribution(model, CLEAN[:1], CORRUPT[:1], method=m, sae=sae)
               for m in ("exact", "eap")}
    w, _, _, eps = hf_readout(hf, "llama")
    x = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"][0, -1]
    s = (x.pow(2).mean() + eps).sqrt()
    df, _ = _hand_changes(model, sae, CLEAN[0], CORRUPT[0])
    hand = df[-1] * (sae.W_dec @ w[0]) / s
    assert hand.abs().max() > 1e-3
    for res in got.values():
        fe = res.features
        torch.testing.assert_close(fe.scores[-1, :-1], hand[fe.features], atol=EDGE_ATOL, rtol=0)
        m1 = res.scores[-1, res.graph.sources.index("m1")]
        # an exact score is a difference of two float32 rewards of about 3 (the patched ones
        # run stacked, so each carries up to ~3e-6 of rounding); the sum adds one per node
        tol = EDGE_ATOL if res.method == "eap" else 3e-6 * len(fe.nodes)
        assert float(fe.scores[-1].sum()) == pytest.approx(float(m1), abs=tol), res.method


def test_an_attached_sae_is_used_and_stays_attached(tiny, tmp_path) -> None:
    """An SAE attached with SAELens's ``add_sae`` gives the nodes ``sae=`` gives; the edges of
    the graph are the plain model's; the SAE is attached again after; results save and load."""
    model, _, _ = tiny("llama")
    hook = "blocks.1.hook_resid_post"
    sae = make_sae(model.cfg.d_model, hook)
    ref = edge_attribution(model, CLEAN, CORRUPT, method="eap", sae=sae)
    plain = edge_attribution(model, CLEAN, CORRUPT, method="eap")
    sm = as_sae_model(model)
    sm.add_sae(sae, use_error_term=True)
    got = edge_attribution(sm, CLEAN, CORRUPT, method="eap")
    assert sm.acts_to_saes == {hook: sae}
    assert got.features.features == ref.features.features and got.features.prefix == "r2"
    torch.testing.assert_close(got.features.scores, ref.features.scores, equal_nan=True)
    torch.testing.assert_close(got.scores, plain.scores, equal_nan=True)
    assert plain.features is None
    back = load_result(got.save(tmp_path / "edges"))
    torch.testing.assert_close(back.features.scores, got.features.scores, equal_nan=True)
    assert back.features.nodes == got.features.nodes


def test_sae_at_another_hook_is_refused_with_the_fix(tiny) -> None:
    model, _, _ = tiny("llama")
    sae = make_sae(model.cfg.d_model, "blocks.1.hook_resid_mid")
    with pytest.raises(TLRewardError, match="hook_mlp_out"):
        edge_attribution(model, CLEAN, CORRUPT, method="eap", sae=sae)


def test_padding_side_and_batch_size_do_not_change_feature_edges(tiny) -> None:
    model, _, _ = tiny("llama")
    sae = make_sae(model.cfg.d_model, "blocks.1.hook_resid_post")
    clean, corrupt = [*CLEAN, [7, 8, 9, 10]], [*CORRUPT, [7, 8, 11, 10]]
    ref = edge_attribution(model, clean, corrupt, method="eap", batch_size=1, sae=sae).features
    for kw in [dict(batch_size=3, padding_side="left"), dict(batch_size=2, padding_side="right")]:
        got = edge_attribution(model, clean, corrupt, method="eap", sae=sae, **kw).features
        assert got.features == ref.features
        torch.testing.assert_close(got.scores, ref.scores, atol=EDGE_ATOL, rtol=0, equal_nan=True)


# -- circuits over feature nodes ----------------------------------------------------------------
def _feature_mask(g, prefix: str, hook_mask: torch.Tensor, n_nodes: int) -> torch.Tensor:
    """A hook-level circuit mask as a feature circuit's: each split source's edges after the
    hook out, every node's edge into each destination after the hook that the hook-level
    circuit fed from every split source."""
    lo, hi = node_split(g, prefix)
    dests = after(g, hi)
    whole = hook_mask[:, lo:hi].all(1) & dests
    m = hook_mask.clone()
    m[:, lo:hi] &= ~dests[:, None]
    return torch.cat([m, whole[:, None].expand(-1, n_nodes)], 1)


@pytest.mark.parametrize("hook", ["blocks.1.hook_mlp_out", "blocks.1.hook_resid_post"])
def test_circuit_with_every_node_edge_is_the_hook_level_circuit(tiny, hook: str) -> None:
    """A hook-level circuit with missing edges upstream of the hook (so the hook's activation
    is not the clean one) and the same circuit with each split edge after the hook replaced by
    the edges of all 32 features and the error node: the same metric; the full and empty
    feature circuits give the clean and corrupted metrics."""
    model, _, _ = tiny("llama")
    sae = make_sae(model.cfg.d_model, hook)
    g = RewardGraph.from_model(model)
    prefix, lo, hi = sae_split(g, hook)
    full = g.edge_mask()
    gen = torch.Generator().manual_seed(0)
    hook_mask = full & (torch.rand(full.shape, generator=gen) < 0.6)
    hook_mask[after(g, hi), lo:hi] = True  # every split edge after the hook in
    hook_mask[-1, lo:hi] = hook.endswith("mlp_out")  # and for the residual, none into reward
    feats = list(range(32))
    ref = evaluate_circuit(model, RewardCircuit.from_mask(g, hook_mask), CLEAN, CORRUPT)
    fc = RewardCircuit.from_mask(g, _feature_mask(g, prefix, hook_mask, 33), prefix, feats)
    assert fc.mask[:, len(g.sources):].any()
    got = evaluate_circuit(model, fc, CLEAN, CORRUPT, sae=sae)
    torch.testing.assert_close(got.metric, ref.metric, atol=EDGE_ATOL, rtol=0)
    assert min((ref.metric - ref.full).abs().min(), (ref.metric - ref.empty).abs().min()) > 5e-3
    for mask, want in [(fc.mask | True, got.full), (fc.mask & False, got.empty)]:
        ev = evaluate_circuit(model, RewardCircuit.from_mask(g, mask, prefix, feats), CLEAN,
                              CORRUPT, sae=sae)
        torch.testing.assert_close(ev.metric, want, atol=EDGE_ATOL, rtol=0)


@pytest.mark.parametrize("hook", ["blocks.1.hook_mlp_out", "blocks.1.hook_resid_post"])
def test_circuit_missing_one_node_edge_is_a_hand_patch(tiny, hook: str) -> None:
    """The top circuit of every edge of an attribution with SAE nodes, less one feature's (or
    the error node's) edge: its metric minus the clean one is a hand-written TransformerLens
    patch adding that node's change (from the SAE's encode and ``W_dec``) to that input."""
    model, _, _ = tiny("llama")
    sae = make_sae(model.cfg.d_model, hook)
    att = edge_attribution(model, CLEAN, CORRUPT, method="eap", sae=sae)
    fe, g = att.features, att.graph
    every = RewardCircuit.top(att, 10**6)
    assert every.prefix == fe.prefix and every.features == fe.features
    split = set(g.sources[slice(*sae_split(g, hook)[1:])])
    assert split == ({"m1"} if "mlp" in hook else {s for s in g.sources if _layer(s) <= 1})
    assert every.n_edges == every.headline()["of"]
    assert not any(s in split and d == "reward" for s, d, _ in every.edges())
    top = fe.features[int(fe.scores[-1, :-1].abs().argmax())]
    hand = [_hand_changes(model, sae, c, k) for c, k in zip(CLEAN, CORRUPT, strict=True)]
    for node, dst, qkv in [(top, "reward", ""), (top, "a2.h1", "q"), ("err", "m2", "")]:
        col = len(g.sources) + (len(fe.features) if node == "err" else fe.features.index(node))
        mask = every.mask.clone()
        mask[g.dests.index((dst, qkv)), col] = False
        ev = evaluate_circuit(model, RewardCircuit.from_mask(g, mask, fe.prefix, fe.features),
                              CLEAN, CORRUPT, sae=sae)
        ref = [patch_edge_input(model, c, derr if node == "err" else df[:, node, None]
                                * sae.W_dec[node], dst, qkv)
               for c, (df, derr) in zip(CLEAN, hand, strict=True)]
        torch.testing.assert_close(ev.metric - ev.full, torch.tensor(ref), atol=EDGE_ATOL, rtol=0)
        assert max(map(abs, ref)) > 1e-3, (node, dst)


def test_feature_circuits_select_prune_and_travel(tiny, tmp_path) -> None:
    """Selections rank the nodes' edges with the hook-level edges they do not split (the two
    dataframes merged by hand); pruning follows the nodes (a feature of ``m1`` is reached only
    through ``m1``'s inputs) and leaves the metric unchanged; ``from_edges`` reads the nodes'
    names back; the curve's points are circuit evaluations; results save and load."""
    model, _, _ = tiny("llama")
    sae = make_sae(model.cfg.d_model, "blocks.1.hook_mlp_out")
    att = edge_attribution(model, CLEAN, CORRUPT, method="exact", sae=sae)
    fe, g = att.features, att.graph
    hdf = att.to_dataframe()
    df = pd.concat([hdf[hdf.src != "m1"], fe.to_dataframe()])
    df = df.iloc[np.argsort(-df.score.abs().to_numpy(), kind="stable")]
    edges = list(map(tuple, df[["src", "dst", "qkv"]].values.tolist()))
    assert RewardCircuit.fraction(att, 1.0).n_edges == len(df) > len(hdf)
    view = str(att.view(max_edges=len(df)))  # the view draws the edges circuits select from
    drawn = re.findall(r'<path class="e" data-rank="\d+" data-src="([^"]+)" data-dst="([^"]+)"',
                       view)
    assert sorted(drawn) == sorted(zip(df.src, df.dst, strict=True))
    f0 = f"m1.f{fe.features[0]}"
    fdf = fe.to_dataframe().set_index(["src", "dst"])
    assert f"{f0}: direct effect on the reward {fdf.score[f0, 'reward']:+.4g}" in view
    for n in (5, 40):
        top = RewardCircuit.top(att, n)
        assert set(top.edges()) <= set(edges[:n])
        back = RewardCircuit.from_edges(g, top.edges())
        assert set(back.edges()) == set(top.edges()) and set(back.features) <= set(top.features)
    assert any(".f" in e[0] for e in top.edges())
    view = str(top.view(att))  # the circuit alone, every edge shown, its nodes drawn
    drawn = re.findall(r'<path class="e" data-rank="\d+" data-src="([^"]+)" data-dst="([^"]+)"',
                       view)
    assert sorted(drawn) == sorted((s, d) for s, d, _ in top.edges())
    assert "display:none" not in view and f'data-name="{top.edges()[0][0]}"' in view
    plain = edge_attribution(model, CLEAN, CORRUPT, method="eap")
    with pytest.raises(TLRewardError, match="other SAE nodes"):
        top.view(plain)
    with pytest.raises(TLRewardError, match="other SAE nodes"):
        RewardCircuit.top(plain, 5).view(att)
    assert set(RewardCircuit.threshold(att, float(df.score.abs().iloc[12])).edges()) <= set(
        edges[:13])
    greedy = RewardCircuit.greedy(att, 12)
    assert greedy.n_edges >= 12 and any(e[0].startswith("m1.") for e in greedy.edges())
    f = f"m1.f{fe.features[0]}"
    assert RewardCircuit.from_edges(g, [(f, "reward", "")]).n_edges == 0  # m1 is not reached
    assert RewardCircuit.from_edges(g, [(f, "reward", ""), ("input", "m1", "")]).n_edges == 2
    full = edge_mask(g, fe.prefix, len(fe.nodes))
    raw = full & (torch.rand(full.shape, generator=torch.Generator().manual_seed(1)) < 0.25)
    pruned = RewardCircuit.from_mask(g, raw, fe.prefix, fe.features)
    assert 0 < pruned.n_edges < int(raw.sum())
    evs = [evaluate_circuit(model, c, CLEAN, CORRUPT, sae=sae) for c in
           (RewardCircuit(g, raw, fe.prefix, fe.features), pruned)]
    torch.testing.assert_close(evs[0].metric, evs[1].metric, atol=EDGE_ATOL, rtol=0)
    sizes = (0.1, 0.3, 1.0)
    curve = faithfulness_curve(model, att, CLEAN, CORRUPT, sizes=sizes, sae=sae)
    for i, frac in enumerate(sizes):
        ev = evaluate_circuit(model, RewardCircuit.fraction(att, frac), CLEAN, CORRUPT, sae=sae)
        assert float(curve.faithfulness[i]) == pytest.approx(float(ev.per_item.mean()), abs=1e-5)
    assert float(curve.random[-1]) == pytest.approx(1.0, abs=1e-4)
    back = load_result(evs[1].save(tmp_path / "eval")).circuit
    assert back.edges() == pruned.edges() and back.features == fe.features
    cfg = model.cfg  # EAP-IG's JSON has no feature nodes: refused, not silently dropped
    with pytest.raises(TLRewardError, match="SAE feature nodes has no EAP-IG form"):
        to_mib_json(hdf, cfg.n_layers, cfg.n_heads, set(greedy.edges()), d_model=cfg.d_model,
                    n_kv_heads=g.n_kv_heads)


def test_feature_circuit_input_is_checked(tiny) -> None:
    model, _, _ = tiny("llama")
    g = RewardGraph.from_model(model)
    with pytest.raises(TLRewardError, match="those of one SAE"):
        RewardCircuit.from_edges(g, [("m1.f3", "reward", ""), ("r2.err", "reward", "")])
    with pytest.raises(TLRewardError, match="not an edge"):
        RewardCircuit.from_edges(g, [("m1.f3", "reward", ""), ("m1", "reward", "")])
    c = RewardCircuit.from_edges(g, [("m1.f3", "reward", ""), ("input", "m1", "")])
    for sae in (None, make_sae(model.cfg.d_model, "blocks.1.hook_resid_post")):
        with pytest.raises(TLRewardError, match="pass that SAE"):
            evaluate_circuit(model, c, CLEAN, CORRUPT, sae=sae)


def test_node_change_is_taken_at_the_current_activation(tiny) -> None:
    """Every edge but ``input -> m1`` and one feature's edge into the reward: by hand, ``m1``'s
    input gets the embeddings' change, so ``m1`` writes some ``x`` that is neither clean nor
    corrupted, and the reward's input gets ``(enc(x_corr)_i - enc(x)_i) W_dec[i]`` with ``x``
    read in the same forward (TransformerLens hooks)."""
    model, _, _ = tiny("llama")
    hook = "blocks.1.hook_mlp_out"
    sae = make_sae(model.cfg.d_model, hook)
    att = edge_attribution(model, CLEAN, CORRUPT, method="eap", sae=sae)
    fe, g = att.features, att.graph
    i = fe.features[int(fe.scores[-1, :-1].abs().argmax())]
    mask = RewardCircuit.top(att, 10**6).mask
    mask[g.dests.index(("m1", "")), 0] = False
    mask[-1, len(g.sources) + fe.features.index(i)] = False
    ev = evaluate_circuit(model, RewardCircuit.from_mask(g, mask, fe.prefix, fe.features), CLEAN,
                          CORRUPT, sae=sae)
    emb, last = "blocks.0.hook_resid_pre", f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    ref = []
    for c, k in zip(CLEAN, CORRUPT, strict=True):
        with torch.no_grad():
            corr = model.run_with_cache(torch.tensor([k]), names_filter=[emb, hook])[1]
            clean = model.run_with_cache(torch.tensor([c]), names_filter=[emb])[1]
        seen = {}

        def read(act, hook, seen=seen):
            seen["x"] = act

        def add_df(act, hook, seen=seen, corr=corr):
            df = sae.encode(corr["blocks.1.hook_mlp_out"])[..., i] - sae.encode(seen["x"])[..., i]
            return act + df[..., None] * sae.W_dec[i]
        hooks = [("blocks.1.hook_mlp_in", lambda a, hook, d=corr[emb] - clean[emb]: a + d),
                 (hook, read), (last, add_df)]
        model.cfg.use_hook_mlp_in = True
        try:
            with torch.no_grad():
                r = model.run_with_hooks(torch.tensor([c]), return_type="reward",
                                         fwd_hooks=hooks)[0, 0]
        finally:
            model.cfg.use_hook_mlp_in = False
        ref.append(float(r))
    torch.testing.assert_close(ev.metric, torch.tensor(ref), atol=EDGE_ATOL, rtol=0)


def test_feature_circuits_on_device(tiny, device: str) -> None:
    """On ``device`` (cuda where available): exact feature edges, a feature circuit's metric
    and the full circuit equal the CPU's (results come back on the CPU)."""
    cpu, hf, tok = tiny("llama")
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device=device)
    hook = "blocks.1.hook_resid_post"
    saes = [make_sae(cpu.cfg.d_model, hook) for _ in (0, 1)]
    res = [edge_attribution(m, CLEAN, CORRUPT, method="exact", sae=s)
           for m, s in zip((model, cpu), saes, strict=True)]
    assert res[0].features.scores.device.type == "cpu" and saes[0].W_dec.device.type == device
    assert res[0].features.features == res[1].features.features
    torch.testing.assert_close(res[0].features.scores, res[1].features.scores, atol=EDGE_ATOL,
                               rtol=0, equal_nan=True)
    for n in (30, 10**6):
        evs = [evaluate_circuit(m, RewardCircuit.top(res[1], n), CLEAN, CORRUPT, sae=s)
               for m, s in zip((model, cpu), saes, strict=True)]
        torch.testing.assert_close(evs[0].metric, evs[1].metric, atol=EDGE_ATOL, rtol=0)
    torch.testing.assert_close(evs[0].metric, evs[1].full, atol=EDGE_ATOL, rtol=0)
