"""Pooling rules against brute force, and the pad == end-of-turn trap on real templates."""

from __future__ import annotations

import pytest
import torch

from tl_reward.errors import MissingPadTokenError, TLRewardError
from tl_reward.model.pooling import pool_positions

PAD = 0


def brute(tokens: torch.Tensor, mask: torch.Tensor, rule: str) -> list[int]:
    out = []
    for row, m in zip(tokens.tolist(), mask.tolist(), strict=True):
        if rule == "hf":
            out.append(max([i for i, t in enumerate(row) if t != PAD], default=0))
        elif rule == "legacy":
            first = row.index(PAD) if PAD in row else 0
            out.append((first - 1) % len(row))
        else:
            out.append(max(i for i, v in enumerate(m) if v))
    return out


@pytest.mark.parametrize("rule", ["hf", "legacy", "mask"])
def test_rules_match_brute_force(rule: str) -> None:
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 9, (16, 11), generator=gen)
    mask = torch.ones_like(tokens)
    for i in range(16):  # right padding of random length, plus pad ids inside some rows
        n = int(torch.randint(1, 11, (1,), generator=gen))
        tokens[i, n:] = PAD
        mask[i, n:] = 0
        if i % 3 == 0 and n > 3:
            tokens[i, 1] = PAD  # pad id inside the text (pad == end-of-turn)
    got = pool_positions(tokens, mask, PAD, rule)
    assert got.tolist() == brute(tokens, mask, rule)


def test_hf_rule_left_padding_reads_last_position() -> None:
    tokens = torch.tensor([[PAD, PAD, 5, 6], [3, PAD, 4, 7]])
    assert pool_positions(tokens, None, PAD, "hf").tolist() == [3, 3]
    assert pool_positions(tokens, None, PAD, "legacy").tolist() == [3, 0]


def test_no_pad_token_refuses_batches_but_not_single_or_mask() -> None:
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with pytest.raises(MissingPadTokenError, match="pad_token"):
        pool_positions(tokens, None, None, "hf")
    assert pool_positions(tokens[:1], None, None, "hf").tolist() == [2]
    assert pool_positions(tokens, torch.tensor([[1, 1, 0], [1, 1, 1]]), None, "mask").tolist() == [
        1, 2]


def test_unknown_rule() -> None:
    with pytest.raises(TLRewardError, match="pooling rule"):
        pool_positions(torch.tensor([[1]]), None, 0, "first")


@pytest.mark.slow
def test_smollm2_chatml_pad_is_end_of_turn() -> None:
    """HF's rule lands on the final newline; the legacy rule lands inside the first turn."""
    from transformers import AutoTokenizer

    from tl_reward.model.demo import smollm2_local_dir

    tok = AutoTokenizer.from_pretrained(smollm2_local_dir())
    conv = [{"role": "user", "content": "Is the sky blue?"},
            {"role": "assistant", "content": "Yes."}]
    ids = tok.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"]
    tokens = torch.tensor([ids])
    assert tok.pad_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    hf_pos = int(pool_positions(tokens, None, tok.pad_token_id, "hf")[0])
    legacy_pos = int(pool_positions(tokens, None, tok.pad_token_id, "legacy")[0])
    assert hf_pos == len(ids) - 1 and tok.decode([ids[hf_pos]]) == "\n"
    first_end = ids.index(tok.pad_token_id)
    assert legacy_pos == first_end - 1 < len(ids) - 10  # inside the system turn
