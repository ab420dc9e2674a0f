"""Fingerprints of everything that determines a reward model's outputs, and of its tokenizer.

Resumable jobs and caches (:mod:`tl_reward.store`) key their results on
:func:`model_fingerprint`, so two models never share results unless they compute the same
function. It covers every parameter and buffer (name, dtype, shape and the SHA-256 of its full
bytes, in order: any changed or swapped element changes it), the head's settings (kind,
objective names, ArmoRM's gate temperature and token pattern, a judge's rating values), the
config (minus the device), the dtype, the pooling rule, the pad id and the library version.

Hashing the weights reads every byte once (SHA-256 at about 1.3 GB/s on one CPU core: some 15 s
for an 8B model in bf16), copying at most 256 MiB to the CPU at a time. That part is memoised on
the model, keyed on each tensor's name, storage address, version counter, dtype and shape, so
it is redone when a tensor is replaced or modified in place; the settings are hashed afresh on
every call. Edits through ``param.data`` bypass the version counter: pass ``refresh=True``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

_CHUNK_BYTES = 256 * 2**20  # bytes copied to the CPU at a time
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MEMO = "_tl_reward_weights_digest"


def _update(h: Any, t: torch.Tensor, *head: str) -> None:
    """Feed ``h`` the JSON of ``head``, ``t``'s dtype and shape, then all of ``t``'s bytes."""
    h.update(json.dumps([*head, str(t.dtype), list(t.shape)]).encode())
    flat = t.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    flat = flat.contiguous().view(_INT_VIEW[flat.element_size()])  # bf16 -> int16: numpy-able
    step = max(1, _CHUNK_BYTES // flat.element_size())
    for i in range(0, flat.numel(), step):
        h.update(flat[i: i + step].cpu().numpy().data)


def tensor_digest(t: torch.Tensor) -> str:
    """SHA-256 (first 32 hex digits) of a tensor's dtype, shape and full bytes in row-major
    order: equal tensors give equal digests on any device; any changed or swapped element
    changes it."""
    h = hashlib.sha256()
    _update(h, t)
    return h.hexdigest()[:32]


def weights_digest(model: torch.nn.Module, refresh: bool = False) -> str:
    """SHA-256 of every named parameter and buffer (any ``nn.Module``, HF models included),
    memoised on ``model`` until a tensor is replaced or modified in place."""
    tensors = [*model.named_parameters(), *((n, b) for n, b in model.named_buffers()
                                            if b is not None)]
    key = tuple((n, t.data_ptr(), t._version, t.dtype, tuple(t.shape)) for n, t in tensors)
    memo = getattr(model, _MEMO, None)
    if not refresh and memo is not None and memo[0] == key:
        return memo[1]
    h = hashlib.sha256()
    with torch.no_grad():
        for name, t in tensors:
            _update(h, t, name)
    object.__setattr__(model, _MEMO, (key, h.hexdigest()))
    return h.hexdigest()


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
    for attr in ("temperature", "token_pattern", "rating_values"):
        if hasattr(head, attr):
            out.append([attr, getattr(head, attr)])
    return out


def model_fingerprint(model: Any, refresh: bool = False) -> str:
    """A 32-hex-digit hash of every weight and buffer, the head's settings, config, dtype,
    pooling rule, pad id, suffix ids, input format (a PRM's steps, a judge's template) and
    library version: equal only if all of these agree (up to a 128-bit
    collision). The weights' hash is memoised on ``model``; ``refresh=True`` recomputes it."""
    import tl_reward

    h = hashlib.sha256(json.dumps({
        "weights": weights_digest(model, refresh),
        "head": _head(model),
        "config": _config(model),
        "dtype": str(getattr(model.cfg, "dtype", None)),
        "pooling": getattr(model, "pooling", None),
        "pad_token_id": getattr(model, "pad_token_id", None),
        "suffix_ids": list(getattr(model, "suffix_ids", ())),
        # how inputs are built: a PRM's step format, a judge's template (frozen dataclasses)
        "input_format": repr(getattr(model, "input_format", None)),
        "library": tl_reward.library_version(),
    }, sort_keys=True, default=str).encode())
    return h.hexdigest()[:32]


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A 32-hex-digit hash of how ``tokenizer`` turns text and conversations into ids: its
    vocabulary, merges, normalisation and added tokens (the fast backend's full JSON, else the
    sorted vocabulary), the special tokens and their ids, the chat template and whether it adds
    BOS. ``None`` (no tokenizer) hashes as such."""
    if tokenizer is None:
        return hashlib.sha256(b"null").hexdigest()[:32]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = (backend.to_str() if backend is not None
            else json.dumps(sorted(tokenizer.get_vocab().items())))
    fields = {
        "class": type(tokenizer).__name__,
        "added": sorted((str(k), str(v)) for k, v in
                        (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()),
        "special": getattr(tokenizer, "special_tokens_map", {}),
        "ids": [getattr(tokenizer, f"{k}_token_id", None) for k in ("bos", "eos", "pad", "unk")],
        "chat_template": getattr(tokenizer, "chat_template", None),
        "add_bos": getattr(tokenizer, "add_bos_token", None),
        "add_eos": getattr(tokenizer, "add_eos_token", None),
    }
    h = hashlib.sha256(body.encode())
    h.update(json.dumps(fields, sort_keys=True, default=str).encode())
    return h.hexdigest()[:32]


def attachments(model: Any, only: tuple[str, ...] = (), skip: tuple[str, ...] = (),
                hook_points: bool = True) -> list[str]:
    """Everything attached to ``model`` beyond its stock forward, one description each: global
    torch module hooks, forward or pre-forward hooks on any submodule (on hook points too unless
    ``hook_points=False``), and modules that are neither TransformerLens's, torch's, HF's
    (which a bridge wraps) nor the library's own (an attached SAE, a replaced MLP, a wrapped
    hook point). ``only`` / ``skip`` restrict to / leave out submodules under these top-level
    names. Empty for a stock model."""
    from torch.nn.modules import module as nn_module
    from transformer_lens.hook_points import HookPoint

    out = []
    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        out.append("a global torch module hook")
    for name, mod in model.named_modules():
        top = name.split(".")[0]
        if not name or (only and top not in only) or top in skip:
            continue
        n_hooks = len(mod._forward_hooks) + len(mod._forward_pre_hooks)
        if n_hooks and (hook_points or not isinstance(mod, HookPoint)):
            out.append(f"a hook on {name}")
        cls = type(mod)
        if not cls.__module__.startswith(("transformer_lens.", "torch.nn.", "tl_reward.",
                                          "transformers.")):  # a bridge wraps HF's modules
            what = " (an attached SAE)" if cls.__module__.startswith("sae_lens") else ""
            out.append(f"{name} is a {cls.__module__}.{cls.__qualname__}{what}")
    return out
