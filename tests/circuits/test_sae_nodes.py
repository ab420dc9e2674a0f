"""SAE features and the error term as nodes of the edge graph (Sparse Feature Circuits'
construction), against independent references: the hook-level edge scores (EAP is linear, so
feature and error edges into a destination sum to the hook's), hand-written TransformerLens
path patches of one feature's decoded change, and a feature's direct effect on the reward by
hand (activation change x decoder row . HF's head row through the frozen final norm)."""

from __future__ import annotations

import pytest
import torch
from helpers import hf_readout, patch_edge_input
from sae_lens.saes.topk_sae import TopKSAE

from tests.sae.test_sae_attribution import make_sae as seeded_sae
from tl_reward.circuits import edge_attribution
from tl_reward.errors import TLRewardError
from tl_reward.results import load_result
from tl_reward.sae import as_sae_model

CLEAN = [[5, 17, 30, 41, 52, 8], [6, 19, 33, 44, 12, 9, 23]]
CORRUPT = [[5, 17, 31, 41, 50, 8], [6, 20, 33, 44, 12, 9, 23]]
ATOL = 2e-5  # float32 rounding of rewards of size ~3 through 3 layers


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
        assert float(fe.scores[j].sum()) == pytest.approx(float(want), abs=ATOL), dst
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
            assert got == pytest.approx(ref, abs=ATOL), (node, dst, qkv)
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
        torch.testing.assert_close(fe.scores[-1, :-1], hand[fe.features], atol=ATOL, rtol=0)
        m1 = res.scores[-1, res.graph.sources.index("m1")]
        # an exact score is a difference of two float32 rewards of about 3 (the patched ones
        # run stacked, so each carries up to ~3e-6 of rounding); the sum adds one per node
        tol = ATOL if res.method == "eap" else 3e-6 * len(fe.nodes)
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
        torch.testing.assert_close(got.scores, ref.scores, atol=ATOL, rtol=0, equal_nan=True)
