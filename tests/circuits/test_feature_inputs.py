"""Edges into SAE nodes (features as destinations, Sparse Feature Circuits' construction) and
two SAEs, against references written with plain TransformerLens hooks: an exact edge is a hand
path patch that adds its source's change (HF's source outputs, :mod:`tests.circuits.hand_edges`,
or an upstream node's change from the SAE's ``encode``) to the node's input alone (for an
MLP-output SAE through the MLP, run by hand), encodes the whole patched input with the SAE's
own ``encode`` and adds that node's decoded change at the hook; EAP and EAP-IG are that patch's
gradient by autograd. Ground truth: a planted mechanism in which a feature of an SAE at the
embeddings writes a feature of an SAE at the next residual."""

from __future__ import annotations

import pytest
import torch
from helpers import CLEAN, CORRUPT, EDGE_ATOL, needs_hooked_transformer
from sae_lens.saes.sae import SAEMetadata
from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

from tests.circuits import hand_edges
from tests.circuits.test_sae_nodes import make_sae
from tl_reward.circuits import (
    RewardCircuit,
    edge_attribution,
    evaluate_circuit,
    faithfulness_curve,
)
from tl_reward.circuits.edges import ig_alphas
from tl_reward.errors import TLRewardError
from tl_reward.results import load_result

RESID, MLP = "blocks.1.hook_resid_post", "blocks.1.hook_mlp_out"


def _layer(src: str) -> int:
    return -1 if src == "input" else int(src[1:].split(".")[0])


def _node_change(sae: TopKSAE, x: torch.Tensor, x_new: torch.Tensor, node: int | str
                 ) -> torch.Tensor:
    """Node ``node``'s output change ``[pos, d]`` when the SAE's input goes from ``x`` to
    ``x_new`` (the whole input encoded): a feature's activation change times its ``W_dec``
    row, or the error term's ``x - f W_dec`` change."""
    df = sae.encode(x_new) - sae.encode(x)
    return (x_new - x) - df @ sae.W_dec if node == "err" else df[:, node, None] * sae.W_dec[node]


def _reward(model, ids: list[int], sae: TopKSAE, node: int | str, add: torch.Tensor,
            embed: torch.Tensor | None = None) -> torch.Tensor:
    """The reward with ``add`` ``[pos, d]`` added to ``node``'s input alone (differentiable
    in ``add``): at a residual hook the activation there; at ``hook_mlp_out`` the MLP's input,
    run through the layer's own norm and MLP by hand. ``embed`` replaces the embeddings."""
    hook = sae.cfg.metadata.hook_name
    layer = int(hook.split(".")[1])
    seen: dict[str, torch.Tensor] = {}
    hooks = [] if embed is None else [("blocks.0.hook_resid_pre", lambda a, hook: embed[None])]

    def out(act: torch.Tensor, hook: object) -> torch.Tensor:
        x = act[0]
        if "x_in" in seen:
            block = model.blocks[layer]
            x_new = block.mlp(block.ln2(seen["x_in"] + add[None]))[0]
        else:
            x_new = x + add
        return act + _node_change(sae, x, x_new, node)[None]
    if hook.endswith("mlp_out"):
        hooks.append((f"blocks.{layer}.hook_mlp_in", lambda a, hook: seen.update(x_in=a)))
    hooks.append((hook, out))
    model.cfg.use_hook_mlp_in = True
    try:
        return model.run_with_hooks(torch.tensor([ids]), return_type="reward",
                                    fwd_hooks=hooks)[0, 0]
    finally:
        model.cfg.use_hook_mlp_in = False


def _acts(model, ids: list[int], hook: str) -> torch.Tensor:
    with torch.no_grad():
        return model.run_with_cache(torch.tensor([ids]), names_filter=hook)[1][hook][0]


def _columns(model, hf, clean: list[int], corrupt: list[int],
             upstream: tuple[TopKSAE, str] | None = None) -> dict[str, torch.Tensor]:
    """Each graph source's corrupted-minus-clean output (HF's, by hand), and each node of the
    ``upstream`` ``(sae, prefix)``'s change (its ``encode`` at its hook)."""
    a, b = hand_edges.sources(hf, clean), hand_edges.sources(hf, corrupt)
    out = {k: b[k] - a[k] for k in a}
    if upstream is not None:
        sae, prefix = upstream
        x, x_new = (_acts(model, ids, sae.cfg.metadata.hook_name) for ids in (clean, corrupt))
        with torch.no_grad():
            for i in range(sae.cfg.d_sae):
                out[f"{prefix}.f{i}"] = _node_change(sae, x, x_new, i)
            out[f"{prefix}.err"] = _node_change(sae, x, x_new, "err")
    return out


def _exact_by_hand(model, ids, sae, node, add) -> float:
    with torch.no_grad():
        return float(_reward(model, ids, sae, node, add)
                     - _reward(model, ids, sae, node, torch.zeros_like(add)))


def _input_grad(model, hf, clean, corrupt, sae, node, alphas: list[float] | None
                ) -> torch.Tensor:
    """``dM/d(input of node)`` ``[pos, d]`` by autograd of :func:`_reward`, at the clean run
    (``alphas`` None) or averaged over EAP-IG's points on the embeddings."""
    emb = [] if alphas is None else [hand_edges.sources(hf, ids)["input"]
                                     for ids in (clean, corrupt)]
    grads = []
    for alpha in [None] if alphas is None else alphas:
        eps = torch.zeros(len(clean), model.cfg.d_model, requires_grad=True)
        embed = None if alpha is None else emb[1] + alpha * (emb[0] - emb[1])
        grads.append(torch.autograd.grad(_reward(model, clean, sae, node, eps, embed), eps)[0])
    return torch.stack(grads).mean(0)


def _node_of(name: str) -> int | str:
    tail = name.split(".")[1]
    return "err" if tail == "err" else int(tail[1:])


# -- one SAE: exact and gradient edges into its nodes -------------------------------------------
@pytest.mark.parametrize(("first", "hook"), [(None, RESID), (None, MLP),
                                             ("blocks.0.hook_mlp_out", RESID)])
def test_exact_edges_into_nodes_are_hand_path_patches(tiny, first: str | None,
                                                      hook: str) -> None:
    """Edges into the feature of largest direct effect, another feature and the error node,
    from every source upstream of their input (every source before a residual hook; the
    sources feeding layer 1's MLP) against the hand patch; after an SAE at ``m0``, from its
    nodes in place of ``m0``."""
    model, hf, _ = tiny("llama")
    sae = make_sae(model.cfg.d_model, hook)
    saes = [sae] if first is None else [make_sae(model.cfg.d_model, first, seed=1), sae]
    att = edge_attribution(model, CLEAN[:1], CORRUPT[:1], method="exact", sae=saes,
                           feature_inputs=True)
    fe = att.features if first is None else att.downstream
    upstream = [s for s in fe.graph.sources if _layer(s) < 1 or (
        hook == RESID and _layer(s) == 1) or (s.startswith("a1.") and hook == MLP)]
    if first is not None:
        upstream = [s for s in upstream if s != "m0"] + att.features.nodes
    assert fe.input_sources == upstream and fe.inputs.shape == (len(fe.nodes), len(upstream))
    cols = _columns(model, hf, CLEAN[0], CORRUPT[0], None if first is None else (saes[0], "m0"))
    top = int(fe.scores[-1, :-1].abs().argmax())
    for k in (top, (top + 1) % len(fe.features), len(fe.features)):
        node = "err" if k == len(fe.features) else fe.features[k]
        ref = torch.tensor([_exact_by_hand(model, CLEAN[0], sae, node, cols[s])
                            for s in upstream])
        torch.testing.assert_close(fe.inputs[k], ref, atol=EDGE_ATOL, rtol=0)
        assert ref.abs().max() > 1e-3, node
    assert first is None or ref[-1].abs() > 1e-3  # the upstream error node's edge counts
    df = fe.to_dataframe()
    assert set(df.dst) >= set(fe.nodes) and len(df) == int((~fe.scores.isnan()).sum()
                                                             + fe.inputs.numel())


@pytest.mark.parametrize(("hook", "method", "rule"), [
    (RESID, "eap", None), (MLP, "eap", None), (RESID, "eap-ig", "right"),
    (MLP, "eap-ig", "midpoint")])
def test_gradient_edges_into_nodes_are_hand_gradients(tiny, hook: str, method: str,
                                                      rule: str | None) -> None:
    """EAP (the clean run) and EAP-IG (the rule's points on the embeddings, 2 steps) into every
    node: each column's change times the hand gradient of the node's input."""
    model, hf, _ = tiny("llama")
    sae = make_sae(model.cfg.d_model, hook)
    kw = {} if rule is None else {"ig_rule": rule, "ig_steps": 2}
    fe = edge_attribution(model, CLEAN[:1], CORRUPT[:1], method=method, sae=sae,
                          feature_inputs=True, **kw).features
    cols = _columns(model, hf, CLEAN[0], CORRUPT[0])
    alphas = None if rule is None else ig_alphas(rule, 2)
    d = torch.stack([cols[s] for s in fe.input_sources])
    for k, name in enumerate(fe.nodes):
        g = _input_grad(model, hf, CLEAN[0], CORRUPT[0], sae, _node_of(name), alphas)
        torch.testing.assert_close(fe.inputs[k], (d * g).sum((1, 2)), atol=EDGE_ATOL, rtol=0)
    assert fe.inputs.abs().max() > 1e-2


@pytest.mark.parametrize("pair", [("blocks.0.hook_mlp_out", RESID), (None, RESID), (None, MLP)])
def test_edges_into_a_node_sum_to_its_first_order_change(tiny, pair) -> None:
    """EAP is linear in the columns' changes, which sum to the change of the node's input (the
    residual at the hook, or the MLP's input; an upstream SAE's nodes sum to the sources they
    split): per node, its edges in sum to ``dx . dM/d(input)``, ``dx`` read off the clean and
    corrupted runs; two items of different lengths (padding)."""
    model, _, _ = tiny("llama")
    saes = [make_sae(model.cfg.d_model, h, seed=i) for i, h in enumerate(pair) if h]
    att = edge_attribution(model, CLEAN, CORRUPT, method="eap", sae=saes, feature_inputs=True)
    fe = att.downstream if len(saes) == 2 else att.features
    sae = saes[-1]
    if len(saes) == 2:  # m0 gives way to its nodes
        assert "m0" not in fe.input_sources and fe.input_sources[-1] == "m0.err"
    hook = sae.cfg.metadata.hook_name
    reads = hook if hook == RESID else "blocks.1.hook_mlp_in"
    want = torch.zeros(len(fe.nodes))
    model.cfg.use_hook_mlp_in = True
    try:
        dx = [_acts(model, k, reads) - _acts(model, c, reads) for c, k in zip(CLEAN, CORRUPT,
                                                                            strict=True)]
    finally:
        model.cfg.use_hook_mlp_in = False
    for k, name in enumerate(fe.nodes):
        for c, kk, x in zip(CLEAN, CORRUPT, dx, strict=True):
            g = _input_grad(model, None, c, kk, sae, _node_of(name), None)
            want[k] += float((x * g).sum()) / len(CLEAN)
    torch.testing.assert_close(fe.inputs.sum(1), want, atol=EDGE_ATOL, rtol=0)
    assert want.abs().max() > 1e-2


# -- a planted mechanism: a feature at the embeddings writes a feature at the next residual -----
T, C = 30, 31
PLANT_CLEAN = [[5, 17, 41, 52, 8, T], [6, 19, T, 12, 9, 23], [7, 40, 11, T]]
PLANT_CORRUPT = [[C if t == T else t for t in ids] for ids in PLANT_CLEAN]


def _topk(hook: str, enc: torch.Tensor, b_enc: torch.Tensor, dec: torch.Tensor) -> TopKSAE:
    cfg = TopKSAEConfig(d_in=enc.shape[0], d_sae=enc.shape[1], k=1)
    cfg.metadata = SAEMetadata(hook_name=hook)
    sae = TopKSAE(cfg)
    with torch.no_grad():
        sae.W_enc.copy_(enc)
        sae.b_enc.copy_(b_enc)
        sae.W_dec.copy_(dec)
        sae.b_dec.zero_()
    return sae


def _plant(model, hf) -> tuple[TopKSAE, TopKSAE]:
    """SAE A at the embeddings (``r0``): feature 0 reads ``T - C``'s direction ``u`` and fires
    on ``T`` alone; it writes ``10 u``, so that its change is the embeddings' (the error node's
    is 0). SAE B at ``r1`` (TopK, k = 1): feature 0 (``b``) reads ``u / 2`` plus twice the
    direction of ``T + C`` (present at the trigger in both runs) and writes the reward's
    direction; feature 1 (``c``) reads ``-u / 2`` plus the same. Biases (midpoints of the
    measured pre-activations): neither fires off the trigger; at the clean trigger ``b`` wins;
    with A's change in B's input ``c`` wins while ``b``'s pre-activation stays positive, so
    ``b``'s change there is TopK's, not its ReLU's. Other features never fire."""
    emb = model.W_E.detach()
    d = emb.shape[1]
    delta = emb[T] - emb[C]
    size = float(delta.norm())
    u, m = delta / size, (emb[T] + emb[C]) / (emb[T] + emb[C]).norm()
    gen = torch.Generator().manual_seed(0)
    enc, dec = torch.randn(d, 3, generator=gen), torch.randn(3, d, generator=gen) / d**0.5
    enc[:, 0], dec[0] = u, 10 * u
    a = _topk("blocks.0.hook_resid_pre", enc,
              torch.tensor([float(-(emb[T] + emb[C]) @ u / 2 - 0.4 * size), -100.0, -100.0]),
              dec)
    reads = torch.stack([u / 2 + 2 * m, -u / 2 + 2 * m], 1)
    pre, patched, off = [], [], []
    for c, k in zip(PLANT_CLEAN, PLANT_CORRUPT, strict=True):
        x, xc = (_acts(model, ids, "blocks.0.hook_resid_post") for ids in (c, k))
        t = torch.tensor(c) == T
        pre.append((x @ reads)[t])
        patched.append(((x - delta) @ reads)[t])
        off += [(x @ reads)[~t], (xc @ reads)[~t]]
    pre, patched, off = torch.cat(pre), torch.cat(patched), torch.cat(off)
    b_b = -float(off[:, 0].max() + patched[:, 0].min()) / 2
    b_c = b_b + float((pre[:, 0] - pre[:, 1]).min() - (patched[:, 1] - patched[:, 0]).min()) / 2
    assert b_c < -float(off[:, 1].max())
    enc, dec = torch.randn(d, 4, generator=gen), torch.randn(4, d, generator=gen) / d**0.5
    enc[:, :2], dec[0] = reads, hf.score.weight[0].detach() / hf.score.weight[0].norm()
    return a, _topk("blocks.0.hook_resid_post", enc,
                    torch.tensor([b_b, b_c, -100.0, -100.0]), dec)


def _planted_hand(model, hf, a: TopKSAE, b: TopKSAE, per_feature: bool = False) -> float:
    """The A-feature -> B-feature edge by hand, the mean over the items; ``per_feature``: with
    B's feature 0 encoded alone (its ReLU, no TopK), the bug the plant exposes."""
    out = []
    for c, k in zip(PLANT_CLEAN, PLANT_CORRUPT, strict=True):
        add = _columns(model, hf, c, k, (a, "r0"))["r0.f0"]
        if not per_feature:
            out.append(_exact_by_hand(model, c, b, 0, add))
            continue
        x = _acts(model, c, "blocks.0.hook_resid_post")
        with torch.no_grad():
            f = [torch.relu(v @ b.W_enc[:, 0] + b.b_enc[0]) for v in (x, x + add)]
        out.append(float(_reward_with(model, c, b.cfg.metadata.hook_name,
                                      (f[1] - f[0])[:, None] * b.W_dec[0])))
    return sum(out) / len(out)


def _reward_with(model, ids: list[int], hook: str, add: torch.Tensor) -> torch.Tensor:
    tok = torch.tensor([ids])
    with torch.no_grad():
        return (model.run_with_hooks(tok, return_type="reward",
                                     fwd_hooks=[(hook, lambda act, hook: act + add)])[0, 0]
                - model(tok, return_type="reward")[0, 0])


def test_planted_feature_writes_feature(tiny, tmp_path) -> None:
    """``sae=[A, B]``: B's nodes' edges come from the components A does not split and from A's
    nodes; the planted edge ``r0.f0 -> r1.f0`` is the top edge into ``r1.f0`` under exact
    patching and equals the hand path patch (encoding B's whole patched input: its ReLU alone
    would be another number); under EAP it is the hand gradient. Results save and load."""
    model, hf, _ = tiny("llama")
    a, b = _plant(model, hf)
    for ids in PLANT_CLEAN:  # the plant: A's feature 0 fires at the trigger alone
        fired = a.encode(_acts(model, ids, "blocks.0.hook_resid_pre"))[:, 0] > 0
        assert fired.tolist() == [t == T for t in ids]
    att = edge_attribution(model, PLANT_CLEAN, PLANT_CORRUPT, method="exact", sae=[a, b])
    fa, fb = att.features, att.downstream
    assert fa.nodes == ["r0.f0", "r0.err"] and fa.inputs.shape == (2, 1)
    assert fb.features[:2] == [0, 1]
    assert fb.input_sources == ["a0.h0", "a0.h1", "a0.h2", "a0.h3", "m0", "r0.f0", "r0.err"]
    into = fb.to_dataframe().query("dst == 'r1.f0'").reset_index(drop=True)
    assert into.src[0] == "r0.f0" and abs(into.score[0]) > 4 * abs(into.score[1])
    hand = _planted_hand(model, hf, a, b)
    assert into.score[0] == pytest.approx(hand, abs=EDGE_ATOL)
    assert abs(_planted_hand(model, hf, a, b, per_feature=True) - hand) > 0.1 * abs(hand)
    eap = edge_attribution(model, PLANT_CLEAN, PLANT_CORRUPT, method="eap", sae=[a, b])
    got = float(eap.downstream.inputs[0, fb.input_sources.index("r0.f0")])
    want = 0.0
    for c, k in zip(PLANT_CLEAN, PLANT_CORRUPT, strict=True):
        add = _columns(model, hf, c, k, (a, "r0"))["r0.f0"]
        want += float((add * _input_grad(model, hf, c, k, b, 0, None)).sum()) / 3
    assert got == pytest.approx(want, abs=EDGE_ATOL) and abs(want) > 1e-2
    back = load_result(att.save(tmp_path / "edges"))
    torch.testing.assert_close(back.downstream.inputs, fb.inputs)
    assert back.downstream.input_sources == fb.input_sources


def test_frozen_norm_eap_equals_exact_on_edges_into_reward(tiny) -> None:
    """With the final norm's scale frozen at its clean value the reward is linear in the final
    residual: with two SAEs (an MLP's and a later residual's), EAP equals exact on every edge
    into ``reward``, hook-level and both SAEs' nodes'."""
    model, _, _ = tiny("llama")
    saes = [make_sae(model.cfg.d_model, h, seed=i)
            for i, h in enumerate(["blocks.0.hook_mlp_out", RESID])]
    _, cache = model.run_with_cache(torch.tensor(CLEAN[:1]), return_type=None)
    scale = cache["ln_final.hook_scale"]
    freeze = ("ln_final.hook_scale",
              lambda act, hook: scale.repeat(act.shape[0], 1, 1).to(act.dtype))
    with model.hooks(fwd_hooks=[freeze]):
        ex, ea = (edge_attribution(model, CLEAN[:1], CORRUPT[:1], method=m, sae=saes)
                  for m in ("exact", "eap"))
    # an exact score is a difference of two float32 rewards of about 3 (the patched ones run
    # stacked, so each carries up to ~3e-6 of rounding)
    torch.testing.assert_close(ea.scores[-1], ex.scores[-1], atol=1e-5, rtol=0)
    for x, y in [(ex.features, ea.features), (ex.downstream, ea.downstream)]:
        assert x.features == y.features
        torch.testing.assert_close(y.scores[-1], x.scores[-1], atol=1e-5, rtol=0)
        assert x.scores[-1].abs().max() > 1e-2


# -- one SAE as today, circuits refused, input checks -------------------------------------------
def test_one_sae_keeps_its_edges_and_circuits_refuse_edges_into_nodes(tiny) -> None:
    """Without ``feature_inputs`` one SAE's result is today's (no edges in); scoring the edges
    in leaves every other score unchanged; circuits over edges into nodes are refused, not
    silently evaluated without them."""
    model, _, _ = tiny("llama")
    sae = make_sae(model.cfg.d_model, MLP)
    plain = edge_attribution(model, CLEAN, CORRUPT, method="eap", sae=sae)
    assert plain.features.inputs is None and plain.downstream is None
    both = edge_attribution(model, CLEAN, CORRUPT, method="eap", sae=sae, feature_inputs=True)
    assert both.features.features == plain.features.features
    torch.testing.assert_close(both.features.scores, plain.features.scores, equal_nan=True,
                               atol=0, rtol=0)
    torch.testing.assert_close(both.scores, plain.scores, equal_nan=True, atol=0, rtol=0)
    for select in (lambda a: RewardCircuit.top(a, 5), lambda a: RewardCircuit.greedy(a, 5),
                   lambda a: RewardCircuit.fraction(a, 0.5), lambda a: a.view()):
        with pytest.raises(TLRewardError, match="not built"):
            select(both)
    with pytest.raises(TLRewardError, match="not built"):
        faithfulness_curve(model, both, CLEAN, CORRUPT, sae=sae)
    circuit = RewardCircuit.greedy(plain, 10)
    pair = [make_sae(model.cfg.d_model, "blocks.0.hook_mlp_out"), sae]
    with pytest.raises(TLRewardError, match="holds the nodes of one"):
        evaluate_circuit(model, circuit, CLEAN, CORRUPT, sae=pair)


def test_sae_pairs_and_feature_inputs_are_checked(tiny) -> None:
    model, _, _ = tiny("llama")
    d = model.cfg.d_model
    late, early = make_sae(d, "blocks.2.hook_resid_pre"), make_sae(d, "blocks.0.hook_mlp_out")
    for saes in ([late, early], [make_sae(d, RESID), late]):  # wrong order; one residual
        with pytest.raises(TLRewardError, match="earlier SAE first"):
            edge_attribution(model, CLEAN, CORRUPT, method="eap", sae=saes)
    with pytest.raises(TLRewardError, match="ordered pair"):
        edge_attribution(model, CLEAN, CORRUPT, method="eap", sae=[early, early, late])
    with pytest.raises(TLRewardError, match="pass sae="):
        edge_attribution(model, CLEAN, CORRUPT, method="eap", feature_inputs=True)


@needs_hooked_transformer
def test_edges_into_nodes_on_the_bridge_equal_hooked() -> None:
    """The TransformerBridge (its own MLP-input and residual hooks) gives the edges into two
    SAEs' nodes HookedRewardModel's do (checked by hand above), exact and EAP."""
    from tests.circuits.test_bridge_circuits import _close, bridge, hooked

    model, clean, corrupt = bridge("llama")
    ht = hooked("llama")
    saes = [make_sae(model.cfg.d_model, h, seed=i)
            for i, h in enumerate(["blocks.0.hook_resid_post", MLP])]
    for method, n in (("exact", 1), ("eap", 2)):  # exact: one forward per edge, one pair
        a, b = (edge_attribution(m, clean[:n], corrupt[:n], method=method, sae=saes)
                for m in (model, ht))
        r = float(b.clean_metric.abs().max())
        for x, y in [(a.features, b.features), (a.downstream, b.downstream)]:
            assert x.features == y.features and x.input_sources == y.input_sources
            _close(x.inputs, y.inputs, f"{y.prefix} {method}", r)
        assert b.downstream.inputs.abs().max() > 1e-2
