"""SAEs on the bridge: the same SAE attribution and ``sae_fit`` as on HookedRewardModel.

One tiny seeded Llama RM loaded both ways (as in ``test_bridge_analyses.py``) and tiny seeded
SAELens SAEs (TopK with unequal decoder norms, and a standard ReLU SAE) at residual, MLP-output
and MLP-neuron hooks named the HookedTransformer way. The bridge attaches them through SAELens's
``SAETransformerBridge`` (``tl_backend.sae_bridge``); HookedRewardModel through
``HookedSAETransformer``. The two forwards differ by float32 rounding, so every quantity is
compared at :func:`~helpers.parity_atol` of its own magnitude. Skipped where SAELens is missing
(the TransformerLens 4 environment) or HookedTransformer is (nothing to compare with).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("sae_lens", reason="SAELens is not installed (TransformerLens 4: SAELens#738)")

from sae_lens.saes.sae import SAEMetadata  # noqa: E402
from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig  # noqa: E402

from tests.helpers import CONVERSATIONS, hf_rewards, needs_hooked_transformer, parity_atol  # noqa: E402
from tests.sae.test_sae_attribution import make_sae  # noqa: E402
from tl_reward.data import PreferencePair  # noqa: E402

pytestmark = needs_hooked_transformer

PAIRS = [PreferencePair.from_prompt("Is the sky blue?", "Yes, on a clear day.", "No."),
         PreferencePair.from_prompt("hi", "Hello! How can I help?", "Go away."),
         PreferencePair.from_prompt("2 + 2?", "Four.", "Five, probably.")]
#: hook (HookedTransformer's name) -> the SAE kind read there
HOOKS = {"blocks.0.hook_resid_post": "topk", "blocks.1.hook_mlp_out": "standard",
         "blocks.0.mlp.hook_post": "topk", "blocks.2.hook_resid_post": "topk"}


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    """The same seeded tiny Llama RM as ``{"hooked": ..., "bridge": ..., "hf": ...}``."""
    from tl_reward import HookedRewardModel
    from tl_reward.model.bridge_reward_model import BridgeRewardModel
    from tl_reward.testing import tiny_hf_reward_model

    hf, tok = tiny_hf_reward_model("llama")
    hooked = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
    assert hooked.cfg.n_layers == 3  # HOOKS' last entry is the final residual
    return {"hooked": hooked, "hf": hf,
            "bridge": BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok)}


def sae_at(model: Any, hook: str) -> Any:
    """A seeded tiny SAE of the kind :data:`HOOKS` names, reading ``hook``."""
    d_in = model.cfg.d_mlp if ".mlp." in hook else model.cfg.d_model
    if HOOKS[hook] == "topk":
        return make_sae(d_in, hook, rescale=True)
    torch.manual_seed(1)
    sae = StandardSAE(StandardSAEConfig(d_in=d_in, d_sae=64))
    sae.cfg.metadata = SAEMetadata(hook_name=hook)
    with torch.no_grad():
        sae.b_dec.normal_(0, 0.3)
    return sae


def assert_equal(got: dict[str, Any], want: dict[str, Any], n_layers: int, what: str) -> None:
    """Each entry of ``got`` at :func:`parity_atol` of ``want``'s; no tensor all zero (a
    figure, such as a share of dead features, may be 0)."""
    assert got.keys() == want.keys()
    for key, ref in want.items():
        ref, new = (torch.from_numpy(np.array(x, dtype=np.float64)) for x in (ref, got[key]))
        assert ref.numel() == 1 or float(ref.abs().max()) > 1e-3, f"{what}: {key} is vacuous"
        torch.testing.assert_close(new, ref, atol=parity_atol(ref, n_layers), rtol=0,
                                   equal_nan=True, msg=f"{what}: {key}")


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_error_term_keeps_the_reward_exact(models: dict[str, Any], hook: str) -> None:
    """With its error term an SAE spliced into the bridge leaves HF's reward; without it the
    reward moves, by what it moves on HookedRewardModel. Afterwards the bridge's own hook at
    that point fires again (SAELens's reset leaves a hook point no hook reaches)."""
    from tl_reward.sae.splice import as_sae_model

    bridge, hooked = models["bridge"], models["hooked"]
    batch = bridge.build(CONVERSATIONS)
    args = (batch.tokens, batch.attention_mask)
    ref = hf_rewards(models["hf"], *args)["reward"]
    sae = sae_at(bridge, hook)
    rewards = {}
    for name, model in (("bridge", as_sae_model(bridge)), ("hooked", as_sae_model(hooked))):
        for error in (True, False):
            with model.saes(saes=[sae], use_error_term=error):
                rewards[name, error] = model.pooled_outputs(*args)[0]
    atol = parity_atol(ref, 3)
    torch.testing.assert_close(rewards["bridge", True], ref, atol=atol, rtol=0)
    assert float((rewards["bridge", False] - ref).abs().max()) > 0.05  # the SAE was in
    torch.testing.assert_close(rewards["bridge", False], rewards["hooked", False], atol=atol,
                               rtol=0)
    seen: list[torch.Tensor] = []
    with bridge.hooks(fwd_hooks=[(hook, lambda a, hook: seen.append(a))]):
        torch.testing.assert_close(bridge.pooled_outputs(*args)[0], ref, atol=atol, rtol=0)
    assert len(seen) == 1 and seen[0].shape[:2] == batch.tokens.shape


def _attribution(model: Any, hook: str) -> dict[str, Any]:
    from tl_reward.sae.attribution import differential_sae_attribution, sae_attribution

    sae = sae_at(model, hook)
    a = sae_attribution(model, sae, CONVERSATIONS, method="gradient")
    d = differential_sae_attribution(model, sae, PAIRS, method="gradient")
    return {**{k: getattr(a, k) for k in ("features", "b_dec", "error", "reward",
                                          "reconstruction_gap", "activations")},
            "pair difference": d.difference(), "pair margin": d.margin}


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_sae_attribution_by_gradient_equal_on_both_backends(models: dict[str, Any],
                                                            hook: str) -> None:
    want = _attribution(models["hooked"], hook)
    assert_equal(_attribution(models["bridge"], hook), want, 3, f"SAE attribution at {hook}")


def _fit(model: Any, hook: str) -> dict[str, Any]:
    from tl_reward.sae.fit import sae_fit

    fit = sae_fit(model, sae_at(model, hook), PAIRS)
    return {**{f"{r} {k}": v for r, m in fit.reconstruction.items() for k, v in m.items()},
            **fit.recovered, "clean": fit.clean, "spliced": fit.spliced}


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_sae_fit_equal_on_both_backends(models: dict[str, Any], hook: str) -> None:
    assert_equal(_fit(models["bridge"], hook), _fit(models["hooked"], hook), 3,
                 f"sae_fit at {hook}")


def _ablation(model: Any, hook: str) -> dict[str, Any]:
    from tl_reward.sae.ablation import ablation_check, pair_ablation_check
    from tl_reward.sae.features import feature_views

    sae = sae_at(model, hook)
    one = ablation_check(model, sae, CONVERSATIONS, top_k=4)
    pair = pair_ablation_check(model, sae, PAIRS, top_k=4)
    views = feature_views(model, sae, [0, 3, 5], CONVERSATIONS, ablate_items=3)
    return {"features": one.feature, "actual": one.actual, "predicted": one.predicted,
            "joint actual": one.joint_actual, "pair actual": pair.actual,
            "pair joint actual": pair.joint_actual,
            **{f"view {v.feature} {k}": getattr(v, k) for v in views
               for k in ("reward_alignment", "frequency", "mean_activation")},
            **{f"view {v.feature} ablation": v.ablation.to_numpy(dtype=np.float64)
               for v in views}}


@pytest.mark.parametrize("hook", ["blocks.0.hook_resid_post", "blocks.1.hook_mlp_out"])
def test_ablation_and_feature_views_equal_on_both_backends(models: dict[str, Any],
                                                           hook: str) -> None:
    """The bridge ablates with the SAE spliced in (it cannot restart a run at block ``L + 1``
    from an edited residual, as HookedRewardModel does for a ``hook_resid_post`` SAE)."""
    want = _ablation(models["hooked"], hook)
    assert_equal(_ablation(models["bridge"], hook), want, 3, f"ablation at {hook}")


def test_layer_norm_bridge_takes_saes_of_the_uncentred_residual() -> None:
    """GPT-2 on the bridge exposes HF's residual (per-token mean not 0), HookedRewardModel the
    centred one: an SAE that read an uncentred residual fits the bridge and is refused on the
    hooked model, and one that read a centred residual the other way round (before, the bridge
    was taken for centred: the first was refused there and the second accepted)."""
    from tl_reward import HookedRewardModel
    from tl_reward.errors import SAEError
    from tl_reward.model.bridge_reward_model import BridgeRewardModel
    from tl_reward.sae.pretrained import prepare_sae
    from tl_reward.testing import tiny_hf_reward_model

    hf, tok = tiny_hf_reward_model("gpt2")
    hooked = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
    bridge = BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok)
    hook = "blocks.0.hook_resid_post"
    batch = bridge.build(CONVERSATIONS)
    means = {}
    for name, m in (("hooked", hooked), ("bridge", bridge)):
        _, cache = m.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                    return_type=None, names_filter=lambda n: n == hook)
        means[name] = float(cache[hook].mean(-1).abs().max())
    assert means["hooked"] < 1e-5 < 1e-2 < means["bridge"]
    for read, fits, refuses in ((False, bridge, hooked), (True, hooked, bridge)):
        sae = make_sae(bridge.cfg.d_model, hook)
        sae.cfg.metadata.model_from_pretrained_kwargs = {"center_writing_weights": read}
        prepare_sae(fits, sae)
        with pytest.raises(SAEError, match=f"center_writing_weights={read}"):
            prepare_sae(refuses, sae)
