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


@cache
def pad_is_eot_hf(arch: str = "llama") -> tuple[Any, Any]:
    """``(hf_model, tokenizer)`` whose pad token is ``<|eot_id|>`` = EOS (as many RMs set it):
    the tiny template ends every turn with it, so the pooling rules read different tokens."""
    from tl_reward.testing.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    tok.pad_token = tok.eos_token
    return tiny_hf_reward_model(arch, tokenizer=tok)


def pad_is_eot_model(pooling: str = "hf", arch: str = "llama",
                     dtype: torch.dtype = torch.float32, device: str = "cpu") -> Any:
    """A :class:`HookedRewardModel` of :func:`pad_is_eot_hf` with pooling rule ``pooling``."""
    hf, tok = pad_is_eot_hf(arch)
    return HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device=device,
                                             dtype=dtype, pooling=pooling)


def hf_reward_at(hf: Any, ids: list[int], position: int) -> torch.Tensor:
    """HF's backbone and ``score`` layer read at ``position`` of the unpadded ``ids``: an
    independent reference for any pooling rule."""
    with torch.no_grad():
        tokens = torch.tensor([ids])
        h = hf.base_model(input_ids=tokens, attention_mask=torch.ones_like(tokens))[0]
        return hf.score(h[0, position]).float()
