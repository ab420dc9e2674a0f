"""The model fingerprint: equal for equal models, different when any weight, the pooling rule,
the head or the dtype differs (it keys the faithfulness cache and the sweep's resume/merge)."""

from __future__ import annotations

import torch

from tl_reward import HookedRewardModel
from tl_reward.model.fingerprint import model_fingerprint, tensor_checksum
from tl_reward.testing import tiny_hf_reward_model


def fresh(arch: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float32):
    hf, tok = tiny_hf_reward_model(arch, num_labels=1, seed=seed)
    return HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                             dtype=dtype)


def test_fingerprint_sees_every_weight_pooling_and_dtype() -> None:
    a, b = fresh(), fresh()
    assert a.cfg.model_name == b.cfg.model_name
    assert model_fingerprint(a) == model_fingerprint(b)  # same seed, same function
    # one body weight (not the head, not the embedding) moved by one float32 ulp
    with torch.no_grad():
        w = b.blocks[1].mlp.W_in
        w[7, 11] = torch.nextafter(w[7, 11], torch.tensor(float("inf")))
    assert model_fingerprint(a) != model_fingerprint(b)  # memo refreshed by the version counter
    c = fresh()
    c.pooling = "legacy"
    assert model_fingerprint(c) != model_fingerprint(a)
    assert model_fingerprint(fresh(dtype=torch.bfloat16)) != model_fingerprint(a)
    assert model_fingerprint(fresh("qwen2")) != model_fingerprint(a)


def test_checksum_is_exact_and_order_sensitive() -> None:
    t = torch.randn(1000)
    swapped = t.clone()
    swapped[[3, 4]] = swapped[[4, 3]]
    assert tensor_checksum(t) == tensor_checksum(t.clone())
    assert tensor_checksum(t) != tensor_checksum(swapped)
    # brute-force reference: the sum in Python integers over the raw bit patterns
    bits = [int(x) for x in t.view(torch.int32).tolist()]
    assert tensor_checksum(t)[0] == sum(bits) % 2**64
    one = t.clone()
    one[777] = torch.nextafter(one[777], torch.tensor(float("inf")))
    big = torch.randn(100_000)
    big2 = big.clone()
    big2[12_345] = torch.nextafter(big2[12_345], torch.tensor(float("inf")))  # not sampled
    assert tensor_checksum(t) != tensor_checksum(one)
    assert tensor_checksum(big) != tensor_checksum(big2)
