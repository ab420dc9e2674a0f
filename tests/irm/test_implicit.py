"""implicit_rewards against a direct HF computation, one unpadded sequence at a time."""

from __future__ import annotations

import pytest
import torch
from helpers import parity_atol

from tl_reward.errors import TLRewardError, UnsupportedArchitectureError
from tl_reward.irm.implicit import implicit_rewards
from tl_reward.irm.models import hooked_causal_lm, hooked_logits
from tl_reward.model.inputs import encode
from tl_reward.testing.causal import tiny_causal_lm_pair

ITEMS = [
    ("Is the sky blue?", "Yes, the sky is blue on a clear day."),
    ("What, in one word, is the greatest thing ever?", "Love."),
    ([{"role": "user", "content": "Hate."}, {"role": "assistant", "content": "No."},
      {"role": "user", "content": "Is the fox quick?"}], "Sure! The quick brown fox jumps."),
]
BETA = 0.2


@pytest.fixture(scope="module")
def pair():
    return tiny_causal_lm_pair("llama", seed=3)


def direct(policy, reference, tok, item, beta, start_shift=0, prompt_too=False):
    """beta * sum over response tokens of the log-ratio, by HF forward + log_softmax on one
    unpadded sequence. ``start_shift``/``prompt_too`` give the plausible bugs to rule out."""
    enc = encode(tok, item)
    ids = torch.tensor([enc.ids])
    total = 0.0
    for sign, m in ((1.0, policy), (-1.0, reference)):
        with torch.no_grad():
            lp = m(input_ids=ids).logits[0].double().log_softmax(-1)
        start = 1 if prompt_too else enc.response_start
        for j in range(start, len(enc.ids)):
            total += sign * float(lp[j - 1 + start_shift, enc.ids[j]])
    return beta * total


@pytest.mark.parametrize("backend", ["hf", "tl"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_equals_direct_hf(pair, backend, side):
    policy, reference, tok = pair
    if backend == "tl":
        pol, ref = hooked_causal_lm(policy, tok), hooked_causal_lm(reference, tok)
    else:
        pol, ref = policy, reference
    res = implicit_rewards(pol, ref, ITEMS, BETA, tokenizer=tok, batch_size=3,
                           padding_side=side)
    want = torch.tensor([direct(policy, reference, tok, it, BETA) for it in ITEMS])
    # float32 log-softmax over ~20 tokens of O(1) log-probs: ~1e-5 absolute; the TL copy folds
    # norms and centres weights (float32 rounding ~1e-5 per logit)
    torch.testing.assert_close(res.rewards.double(), want.double(), atol=2e-4, rtol=1e-4)
    # the rewards are far from zero and differ between items, so the check has teeth
    assert want.abs().min() > 0.05 and (want.max() - want.min()) > 0.1
    # the plausible bugs give different numbers by far more than the tolerance
    for bug in ({"start_shift": 1}, {"prompt_too": True}):
        wrong = torch.tensor([direct(policy, reference, tok, it, BETA, **bug)
                              for it in ITEMS[:2]])
        assert (wrong - res.rewards[:2].double()).abs().max() > 1e-2


def test_per_token_terms_against_hf_log_softmax(pair):
    """Each response token's log-probs (so its contribution) against an HF forward and a float64
    log_softmax of one unpadded sequence, item by item; the table's rows against the same."""
    policy, reference, tok = pair
    res = implicit_rewards(policy, reference, ITEMS, BETA, tokenizer=tok, batch_size=3)
    rows = []
    for i, item in enumerate(ITEMS):
        enc = encode(tok, item)
        ids = torch.tensor([enc.ids])
        resp = enc.ids[enc.response_start:]
        assert res.response_ids[i] == resp
        assert res.tokens[i] == tok.convert_ids_to_tokens(resp)
        want = {}
        for name, m in (("policy", policy), ("reference", reference)):
            with torch.no_grad():
                lp = m(input_ids=ids).logits[0].double().log_softmax(-1)
            want[name] = torch.stack([lp[j - 1, enc.ids[j]]
                                      for j in range(enc.response_start, len(enc.ids))])
        # float32 log-softmax of O(1) logits over a 1k vocabulary: ~1e-6 absolute
        torch.testing.assert_close(res.policy_logprobs[i].double(), want["policy"], atol=1e-5,
                                   rtol=0)
        torch.testing.assert_close(res.reference_logprobs[i].double(), want["reference"],
                                   atol=1e-5, rtol=0)
        terms = BETA * (want["policy"] - want["reference"])
        torch.testing.assert_close(res.contributions(i).double(), terms, atol=1e-5, rtol=0)
        assert terms.abs().max() > 1e-2  # far from zero: a sign or beta slip would show
        rows += [(i, t, tid, float(terms[t])) for t, tid in enumerate(resp)]
        # the response's template closing token (<|eot_id|>) is scored as part of the response
        assert res.tokens[i][-1] == "<|eot_id|>"
        assert res.tokens[i][0] != "<|end_header_id|>"
    df = res.to_dataframe()
    assert list(zip(df["item"], df["position"], df["token_id"], strict=True)) == [
        r[:3] for r in rows]
    torch.testing.assert_close(torch.tensor(df["contribution"].values, dtype=torch.float64),
                               torch.tensor([r[3] for r in rows], dtype=torch.float64),
                               atol=1e-5, rtol=0)
    fig = res.plot(0)
    torch.testing.assert_close(torch.tensor(fig.data[0].y, dtype=torch.float64),
                               res.contributions(0).double(), atol=1e-6, rtol=0)


def test_bf16_accumulates_in_float32(pair):
    policy, reference, tok = pair
    res32 = implicit_rewards(policy, reference, ITEMS, BETA, tokenizer=tok)
    import copy

    pb, rb = copy.deepcopy(policy).bfloat16(), copy.deepcopy(reference).bfloat16()
    res16 = implicit_rewards(pb, rb, ITEMS, BETA, tokenizer=tok)
    assert res16.rewards.dtype == torch.float32 and res16.policy_logprobs[0].dtype == torch.float32
    # bf16 weights/activations: ~1e-2 relative error in logits, summed over ~20 tokens
    torch.testing.assert_close(res16.rewards, res32.rewards, atol=0.1, rtol=0.1)


def test_bad_inputs(pair):
    policy, reference, tok = pair
    with pytest.raises(TLRewardError, match="response start"):
        implicit_rewards(policy, reference, ["just a string"], BETA, tokenizer=tok)
    with pytest.raises(TLRewardError, match="tokenizer"):
        implicit_rewards(policy, reference, ITEMS, BETA)
    with pytest.raises(TLRewardError, match="beta"):
        implicit_rewards(policy, reference, ITEMS, 0.0, tokenizer=tok)


@pytest.fixture(scope="module")
def saved_pairs(tmp_path_factory):
    """``arch -> (policy, reference, tokenizer)``: tiny seeded pairs saved with
    ``save_pretrained`` and loaded back through ``AutoModelForCausalLM`` (the real path)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache: dict[str, tuple] = {}

    def load(arch: str) -> tuple:
        if arch not in cache:
            policy, reference, tok = tiny_causal_lm_pair(arch, seed=3)
            out = []
            for name, m in (("policy", policy), ("reference", reference)):
                path = tmp_path_factory.mktemp(f"{arch}-{name}")
                m.save_pretrained(path)
                tok.save_pretrained(path)
                out.append(AutoModelForCausalLM.from_pretrained(
                    path, attn_implementation="eager").eval())
            cache[arch] = (*out, AutoTokenizer.from_pretrained(path))
        return cache[arch]

    return load


def _uncapped(model):
    """The same TransformerLens model with its output soft-cap switched off (the old bug)."""
    import copy

    out = copy.deepcopy(model)
    out.cfg.output_logits_soft_cap = -1.0
    return out


@pytest.mark.parametrize("arch", ["gemma2", "gpt2"])
def test_hooked_causal_lm_logits_equal_hf(saved_pairs, arch):
    policy, _, tok = saved_pairs(arch)
    assert type(policy).__name__ == {"gemma2": "Gemma2ForCausalLM",
                                     "gpt2": "GPT2LMHeadModel"}[arch]
    tl = hooked_causal_lm(policy, tok)
    ids = torch.tensor([encode(tok, ITEMS[2]).ids])
    with torch.no_grad():
        want = policy(input_ids=ids).logits
        name = f"blocks.{tl.cfg.n_layers - 1}.hook_resid_post"
        got, cache = tl.run_with_cache(ids, names_filter=name)
        from_resid = hooked_logits(tl, cache[name])
    atol = parity_atol(want, tl.cfg.n_layers)
    torch.testing.assert_close(got, want, atol=atol, rtol=0)
    # the logits the IRM vocabulary sweep reads from a residual are the forward's own
    torch.testing.assert_close(from_resid, got, atol=0, rtol=0)
    if arch == "gemma2":
        cap = policy.config.final_logit_softcapping
        assert tl.cfg.output_logits_soft_cap == cap and tl.cfg.attn_scores_soft_cap == 5.0
        assert want.abs().max() <= cap
        # without the cap the logits would be off by far more than the tolerance
        with torch.no_grad():
            raw = _uncapped(tl)(ids, return_type="logits")
        assert (raw - want).abs().max() > 1e3 * atol


@pytest.mark.parametrize("arch", ["gemma2", "gpt2"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_tl_equals_direct_hf_gemma2_gpt2(saved_pairs, arch, side):
    policy, reference, tok = saved_pairs(arch)
    pol, ref = hooked_causal_lm(policy, tok), hooked_causal_lm(reference, tok)
    res = implicit_rewards(pol, ref, ITEMS, BETA, tokenizer=tok, batch_size=3,
                           padding_side=side)
    want = torch.tensor([direct(policy, reference, tok, it, BETA) for it in ITEMS],
                        dtype=torch.float64)
    # each response log-prob is off by about one logit's error (parity_atol at the logits'
    # scale); the reward sums 2 x T of them, times beta
    encs = [encode(tok, it) for it in ITEMS]
    with torch.no_grad():
        scale = max(float(m(input_ids=torch.tensor([e.ids])).logits.abs().max())
                    for m in (policy, reference) for e in encs)
    n_terms = 2 * max(len(e.ids) - e.response_start for e in encs)
    atol = BETA * n_terms * parity_atol(torch.tensor(scale), pol.cfg.n_layers)
    torch.testing.assert_close(res.rewards.double(), want, atol=atol, rtol=0)
    assert want.abs().min() > 0.1 and (want.max() - want.min()) > 0.5
    if arch == "gemma2":
        # dropping the final soft-cap (final_logit_softcapping=3) moves the rewards by far
        # more than the tolerance
        raw = implicit_rewards(_uncapped(pol), _uncapped(ref), ITEMS, BETA, tokenizer=tok,
                               batch_size=3, padding_side=side).rewards.double()
        assert (raw - want).abs().max() > 100 * atol


def test_hooked_causal_lm_rejects_non_causal_lm():
    from tl_reward.testing.tiny import tiny_hf_reward_model

    hf, tok = tiny_hf_reward_model("gpt2")
    with pytest.raises(UnsupportedArchitectureError, match="not an HF causal LM"):
        hooked_causal_lm(hf, tok)
