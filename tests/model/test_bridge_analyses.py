"""Every analysis on a BridgeRewardModel gives the HookedRewardModel's numbers, or refuses by name.

One tiny seeded Llama RM loaded both ways (the bridge wraps HF's module and runs HF's forward;
the hooked model runs TransformerLens's own on processed weights), the same inputs. The two
forwards differ only by float32 rounding, so each quantity is compared at
:func:`~helpers.parity_atol` of its own magnitude (about 1e-4 here; a wrong pooled token, an
unfolded norm gain or a missing component moves them by their own size). What needs
HookedTransformer itself (the prefix caches) refuses a bridge with a TLRewardError naming the
analysis and the fix; the SAE analyses that attach an SAE: ``test_bridge_sae.py``. Skipped
under TransformerLens 4 (no HookedTransformer to compare with).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers import CONVERSATIONS, hf_rewards, needs_hooked_transformer, parity_atol
from tl_reward.data import PreferencePair
from tl_reward.errors import TLRewardError

pytestmark = needs_hooked_transformer

PAIR = PreferencePair.from_prompt("Is the sky blue?", "Yes, the sky is blue.", "No, it is red.")
POS = [("Is the sky blue?", f"Yes, the sky is blue{'!' * i}") for i in range(1, 5)]
NEG = [("Is the sky blue?", f"No. War. Hate{'.' * i}") for i in range(1, 5)]
CORPUS = [(f"Question {i}?", f"Answer {'yes ' * (i % 4 + 1)}and {i}.") for i in range(10)]


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    """The same seeded tiny Llama RM as ``{"hooked": ..., "bridge": ..., "hf": ...}``."""
    from tl_reward import HookedRewardModel
    from tl_reward.model.bridge_reward_model import BridgeRewardModel
    from tl_reward.testing import tiny_hf_reward_model

    hf, tok = tiny_hf_reward_model("llama")
    hooked = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
    return {"hooked": hooked, "hf": hf,
            "bridge": BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok)}


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
