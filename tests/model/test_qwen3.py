"""Qwen3 (Skywork-Reward-V2 Qwen3 series): HF parity from disk, the q/k norm, BOS rule, sweep.

Tolerance: 1e-4 absolute on rewards of order 1 in float32. Our forward and HF's differ only in
summation order (folded norms, split heads), which costs a few float32 ulps per layer (~1e-6
measured); 1e-4 leaves room for that and is ~1e4 times smaller than any bug we know of.
"""

from __future__ import annotations

import pytest
import torch
from helpers import CONVERSATIONS, hf_rewards

from tl_reward import HookedRewardModel
from tl_reward.architectures import Architecture, get_architecture, register_architecture
from tl_reward.model.inputs import encode
from tl_reward.testing import save_tiny_reward_model, tiny_hf_reward_model, tiny_tokenizer
from tl_reward.tl_backend import build_prefix_cache, fast_cache_unsupported

TOL = 1e-4


def _reload(tmp_path, arch: str, k: int, **kwargs):
    from transformers import AutoModelForSequenceClassification

    path = save_tiny_reward_model(tmp_path / f"{arch}{k}", arch, num_labels=k, seed=4)
    model = HookedRewardModel.from_pretrained(str(path), device="cpu", **kwargs)
    hf = AutoModelForSequenceClassification.from_pretrained(
        path, attn_implementation="eager", **kwargs).eval()
    return model, hf


@pytest.mark.parametrize("k", [1, 2])
def test_qwen3_from_disk_matches_hf_both_paddings(tmp_path, k: int) -> None:
    model, hf = _reload(tmp_path, "qwen3", k)
    assert model.cfg.use_qk_norm and model.cfg.d_head == 24 != model.cfg.d_model // 4
    for side in ("right", "left"):
        batch = model.make_batch(CONVERSATIONS, padding_side=side)
        with torch.no_grad():
            ours = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
        assert ours.shape == (3, k)
        for i, conv in enumerate(CONVERSATIONS):  # HF unpadded: the ground truth per row
            one = model.make_batch(conv)
            ref = hf_rewards(hf, one.tokens, one.attention_mask)["reward"][0]
            assert ref.abs().max() > 0.05
            torch.testing.assert_close(ours[i], ref, atol=TOL, rtol=0)


def test_qwen3_without_qk_norm_would_fail(tiny) -> None:
    """The check above can fail: the same weights with the per-head q/k norm dropped are off."""
    model, hf, tok = tiny("qwen3")
    arch = get_architecture("Qwen3ForSequenceClassification")

    def no_qk_norm(hf_config):
        return {**arch.config(hf_config), "use_qk_norm": False}

    register_architecture(Architecture(hf_class=arch.hf_class, config=no_qk_norm,
                                       convert=arch.convert), overwrite=True)
    try:
        wrong = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
    finally:
        register_architecture(arch, overwrite=True)
    batch = model.make_batch(CONVERSATIONS)
    ref = hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"]
    with torch.no_grad():
        bad = wrong(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
        good = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
    assert (bad - ref).abs().max() > 100 * TOL
    torch.testing.assert_close(good, ref, atol=TOL, rtol=0)


def _card_ids(tok, conv) -> list[int]:
    """Skywork-Reward-V2's model card, literally: template to a string, strip one leading
    ``bos_token`` ("remove the potential duplicate bos token"), then ``tokenizer(text)``."""
    text = tok.apply_chat_template(conv, tokenize=False)
    if tok.bos_token is not None and text.startswith(tok.bos_token):
        text = text[len(tok.bos_token):]
    return tok(text)["input_ids"]


def test_bos_rule_equals_the_model_card_recipe() -> None:
    conv = CONVERSATIONS[0]
    # Llama-3-style: the template writes BOS and the tokenizer adds one -> the naive string
    # route duplicates it (the trap the card warns about)
    tok = tiny_tokenizer()
    naive = tok(tok.apply_chat_template(conv, tokenize=False))["input_ids"]
    assert naive[:2] == [tok.bos_token_id] * 2
    assert encode(tok, conv).ids == _card_ids(tok, conv)
    assert encode(tok, conv).ids.count(tok.bos_token_id) == 1
    # a template that writes no BOS while the tokenizer adds one: the card's ids have one BOS
    tok.chat_template = tok.chat_template.replace("{{ bos_token }}", "")
    assert tok.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"][0] \
        != tok.bos_token_id
    assert encode(tok, conv).ids == _card_ids(tok, conv)
    # Qwen3-style: no BOS token and none added -> ids untouched
    from tokenizers import processors

    tok.backend_tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.bos_token = None
    assert tok("hi")["input_ids"] == tok("hi", add_special_tokens=False)["input_ids"]
    assert encode(tok, conv).ids == _card_ids(tok, conv)


def test_qwen3_sweep_uses_fast_cache_and_matches_naive(tiny) -> None:
    """Per-head q/k norms run inside ``calculate_qkv_matrices``, so the fast prefix cache
    serves Qwen3 (the per-architecture sweep test checks its scores against naive and HF)."""
    model, _, tok = tiny("qwen3")
    assert fast_cache_unsupported(model.cfg) is None
    prefix = torch.tensor(encode(tok, CONVERSATIONS[2]).ids)
    cache = build_prefix_cache(model, prefix[:-3])
    assert cache.method == "fast"
    from tl_reward.tl_backend import run_after_prefix

    resid = run_after_prefix(model, cache, prefix[-3:][None])
    with torch.no_grad():
        full = model(prefix[None], stop_at_layer=model.cfg.n_layers)
    torch.testing.assert_close(resid[0], full[0, -3:], atol=TOL, rtol=0)
    # an OLMo-style whole-vector q/k norm still falls back to the stock cache
    olmo = model.cfg.__class__.from_dict({**model.cfg.to_dict(),
                                          "original_architecture": "Olmo2ForCausalLM"})
    assert "OLMo" in (fast_cache_unsupported(olmo) or "")


def test_qwen3_tiny_builder_shape() -> None:
    hf, _ = tiny_hf_reward_model("qwen3", 2)
    assert type(hf).__name__ == "Qwen3ForSequenceClassification"
    assert hf.model.layers[0].self_attn.q_norm.weight.shape == (24,)
