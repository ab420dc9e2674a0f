"""The model fingerprint: equal for equal models, different when any weight, buffer, the pooling
rule, the pad id, the head or the dtype differs, also after a first (memoised) call; and the
tokenizer fingerprint (it keys every resumable store in :mod:`tl_reward.store`)."""

from __future__ import annotations

import hashlib

import pytest
import torch

from tl_reward import HookedRewardModel
from tl_reward.model.fingerprint import model_fingerprint, tensor_digest, tokenizer_fingerprint
from tl_reward.testing import tiny_hf_reward_model


def fresh(arch: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float32):
    hf, tok = tiny_hf_reward_model(arch, num_labels=1, seed=seed)
    return HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                             dtype=dtype)


def old_checksum(t: torch.Tensor) -> tuple[int, str]:
    """The fingerprint's checksum before issue 17: bit-pattern sum + a strided sample."""
    flat = t.detach().reshape(-1).contiguous().view(torch.int32)
    sample = flat[:: max(1, flat.numel() // 4096)].numpy().tobytes()
    return int(flat.sum(dtype=torch.int64)) & (2**64 - 1), hashlib.sha1(sample).hexdigest()


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


def test_settings_changed_after_a_first_call_change_the_fingerprint() -> None:
    """The weights' hash is memoised; pooling, pad id and head settings are not (issue 17:
    they used to be memoised with the weights and returned the stale fingerprint)."""
    m = fresh("armorm")
    fp0 = model_fingerprint(m)
    old_pooling = m.pooling
    m.pooling = "attention_mask" if old_pooling != "attention_mask" else "hf"
    assert model_fingerprint(m) != fp0
    m.pooling = old_pooling
    assert model_fingerprint(m) == fp0
    old_pad = m.pad_token_id
    m.pad_token_id = old_pad + 1
    assert model_fingerprint(m) != fp0
    m.pad_token_id = old_pad
    head = m.reward_head
    head.temperature = head.temperature * 2
    assert model_fingerprint(m) != fp0
    head.temperature = head.temperature / 2
    assert model_fingerprint(m) == fp0
    before = head.transform.clone()
    with torch.no_grad():
        head.transform.mul_(0.5)  # in place: same storage, new version
    assert model_fingerprint(m) != fp0
    with torch.no_grad():
        head.transform.copy_(before)
    assert model_fingerprint(m) == fp0


def test_swap_outside_the_old_sample_changes_the_fingerprint() -> None:
    """Two swapped weights that the old stride sample skipped: the old checksum (sum + sample)
    is blind to it, the full-bytes hash is not; swapping back restores the fingerprint."""
    m = fresh()
    fp0 = model_fingerprint(m)
    w = m.W_E  # [d_vocab, d_model], more than 4096 elements: the old sample strided
    flat = w.detach().view(-1)
    step = flat.numel() // 4096
    assert step > 1
    i, j = 1, 2  # neither is a multiple of the stride
    assert flat[i] != flat[j]
    old = old_checksum(w)
    with torch.no_grad():
        flat[[i, j]] = flat[[j, i]].clone()
    assert old_checksum(w) == old  # the test can fail: the old algorithm misses the swap
    assert model_fingerprint(m) != fp0
    with torch.no_grad():
        flat[[i, j]] = flat[[j, i]].clone()
    assert model_fingerprint(m) == fp0


def test_tensor_digest_is_exact_and_order_sensitive() -> None:
    t = torch.randn(100_000)
    swapped = t.clone()
    swapped[[3, 4]] = swapped[[4, 3]]
    one = t.clone()
    one[12_345] = torch.nextafter(one[12_345], torch.tensor(float("inf")))
    assert tensor_digest(t) == tensor_digest(t.clone())
    assert tensor_digest(t) != tensor_digest(swapped)
    assert tensor_digest(t) != tensor_digest(one)
    # independent reference: SHA-256 of the header and numpy's own bytes of the tensor
    ref = hashlib.sha256()
    ref.update(b'["torch.float32", [100000]]')
    ref.update(t.numpy().tobytes())
    assert tensor_digest(t) == ref.hexdigest()[:32]
    b = t.to(torch.bfloat16)
    assert tensor_digest(b) != tensor_digest(b.reshape(1000, 100))  # shape is hashed


def test_chunked_copy_hashes_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights reach the hash in chunks (bounded host memory for GPU models); chunks of 64
    bytes (94 of them here) give the digest of one pass over the whole tensor."""
    import tl_reward.model.fingerprint as fp

    t = torch.randn(3001).to(torch.bfloat16)
    whole = tensor_digest(t)
    monkeypatch.setattr(fp, "_CHUNK_BYTES", 64)
    assert tensor_digest(t) == whole
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:  # the device the weights live on does not enter the digest
        assert tensor_digest(t.to(dev)) == whole


def test_tokenizer_fingerprint_sees_the_template_and_specials() -> None:
    _, tok = tiny_hf_reward_model("llama", num_labels=1)
    _, tok2 = tiny_hf_reward_model("llama", num_labels=1)
    fp = tokenizer_fingerprint(tok)
    assert fp == tokenizer_fingerprint(tok2)  # built the same way, same fingerprint
    tok2.chat_template = tok2.chat_template.replace("<|eot_id|>", "\n")
    assert tokenizer_fingerprint(tok2) != fp
    _, tok3 = tiny_hf_reward_model("llama", num_labels=1)
    tok3.add_tokens(["<|new|>"])
    assert tokenizer_fingerprint(tok3) != fp
