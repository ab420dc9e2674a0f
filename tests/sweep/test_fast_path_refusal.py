"""The hand-written continuation runs only on a stock module tree (issue 17, item 5).

An SAE attached with ``add_sae`` replaces a hook point; a user may replace a module; the lean
path calls neither, so it scored the model without them (full forward 0.757, fast path 0.663,
no SAE 0.712). Each case must fall back to TransformerLens's own cached forward, say so once,
and equal the naive full-sequence score; each case also changes the scores by far more than
the tolerance, so skipping it (what the lean path did) would fail the test.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from sae_lens import TopKSAE, TopKSAEConfig
from sae_lens.saes.sae import SAEMetadata

from tl_reward import tl_backend
from tl_reward.model.hooked_sae_reward_model import HookedSAERewardModel
from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, score_vocabulary

PROMPT = PAPER_PROMPTS["best"]
IDS = list(range(20, 84))
TOL = 1e-4  # float32 sums in another order on rewards of order 1 (measured ~1e-6)


def _sweep(model: Any, cache: str) -> torch.Tensor:
    return score_vocabulary(model, PROMPT, IDS, cache=cache, batch_size=32,
                            progress=False).values(0)


def _refusals(model: Any, cache: str = "auto") -> tuple[torch.Tensor, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _sweep(model, cache)
        _sweep(model, cache)  # a second sweep says nothing new
    return got, [str(w.message) for w in caught if "fast continuation" in str(w.message)]


class ShiftedMLP(torch.nn.Module):
    """A user's replacement: the original MLP plus a constant."""

    def __init__(self, mlp: torch.nn.Module) -> None:
        super().__init__()
        self.inner = mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + 0.5


def test_stock_model_takes_the_fast_path(tiny: Any) -> None:
    model = tiny("llama")[0]
    assert tl_backend.nonstock_module(model) is None
    assert tl_backend.continuation_method(model, "auto") == "fast"
    got, said = _refusals(model)
    assert said == []
    torch.testing.assert_close(got, _sweep(model, "none"), atol=TOL, rtol=0)


def test_attached_sae_falls_back_and_equals_naive(tiny: Any) -> None:
    base = tiny("llama")[0]
    model = HookedSAERewardModel.from_reward_model(base)
    hook = "blocks.1.hook_resid_post"
    torch.manual_seed(0)
    cfg = TopKSAEConfig(d_in=model.cfg.d_model, d_sae=32, k=4, dtype="float32")
    cfg.metadata = SAEMetadata(hook_name=hook)
    sae = TopKSAE(cfg)
    with torch.no_grad():
        sae.b_dec.normal_(0, 0.3)
    plain = _sweep(model, "none")
    model.add_sae(sae)  # no error term: the SAE's reconstruction replaces the activation
    try:
        assert "an attached SAE" in (tl_backend.nonstock_module(model) or "")
        got, said = _refusals(model)
        naive = _sweep(model, "none")
        fast, said_fast = _refusals(model, "fast")
    finally:
        model.reset_saes()
    assert len(said) == 1 and hook in said[0] and said_fast == []  # once per model and reason
    torch.testing.assert_close(got, naive, atol=TOL, rtol=0)
    torch.testing.assert_close(fast, naive, atol=TOL, rtol=0)
    assert (naive - plain).abs().max() > 100 * TOL  # the SAE matters: skipping it is caught
    assert tl_backend.nonstock_module(model) is None  # removed again: the fast path is back


def test_replaced_module_falls_back_and_equals_naive(tiny: Any) -> None:
    model = tiny("gemma2")[0]
    plain = _sweep(model, "none")
    original = model.blocks[1].mlp
    model.blocks[1].mlp = ShiftedMLP(original)
    try:
        got, said = _refusals(model)
        naive = _sweep(model, "none")
        stale = tl_backend.build_prefix_cache  # a fast cache built before the swap refuses
    finally:
        model.blocks[1].mlp = original
    cache = stale(model, torch.tensor(model.response_template(PROMPT).prefix), "fast")
    model.blocks[1].mlp = ShiftedMLP(original)
    try:
        with pytest.raises(ValueError, match="blocks.1.mlp"):
            tl_backend.run_after_prefix(model, cache, torch.tensor([[IDS[0]]]))
    finally:
        model.blocks[1].mlp = original
    assert len(said) == 1 and "blocks.1.mlp" in said[0] and "ShiftedMLP" in said[0]
    torch.testing.assert_close(got, naive, atol=TOL, rtol=0)
    assert (naive - plain).abs().max() > 100 * TOL


def test_forward_hook_runs_on_the_hooked_path(tiny: Any) -> None:
    """A hook keeps the module tree stock: the fast cache runs with every hook point called
    (no warning), equal to the hooked full forward."""
    model = tiny("llama")[0]
    plain = _sweep(model, "none")

    def double(act: torch.Tensor, hook: Any) -> torch.Tensor:
        return 2 * act

    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", double)]):
        assert tl_backend.hooks_active(model)
        got, said = _refusals(model)
        naive = _sweep(model, "none")
    assert said == []
    torch.testing.assert_close(got, naive, atol=TOL, rtol=0)
    assert (naive - plain).abs().max() > 100 * TOL
