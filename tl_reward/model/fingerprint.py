"""A fingerprint of everything that determines a reward model's outputs.

Caches and resumable jobs (the faithfulness report's per-pair cache, the vocabulary sweep's
resume and merge) key their results on :func:`model_fingerprint`, so two models never share
results unless they compute the same function. It covers:

* every parameter tensor (body and head): its name, shape, dtype, the exact integer sum of the
  raw bit patterns of all its elements (a change to any single weight changes it) and the bytes
  of a deterministic strided sample of at most 4096 elements (order-sensitive);
* the head's buffers and settings (kind, objective names, ArmoRM's transform and gating pattern);
* the config (minus the device), the dtype, the pooling rule and the pad id;
* the library version (a new version may compute differently).

The checksum runs on the model's device: one integer reduction over the weights' bits (no copy),
so one read of the weights per model. It is memoised on the model and
recomputed only when a parameter is replaced or modified in place (PyTorch's version counter).
In-place edits through ``param.data`` bypass that counter: call :func:`model_fingerprint` with
``refresh=True`` after such edits.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

_SAMPLE = 4096  # elements per tensor whose bytes enter the hash in order
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MEMO = "_tl_reward_fingerprint"


def tensor_checksum(t: torch.Tensor) -> tuple[int, str]:
    """Exact checksum of a tensor's bits: ``(sum of all bit patterns mod 2**64, SHA-1 of the
    bytes of a strided sample of at most 4096 elements)``. Integer arithmetic, so equal tensors
    give equal checksums on any device and any summation order."""
    flat = t.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    flat = flat.contiguous().view(_INT_VIEW[flat.element_size()])
    total = int(flat.sum(dtype=torch.int64).item()) & (2**64 - 1) if flat.numel() else 0
    sample = flat[:: max(1, flat.numel() // _SAMPLE)].cpu().numpy().tobytes()
    return total, hashlib.sha1(sample).hexdigest()


def _state_key(model: torch.nn.Module) -> tuple[Any, ...]:
    return tuple((name, p.data_ptr(), p._version, p.dtype, tuple(p.shape))
                 for name, p in model.named_parameters())


def _config(model: Any) -> str:
    cfg = dict(model.cfg.to_dict() if hasattr(model.cfg, "to_dict") else vars(model.cfg))
    for k in ("device", "n_devices"):
        cfg.pop(k, None)
    return json.dumps(cfg, sort_keys=True, default=str)


def _head(model: Any) -> list[Any]:
    head = getattr(model, "reward_head", None)
    if head is None:
        return [None]
    out: list[Any] = [type(head).__name__, list(getattr(head, "objectives", []))]
    for attr in ("temperature", "token_pattern"):
        if hasattr(head, attr):
            out.append([attr, getattr(head, attr)])
    for name, b in head.named_buffers():
        if b is not None:
            out.append([name, str(b.dtype), list(b.shape), tensor_checksum(b)])
    return out


def model_fingerprint(model: Any, refresh: bool = False) -> str:
    """A 32-hex-digit hash of the weights, head, config, dtype, pooling rule and library version.

    Two models get the same fingerprint only if all of these agree (up to a 128-bit hash
    collision). Memoised on ``model``; ``refresh=True`` recomputes it.
    """
    import tl_reward

    state = _state_key(model)
    memo = getattr(model, _MEMO, None)
    if not refresh and memo is not None and memo[0] == state:
        return memo[1]
    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.named_parameters():
            h.update(json.dumps([name, str(p.dtype), list(p.shape), tensor_checksum(p)]).encode())
        h.update(json.dumps({
            "head": _head(model),
            "config": _config(model),
            "dtype": str(getattr(model.cfg, "dtype", None)),
            "pooling": getattr(model, "pooling", None),
            "pad_token_id": getattr(model, "pad_token_id", None),
            "library": tl_reward.__version__,
        }, sort_keys=True, default=str).encode())
    fp = h.hexdigest()[:32]
    object.__setattr__(model, _MEMO, (state, fp))
    return fp
