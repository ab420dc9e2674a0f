"""Every analysis on a BridgeRewardModel gives the HookedRewardModel's numbers, or refuses by name.

One tiny seeded Llama RM loaded both ways (the bridge wraps HF's module and runs HF's forward;
the hooked model runs TransformerLens's own on processed weights), the same inputs. The two
forwards differ only by float32 rounding, so each quantity is compared at
:func:`~helpers.parity_atol` of its own magnitude (about 1e-4 here; a wrong pooled token, an
unfolded norm gain or a missing component moves them by their own size). What needs
HookedTransformer itself (the prefix caches) refuses a bridge with a TLRewardError naming the
analysis and the fix; the SAE analyses that attach an SAE: ``test_bridge_sae.py``.

Under TransformerLens 4 (no HookedTransformer) the comparisons skip; each analysis is then
checked on the bridge alone against a reference that needs neither backend
(``test_analysis_equals_an_independent_reference``, which runs under both versions): HF's own
modules by hand (residuals, head outputs, ablations through HF hooks, rewards of HF's forward),
or an identity (direct-path patching at a frozen scale is the DRA difference; attribution
patching is the limit of finite differences; a model's layers have CKA 1 with themselves).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers import (
    CONVERSATIONS,
    hf_readout,
    hf_rewards,
    hooked_transformer_missing,
    needs_hooked_transformer,
    needs_sae_lens,
    parity_atol,
)
from tl_reward.data import PreferencePair
from tl_reward.errors import TLRewardError

PAIR = PreferencePair.from_prompt("Is the sky blue?", "Yes, the sky is blue.", "No, it is red.")
POS = [("Is the sky blue?", f"Yes, the sky is blue{'!' * i}") for i in range(1, 5)]
NEG = [("Is the sky blue?", f"No. War. Hate{'.' * i}") for i in range(1, 5)]
CORPUS = [(f"Question {i}?", f"Answer {'yes ' * (i % 4 + 1)}and {i}.") for i in range(10)]


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    """The same seeded tiny Llama RM as ``{"hooked": ..., "bridge": ..., "hf": ...}`` (no
    ``"hooked"`` under TransformerLens 4)."""
    from tl_reward.model.bridge_reward_model import BridgeRewardModel
    from tl_reward.testing import tiny_hf_reward_model

    hf, tok = tiny_hf_reward_model("llama")
    out = {}
    if hooked_transformer_missing() is None:
        from tl_reward import HookedRewardModel

        out["hooked"] = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok,
                                                          device="cpu")
    out["bridge"] = BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok)
    out["hf"] = tiny_hf_reward_model("llama")[0]  # fresh: the bridge put its components in hf
    return out


def _lens(m: Any) -> dict[str, Any]:
    from tl_reward.analysis.lens import reward_lens

    lens = reward_lens(m, CONVERSATIONS)
    return {"frozen": lens.values["frozen"], "recompute": lens.values["recompute"]}


def _dra(m: Any) -> dict[str, Any]:
    from tl_reward.analysis.attribution import direct_reward_attribution

    d = direct_reward_attribution(m, CONVERSATIONS, neurons=True, per_position=True)
    return {"embed": d.embed, "heads": d.heads, "mlp": d.mlp,
            "reward": d.reward, "neurons": d.neurons,
            "head_positions": torch.cat([h.flatten() for h in d.head_positions])}


def _direct_path(m: Any) -> dict[str, Any]:
    from tl_reward.analysis.direct_path import direct_path_patching

    head = direct_path_patching(m, PAIR, level="head", scale="frozen")
    sub = direct_path_patching(m, PAIR, level="sublayer", scale="recompute", mode="noising")
    return {"head": head.effect, "sublayer": sub.effect, "patched": sub.patched}


def _patching(m: Any) -> dict[str, Any]:
    from tl_reward.analysis.patching import activation_patching, patch_components

    out = {f"{site} {mode}": activation_patching(
        m, PAIR, site, mode, positions="all" if site == "head" else "each").patched
        for site in ("resid", "attn_out", "mlp_out", "head") for mode in ("denoising", "zero")}
    out["components"] = patch_components(m, PAIR, ["embed", "L0.attn", "L1.mlp", "L2.H1"])
    return out


def _attribution_patching(m: Any) -> dict[str, Any]:
    from tl_reward.analysis.attribution_patching import attribution_patching

    ap = attribution_patching(m, PAIR)
    return {f"{site} {mode}": getattr(ap, site)[mode] for mode in ("denoising", "noising")
            for site in ("resid", "attn_out", "mlp_out", "head", "neuron")}


def _sae_attribution(m: Any) -> dict[str, Any]:
    from tests.sae.test_sae_attribution import make_sae
    from tl_reward.sae.attribution import sae_attribution

    sae = make_sae(m.cfg.d_model, f"blocks.{m.cfg.n_layers - 1}.hook_resid_post")
    a = sae_attribution(m, sae, CONVERSATIONS)  # exact: the final residual's split
    return {k: getattr(a, k) for k in ("features", "b_dec", "error", "reward",
                                       "reconstruction_gap", "activations", "scale")}


def _probes(m: Any) -> dict[str, Any]:
    from tl_reward.audit.perturbations import user_items
    from tl_reward.audit.probes import run_probes

    rep = run_probes(m, user_items(POS + NEG), ["length", "flattery"], n_permutations=4995)
    return {"rows": rep.rows.select_dtypes("number").to_numpy(dtype=np.float64),
            "natural_sd": rep.natural_sd}


def _concepts(m: Any) -> dict[str, Any]:
    from tl_reward.audit.concepts import concept_alignment, concept_vector, steering_curve

    c = concept_vector(m, POS, NEG, name="yes")
    al = concept_alignment(m, c, POS + NEG, separability=False)
    curve = steering_curve(m, c, POS[:2], alphas=[-1.0, 0.0, 1.0])
    return {"vector": c.vector, "cosine_head": al.cosine_head, "cosine_local": al.cosine_local,
            "slope": al.slope, "steered": curve.rewards, "predicted": curve.predicted_slope}


def _sweep(m: Any) -> dict[str, Any]:
    from tl_reward.sweep.vocab_sweep import score_vocabulary

    sweep = score_vocabulary(m, ["Is the sky blue?", "hi"], ids=list(range(10, 74)))
    return {"values": sweep.to_dataframe().select_dtypes("floating").to_numpy()}


def _compare(m: Any, other: Any) -> dict[str, Any]:
    from tl_reward.compare.behaviour import compare_models
    from tl_reward.compare.layers import compare_layers

    cmp = compare_models({"a": m, "b": other}, CORPUS)
    layers = compare_layers(m, other, CORPUS, n_permutations=0)
    return {"rewards": cmp.rewards["a"],
            "readability": np.stack([r.predicted for r in cmp.readability]),
            **{f"cka_{k}": v for k, v in layers.observed.items()}}


EQUAL: dict[str, Callable[..., dict[str, Any]]] = {
    "rewards": lambda m: {"rewards": m.rewards(CONVERSATIONS).values(0)},
    "lens": _lens,
    "direct reward attribution": _dra,
    "direct-path patching": _direct_path,
    "activation patching": _patching,
    "attribution patching": _attribution_patching,
    "probes": _probes,
    "SAE attribution (exact)": _sae_attribution,
    "concepts": _concepts,
    "vocabulary sweep": _sweep,
    "compare": _compare,
}


@needs_hooked_transformer
@pytest.mark.parametrize("analysis", sorted(EQUAL))
def test_analysis_equal_on_both_backends(models: dict[str, Any], analysis: str) -> None:
    args = (models["hooked"],) if analysis != "compare" else (models["hooked"], models["hooked"])
    want = EQUAL[analysis](*args)
    got = EQUAL[analysis](models["bridge"], *args[1:])
    assert want.keys() == got.keys()
    assert models["bridge"].cfg.model_name == models["hooked"].cfg.model_name  # same labels
    n_layers = models["hooked"].cfg.n_layers
    for key, ref in want.items():
        ref, new = (torch.from_numpy(np.array(x, dtype=np.float64)) for x in (ref, got[key]))
        assert float(ref.abs().max()) > 1e-3, key  # not vacuous
        torch.testing.assert_close(new, ref, atol=parity_atol(ref, n_layers), rtol=0,
                                   equal_nan=True, msg=f"{analysis}: {key}")


def test_rewards_and_readout_equal_hf(models: dict[str, Any]) -> None:
    """The bridge's folded head reads HF's reward from HF's final hidden state: the readout
    the lens, DRA and concepts share (a head without the norm gain folded in is off by its
    own size)."""
    from tl_reward.model.readout import reward_readout

    bridge, hf = models["bridge"], models["hf"]
    batch = bridge.build(CONVERSATIONS)
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"]
    resid = bridge.final_residual(batch.tokens, batch.attention_mask)
    ro = reward_readout(bridge, resid, batch.tokens, batch.attention_mask)
    torch.testing.assert_close(ro.reward, ref, atol=parity_atol(ref, 3), rtol=0)
    w, _ = bridge.folded_head
    torch.testing.assert_close(w[:, 0], hf.model.norm.weight * hf.score.weight[0], atol=1e-6,
                               rtol=0)


def _head_zero(m: Any) -> dict[str, Any]:
    from tl_reward.analysis.patching import activation_patching

    return {"head zero": activation_patching(m, PAIR, "head", "zero", positions="all").patched}


@needs_hooked_transformer
@pytest.mark.parametrize("arch", ["gemma2", "gpt2"])
def test_decompositions_equal_on_other_norms(arch: str) -> None:
    """Gemma-2's ``1 + w`` gains and sandwich norms, GPT-2's LayerNorm biases and value bias
    (HookedTransformer folds both into ``b_O``; a bridge keeps HF's, so zeroing a head's z on
    the bridge would also remove them, 0.36 off here before the fix)."""
    from tl_reward import HookedRewardModel
    from tl_reward.model.bridge_reward_model import BridgeRewardModel
    from tl_reward.testing import tiny_hf_reward_model

    hf, tok = tiny_hf_reward_model(arch)
    hooked = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
    bridge = BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok)
    for fn in (_lens, _dra, _head_zero, _attribution_patching):
        want, got = fn(hooked), fn(bridge)
        for key, ref in want.items():
            torch.testing.assert_close(got[key], ref, rtol=0, msg=f"{arch} {fn.__name__}: {key}",
                                       atol=parity_atol(ref, hooked.cfg.n_layers))


REFUSED: dict[str, tuple[str, str, tuple[Any, ...], dict[str, Any]]] = {
    # analysis (as the error names it): module, function, arguments after the model
    "the 'fast' prefix cache": ("tl_reward.sweep.vocab_sweep", "score_vocabulary",
                                ("hi",), {"ids": [10, 11], "cache": "fast"}),
    # what the IRM pipeline and sweep call: refused, not a fast cache built on a bridge
    "a key/value prefix cache": ("tl_reward.tl_backend.prefix_cache", "build_prefix_cache",
                                 (torch.tensor([1, 5, 7]),), {}),
}


@pytest.mark.parametrize("analysis", sorted(REFUSED))
def test_hooked_only_analyses_refuse_a_bridge_by_name(models: dict[str, Any],
                                                      analysis: str) -> None:
    module, fn, args, kwargs = REFUSED[analysis]
    with pytest.raises(TLRewardError, match=rf"^{analysis} does not run on a TransformerBridge"
                       r".*HookedRewardModel\.from_pretrained"):
        getattr(importlib.import_module(module), fn)(models["bridge"], *args, **kwargs)


# --- on the bridge alone: references that need neither backend (what runs under TL 4.3) ---


def _hf_parts(hf: Any, tokens: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """From HF's own forward, through hooks on its modules: the residual entering each block
    and the final norm ``[N, L + 1, pos, d]``, and each block's attention input to its output
    projection (heads merged) ``[N, L, pos, n_heads * d_head]``."""
    body = hf.transformer if hasattr(hf, "transformer") else hf.model
    layers, norm = (body.h, body.ln_f) if hasattr(body, "h") else (body.layers, body.norm)
    resid: list[torch.Tensor] = []
    z: list[torch.Tensor] = []

    def keep(out: list[torch.Tensor]) -> Callable[..., None]:
        return lambda mod, args, kwargs: out.append((args or (kwargs["hidden_states"],))[0])

    handles = []
    try:
        for m, out in [*((m, resid) for m in [*layers, norm]),
                       *((_out_proj(layer), z) for layer in layers)]:
            handles.append(m.register_forward_pre_hook(keep(out), with_kwargs=True))
        with torch.no_grad():
            hf(input_ids=tokens, attention_mask=mask)
    finally:
        for h in handles:
            h.remove()
    return {"resid": torch.stack(resid, 1), "z": torch.stack(z, 1)}


def _out_proj(layer: Any) -> Any:
    """A block's attention output projection (its input: the heads' ``z``, merged)."""
    return layer.attn.c_proj if hasattr(layer, "attn") else layer.self_attn.o_proj


def _head_outputs(block: Any, arch: str, z: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Each head's write to the residual ``[..., head, d]``, by hand from HF's weights: its slice
    of ``z`` less the constant part of the values (which HookedTransformer folds into ``b_O``)
    through its rows of the output projection, then Gemma-2's post-attention norm at the scale
    of all heads' output (OLMo-2's likewise, the only norm of its attention)."""
    proj = _out_proj(block)
    weight = proj.weight if arch == "gpt2" else proj.weight.T  # [heads * d_head, d]
    z = z - _value_bias(block, arch)
    out = torch.stack([zh @ rows for zh, rows in zip(z.chunk(n_heads, -1),
                                                      weight.chunk(n_heads, 0), strict=True)], -2)
    if arch in ("gemma2", "olmo2"):
        post = block.post_attention_layernorm
        eps = post.eps if arch == "gemma2" else post.variance_epsilon
        s = ((z @ weight).pow(2).mean(-1, keepdim=True) + eps).sqrt().unsqueeze(-2)
        out = out / s * (post.weight + (1 if arch == "gemma2" else 0))  # Gemma scales by 1 + w
    return out.detach()


def _value_bias(block: Any, arch: str) -> torch.Tensor:
    """The constant part of a block's values, heads merged: the value bias, and for GPT-2 the
    input LayerNorm's bias through ``W_V`` (0 where there is none)."""
    if arch == "gpt2":
        qkv = block.attn.c_attn
        return (block.ln_1.bias @ qkv.weight.chunk(3, 1)[2] + qkv.bias.chunk(3)[2]).detach()
    v = block.self_attn.v_proj.bias
    return torch.zeros(()) if v is None else v.detach()


def _frozen(hf: Any, arch: str, h: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """``w . c(h) / s + b`` with ``s`` the final norm's scale on ``final``, by hand."""
    w, bias, centre, eps = hf_readout(hf, arch)

    def c(v: torch.Tensor) -> torch.Tensor:
        return v - v.mean(-1, keepdim=True) if centre else v

    s = (c(final).pow(2).mean(-1, keepdim=True) + eps).sqrt()
    return (c(h) / s.unsqueeze(1) if h.dim() > final.dim() else c(h) / s) @ w.T + bias


def _check(got: Any, ref: torch.Tensor, what: str) -> None:
    got = torch.as_tensor(np.asarray(got, dtype=np.float32)) if not torch.is_tensor(got) else got
    assert float(ref.abs().max()) > 1e-3, what  # not vacuous
    torch.testing.assert_close(got.float(), ref.float(), atol=parity_atol(ref, 3), rtol=0,
                               msg=what)


def _pooled_parts(model: Any, hf: Any, inputs: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    batch = model.build(inputs)
    parts = _hf_parts(hf, batch.tokens, batch.attention_mask)
    at = torch.arange(len(inputs))
    return batch, {k: v[at, :, batch.pooled] for k, v in parts.items()}


def _lens_alone(model: Any, hf: Any, arch: str = "llama") -> None:
    """Recompute: HF's final norm and head on each residual; frozen: the final residual's norm
    scale, by hand."""
    from tl_reward.analysis.lens import reward_lens

    lens = reward_lens(model, CONVERSATIONS)
    _, parts = _pooled_parts(model, hf, CONVERSATIONS)
    h = parts["resid"]
    body = hf.transformer if arch == "gpt2" else hf.model
    with torch.no_grad():
        recompute = hf.score((body.ln_f if arch == "gpt2" else body.norm)(h))
    _check(lens.values["recompute"], recompute, "lens recompute")
    _check(lens.values["frozen"], _frozen(hf, arch, h, h[:, -1]), "lens frozen")


def _dra_alone(model: Any, hf: Any, arch: str = "llama") -> None:
    """Each block's attention (heads, by hand from HF's ``z`` and output projection, plus its
    bias) and MLP add up to the residual's increments, read at the frozen scale; neurons add up
    to their MLP, source positions to their head; the total is HF's reward."""
    from tl_reward.analysis.attribution import direct_reward_attribution

    d = direct_reward_attribution(model, CONVERSATIONS, neurons=True, per_position=True)
    batch, parts = _pooled_parts(model, hf, CONVERSATIONS)
    h, z = parts["resid"], parts["z"]
    bias = hf_readout(hf, arch)[1]
    final = h[:, -1]
    _check(d.total(), hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"], "total")
    _check(d.embed.sum(1), _frozen(hf, arch, h[:, 0], final) - bias, "embed")
    blocks = d.attn + d.mlp  # [n, layer, obj]
    _check(blocks, _frozen(hf, arch, h.diff(dim=1), final) - bias, "attention + MLP per block")
    layers = hf.transformer.h if arch == "gpt2" else hf.model.layers
    for layer, block in enumerate(layers):
        out = _head_outputs(block, arch, z[:, layer], model.cfg.n_heads)
        _check(d.heads[:, layer], _frozen(hf, arch, out, final) - bias, f"L{layer} heads")
    mlp = d.mlp if d.mlp_bias is None else d.mlp - d.mlp_bias
    _check(d.neurons.sum(2), mlp, "neurons")
    for i, per_pos in enumerate(d.head_positions):
        _check(per_pos.sum(-2), d.heads[i], "head positions")


def _head_zero_alone(model: Any, hf: Any, arch: str = "llama",
                     values: Callable[[torch.Tensor], dict[str, torch.Tensor]] | None = None
                     ) -> None:
    """Zeroing one head's ``z`` everywhere: HF's forward with that slice of its output
    projection's input set to the constant part of the values (which HookedTransformer's
    ``b_O`` keeps), on each unpadded reply. ``values(ids)``: the objectives by name from HF's
    module (default: its one reward)."""
    from tl_reward.analysis.patching import activation_patching

    res = activation_patching(model, PAIR, "head", "zero", positions="all")
    read = values or (lambda ids: {res.objective: hf_rewards(hf, ids, torch.ones_like(ids))[
        "reward"][0, 0]})
    replies = [torch.tensor([model.encode(c).ids])
               for c in (PAIR.chosen_conversation(), PAIR.rejected_conversation())]
    layers = hf.transformer.h if arch == "gpt2" else hf.model.layers
    d_head = model.cfg.d_head
    ref = torch.zeros_like(res.patched)
    for layer, block in enumerate(layers):
        v = _value_bias(block, arch).expand(model.cfg.n_heads * d_head)
        for head in range(model.cfg.n_heads):
            cut = slice(head * d_head, (head + 1) * d_head)

            def zero(mod: Any, args: tuple[Any, ...], cut: slice = cut,
                     v: torch.Tensor = v) -> tuple[Any, ...]:
                x = args[0].clone()
                x[..., cut] = v[cut]
                return (x,)

            handle = _out_proj(block).register_forward_pre_hook(zero)
            try:
                ref[:, layer, head] = torch.stack([read(r)[res.objective] for r in replies])
            finally:
                handle.remove()
    _check(res.patched, ref, "head zero")


def _direct_path_alone(model: Any, hf: Any) -> None:
    """At a frozen scale the patched reward moves by exactly the DRA difference."""
    from tl_reward.analysis.attribution import differential_attribution
    from tl_reward.analysis.direct_path import direct_path_patching

    dp = direct_path_patching(model, PAIR, level="head", scale="frozen")
    diff, names = differential_attribution(model, [PAIR]).difference("head")
    assert dp.names == names
    _check(dp.effect, diff[0, :, 0] / (dp.clean_chosen - dp.clean_rejected), "effect")


def _attribution_patching_alone(model: Any, hf: Any) -> None:
    """The estimate is the limit of finite differences: 10x smaller eps, about 10x smaller error
    (float64; HF computes the rotary angles in float32, whose rounding hides the convergence
    below eps = 1e-2)."""
    from tl_reward.analysis.attribution_patching import attribution_patching
    from tl_reward.analysis.patching import activation_patching
    from tl_reward.model.bridge_reward_model import BridgeRewardModel
    from tl_reward.testing import tiny_hf_reward_model

    hf64, tok = tiny_hf_reward_model("llama")
    model = BridgeRewardModel.from_pretrained(hf_model=hf64.double(), tokenizer=tok,
                                              dtype=torch.float64)
    ap = attribution_patching(model, PAIR)
    for site, mode, positions, estimate in [("resid", "denoising", "each", ap.resid["denoising"]),
                                            ("head", "noising", "all",
                                             ap.head["noising"].sum(-1))]:
        errs = [float((activation_patching(model, PAIR, site, mode, positions=positions,
                                           fraction=eps).effect / eps - estimate).abs().max())
                for eps in (1e-1, 1e-2)]
        assert errs[1] < 0.3 * errs[0] and errs[1] < 1e-2 * max(1.0, float(
            estimate.abs().max())), (site, errs)


def _probes_alone(model: Any, hf: Any) -> None:
    """Every row's rewards are HF's forward on its texts."""
    from tl_reward.audit.perturbations import user_items
    from tl_reward.audit.probes import run_probes

    df = run_probes(model, user_items(POS + NEG), ["length", "flattery"]).rows
    df = df[df["applied"]]
    for side in ("neutral", "perturbed"):
        batch = model.build(list(zip(df[f"{side}_user"], df[f"{side}_reply"], strict=True)))
        ref = hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"][:, 0]
        _check(torch.tensor(df[f"{side}:reward"].to_numpy()), ref, side)


def _concepts_alone(model: Any, hf: Any) -> None:
    """The vector is the difference of HF's final residuals' means at the pooled token;
    ``cosine_head`` its cosine with HF's head row times the norm gain; ``cosine_local`` with
    the gradient of HF's norm and head, by autograd."""
    from tl_reward.audit.concepts import concept_alignment, concept_vector

    c = concept_vector(model, POS, NEG, name="yes")
    al = concept_alignment(model, c, POS + NEG, separability=False)
    h_pos, h_neg = (_pooled_parts(model, hf, x)[1]["resid"][:, -1] for x in (POS, NEG))
    v = h_pos.mean(0) - h_neg.mean(0)
    _check(c.vector, v, "vector")
    w = hf_readout(hf, "llama")[0][0]
    _check(al.cosine_head, torch.cosine_similarity(v, w, 0).expand(len(POS + NEG)),
           "cosine_head")
    h = torch.cat([h_pos, h_neg]).requires_grad_(True)
    (grad,) = torch.autograd.grad(hf.score(hf.model.norm(h)).sum(), h)
    _check(al.cosine_local, torch.cosine_similarity(grad, v[None], 1), "cosine_local")


def _sweep_alone(model: Any, hf: Any) -> None:
    """Each token's reward is HF's forward on ``prefix + [v] + suffix``."""
    from tl_reward.sweep.vocab_sweep import score_vocabulary

    ids = list(range(10, 42))
    sweep = score_vocabulary(model, ["Is the sky blue?"], ids=ids).to_dataframe()
    template = model.response_template("Is the sky blue?")
    tokens = torch.tensor([template.ids(v) for v in sweep["token_id"]])
    ref = hf_rewards(hf, tokens, torch.ones_like(tokens))["reward"][:, 0]
    _check(torch.tensor(sweep["score:prompt_0"].to_numpy()), ref, "sweep")


def _compare_alone(model: Any, hf: Any) -> None:
    """``compare_models``' rewards are HF's; each layer has debiased CKA and RV2 1 with
    itself."""
    from tl_reward.compare.behaviour import compare_models
    from tl_reward.compare.layers import compare_layers

    cmp = compare_models({"a": model, "b": model}, CORPUS)
    batch = model.build(CORPUS)
    _check(cmp.rewards["a"], hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"][:, 0],
           "rewards")
    for name, sim in compare_layers(model, None, CORPUS, n_permutations=0).observed.items():
        _check(np.diag(sim), torch.ones(sim.shape[0]), name)


def _sae_attribution_alone(model: Any, hf: Any) -> None:
    """The exact split at the final residual is the hand split of
    :func:`~helpers.sae_terms_by_hand` (SAELens's own decoder, HF's head)."""
    from tests.helpers import sae_terms_by_hand
    from tests.sae.test_sae_attribution import make_sae
    from tl_reward.sae.attribution import sae_attribution

    sae = make_sae(model.cfg.d_model, f"blocks.{model.cfg.n_layers - 1}.hook_resid_post")
    for i, item in enumerate(CONVERSATIONS):
        a = sae_attribution(model, sae, [item])
        ref = sae_terms_by_hand(model, hf, "llama", sae, item)
        for key in ("features", "b_dec", "error"):
            _check(getattr(a, key)[0], ref[key], f"{i} {key}")


ALONE: dict[str, Callable[[Any, Any], None]] = {
    "rewards": lambda m, hf: _check(
        m.rewards(CONVERSATIONS).values(0),
        hf_rewards(hf, *(lambda b: (b.tokens, b.attention_mask))(m.build(CONVERSATIONS)))[
            "reward"][:, 0], "rewards"),
    "lens": _lens_alone,
    "direct reward attribution": _dra_alone,
    "direct-path patching": _direct_path_alone,
    "activation patching": _head_zero_alone,
    "attribution patching": _attribution_patching_alone,
    "probes": _probes_alone,
    "concepts": _concepts_alone,
    "vocabulary sweep": _sweep_alone,
    "compare": _compare_alone,
    "SAE attribution (exact)": _sae_attribution_alone,
}


@pytest.mark.parametrize("analysis", [
    pytest.param(a, marks=needs_sae_lens) if "SAE" in a else a for a in sorted(ALONE)])
def test_analysis_equals_an_independent_reference(models: dict[str, Any], analysis: str) -> None:
    """Each analysis of :data:`EQUAL` on the bridge alone, against HF's own modules or an
    identity (module docstring); float32, :func:`parity_atol` of each quantity."""
    assert ALONE.keys() == EQUAL.keys()
    ALONE[analysis](models["bridge"], models["hf"])


@pytest.mark.parametrize("arch", ["gemma2", "gpt2", "olmo2"])
def test_decompositions_by_hand_on_other_norms(arch: str) -> None:
    """Gemma-2 (``1 + w`` gain, sandwich norms), GPT-2 (LayerNorm, value and norm biases) and
    OLMo-2 (norms after each sublayer only): the lens, DRA (each head by hand) and
    zero-ablated heads on the bridge against HF's modules by hand."""
    from tl_reward.model.bridge_reward_model import BridgeRewardModel
    from tl_reward.testing import tiny_hf_reward_model

    hf, tok = tiny_hf_reward_model(arch)
    model = BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok)
    hf = tiny_hf_reward_model(arch)[0]  # a fresh copy: the bridge put its components in hf
    for fn in (_lens_alone, _dra_alone, _head_zero_alone):
        fn(model, hf, arch)
