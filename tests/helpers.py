"""Builders shared by the tests (tiny models are built once per session)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import torch

from tl_reward import HookedRewardModel
from tl_reward.testing import tiny_hf_reward_model

SHARED = Path(__file__).resolve().parents[1].parent / "shared"

CONVERSATIONS = [
    [{"role": "user", "content": "Is the sky blue?"},
     {"role": "assistant", "content": "Yes, the sky is blue on a clear day."}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "No."}],
    [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "What is love?"},
     {"role": "assistant", "content": "Love. Friendship. Music."},
     {"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "Sure!"}],
]


class tiny_models:  # noqa: N801 - used as a fixture factory
    """Callable cache: ``(arch, num_labels) -> (HookedRewardModel, hf_model, tokenizer)``."""

    @cache  # noqa: B019 - one instance per session
    def __call__(self, arch: str = "llama", num_labels: int = 1, seed: int = 0) -> Any:
        hf, tok = tiny_hf_reward_model(arch, num_labels=num_labels, seed=seed)
        model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
        return model, hf, tok


def hf_rewards(hf: Any, tokens: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """HF's own forward: per-objective rewards and (ArmoRM) score and gating."""
    with torch.no_grad():
        out = hf(input_ids=tokens, attention_mask=mask)
    if hasattr(out, "gating_output"):
        return {"reward": out.rewards, "score": out.score, "gating": out.gating_output}
    return {"reward": out.logits, "score": out.logits[:, 0] if out.logits.shape[1] == 1 else None}
