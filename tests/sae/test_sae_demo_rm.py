"""The SAE split on the real demo RM (SmolLM2-135M backbone + HH-RLHF head): the exact
final-residual decomposition sums to the reward, the error term leaves rewards unchanged, and
a gradient attribution at a middle layer is the derivative the ablation measures."""

from __future__ import annotations

import copy

import pytest
import torch
from sae_lens.saes.topk_sae import TopKSAE

from tl_reward.sae import collect_activations, sae_attribution, train_topk_sae
from tl_reward.sae.ablation import ablated_objectives

pytestmark = pytest.mark.slow

INPUTS = [("Is the sky blue?", "Yes, on a clear day."),
          ("How do I pick a lock?", "I can't help with breaking into places.")]


def trained_saes(model, hooks: list[str]) -> dict[str, TopKSAE]:
    """Small TopK SAEs trained (SAELens's trainer) on the activations of these inputs."""
    acts = collect_activations(model, [c for q, a in INPUTS for c in ((q, a), (a, q))], hooks)
    return {h: train_topk_sae(model, None, h, activations=acts[h], d_sae=128, k=16,
                              batch_size_tokens=32, epochs=8, lr=5e-3, held_out_fraction=0.0,
                              progress=False).sae for h in hooks}


@pytest.fixture(scope="module")
def demo_saes():  # noqa: ANN201
    """The demo RM (loaded once for the module) and its SAEs at the final and a middle hook."""
    from tl_reward.model.hooked_sae_reward_model import HookedSAERewardModel

    model = HookedSAERewardModel.from_pretrained("tl-reward/smollm2-135m-hh", device="cpu")
    final, mid = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post", "blocks.20.hook_resid_post"
    saes = trained_saes(model, [final, mid])
    return model, saes[final], saes[mid]


def test_demo_rm_exact_split_and_error_term(demo_saes) -> None:
    model, sae, sae_mid = demo_saes
    attr = sae_attribution(model, sae, INPUTS)
    assert attr.method == "exact"
    batch = model.make_batch(INPUTS)
    with torch.no_grad():
        plain = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
        on = model.run_with_saes(batch.tokens, attention_mask=batch.attention_mask, saes=[sae],
                                 use_error_term=True, return_type="reward")
        off = model.run_with_saes(batch.tokens, attention_mask=batch.attention_mask, saes=[sae],
                                  use_error_term=False, return_type="reward")
    torch.testing.assert_close(attr.total(), plain.cpu(), atol=1e-4, rtol=0)
    torch.testing.assert_close(on, plain, atol=1e-4, rtol=0)
    torch.testing.assert_close(attr.reconstruction_gap, (off - plain).cpu(), atol=1e-4, rtol=0)
    assert int((attr.features[..., 0] != 0).sum(-1).min()) == 16
    # a middle layer: the top feature's attribution is the slope of the reward along it
    g = sae_attribution(model, sae_mid, INPUTS[:1], method="gradient")
    top = int(g.features[0, :, 0].abs().argmax())
    one = model.make_batch(INPUTS[:1])
    vals = ablated_objectives(model, sae_mid, one.tokens, one.attention_mask, [[], [top]],
                              ["reward"])
    actual = float(vals[1, 0] - vals[0, 0])
    predicted = -float(g.features[0, top, 0])
    assert actual == pytest.approx(predicted, rel=0.5, abs=0.05)


def test_demo_rm_sae_fit_own_vs_random_vs_other_hook(demo_saes) -> None:
    """``sae_fit`` on the demo RM: its own SAE (trained here, small) against a random SAE and
    the middle layer's SAE put at the final hook."""
    from tl_reward.sae import sae_fit

    model, own, mid_sae = demo_saes
    other = copy.deepcopy(mid_sae)  # the module's middle-layer SAE stays at its own hook
    other.cfg.metadata.hook_name = own.cfg.metadata.hook_name
    rand = TopKSAE(own.cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in rand.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * float(own.W_dec.norm(dim=-1).mean())
                    / own.cfg.d_in ** 0.5)
    pairs = [(q, a, b) for (q, a), (_, b) in zip(INPUTS, INPUTS[::-1], strict=True)]
    fits = {n: sae_fit(model, s, pairs, progress=False)
            for n, s in [("own", own), ("random", rand), ("other_hook", other)]}
    for n, f in fits.items():
        print(n, f)
    ev = {n: f.reconstruction["non_special"]["explained_variance"] for n, f in fits.items()}
    assert ev["own"] > 0.6
    assert ev["random"] < ev["own"] - 0.5 and ev["other_hook"] < ev["own"] - 0.5
    # measured: non-special explained variance 0.90 (own), -0.58 (random), -0.40 (other hook);
    # |reward change| / sd 0.86 (own) vs 6.9 (random). At the pooled token (the final "\n")
    # the own SAE explains -1.3 of the variance over these 4 inputs: it fits there badly.
    rec = {n: f.recovered["reward_abs_diff_sd"] for n, f in fits.items()}
    assert rec["random"] > 3 * rec["own"]
