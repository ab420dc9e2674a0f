"""Round-trip diagnostic: which tokens change on the decode -> template -> re-tokenise path."""

from __future__ import annotations

import pytest
import torch

from tl_reward.errors import TLRewardError
from tl_reward.model.inputs import encode
from tl_reward.sweep.roundtrip import roundtrip_check, roundtrip_report, text_path_ids
from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, candidate_ids, score_vocabulary

PROMPT = PAPER_PROMPTS["best"]


def test_paper_path_duplicates_bos_and_loses_byte_tokens(tiny) -> None:
    model, _, tok = tiny("llama")
    ids = candidate_ids(model)
    paper = roundtrip_check(tok, PROMPT, ids, "paper")
    template = roundtrip_check(tok, PROMPT, ids, "template")
    assert bool(paper.bos_duplicated.all()) and paper.failure_rate == 1.0  # BOS twice, always
    assert not bool(template.bos_duplicated.any())
    assert torch.equal(paper.survives, template.survives)
    assert torch.equal(template.identical, template.survives)
    for v, ok, text in zip(ids, template.survives.tolist(), template.tokens, strict=True):
        if "\ufffd" in text:  # a piece of a multi-byte character: cannot survive decoding
            assert not ok
        if text.strip() and "\ufffd" not in text:  # independent check: the library's encoder
            assert ok == (encode(tok, (PROMPT, text)).ids == paper.template.ids(v))
    assert 0.2 < paper.token_failure_rate < 0.6  # the byte-level tokens of this tokenizer
    summary = paper.summary()
    assert summary.loc["BOS duplicated", "count"] == len(ids)
    assert list(paper.to_dataframe().columns[:3]) == ["token_id", "token", "identical"]
    assert paper.plot().data


def test_text_mode_scores_the_text_path(tiny) -> None:
    model, _, tok = tiny("gpt2")
    ids = candidate_ids(model)[::4]
    text = score_vocabulary(model, PROMPT, ids, mode="text", batch_size=32, progress=False)
    conv = [{"role": "user", "content": PROMPT}]
    seqs = [text_path_ids(tok, conv, v, "paper") for v in ids]
    ref = model.rewards(seqs, batch_size=16).score
    torch.testing.assert_close(text.values(0), ref, atol=1e-4, rtol=0)
    report = roundtrip_report(model, PROMPT, ids, path="template", score=True, batch_size=32)
    same = report.survives
    torch.testing.assert_close(report.text_scores[same], report.id_scores[same], atol=1e-4,
                               rtol=0)
    assert (report.text_scores[~same] - report.id_scores[~same]).abs().max() > 1e-3
    assert "Kendall tau-b (id vs text scores)" in report.summary().index


def test_demo_tokenizer_round_trip() -> None:
    """SmolLM2 adds no BOS; byte pieces (decoded as U+FFFD) and whitespace runs (merged with
    the template's newline) fail to come back."""
    from transformers import AutoTokenizer

    from tl_reward.model.demo import smollm2_local_dir
    from tl_reward.sweep.vocab_sweep import special_token_ids

    tok = AutoTokenizer.from_pretrained(smollm2_local_dir())
    ids = [i for i in range(0, len(tok), 23) if i not in special_token_ids(tok)]
    report = roundtrip_check(tok, PROMPT, ids, "paper")
    assert len(report.template.prefix) == 42 and not bool(report.bos_duplicated.any())
    failed = [t for t, ok in zip(report.tokens, report.survives.tolist(), strict=True) if not ok]
    assert 0 < len(failed) < 0.02 * len(ids)
    assert all("\ufffd" in t or not t.strip() for t in failed)
    assert any("\ufffd" in t for t in failed)


def test_unknown_path_is_refused(tiny) -> None:
    _, _, tok = tiny("llama")
    with pytest.raises(TLRewardError, match="path"):
        text_path_ids(tok, [{"role": "user", "content": "hi"}], 10, "bytes")
