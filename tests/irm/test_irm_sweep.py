"""The IRM vocabulary sweep against an HF forward + log_softmax of every full sequence, built
from the chat template (independently of response_template and implicit_rewards)."""

from __future__ import annotations

import pytest
import torch

from tl_reward.irm.models import hooked_causal_lm
from tl_reward.irm.sweep import irm_vocab_sweep
from tl_reward.sweep.agreement import model_agreement
from tl_reward.testing.causal import tiny_causal_lm_pair

PROMPT = "Love?"
BETA = 0.5


@pytest.fixture(scope="module")
def pair():
    return tiny_causal_lm_pair("llama", seed=5)


def chat_template_split(tok, prompt):
    """The prompt's ids up to the reply (the chat template with a generation prompt) and the
    closing ids after a reply (the template applied to a one-word reply, minus that word),
    straight from ``apply_chat_template``: independent of ``response_template``."""
    conv = [{"role": "user", "content": prompt}]
    head = list(tok.apply_chat_template(conv, add_generation_prompt=True,
                                        return_dict=True)["input_ids"])
    full = list(tok.apply_chat_template(conv + [{"role": "assistant", "content": "love"}],
                                        return_dict=True)["input_ids"])
    word = tok.encode("love", add_special_tokens=False)
    assert full[:len(head) + len(word)] == head + word
    return head, full[len(head) + len(word):]


def direct_logratios(policy, reference, prefix, suffix, cands):
    """Per candidate v: the log-ratio of v after ``prefix`` and the summed log-ratio of the
    ``suffix`` after it, from one HF forward of ``prefix + [v] + suffix`` (all the same length,
    no padding) and a float64 log_softmax."""
    ids = torch.tensor([prefix + [v] + suffix for v in cands])
    p = len(prefix)
    first = torch.zeros(len(cands), dtype=torch.float64)
    rest = torch.zeros(len(cands), dtype=torch.float64)
    for sign, m in ((1.0, policy), (-1.0, reference)):
        with torch.no_grad():
            lp = m(input_ids=ids).logits.double().log_softmax(-1)
        tok_lp = lp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]  # log p(ids[j] | ids[<j])
        first += sign * tok_lp[:, p - 1]
        rest += sign * tok_lp[:, p:].sum(-1)
    return first, rest


@pytest.mark.parametrize("backend", ["hf", "tl"])
def test_sweep_equals_per_token_scoring(pair, backend):
    policy, reference, tok = pair
    if backend == "tl":
        pol, ref = hooked_causal_lm(policy, tok), hooked_causal_lm(reference, tok)
    else:
        pol, ref = policy, reference
    sweep = irm_vocab_sweep(pol, ref, {"love": PROMPT}, BETA, tokenizer=tok,
                            batch_size=50, progress=False)
    prefix, suffix = chat_template_split(tok, PROMPT)
    assert len(suffix) >= 1  # the closing <|eot_id|> is scored, so the suffix path runs
    # every candidate of the vocabulary, scored as a full sequence by HF forward + log_softmax
    first, rest = direct_logratios(policy, reference, prefix, suffix, sweep.token_ids.tolist())
    want = BETA * (first + rest)
    assert len(sweep) > 250
    # float32 log-softmax of O(1) logits; TL's folded copy adds ~1e-5 per logit
    torch.testing.assert_close(sweep.rewards[:, 0].double(), want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sweep.first[:, 0].double(), first, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sweep.suffix[:, 0].double(), rest, atol=1e-4, rtol=1e-4)
    # both terms matter: dropping the suffix term would miss by far more than the tolerance
    assert (BETA * first - want).abs().max() > 1e-2
    assert want.std() > 1e-2  # candidates differ: a constant offset or a shuffle would show
    df = sweep.to_dataframe()
    assert list(df.columns[-3:]) == ["first_logratio", "suffix_logratio", "reward"]


def test_converts_to_vocab_sweep(pair):
    policy, reference, tok = pair
    ids = list(range(20, 120))
    a = irm_vocab_sweep(policy, reference, PROMPT, BETA, tokenizer=tok, ids=ids, progress=False)
    b = irm_vocab_sweep(reference, policy, PROMPT, BETA, tokenizer=tok, ids=ids, progress=False,
                        model_name="swapped")
    vs = a.to_vocab_sweep()
    # the VocabSweep carries the implicit rewards of HF's own forward, candidate by candidate
    first, rest = direct_logratios(policy, reference, *chat_template_split(tok, PROMPT), ids)
    torch.testing.assert_close(vs.values(0).double(), BETA * (first + rest), atol=1e-4,
                               rtol=1e-4)
    assert vs.token_ids.tolist() == ids and vs.tokens == [tok.decode([i]) for i in ids]
    # swapping policy and reference negates every implicit reward: Kendall tau is exactly -1
    torch.testing.assert_close(b.rewards, -a.rewards, atol=1e-5, rtol=0)
    agr = model_agreement({"irm": vs, "swapped": b.to_vocab_sweep()})
    assert agr.kendall_tau_b[0, 1] == pytest.approx(-1.0)


def test_sweep_keeps_gemma2_logit_softcap():
    policy, reference, tok = tiny_causal_lm_pair("gemma2", seed=5)
    pol, ref = hooked_causal_lm(policy, tok), hooked_causal_lm(reference, tok)
    ids = list(range(20, 120))
    sweep = irm_vocab_sweep(pol, ref, PROMPT, BETA, tokenizer=tok, ids=ids, progress=False)
    prefix, suffix = chat_template_split(tok, PROMPT)
    first, rest = direct_logratios(policy, reference, prefix, suffix, ids)
    want = (BETA * (first + rest)).float()
    # logits soft-capped at 3 (|logit| <= 3): the same float32 tolerance as above
    torch.testing.assert_close(sweep.rewards[:, 0], want, atol=1e-4, rtol=1e-4)
    for m in (pol, ref):  # the sweep reads logits from residuals: without the cap it misses
        m.cfg.output_logits_soft_cap = -1.0
    raw = irm_vocab_sweep(pol, ref, PROMPT, BETA, tokenizer=tok, ids=ids, progress=False)
    assert (raw.rewards[:, 0] - want).abs().max() > 1.0
