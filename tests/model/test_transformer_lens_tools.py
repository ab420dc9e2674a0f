"""TransformerLens's own tools work on a HookedRewardModel unchanged."""

from __future__ import annotations

import pytest
import torch
import transformer_lens.patching as tl_patching
from helpers import CONVERSATIONS
from transformer_lens import ActivationCache, utils

ARCHS = ["llama", "gemma2", "gpt2", "armorm"]


def _k(arch: str) -> int:
    return 5 if arch == "armorm" else 1


@pytest.mark.parametrize("arch", ARCHS)
def test_run_with_cache_and_decompose_resid_sum_to_reward(tiny, arch: str) -> None:
    model, _, _ = tiny(arch, _k(arch))
    batch = model.make_batch(CONVERSATIONS)
    reward, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                         return_type="reward")
    assert isinstance(cache, ActivationCache)
    stack = cache.decompose_resid(layer=-1, return_labels=False)  # [comp, batch, pos, d_model]
    pos = model.pool_positions(batch.tokens, batch.attention_mask)
    rows = torch.arange(len(CONVERSATIONS))
    comps = stack[:, rows, pos]  # [comp, batch, d_model]
    if model.cfg.normalization_type == "LNPre":  # LayerNorm centres the residual
        comps = comps - comps.mean(-1, keepdim=True)
    scale = cache["ln_final.hook_scale"][rows, pos]  # [batch, 1]
    recon = torch.einsum("cbd,dk->bk", comps / scale, model.W_U) + model.b_U
    torch.testing.assert_close(recon, reward, atol=1e-4, rtol=0)
    assert utils.get_act_name("resid_post", model.cfg.n_layers - 1) in cache


def test_armorm_gating_hook_is_cached(tiny) -> None:
    model, hf, _ = tiny("armorm", 5)
    batch = model.make_batch(CONVERSATIONS)
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask,
                                    return_type="score")
    with torch.no_grad():
        ref = hf(input_ids=batch.tokens, attention_mask=batch.attention_mask).gating_output
    torch.testing.assert_close(cache["reward_head.hook_gating"], ref, atol=1e-4, rtol=0)


def test_run_with_hooks_zero_ablation_changes_reward_as_predicted(tiny) -> None:
    """Zeroing the last MLP's output moves the reward by exactly its direct effect
    (nothing sits after it but the final norm, whose scale we recompute)."""
    model, _, _ = tiny("llama")
    batch = model.make_batch(CONVERSATIONS[:1])
    last = model.cfg.n_layers - 1
    name = utils.get_act_name("mlp_out", last)
    reward, cache = model.run_with_cache(batch.tokens, return_type="reward")
    ablated = model.run_with_hooks(batch.tokens, return_type="reward",
                                   fwd_hooks=[(name, lambda a, hook: torch.zeros_like(a))])
    resid = cache[utils.get_act_name("resid_post", last)][0, -1] - cache[name][0, -1]
    expected = model.ln_final(resid[None, None])[0, 0] @ model.W_U + model.b_U
    torch.testing.assert_close(ablated[0], expected, atol=1e-4, rtol=0)
    assert (ablated - reward).abs().max() > 1e-3


def test_transformer_lens_patching_runs_and_agrees_with_manual(tiny) -> None:
    model, _, _ = tiny("llama")
    t_clean = model.make_batch(("Is the sky blue?", "Yes, it is.")).tokens
    t_corr = t_clean.clone()
    t_corr[0, 6] = (t_corr[0, 6] + 7) % 200 + 20  # a different prompt token, same length
    assert t_clean.shape == t_corr.shape
    _, clean_cache = model.run_with_cache(t_clean)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[0, -1, 0]

    result = tl_patching.get_act_patch_resid_pre(model, t_corr, clean_cache, metric)
    assert result.shape == (model.cfg.n_layers, t_clean.shape[1])
    # patching the whole residual at layer 0 everywhere gives the clean reward
    layer, pos = 1, 4
    name = utils.get_act_name("resid_pre", layer)

    def patch(act: torch.Tensor, hook: object) -> torch.Tensor:
        act[:, pos] = clean_cache[name][:, pos]
        return act

    manual = model.run_with_hooks(t_corr, fwd_hooks=[(name, patch)])[0, -1, 0]
    torch.testing.assert_close(result[layer, pos], manual, atol=1e-5, rtol=0)
    # at layer 0, positions whose token is the same in both runs change nothing
    corrupted = metric(model(t_corr))
    same = (t_clean[0] == t_corr[0]).nonzero().flatten()
    torch.testing.assert_close(result[0, same], corrupted.expand(len(same)), atol=1e-5, rtol=0)
    assert (result[0] - corrupted).abs().max() > 1e-4
