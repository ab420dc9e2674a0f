"""The packaged VADER policy/reference pair: SmolLM2-135M-Instruct and a DPO-tuned LoRA copy.

The adapter (``assets/smollm2_vader_lora.safetensors``) was trained by
``scripts/train_vader_policy.py`` (trl DPO + peft LoRA) on pairs of the base model's own replies
ordered by VADER compound score; it is merged here with plain torch (no peft needed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tl_reward.errors import TLRewardError, check_choice
from tl_reward.irm.lora import load_adapter, merge_lora

VADER_ADAPTER_FILE = (
    Path(__file__).resolve().parent.parent / "assets" / "smollm2_vader_lora.safetensors"
)


def vader_adapter_metadata(adapter_path: str | Path | None = None) -> dict[str, Any]:
    """Training metadata of the packaged adapter (data, steps, time, beta, ...)."""
    return load_adapter(adapter_path or VADER_ADAPTER_FILE)[1]


def load_vader_pair(
    backend: str = "tl",
    dtype: torch.dtype = torch.float32,
    device: str | None = None,
    return_tokenizer: bool = False,
    adapter_path: str | Path | None = None,
) -> tuple[Any, ...]:
    """``(policy, reference)`` (and the tokenizer if asked), offline.

    ``backend="tl"`` gives ``HookedTransformer`` models, ``"hf"`` HF ``LlamaForCausalLM``.
    The policy's DPO ``beta`` is ``vader_adapter_metadata()["beta"]``. ``adapter_path``
    loads another adapter file of the same format (default: the packaged one).
    """
    from tl_reward.irm.models import hooked_causal_lm
    from tl_reward.model.demo import load_smollm2

    check_choice(backend, ("tl", "hf"), "backend")
    path = Path(adapter_path or VADER_ADAPTER_FILE)
    if not path.exists():
        raise TLRewardError(f"the VADER policy adapter {path.name} is missing; "
                            "train it with scripts/train_vader_policy.py")
    reference, tok = load_smollm2(torch.float32)
    adapter, meta = load_adapter(path)
    policy = merge_lora(reference, adapter, r=int(meta["r"]), alpha=float(meta["alpha"]))
    out: list[Any] = []
    for m in (policy, reference):
        m = m.to(dtype)
        if device is not None:
            m = m.to(device)
        m.eval()
        out.append(hooked_causal_lm(m, tok, device=device) if backend == "tl" else m)
    if return_tokenizer:
        out.append(tok)
    return tuple(out)
