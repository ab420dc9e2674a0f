"""One readout (issue 28, items 1, 2, 5, 6): every reward is what the model's own forward records.

The reference is HF's own forward with the same change made to HF's modules (a zeroed MLP, a
doubled final norm, a zeroed head layer): an independent implementation. Each change moves the
rewards by far more than the tolerance, so a path that ignored it (what ``model.rewards``, the
sweep and the decompositions did) fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from tests.helpers import CONVERSATIONS, hf_rewards, parity_atol
from tl_reward.analysis.attribution import direct_reward_attribution
from tl_reward.analysis.patching import objective_value
from tl_reward.errors import AmbiguousPaddingError, TLRewardError
from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, score_vocabulary

IDS = list(range(20, 52))


@contextmanager
def torch_hook(module: torch.nn.Module, fn: Callable[..., Any]) -> Iterator[None]:
    handle = module.register_forward_hook(fn)
    try:
        yield
    finally:
        handle.remove()


def _zero(module: Any, inputs: Any, out: torch.Tensor) -> torch.Tensor:
    return out * 0


def _double(module: Any, inputs: Any, out: torch.Tensor) -> torch.Tensor:
    return out * 2


def _hf(hf: Any, model: Any, convs: list[Any]) -> torch.Tensor:
    batch = model.build(convs)
    return hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"][:, 0]


def _sweep_reference(model: Any, hf: Any) -> torch.Tensor:
    """HF's reward of ``prefix + [v] + suffix`` for every swept id, one unpadded batch."""
    tpl = model.response_template(PAPER_PROMPTS["best"])
    tokens = torch.tensor([tpl.ids(v) for v in IDS])
    return hf_rewards(hf, tokens, torch.ones_like(tokens))["reward"][:, 0]


def _sweep(model: Any, cache: str = "auto") -> torch.Tensor:
    return score_vocabulary(model, PAPER_PROMPTS["best"], IDS, cache=cache,
                            progress=False).values(0)


def test_torch_hook_on_a_submodule_reaches_every_reward(tiny: Any) -> None:
    """A torch forward hook on ``blocks[0].mlp`` (not a hook point): the default sweep took the
    fast path and ignored it ([0.592, 0.730, ...] against the forward's [1.097, 0.943, ...])."""
    model, hf, _ = tiny("llama")
    plain = _sweep(model)
    with torch_hook(model.blocks[0].mlp, _zero), torch_hook(hf.model.layers[0].mlp, _zero):
        ref = _hf(hf, model, CONVERSATIONS)
        sweep_ref = _sweep_reference(model, hf)
        with pytest.warns(RuntimeWarning, match="a hook on blocks.0.mlp"):
            model.__dict__.pop("_tl_reward_fast_path_refused", None)
            swept = _sweep(model, "auto")
        got = {
            "rewards": model.rewards(CONVERSATIONS).values(0),
            "forward": model(CONVERSATIONS, return_type="reward")[:, 0],
            "dra": direct_reward_attribution(model, CONVERSATIONS).reward[:, 0],
        }
    tol = parity_atol(ref, model.cfg.n_layers)
    for name, value in got.items():
        torch.testing.assert_close(value.float(), ref, atol=tol, rtol=0, msg=name)
    torch.testing.assert_close(swept.float(), sweep_ref, atol=tol, rtol=0)
    assert (sweep_ref - plain).abs().max() > 100 * tol


def test_hook_on_final_norm_is_read_by_every_reward(tiny: Any) -> None:
    """``ln_final.hook_normalized`` doubled: HF's reward with its final norm doubled. The
    forward honoured it; ``model.rewards`` and the sweep re-normalised the residual."""
    model, hf, _ = tiny("llama")

    def double(act: torch.Tensor, hook: Any) -> torch.Tensor:
        return 2 * act

    with torch_hook(hf.model.norm, _double):
        ref = _hf(hf, model, CONVERSATIONS)
        sweep_ref = _sweep_reference(model, hf)
    plain = model.rewards(CONVERSATIONS).values(0)
    with model.hooks(fwd_hooks=[("ln_final.hook_normalized", double)]):
        got = {
            "rewards": model.rewards(CONVERSATIONS).values(0),
            "forward": model(CONVERSATIONS, return_type="reward")[:, 0],
            "score": model(CONVERSATIONS, return_type="score"),
        }
        swept = _sweep(model)
        with pytest.raises(TLRewardError, match="ln_final.hook_normalized"):
            direct_reward_attribution(model, CONVERSATIONS)
    tol = parity_atol(ref, model.cfg.n_layers)
    for name, value in got.items():
        torch.testing.assert_close(value, ref, atol=tol, rtol=0, msg=name)
    torch.testing.assert_close(swept, sweep_ref, atol=tol, rtol=0)
    assert (ref - plain).abs().max() > 100 * tol


def test_patching_reads_the_hooked_head(tiny: Any) -> None:
    """INF-ORM's MLP head with its hidden layer zeroed (``reward_head.hook_post``): every reward is
    the last layer's bias (HF's ``score[2].bias``), and activation patching's clean reward too."""
    model, hf, _ = tiny("inform")

    def zero(act: torch.Tensor, hook: Any) -> torch.Tensor:
        return act * 0

    with torch_hook(hf.score[1], _zero):
        ref = _hf(hf, model, CONVERSATIONS[:2])
    torch.testing.assert_close(ref, hf.score[2].bias.expand(2), atol=1e-6, rtol=0)
    batch = model.build(CONVERSATIONS[:1])
    with model.hooks(fwd_hooks=[("reward_head.hook_post", zero)]):
        rewards = model.rewards(CONVERSATIONS[:2]).values(0)
        forward = model(CONVERSATIONS[:2], return_type="reward")[:, 0]
        _, cache = model.run_with_cache(batch.tokens)
        final = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
        patched = objective_value(model, final, batch.tokens, "reward")  # patching's readout
    torch.testing.assert_close(rewards, ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(forward, ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(patched, ref[:1], atol=1e-6, rtol=0)
    assert (model.rewards(CONVERSATIONS[:2]).values(0) - ref).abs().min() > 1e-3


def test_pad_equal_to_bos_keeps_the_bos(tiny: Any) -> None:
    """``pad_token = bos_token``: an unpadded batch starting with BOS was taken as left-padded
    (the BOS masked out: -0.384 against HF's -0.409). One leading BOS is read as HF reads it;
    a batch that may be left-padded is refused, naming the mask."""
    from tl_reward import HookedRewardModel
    from tl_reward.testing import tiny_hf_reward_model

    hf, tok = tiny_hf_reward_model("llama")
    tok.pad_token = tok.bos_token
    hf.config.pad_token_id = tok.pad_token_id
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
    assert model.bos_pad
    tokens = torch.tensor([model.encode(c).ids for c in CONVERSATIONS[:1]])
    assert tokens[0, 0] == tok.bos_token_id
    ref = hf_rewards(hf, tokens, torch.ones_like(tokens))["reward"]
    tol = parity_atol(ref, model.cfg.n_layers)
    torch.testing.assert_close(model(tokens, return_type="reward"), ref, atol=tol, rtol=0)
    torch.testing.assert_close(model(tokens)[:, -1], ref, atol=tol, rtol=0)
    _, cache = model.run_with_cache(tokens)
    masked = model(tokens, return_type="reward", attention_mask=torch.ones_like(tokens))
    torch.testing.assert_close(masked, ref, atol=tol, rtol=0)
    assert cache["blocks.0.hook_resid_pre"].shape[1] == tokens.shape[1]
    padded = model.to_tokens(CONVERSATIONS[:2])
    with pytest.raises(AmbiguousPaddingError, match="attention_mask"):
        model(padded, return_type="reward")
    batch = model.build(CONVERSATIONS[:2], padding_side="left")
    ref2 = hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"]
    torch.testing.assert_close(
        model(batch.tokens, return_type="reward", attention_mask=batch.attention_mask), ref2,
        atol=tol, rtol=0)


def test_forward_pooling_and_mask_rules(tiny: Any) -> None:
    """``forward(text, pooling=...)`` used the model's own rule; ``pooling="mask"`` on right-
    padded tokens without a mask read a pad. The reference is ``model.rewards``'s pooling."""
    model = tiny("llama")[0]
    convs = [*CONVERSATIONS, [{"role": "user", "content": "Hi <|pad|> there"},
                              {"role": "assistant", "content": "Hello."}]]
    for rule in ("legacy", "mask", "hf"):
        ref = model.rewards(convs, pooling=rule).values(0)
        got = model(convs, return_type="reward", pooling=rule)[:, 0]
        torch.testing.assert_close(got, ref, atol=parity_atol(ref, model.cfg.n_layers), rtol=0)
    legacy, hf_rule = (model.rewards(convs, pooling=r).values(0) for r in ("legacy", "hf"))
    assert (legacy - hf_rule).abs().max() > 1e-3  # a pad inside the text: the rules differ
    right = model.build(CONVERSATIONS[:2], padding_side="right")
    assert bool((right.tokens == model.pad_token_id).any())
    with pytest.raises(TLRewardError, match="pooling='mask' reads the attention mask"):
        model(right.tokens, return_type="reward", pooling="mask")
    ok = model(right.tokens, return_type="reward", pooling="mask",
               attention_mask=right.attention_mask)[:, 0]
    ref = model.rewards(CONVERSATIONS[:2], pooling="mask").values(0)
    torch.testing.assert_close(ok, ref, atol=parity_atol(ref, model.cfg.n_layers), rtol=0)


def test_float64_model_gets_float64_rewards(tiny: Any) -> None:
    """The docs promise float64 readouts for a float64 model: ``rewards``, the lens and DRA
    returned float32 (values rounded to 1e-7 relative)."""
    from tl_reward import HookedRewardModel
    from tl_reward.analysis.lens import reward_lens

    _, hf, tok = tiny("llama")
    model = HookedRewardModel.from_pretrained(hf_model=hf.double(), tokenizer=tok, device="cpu",
                                              dtype=torch.float64)
    try:
        batch = model.build(CONVERSATIONS)
        ref = hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"][:, 0]
        got = model.rewards(CONVERSATIONS).values(0)
        dra = direct_reward_attribution(model, CONVERSATIONS).reward[:, 0]
        lens = reward_lens(model, CONVERSATIONS)
    finally:
        hf.float()
    assert got.dtype == dra.dtype == lens.reward.dtype == torch.float64
    # HF computes rotary angles in float32 even in a float64 model: float32-level agreement
    torch.testing.assert_close(got, ref, atol=parity_atol(ref, model.cfg.n_layers), rtol=0)
    forward = model(CONVERSATIONS, return_type="reward")[:, 0]
    assert forward.dtype == torch.float64
    for value in (got, dra, lens.reward[:, 0]):
        torch.testing.assert_close(value, forward, atol=1e-12, rtol=0)
