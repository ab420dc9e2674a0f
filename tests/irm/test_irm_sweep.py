"""The IRM vocabulary sweep against per-candidate implicit_rewards on full sequences."""

from __future__ import annotations

import pytest
import torch

from tl_reward.irm.implicit import implicit_rewards
from tl_reward.irm.models import hooked_causal_lm
from tl_reward.irm.sweep import irm_vocab_sweep
from tl_reward.model.inputs import EncodedInput
from tl_reward.sweep.agreement import model_agreement
from tl_reward.sweep.response_template import response_template
from tl_reward.testing.causal import tiny_causal_lm_pair

PROMPT = "Love?"
BETA = 0.5


@pytest.fixture(scope="module")
def pair():
    return tiny_causal_lm_pair("llama", seed=5)


@pytest.mark.parametrize("backend", ["hf", "tl"])
def test_sweep_equals_per_token_scoring(pair, backend):
    policy, reference, tok = pair
    if backend == "tl":
        pol, ref = hooked_causal_lm(policy, tok), hooked_causal_lm(reference, tok)
    else:
        pol, ref = policy, reference
    sweep = irm_vocab_sweep(pol, ref, {"love": PROMPT}, BETA, tokenizer=tok,
                            batch_size=50, progress=False)
    tpl = response_template(tok, PROMPT)
    assert len(tpl.suffix) >= 1  # the closing <|eot_id|> is scored, so the suffix path runs
    # every candidate of the vocabulary, scored one full sequence each (HF models, no cache)
    items = [EncodedInput(tpl.ids(v), len(tpl.prefix)) for v in sweep.token_ids.tolist()]
    want = implicit_rewards(policy, reference, items, BETA, tokenizer=tok, batch_size=128).rewards
    assert len(sweep) > 250
    # float32 log-softmax of O(1) logits; TL's folded copy adds ~1e-5 per logit
    torch.testing.assert_close(sweep.rewards[:, 0], want, atol=1e-4, rtol=1e-4)
    # both terms matter: dropping the suffix term would miss by far more than the tolerance
    assert (BETA * sweep.first[:, 0] - want).abs().max() > 1e-2
    df = sweep.to_dataframe()
    assert list(df.columns[-3:]) == ["first_logratio", "suffix_logratio", "reward"]


def test_converts_to_vocab_sweep(pair):
    policy, reference, tok = pair
    ids = list(range(20, 120))
    a = irm_vocab_sweep(policy, reference, PROMPT, BETA, tokenizer=tok, ids=ids, progress=False)
    b = irm_vocab_sweep(reference, policy, PROMPT, BETA, tokenizer=tok, ids=ids, progress=False,
                        model_name="swapped")
    vs = a.to_vocab_sweep()
    torch.testing.assert_close(vs.values(0), a.rewards[:, 0])
    # swapping policy and reference negates every implicit reward: Kendall tau is exactly -1
    torch.testing.assert_close(b.rewards, -a.rewards, atol=1e-5, rtol=0)
    agr = model_agreement({"irm": vs, "swapped": b.to_vocab_sweep()})
    assert agr.kendall_tau_b[0, 1] == pytest.approx(-1.0)


def test_sweep_keeps_gemma2_logit_softcap():
    policy, reference, tok = tiny_causal_lm_pair("gemma2", seed=5)
    pol, ref = hooked_causal_lm(policy, tok), hooked_causal_lm(reference, tok)
    ids = list(range(20, 120))
    sweep = irm_vocab_sweep(pol, ref, PROMPT, BETA, tokenizer=tok, ids=ids, progress=False)
    tpl = response_template(tok, PROMPT)
    items = [EncodedInput(tpl.ids(v), len(tpl.prefix)) for v in ids]
    want = implicit_rewards(policy, reference, items, BETA, tokenizer=tok, batch_size=128).rewards
    # logits soft-capped at 3 (|logit| <= 3): the same float32 tolerance as above
    torch.testing.assert_close(sweep.rewards[:, 0], want, atol=1e-4, rtol=1e-4)
    for m in (pol, ref):  # the sweep reads logits from residuals: without the cap it misses
        m.cfg.output_logits_soft_cap = -1.0
    raw = irm_vocab_sweep(pol, ref, PROMPT, BETA, tokenizer=tok, ids=ids, progress=False)
    assert (raw.rewards[:, 0] - want).abs().max() > 1.0
