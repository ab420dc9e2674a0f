"""Reward models on TransformerLens's TransformerBridge (issue 30, first part).

References: HF's own forward of the same module (padded batches, both sides), and the
HookedRewardModel converted from it (skipped under TransformerLens 4, which has no
HookedTransformer; the rest runs in the 4.3 job of ``.ci/run``). Each trap has a test that fails
without its fix.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from transformer_lens.factories.architecture_adapter_factory import ArchitectureAdapterFactory
from transformer_lens.model_bridge.generalized_components import UnembeddingBridge
from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module
from transformer_lens.model_bridge.supported_architectures import (
    Gemma2ArchitectureAdapter,
    LlamaArchitectureAdapter,
)

from tests.helpers import (
    CONVERSATIONS,
    hf_rewards,
    hooked_transformer_missing,
    needs_hooked_transformer,
    parity_atol,
)
from tl_reward.errors import UnsupportedArchitectureError
from tl_reward.model.bridge_reward_model import BridgeRewardModel
from tl_reward.testing import BRIDGE_ARCHITECTURES, tiny_hf_reward_model

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gpt2"]
HOOKS = ["blocks.0.hook_resid_post", "blocks.1.attn.hook_z", "blocks.0.mlp.hook_post",
         "ln_final.hook_normalized", "ln_final.hook_scale", "unembed.hook_out"]


def _bridge(arch: str, dtype: torch.dtype = torch.float32) -> tuple[Any, Any, Any]:
    hf, tok = tiny_hf_reward_model(arch)
    model = BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, dtype=dtype)
    return model, hf, tok


@pytest.mark.parametrize("arch", FAMILIES)
def test_rewards_equal_hf_both_paddings(arch: str) -> None:
    model, hf, _ = _bridge(arch)
    got = model.rewards(CONVERSATIONS).values(0)
    right = model.build(CONVERSATIONS, padding_side="right")
    ref = hf_rewards(hf, right.tokens, right.attention_mask)["reward"][:, 0]
    # HF's left-padded positions are not the unpadded ones for every model (GPT-2): each row alone
    alone = torch.cat([hf_rewards(hf, t, torch.ones_like(t))["reward"][:, 0] for t in
                       (torch.tensor([model.encode(c).ids]) for c in CONVERSATIONS)])
    tol = parity_atol(ref, model.cfg.n_layers)
    torch.testing.assert_close(got, ref, atol=tol, rtol=0)
    torch.testing.assert_close(alone, ref, atol=tol, rtol=0)
    left = model.build(CONVERSATIONS, padding_side="left")
    torch.testing.assert_close(model.pooled_outputs(left.tokens, left.attention_mask)[0][:, 0],
                               alone, atol=tol, rtol=0)
    # HookedTransformer's residual names hold HF's hidden states (the last has HF's final norm)
    batch = model.build(CONVERSATIONS[:1])
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    with torch.no_grad():
        hidden = hf(input_ids=batch.tokens, attention_mask=batch.attention_mask,
                    output_hidden_states=True).hidden_states
    for layer in range(model.cfg.n_layers - 1):
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_resid_post"], hidden[layer + 1],
                                   atol=0, rtol=0)
    # per-position head outputs: the reward is unembed.hook_out at the pooled token
    torch.testing.assert_close(cache["unembed.hook_out"][0, batch.pooled[0], 0], got[0],
                               atol=tol, rtol=0)


@needs_hooked_transformer
@pytest.mark.parametrize("arch", FAMILIES)
def test_same_rewards_and_hook_shapes_as_hooked(arch: str, tiny: Any) -> None:
    """The same model converted for HookedTransformer gives the same rewards, and its hook names
    resolve on the bridge with the same shapes."""
    model, _, _ = _bridge(arch)
    hooked = tiny(arch)[0]
    got = model.rewards(CONVERSATIONS).values(0)
    torch.testing.assert_close(hooked.rewards(CONVERSATIONS).values(0), got,
                               atol=parity_atol(got, model.cfg.n_layers), rtol=0)
    batch = model.build(CONVERSATIONS[:1])
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    _, ref_cache = hooked.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    for name in HOOKS:
        assert cache[name].shape == ref_cache[name].shape, name


def test_bf16_rewards_equal_hf_and_read_in_float32() -> None:
    model, hf, _ = _bridge("llama", torch.bfloat16)
    got = model.rewards(CONVERSATIONS).values(0)
    assert got.dtype == torch.float32
    batch = model.build(CONVERSATIONS)
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"][:, 0].float()
    torch.testing.assert_close(got, ref, atol=0, rtol=0)  # the same forward, read unrounded


def test_compatibility_mode_never_centres_the_head() -> None:
    """TransformerLens's ``enable_compatibility_mode()`` centres the unembed by default: with one
    output column every reward becomes 0. A reward bridge keeps HF's rewards and refuses
    ``center_unembed=True``; a bridge built with TransformerLens's own adapter shows the trap."""
    model, hf, tok = _bridge("llama")
    ref = model.rewards(CONVERSATIONS).values(0)
    model.enable_compatibility_mode(disable_warnings=True)
    after = model.rewards(CONVERSATIONS).values(0)
    torch.testing.assert_close(after, ref, atol=parity_atol(ref, model.cfg.n_layers), rtol=0)
    with pytest.raises(ValueError, match="never centres"):
        model.enable_compatibility_mode(center_unembed=True)

    class Plain(LlamaArchitectureAdapter):  # the adapter without the fix
        def __init__(self, cfg: Any) -> None:
            super().__init__(cfg)
            self.component_mapping["unembed"] = UnembeddingBridge(name="score", config=self.cfg)

    ArchitectureAdapterFactory.register_adapter("PlainLlamaReward", Plain)
    plain = build_bridge_from_module(hf, "PlainLlamaReward", hf_config=hf.config)
    plain.enable_compatibility_mode(disable_warnings=True)
    batch = model.build(CONVERSATIONS[:1])
    assert float(plain(batch.tokens).abs().max()) == 0.0 and float(ref.abs().max()) > 0.1


def test_gemma2_soft_cap_is_not_applied_to_the_score() -> None:
    """The bridge copies Gemma-2's ``final_logit_softcapping`` into ``output_logits_soft_cap``;
    HF's sequence classifier never caps the score, so the reward adapter turns it off."""
    model, hf, _ = _bridge("gemma2")
    x = torch.tensor([[10.0, -7.0]])
    torch.testing.assert_close(model.adapter.apply_output_logits_transform(x), x)

    class Plain(Gemma2ArchitectureAdapter):
        def __init__(self, cfg: Any) -> None:
            super().__init__(cfg)
            self.component_mapping["unembed"] = UnembeddingBridge(name="score", config=self.cfg)

    ArchitectureAdapterFactory.register_adapter("PlainGemma2Reward", Plain)
    plain = build_bridge_from_module(hf, "PlainGemma2Reward", hf_config=hf.config)
    assert hf.config.final_logit_softcapping is not None
    capped = plain.adapter.apply_output_logits_transform(x)
    assert float((capped - x).abs().max()) > 1.0  # the trap: 10 -> cap * tanh(10 / cap)


@pytest.mark.parametrize("arch", BRIDGE_ARCHITECTURES)
def test_architectures_only_the_bridge_loads(arch: str) -> None:
    """HF sequence classifiers HookedRewardModel has no converter for (their decompositions,
    bf16 and float64: ``test_bridge_families.py``)."""
    hf, tok = tiny_hf_reward_model(arch)
    if hooked_transformer_missing() is None:  # TransformerLens 3: HookedRewardModel refuses it
        from tl_reward import HookedRewardModel

        with pytest.raises(UnsupportedArchitectureError):
            HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok)
    model = BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok)
    batch = model.build(CONVERSATIONS)
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"][:, 0]
    got = model.rewards(CONVERSATIONS).values(0)
    torch.testing.assert_close(got, ref, atol=parity_atol(ref, model.cfg.n_layers), rtol=0)
    assert float(ref.std()) > 1e-3  # distinct rewards: a wrong pooled row would show
    _, cache = model.run_with_cache(batch.tokens[:1])
    for name in HOOKS:
        assert name in cache, name


def test_unknown_custom_head_refuses_by_name() -> None:
    """A custom reward class the bridge does not know refuses, naming it and
    HookedRewardModel; the known custom heads (InternLM2 too): tests/model/test_bridge_heads.py."""
    hf, tok = tiny_hf_reward_model("internlm2")
    hf.__class__ = type("FooForRewardModel", (type(hf),), {})
    with pytest.raises(UnsupportedArchitectureError,
                       match=r"^no reward bridge for FooForRewardModel.*HookedRewardModel"):
        BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok)


def test_unknown_architecture_names_the_fix() -> None:
    hf, tok = tiny_hf_reward_model("llama")
    hf.__class__ = type("FooForSequenceClassification", (type(hf),), {})
    with pytest.raises(UnsupportedArchitectureError, match="register a reward adapter"):
        BridgeRewardModel.from_pretrained(hf_model=hf, tokenizer=tok)


def test_sae_parts_refuse_without_sae_lens(monkeypatch: pytest.MonkeyPatch) -> None:
    """SAELens cannot be imported under TransformerLens 4 (SAELens#738): the SAE parts say so
    by name, while ``tl_reward`` and the bridge never need it."""
    from tl_reward.errors import SAELensUnavailableError
    from tl_reward.sae import saes_for

    monkeypatch.setitem(sys.modules, "sae_lens", None)  # as if it could not be imported
    monkeypatch.delitem(sys.modules, "tl_reward.model.hooked_sae_reward_model", raising=False)
    with pytest.raises(SAELensUnavailableError, match=r"transformer-lens<4 .*SAELens#738"):
        import tl_reward.model.hooked_sae_reward_model  # noqa: F401
    with pytest.raises(SAELensUnavailableError, match="SAELens#738"):
        saes_for("org/model", base="org/base")


def test_adapters_come_from_the_entry_point() -> None:
    """TransformerLens finds the reward adapters through ``transformer_lens.architectures``
    (installed from pyproject.toml), with no registration call by tl_reward."""
    from importlib.metadata import PackageNotFoundError, distribution, entry_points

    from tl_reward.tl_backend.bridge import REWARD_ADAPTERS

    try:
        distribution("tl-reward")
    except PackageNotFoundError:
        pytest.skip("tl_reward is on the path but not installed: no entry points to read")
    found = {ep.name: ep.load() for ep in entry_points(group="transformer_lens.architectures")}
    assert {k: found.get(k) for k in REWARD_ADAPTERS} == REWARD_ADAPTERS


def test_a_stock_bridge_has_no_attachments() -> None:
    """The bridge wraps HF's own modules: they are its stock forward, not attachments; a hook
    is one."""
    from tl_reward.tl_backend import attachments

    model, _, _ = _bridge("llama")
    assert attachments(model) == []
    handle = model.blocks[0].mlp.register_forward_hook(lambda m, i, o: o)
    try:
        found = attachments(model)
        assert len(found) == 1 and found[0].startswith("a hook on blocks.0.")
        assert found[0].endswith("mlp")
    finally:
        handle.remove()


@pytest.mark.parametrize("module", [
    "tl_reward", "tl_reward.architectures", "tl_reward.analysis.lens",
    "tl_reward.analysis.attribution", "tl_reward.analysis.direct_path",
    "tl_reward.analysis.patching", "tl_reward.analysis.attribution_patching",
    "tl_reward.audit.probes", "tl_reward.audit.concepts", "tl_reward.sweep.vocab_sweep",
    "tl_reward.compare.behaviour", "tl_reward.compare.layers", "tl_reward.sae.attribution",
    "tl_reward.sae.fit"])
def test_what_the_bridge_uses_imports(module: str) -> None:
    """``tl_reward`` and each module an analysis on the bridge needs import under the installed
    TransformerLens (under 4.3: without HookedTransformer, its config or SAELens; the custom
    heads read ``tl_reward.architectures``)."""
    import importlib

    importlib.import_module(module)
