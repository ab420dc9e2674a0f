"""LoRA merged with plain torch against peft's own adapted forward."""

from __future__ import annotations

import copy

import pytest
import torch

from tl_reward.errors import TLRewardError
from tl_reward.irm.lora import load_adapter, merge_lora, peft_state_to_adapter, save_adapter
from tl_reward.testing.causal import tiny_causal_lm


def test_merge_equals_peft_forward(tmp_path):
    peft = pytest.importorskip("peft")
    base, tok = tiny_causal_lm("llama", seed=2)
    cfg = peft.LoraConfig(r=4, lora_alpha=12, target_modules=["q_proj", "v_proj", "o_proj"],
                          init_lora_weights=False)  # random A and B: a non-zero delta
    adapted = peft.get_peft_model(copy.deepcopy(base), cfg).eval()
    ids = torch.tensor([tok("Is the sky blue? Yes, the sky is blue.")["input_ids"]])
    with torch.no_grad():
        want = adapted(input_ids=ids).logits
        plain = base(input_ids=ids).logits
    adapter = peft_state_to_adapter(peft.get_peft_model_state_dict(adapted))
    assert len(adapter) == 2 * 3 * base.config.num_hidden_layers
    save_adapter(tmp_path / "a.safetensors", adapter, r=4, alpha=12, dtype=torch.float32,
                 note="test")
    tensors, meta = load_adapter(tmp_path / "a.safetensors")
    assert meta["r"] == 4 and meta["note"] == "test"
    merged = merge_lora(base, tensors, r=meta["r"], alpha=meta["alpha"])
    with torch.no_grad():
        got = merged(input_ids=ids).logits
    # float32 forward of O(1) logits; merging vs. adding the low-rank path differs by rounding
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert (want - plain).abs().max() > 0.1  # the adapter changes the model
    # a wrong scale (alpha instead of alpha / r) misses
    wrong = merge_lora(base, tensors, r=1, alpha=meta["alpha"])
    with torch.no_grad():
        assert (wrong(input_ids=ids).logits - want).abs().max() > 1e-2
    # the base model is untouched unless inplace=True
    with torch.no_grad():
        torch.testing.assert_close(base(input_ids=ids).logits, plain)


def test_wrong_architecture_is_reported():
    base, _ = tiny_causal_lm("llama", seed=2)
    bad = {"model.layers.0.self_attn.nope.lora_A": torch.zeros(2, 64),
           "model.layers.0.self_attn.nope.lora_B": torch.zeros(64, 2)}
    with pytest.raises(TLRewardError, match="no such module"):
        merge_lora(base, bad, r=2, alpha=2)
