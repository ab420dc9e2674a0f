"""Every input kind reaches the same token ids; chat templates never duplicate BOS."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from helpers import CONVERSATIONS

from tl_reward.errors import ContextLengthError, EmptyResponseError, TLRewardError


def test_conversation_ids_are_the_template_ids_with_one_bos(tiny) -> None:
    model, _, tok = tiny("llama")
    conv = CONVERSATIONS[0]
    enc = model.encode(conv)
    direct = tok.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"]
    assert enc.ids == list(direct)
    assert enc.ids.count(tok.bos_token_id) == 1 and enc.ids[0] == tok.bos_token_id
    # the trap we avoid: template to a string, tokenise with special tokens -> two BOS
    text = tok.apply_chat_template(conv, tokenize=False)
    assert tok(text)["input_ids"][:2] == [tok.bos_token_id, tok.bos_token_id]


def test_pair_string_and_ids_agree(tiny) -> None:
    model, _, tok = tiny("llama")
    conv = CONVERSATIONS[0]
    pair = model.encode((conv[0]["content"], conv[1]["content"]))
    assert pair.ids == model.encode(conv).ids
    ids = model.encode(torch.tensor(pair.ids))
    assert ids.ids == pair.ids
    text = "plain text input"
    assert model.encode(text).ids == tok(text)["input_ids"]
    res = model.rewards([conv, (conv[0]["content"], conv[1]["content"]), pair.ids])
    assert torch.allclose(res.rewards[0], res.rewards[1]) and torch.allclose(
        res.rewards[0], res.rewards[2])


def test_response_start_marks_the_reply(tiny) -> None:
    model, _, tok = tiny("llama")
    enc = model.encode(CONVERSATIONS[0])
    reply = tok.decode(enc.ids[enc.response_start:], skip_special_tokens=True)
    assert reply == CONVERSATIONS[0][1]["content"]


def test_rewards_result_table_and_order(tiny) -> None:
    model, hf, _ = tiny("llama", 3)
    res = model.rewards(CONVERSATIONS, batch_size=2, labels=["a", "b", "c"])
    df = res.to_dataframe()
    assert list(df["label"]) == ["a", "b", "c"]
    assert res.score is None  # K = 3 without a combination has no scalar score
    for i, conv in enumerate(CONVERSATIONS):  # length-sorted batching restores input order
        single = model.rewards(conv)
        torch.testing.assert_close(res.rewards[i], single.rewards[0], atol=1e-5, rtol=0)
        assert list(df.columns[2:5]) == model.objectives  # label, n_tokens, objectives
    fig = res.plot()
    assert len(fig.data) == 3


def test_rewards_table_carries_each_inputs_texts(tiny) -> None:
    """``to_dataframe()`` had no prompt or response: rows could not be read without the
    inputs. Each row's texts are those of the input at its place (length-sorted batching must
    not shuffle them), after the columns it had before."""
    model, _, tok = tiny("llama")
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Is the sky blue on a clear day, and why?"},
            {"role": "assistant", "content": "Yes: air scatters blue light the most."}]
    ids = model.encode(("Why?", "Because.")).ids
    items = ["plain text", chat, ("Is the sky blue?", "No."), (chat[:4], "It is."), ids,
             torch.tensor(ids[:5]), chat[:2]]
    want = [  # (prompt, response, text) of each input, read off the inputs themselves
        (None, None, "plain text"), (chat[3]["content"], chat[4]["content"], None),
        ("Is the sky blue?", "No.", None), (chat[3]["content"], "It is.", None),
        (None, None, tok.decode(ids)), (None, None, tok.decode(ids[:5])),
        (chat[1]["content"], None, None)]
    res = model.rewards(items, batch_size=2)
    assert sorted(range(len(items)), key=lambda i: -res.n_tokens[i]) != list(range(len(items)))
    df = res.to_dataframe()
    before = type(res)(res.rewards, res.objectives, res.score, res.gating, res.n_tokens)
    assert list(df.columns) == [*before.to_dataframe().columns, "prompt", "response", "text"]
    for i, item in enumerate(items):
        got = tuple(None if pd.isna(v) else v for v in df.loc[i, ["prompt", "response", "text"]])
        assert got == want[i], i
        torch.testing.assert_close(df.loc[i, "reward"], float(model.rewards([item]).score[0]),
                                   atol=1e-5, rtol=0)
    only_text = model.rewards(["a", "b c"]).to_dataframe()  # a column only where it applies
    assert list(only_text["text"]) == ["a", "b c"] and "prompt" not in only_text


def test_empty_response_errors(tiny) -> None:
    model, _, _ = tiny("llama")
    with pytest.raises(EmptyResponseError, match="empty"):
        model.encode(("Is the sky blue?", "   "))
    with pytest.raises(EmptyResponseError, match="empty"):
        model.encode([{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}])


def test_too_long_input_errors(tiny) -> None:
    model, _, _ = tiny("llama")
    long = [5] * (model.cfg.n_ctx + 1)
    with pytest.raises(ContextLengthError, match="context"):
        model.rewards([long])


def test_no_chat_template_errors(tiny) -> None:
    model, _, tok = tiny("llama")
    saved = tok.chat_template
    tok.chat_template = None
    try:
        with pytest.raises(TLRewardError, match="chat template"):
            model.encode(CONVERSATIONS[0])
    finally:
        tok.chat_template = saved


def test_unsupported_input_type(tiny) -> None:
    model, _, _ = tiny("llama")
    with pytest.raises(TypeError, match="unsupported input"):
        model.encode(3.5)  # type: ignore[arg-type]
