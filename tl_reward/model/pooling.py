"""Where a reward is read: the last real token, by one of three rules.

Every rule is defined on the *real* tokens of a row, so left padding, right padding and no
padding give the same position within the text (hence the same reward). A row's real tokens are
those whose attention mask is 1; without a mask they are the row minus its leading pad tokens
(right padding needs no mask for the pad-based rules: trailing pads are never read; a pad id
that is also the BOS is never inferred as left padding, see :func:`implied_mask`).

* ``"hf"``: HF's current rule, the rightmost token that is not ``pad_token_id``.
* ``"legacy"``: the real token just before the first ``pad_token_id`` among the real tokens
  (older HF code and custom RMs such as ArmoRM), or the last real token when the text holds no
  pad token. It differs from ``"hf"`` when the pad token also occurs inside the text (pad = EOS
  = end of turn): it then lands at the end of the first turn. On a right-padded or unpadded row
  it is HF's old ``(first pad - 1) % length``.
* ``"mask"``: the rightmost position whose attention mask is 1 (the last position without one).
"""

from __future__ import annotations

from typing import Literal

import torch
from jaxtyping import Int

from tl_reward.errors import AmbiguousPaddingError, MissingPadTokenError, TLRewardError

PoolingRule = Literal["hf", "legacy", "mask"]
POOLING_RULES: tuple[str, ...] = ("hf", "legacy", "mask")


def check_rule(rule: str) -> PoolingRule:
    """Validate a pooling rule name."""
    if rule not in POOLING_RULES:
        raise TLRewardError(f"unknown pooling rule {rule!r}; choose one of {POOLING_RULES}")
    return rule  # type: ignore[return-value]


def _first_true(x: torch.Tensor, default: torch.Tensor) -> torch.Tensor:
    """Index of the first True of each row, ``default`` where a row has none."""
    seq = x.shape[-1]
    idx = torch.arange(seq, device=x.device)
    first = torch.where(x, idx, seq).min(-1).values
    return torch.where(first == seq, default, first)


def implied_mask(
    tokens: Int[torch.Tensor, "batch pos"], pad_token_id: int | None, bos_pad: bool = False
) -> Int[torch.Tensor, "batch pos"]:
    """The attention mask a batch without one implies: leading pad tokens are left padding,
    everything after the first real token is real (trailing pads are never read).

    With ``bos_pad`` (the pad id is also the BOS the tokenizer puts first) one leading pad is
    the BOS, as HF's forward without a mask reads it; two or more are ambiguous and refused."""
    if pad_token_id is None:
        return torch.ones_like(tokens)
    seq = tokens.shape[1]
    idx = torch.arange(seq, device=tokens.device)
    last = torch.full((tokens.shape[0],), seq - 1, dtype=torch.long, device=tokens.device)
    start = _first_true(tokens != pad_token_id, last)
    if bos_pad:
        if bool((start > 1).any()):
            raise AmbiguousPaddingError(
                f"the pad token (id {pad_token_id}) is also the BOS token, so left padding "
                "cannot be told from the BOS: pass attention_mask= (model.build(inputs) gives "
                "tokens and attention_mask), or pad on the right")
        return torch.ones_like(tokens)
    return (idx >= start[:, None]).long()


def pool_positions(
    tokens: Int[torch.Tensor, "batch pos"],
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    pad_token_id: int | None = None,
    rule: str = "hf",
    bos_pad: bool = False,
) -> Int[torch.Tensor, " batch"]:
    """The position of the token whose head output is the reward, per sequence (``bos_pad``:
    see :func:`implied_mask`)."""
    check_rule(rule)
    batch, seq = tokens.shape
    device = tokens.device
    idx = torch.arange(seq, device=device)
    last = torch.full((batch,), seq - 1, dtype=torch.long, device=device)
    real = None if attention_mask is None else attention_mask.to(device).bool()
    if rule == "mask":
        if real is None and pad_token_id is not None and bool((tokens == pad_token_id).any()):
            raise TLRewardError(
                "pooling='mask' reads the attention mask, and these tokens hold the pad id "
                f"{pad_token_id} without one: pass attention_mask= (model.build(inputs) gives "
                "it), or use pooling='hf'")
        return last if real is None else (idx * real.long()).argmax(-1)
    if pad_token_id is None:
        if batch > 1:
            raise MissingPadTokenError(
                "this model defines no pad token, so a batch of several sequences cannot be "
                f"pooled with the {rule!r} rule; set tokenizer.pad_token (and the model's "
                "pad_token_id), score one sequence at a time, or use pooling='mask'"
            )
        return last if real is None else (idx * real.long()).argmax(-1)
    is_pad = tokens == pad_token_id
    if real is None:
        real = implied_mask(tokens, pad_token_id, bos_pad).bool()
    if rule == "hf":
        return (idx * (real & ~is_pad).long()).argmax(-1)
    start = _first_true(real, last)
    end = (idx * real.long()).argmax(-1)  # last real token
    first_pad = _first_true(real & is_pad, end + 1)
    # the pad opens the text: HF's old rule wraps to the last real token
    return torch.where(first_pad == start, end, first_pad - 1)
