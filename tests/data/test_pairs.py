"""Preference pairs: tokenised once through the chat template, prompt aligned by index,
replies from the end, unaligned positions reported."""

from __future__ import annotations

import pytest
import torch

from tl_reward.data import PreferencePair
from tl_reward.data.pairs import align_ids, short_pairs, tokenize_pair, tokenize_pairs
from tl_reward.errors import TLRewardError


def test_align_ids_prompt_by_index_reply_from_end() -> None:
    tp = align_ids([1, 2, 3, 10, 11, 12, 9], [1, 2, 3, 20, 9], prompt_len=3)
    assert tp.aligned.tolist() == [[0, 0], [1, 1], [2, 2], [5, 3], [6, 4]]
    assert tp.unaligned_chosen == [3, 4] and tp.unaligned_rejected == []
    assert tp.to_rejected(6) == 4 and tp.to_rejected(-1) == 4 and tp.to_rejected(3) is None
    assert tp.to_chosen(3) == 5
    with pytest.raises(TLRewardError, match="differ inside the prompt"):
        align_ids([1, 2, 3], [1, 5, 3], prompt_len=2)


def test_tokenize_pair_matches_model_encoding(tiny) -> None:
    model, _, tok = tiny("llama", 1)
    pair = PreferencePair.from_prompt("Is the sky blue?", "Yes, the sky is blue today.", "No.")
    tp = tokenize_pair(model, pair)
    assert tp.chosen_ids == model.encode(pair.chosen_conversation()).ids
    assert tp.rejected_ids == model.encode(pair.rejected_conversation()).ids
    assert tp.prompt_len == model.encode(pair.chosen_conversation()).response_start
    # every aligned prompt position holds the same token; the last tokens align (pooled tokens)
    c, r = tp.aligned[:, 0], tp.aligned[:, 1]
    ids_c, ids_r = torch.tensor(tp.chosen_ids), torch.tensor(tp.rejected_ids)
    assert torch.equal(ids_c[c[: tp.prompt_len]], ids_r[r[: tp.prompt_len]])
    assert tp.to_rejected(tp.chosen_len - 1) == tp.rejected_len - 1
    # aligned + unaligned cover each side exactly once
    assert sorted(c.tolist() + tp.unaligned_chosen) == list(range(tp.chosen_len))
    assert sorted(r.tolist() + tp.unaligned_rejected) == list(range(tp.rejected_len))
    assert len(tp.unaligned_chosen) == tp.chosen_len - tp.rejected_len > 0
    assert tp.position_labels(tok)[0].startswith("c0/r0")
    batch = tokenize_pairs(model, [pair, ("hi", "Hello!", "No.")])
    tokens, mask = batch.padded("rejected", model.pad_token_id)
    assert tokens.shape[0] == 2 and int(mask[0].sum()) == tp.rejected_len


def test_pair_from_a_prompt_string_or_a_conversation() -> None:
    """``from_prompt`` is the one home of "a prompt string is one user turn": tokenize_pair's
    tuples and the CLI's JSONL records with a string or a messages prompt go through it."""
    from tl_reward.cli.common import pair_from_record

    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"},
             {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Sky?"}]
    want = PreferencePair(prompt=convo, chosen="Blue.", rejected="No.")
    assert PreferencePair.from_prompt(convo, "Blue.", "No.") == want
    assert pair_from_record({"prompt": convo, "chosen": "Blue.", "rejected": "No."}, "x") == want
    one = pair_from_record({"prompt": "Sky?", "chosen": "Blue.", "rejected": "No."}, "x")
    assert one.prompt == [{"role": "user", "content": "Sky?"}]
    assert PreferencePair.from_prompt("Sky?", "Blue.", "No.", system="S").prompt[0] == {
        "role": "system", "content": "S"}


def test_short_pairs_are_the_first_n_within_the_length(tiny) -> None:
    """Against a count by hand of each pair's two sequences (the tokenizer's chat template),
    and the source read no further than needed."""
    model, _, tok = tiny("llama", 1)
    pairs = [PreferencePair.from_prompt("Q?", "yes " * (k + 1), "no " * (8 - k))
             for k in range(8)]

    def n_tokens(p: PreferencePair) -> int:  # the template's ids (a dict per turn)
        return max(len(tok.apply_chat_template(c, tokenize=True)["input_ids"])
                   for c in (p.chosen_conversation(), p.rejected_conversation()))
    limit = sorted(n_tokens(p) for p in pairs)[4]
    want = [p for p in pairs if n_tokens(p) <= limit][:3]
    read = []

    def source():  # noqa: ANN202
        for p in pairs:
            read.append(p)
            yield p
    got = short_pairs(model, source(), 3, limit)
    assert [tp.pair for tp in got] == want and len(got) == 3
    assert all(max(tp.chosen_len, tp.rejected_len) <= limit for tp in got)
    assert len(read) == pairs.index(want[-1]) + 2  # one past the last taken, then stop
