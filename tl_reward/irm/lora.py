"""LoRA adapters merged into a copy of a base model with plain torch (no ``peft`` at load time).

A LoRA adapter on a linear layer ``W [out, in]`` adds ``(alpha / r) * B @ A`` with
``A [r, in]`` and ``B [out, r]``. The adapter file stores, per adapted module ``name``,
``name.lora_A`` and ``name.lora_B``; its metadata holds ``r`` and ``alpha`` (JSON strings).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from tl_reward.errors import TLRewardError


def peft_state_to_adapter(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a peft LoRA state dict (``base_model.model.<name>.lora_A.weight``) to ours."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        for part in ("lora_A", "lora_B"):
            tail = f".{part}.weight"
            if key.endswith(tail):
                name = (key[: -len(tail)].removeprefix("base_model.model.")
                        .replace(f".{part}.default", ""))
                out[f"{name}.{part}"] = value.detach().contiguous()
    if not out:
        raise TLRewardError("no LoRA weights (keys ending in lora_A/lora_B.weight) in this state")
    return out


def merge_lora(
    model: torch.nn.Module,
    adapter: Mapping[str, torch.Tensor],
    r: int,
    alpha: float,
    inplace: bool = False,
) -> torch.nn.Module:
    """``model`` (a copy unless ``inplace``) with every LoRA delta added to its linear weights.

    The delta ``(alpha / r) * B @ A`` is formed in float32 and cast to the weight's dtype.
    """
    target = model if inplace else copy.deepcopy(model)
    names = sorted({k.rsplit(".", 1)[0] for k in adapter})
    modules = dict(target.named_modules())
    scale = float(alpha) / float(r)
    with torch.no_grad():
        for name in names:
            if name not in modules:
                raise TLRewardError(f"the adapter adapts {name!r} but the model has no such "
                                    "module; the adapter belongs to another architecture")
            lin = modules[name]
            a = adapter[f"{name}.lora_A"].to(device=lin.weight.device, dtype=torch.float32)
            b = adapter[f"{name}.lora_B"].to(device=lin.weight.device, dtype=torch.float32)
            if (b.shape[0], a.shape[1]) != tuple(lin.weight.shape):
                raise TLRewardError(f"adapter for {name!r} has shape {(b.shape[0], a.shape[1])} "
                                    f"but the weight is {tuple(lin.weight.shape)}")
            lin.weight.add_((scale * (b @ a)).to(lin.weight.dtype))
    return target


def save_adapter(path: str | Path, adapter: Mapping[str, torch.Tensor], r: int, alpha: float,
                 dtype: torch.dtype = torch.float16, **meta: Any) -> None:
    """Write an adapter as safetensors with ``r``, ``alpha`` and any JSON-able metadata."""
    from safetensors.torch import save_file

    tensors = {k: v.to(dtype).contiguous() for k, v in adapter.items()}
    info = {"r": r, "alpha": alpha, **meta}
    save_file(tensors, str(path), metadata={k: json.dumps(v) for k, v in info.items()})


def load_adapter(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An adapter file's tensors (float32) and its parsed metadata."""
    from safetensors import safe_open

    if not Path(path).exists():
        raise TLRewardError(f"no LoRA adapter at {path}")
    with safe_open(str(path), framework="pt") as fh:
        tensors = {k: fh.get_tensor(k).float() for k in fh.keys()}
        meta = {k: json.loads(v) for k, v in (fh.metadata() or {}).items()}
    for key in ("r", "alpha"):
        if key not in meta:
            raise TLRewardError(f"the adapter {path} has no {key!r} in its metadata")
    return tensors, meta
