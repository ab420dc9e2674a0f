"""InternLM2 reward models: the fused ``wqkv`` split, the appended reward token and the v_head,
exact against the published-structure reference loaded from disk with its custom code.

Tolerance: 1e-4 absolute, float32, rewards of order 1 (measured ~1e-6).
"""

from __future__ import annotations

import einops
import torch
from helpers import CONVERSATIONS

from tl_reward import HookedRewardModel
from tl_reward.architectures import Architecture, get_architecture, register_architecture
from tl_reward.architectures.internlm2 import convert_internlm2
from tl_reward.testing import save_tiny_reward_model

TOL = 1e-4


def _load(tmp_path):
    from transformers import AutoModelForSequenceClassification

    path = save_tiny_reward_model(tmp_path / "internlm2", "internlm2", seed=3)
    model = HookedRewardModel.from_pretrained(str(path), device="cpu", trust_remote_code=True)
    hf = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True).eval()
    return model, hf


def _ref(hf, model, conv) -> torch.Tensor:
    one = model.make_batch(conv)
    with torch.no_grad():
        return hf(input_ids=one.tokens, attention_mask=one.attention_mask).logits[0]


def test_internlm2_from_disk_matches_reference(tmp_path) -> None:
    model, hf = _load(tmp_path)
    assert type(hf).__name__ == "InternLM2ForRewardModel"
    reward_token = hf.config.reward_token_id
    assert model.suffix_ids == (reward_token,)
    assert model.encode(CONVERSATIONS[0]).ids[-1] == reward_token
    ids = model.encode(CONVERSATIONS[0]).ids
    assert model.encode(ids).ids == ids  # token ids are taken as given
    for side in ("right", "left"):
        batch = model.make_batch(CONVERSATIONS, padding_side=side)
        with torch.no_grad():
            ours = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
        for i, conv in enumerate(CONVERSATIONS):
            ref = _ref(hf, model, conv)
            assert ref.abs() > 0.05
            torch.testing.assert_close(ours[i, 0], ref, atol=TOL, rtol=0)
    res = model.rewards(CONVERSATIONS, batch_size=3)
    torch.testing.assert_close(res.score, res.rewards[:, 0])


def test_wrong_wqkv_layout_would_fail(tmp_path) -> None:
    """Reading ``wqkv`` as [all queries; all keys; all values] (the Llama layout) is wrong."""
    model, hf = _load(tmp_path)
    arch = get_architecture("InternLM2ForRewardModel")

    def llama_layout(hf_model, cfg):
        sd = convert_internlm2(hf_model, cfg)
        n_kv = cfg.n_key_value_heads
        for i, layer in enumerate(hf_model.model.layers):
            w = layer.attention.wqkv.weight
            q, k, v = w.split([cfg.n_heads * cfg.d_head, n_kv * cfg.d_head,
                               n_kv * cfg.d_head])
            sd[f"blocks.{i}.attn.W_Q"] = einops.rearrange(q, "(n d) m -> n m d", n=cfg.n_heads)
            sd[f"blocks.{i}.attn._W_K"] = einops.rearrange(k, "(n d) m -> n m d", n=n_kv)
            sd[f"blocks.{i}.attn._W_V"] = einops.rearrange(v, "(n d) m -> n m d", n=n_kv)
        return sd

    register_architecture(Architecture(hf_class=arch.hf_class, config=arch.config,
                                       convert=llama_layout, head=arch.head,
                                       suffix_ids=arch.suffix_ids), overwrite=True)
    try:
        wrong = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=model.tokenizer,
                                                  device="cpu")
    finally:
        register_architecture(arch, overwrite=True)
    batch = model.make_batch(CONVERSATIONS)
    with torch.no_grad():
        bad = wrong(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
    refs = torch.stack([_ref(hf, model, c) for c in CONVERSATIONS])
    assert (bad[:, 0] - refs).abs().max() > 100 * TOL
