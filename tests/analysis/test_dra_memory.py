"""Memory at real sizes (issue 9, item 8): DRA caches only what it reads, at the pooled token,
and attribution patching keeps no gradient-carrying activations, with unchanged results.

Before the fix DRA cached ``hook_resid_pre`` and ``hook_attn_out`` (never read) and, with
``per_position``, every layer's whole ``[batch, head, pos, pos]`` attention pattern."""

from __future__ import annotations

import pytest
import torch

from tl_reward.analysis.attribution import direct_reward_attribution
from tl_reward.analysis.attribution_patching import SITE_HOOKS, attribution_patching
from tl_reward.analysis.components import (
    component_hooks,
    final_components,
    head_position_projections,
    neuron_projections,
    pooled_run,
)
from tl_reward.data import PreferencePair
from tl_reward.data.pairs import tokenize_pair
from tl_reward.model.readout import reward_readout

INPUTS = [("Is the sky blue?", "Yes, the sky is blue on a clear day."), ("hi", "No.")]
PAIR = PreferencePair.from_prompt("Is the sky blue?", "Yes, the sky is blue.", "No, it is red.")


@pytest.mark.parametrize("arch", ["gemma2", "gpt2"])
def test_dra_caches_only_what_it_reads_at_the_pooled_token(tiny, arch: str) -> None:
    model, _, _ = tiny(arch, 1)
    hooks = component_hooks(model, per_position=True, neurons=True)
    assert not [h for h in hooks if h.endswith(("hook_resid_pre", "hook_attn_out"))]
    batch = model.make_batch(INPUTS)
    pos = model.pool_positions(batch.tokens, batch.attention_mask)
    acts = pooled_run(model, batch.tokens, batch.attention_mask, pos, True, True)
    b, seq = batch.tokens.shape
    assert set(acts.full) == {f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"} | {
        f"blocks.{i}.attn.hook_v" for i in range(model.cfg.n_layers)}
    for name, t in acts.items():  # no query-position axis left: one row per input
        if name.endswith("hook_pattern"):
            assert t.shape == (b, model.cfg.n_heads, seq)
        else:
            assert t.shape[0] == b and seq not in t.shape[1:], (name, t.shape)
    # the same decomposition as from a full ActivationCache of every hook
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    ro = reward_readout(model, cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"],
                        batch.tokens, batch.attention_mask)
    ref = final_components(model, cache, pos)
    scaled = ro.directions / ro.scale[:, None, None]
    dra = direct_reward_attribution(model, INPUTS, neurons=True, per_position=True)
    torch.testing.assert_close(dra.heads, ro.project(ref.heads), atol=1e-5, rtol=0)
    torch.testing.assert_close(dra.mlp, ro.project(ref.mlp), atol=1e-5, rtol=0)
    neurons, _ = neuron_projections(model, cache, pos, scaled)
    torch.testing.assert_close(dra.neurons, neurons, atol=1e-5, rtol=0)
    per_pos = head_position_projections(model, cache, pos, scaled)
    for i, hp in enumerate(dra.head_positions or []):
        torch.testing.assert_close(hp, per_pos[i, :, :, : hp.shape[2]], atol=1e-5, rtol=0)


def test_attribution_patching_matches_autograd_over_kept_activations(tiny) -> None:
    """Against the memory-hungry reference: keep every site's activation, one autograd.grad."""
    model, _, _ = tiny("llama", 1)
    ap = attribution_patching(model, PAIR)
    tp = tokenize_pair(model, PAIR)
    n = model.cfg.n_layers
    names = [f"blocks.{layer}.{h}" for layer in range(n) for h in SITE_HOOKS.values()]
    lengths = [tp.chosen_len, tp.rejected_len]
    tokens = torch.full((2, max(lengths)), int(model.pad_token_id), dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for i, side in enumerate(("chosen", "rejected")):
        tokens[i, : lengths[i]] = torch.tensor(tp.ids(side))
        mask[i, : lengths[i]] = 1
    saved: dict[str, torch.Tensor] = {}

    def save(act: torch.Tensor, hook: object) -> None:
        saved[hook.name] = act  # type: ignore[attr-defined]

    with torch.enable_grad(), model.hooks(fwd_hooks=[(nm, save) for nm in names]):
        logits = model(tokens, attention_mask=mask)
        r = logits[torch.arange(2), torch.tensor(lengths) - 1, 0]  # pooled = last real here
        grads = dict(zip(names, torch.autograd.grad(r.sum(), [saved[nm] for nm in names]),
                         strict=True))
    rows_c, rows_r = tp.aligned[:, 0], tp.aligned[:, 1]
    delta = float((r[0] - r[1]).detach())
    for key, hook in (("mlp_out", "hook_mlp_out"), ("head", "attn.hook_z")):
        for layer in range(n):
            a = saved[f"blocks.{layer}.{hook}"].detach()
            g = grads[f"blocks.{layer}.{hook}"][1, rows_r]
            est = ((a[0, rows_c] - a[1, rows_r]) * g).sum(-1) / delta
            ours = ap.mlp_out["denoising"][layer] if key == "mlp_out" else (
                ap.head["denoising"][layer].T)
            torch.testing.assert_close(ours, est, atol=1e-5, rtol=0)
    for p in model.parameters():  # the backward differentiated activations, not the weights
        assert p.grad is None
