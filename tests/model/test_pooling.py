"""Pooling rules against brute force, and the pad == end-of-turn trap on real templates."""

from __future__ import annotations

import pytest
import torch

from tl_reward.errors import MissingPadTokenError, TLRewardError
from tl_reward.model.pooling import pool_positions

PAD = 0


def brute_unpadded(row: list[int], rule: str) -> int:
    """The pooled position of an unpadded row, straight from each rule's definition."""
    if rule == "hf":
        return max([i for i, t in enumerate(row) if t != PAD], default=0)
    if rule == "legacy":
        first = row.index(PAD) if PAD in row else len(row)
        return (first - 1) % len(row)  # HF's old rule
    return len(row) - 1


def brute(tokens: torch.Tensor, mask: torch.Tensor, rule: str) -> list[int]:
    out = []
    for row, m in zip(tokens.tolist(), mask.tolist(), strict=True):
        real = [i for i, v in enumerate(m) if v]
        out.append(real[0] + brute_unpadded(row[real[0] : real[-1] + 1], rule))
    return out


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("rule", ["hf", "legacy", "mask"])
def test_rules_match_brute_force(rule: str, side: str) -> None:
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 9, (16, 11), generator=gen)
    mask = torch.ones_like(tokens)
    for i in range(16):  # padding of random length, plus pad ids inside some rows
        n = int(torch.randint(1, 11, (1,), generator=gen))
        pad = slice(n, None) if side == "right" else slice(0, 11 - n)
        tokens[i, pad] = PAD
        mask[i, pad] = 0
        text = 0 if side == "right" else 11 - n
        if i % 3 == 0 and n > 3:
            tokens[i, text + 1 + i % 2] = PAD  # pad id inside the text (pad == end-of-turn)
    got = pool_positions(tokens, mask, PAD, rule)
    assert got.tolist() == brute(tokens, mask, rule)
    # without a mask, leading pads are left padding and trailing pads are never read (the
    # rows above never start with a pad inside the text); the mask rule reads the mask, so it
    # refuses padded tokens without one (it read a trailing pad: position 10 on every row)
    if rule == "mask":
        with pytest.raises(TLRewardError, match="pass attention_mask"):
            pool_positions(tokens, None, PAD, rule)
    else:
        assert pool_positions(tokens, None, PAD, rule).tolist() == got.tolist()


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


ITEMS = [("Is the sky blue?", "Yes, the sky is blue."), ("hi", "No."),
         ("What is love?", "Love. Friendship. Music.")]


@pytest.mark.parametrize("rule", ["hf", "legacy", "mask"])
def test_padding_side_gives_the_unpadded_reward(rule: str) -> None:
    """Right-padded, left-padded and unpadded inputs give the same reward, which is HF's backbone
    and score layer read at the rule's position (brute force on the unpadded ids). With pad =
    end of turn the three rules read three different tokens. Before the fix, legacy read the
    first left pad (0.850 right-padded, 1.700 left-padded for ("hi", "No."))."""
    from helpers import hf_reward_at, hf_rewards, pad_is_eot_model

    model = pad_is_eot_model(rule)
    hf, pad = model_hf(), model.pad_token_id
    ids = [model.encode(x).ids for x in ITEMS]
    assert all(row.count(pad) >= 2 for row in ids)  # pad inside the text and at its end
    ref = []
    for row in ids:  # ids mapped so that the pad id is PAD and no other id is
        pos = brute_unpadded([PAD if t == pad else t + 1 for t in row], rule)
        ref.append(hf_reward_at(hf, row, pos))
    ref = torch.stack(ref)
    single = torch.cat([model.rewards(x).rewards for x in ITEMS])
    # float32 forwards of a 3-layer model; rewards are O(1): 1e-4 absolute
    torch.testing.assert_close(single, ref, atol=1e-4, rtol=0)
    for side in ("right", "left"):
        batched = model.rewards(ITEMS, padding_side=side, batch_size=3).rewards
        torch.testing.assert_close(batched, ref, atol=1e-4, rtol=0)
        if rule == "hf":  # HF's own forward applies this rule to the padded batch
            batch = model.make_batch(ITEMS, padding_side=side)
            theirs = hf_rewards(hf, batch.tokens, batch.attention_mask)["reward"]
            torch.testing.assert_close(theirs, ref, atol=1e-4, rtol=0)
    # the three rules read three different tokens here, so the check can tell them apart
    mapped = [PAD if t == pad else t + 1 for t in ids[0]]
    assert len({brute_unpadded(mapped, r) for r in ("hf", "legacy", "mask")}) == 3


def model_hf():  # noqa: ANN201
    from helpers import pad_is_eot_hf

    return pad_is_eot_hf()[0]
