"""Generative judges (a causal LM asked a verdict question) as reward models: the yes/no score
and the expected rating against HF's own causal-LM logits at the answer position, the rating
head's linearisation against autograd, DRA summing to a judge's score, and the input errors.

A tiny seeded LlamaForCausalLM judge is saved with its tokenizer (``"Yes"`` added as a token:
the tiny BPE splits it) and loaded by path. Tolerance: 1e-5 absolute in float32 (logits and
ratings of order 1; measured differences ~1e-6); float64 for the linearisation; bfloat16
within twice HF's own bfloat16 error plus 1e-2.
"""

from __future__ import annotations

import pytest
import torch
from helpers import needs_hooked_transformer

from tl_reward import BridgeRewardModel
from tl_reward.errors import EmptyResponseError, TLRewardError
from tl_reward.model.judge import (
    DIGIT_RATINGS,
    RATING_TEMPLATE,
    VERDICT_TEMPLATE,
    JudgeFormat,
    verdict_token_id,
)
from tl_reward.model.rating_head import RatingHead
from tl_reward.testing import tiny_hf_reward_model, tiny_tokenizer

TOL = 1e-5
PAIRS = [
    ("Is the sky blue?", "Yes, the sky is blue on a clear day."),
    ("hi", "No."),
    ([{"role": "system", "content": "Be kind."}, {"role": "user", "content": "What is love?"}],
     "Love. Friendship. Music."),
    [{"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "Sure!"},
     {"role": "user", "content": "What, in one word, is the greatest thing ever?"},
     {"role": "assistant", "content": "Music."}],
]
#: what the judge is asked about each input (the last user turn and the final reply)
QA = [(p[0], p[1]) if isinstance(p[0], str) else (p[0][-1]["content"], p[1]) for p in PAIRS[:3]]
QA.append((PAIRS[3][2]["content"], PAIRS[3][3]["content"]))


@pytest.fixture(scope="module")
def judge(tmp_path_factory):  # noqa: ANN201
    """``(path, tokenizer, hf float32)`` of the saved tiny judge."""
    from transformers import AutoModelForCausalLM

    tok = tiny_tokenizer()
    tok.add_tokens(["Yes"])
    hf, _ = tiny_hf_reward_model("nemotron", seed=4, tokenizer=tok)
    path = tmp_path_factory.mktemp("judge") / "tiny-judge"
    hf.save_pretrained(path)
    tok.save_pretrained(path)
    ref = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    return path, tok, ref


@pytest.fixture(scope="module")
def hooked():  # noqa: ANN201
    from tl_reward import HookedRewardModel

    return HookedRewardModel


def prompt_ids(tok, template: str, question: str, response: str) -> list[int]:  # noqa: ANN001
    """The judge's prompt built here, independently of the library: the template filled in, the
    chat template with its generation prompt (the tiny template writes the one BOS)."""
    text = template.replace("{question}", question).replace("{response}", response)
    out = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                  add_generation_prompt=True, return_dict=True)
    return list(out["input_ids"])


def hf_answer_logits(hf, ids: list[int]) -> torch.Tensor:  # noqa: ANN001
    """HF's logits over the vocabulary at the last position of one unpadded prompt."""
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids])).logits[0, -1].float()


def load(cls, path, **kw):  # noqa: ANN001, ANN003, ANN201
    kw = {"device": "cpu", **kw} if cls is not BridgeRewardModel else kw
    return cls.from_judge(str(path), **kw)


@pytest.mark.parametrize("backend", [pytest.param("hooked", marks=needs_hooked_transformer),
                                     "bridge"])
def test_verdict_score_matches_hf(judge, request, backend: str) -> None:
    path, tok, hf = judge
    cls = request.getfixturevalue("hooked") if backend == "hooked" else BridgeRewardModel
    model = load(cls, path)
    yes, no = tok.convert_tokens_to_ids("Yes"), tok.convert_tokens_to_ids("No")
    assert model.objectives == ["verdict_no", "verdict_yes"] and model.pooling == "mask"
    refs, wrong = [], []
    for item, (q, r) in zip(PAIRS, QA, strict=True):
        ids = prompt_ids(tok, VERDICT_TEMPLATE, q, r)
        assert model.encode(item).ids == ids
        logits = hf_answer_logits(hf, ids)
        refs.append(logits[yes] - logits[no])
        with torch.no_grad():  # one position early: what a misplaced answer position reads
            before = hf(input_ids=torch.tensor([ids[:-1]])).logits[0, -1]
        wrong.append(before[yes] - before[no])
    ref = torch.stack(refs)
    assert ref.std() > 100 * TOL  # rows differ: a row mix-up would show
    for side in ("right", "left"):
        got = model.rewards(PAIRS, padding_side=side).score
        err = float((got - ref).abs().max())
        print(f"{backend} {side}: max |score - HF| = {err:.2e}")
        assert err < TOL
    assert float((torch.stack(wrong) - ref).abs().max()) > 100 * TOL


@needs_hooked_transformer
def test_rating_matches_hf(judge, hooked) -> None:
    path, tok, hf = judge
    model = load(hooked, path, ratings=DIGIT_RATINGS)
    assert model.objectives == ["rating"] and model.cfg.d_vocab_out == 1
    assert isinstance(model.reward_head, RatingHead) and bool(model.W_U.isnan().all())
    digits = [tok.convert_tokens_to_ids(d) for d in DIGIT_RATINGS]
    template = RATING_TEMPLATE.replace("{lowest}", "1").replace("{highest}", "9")
    refs = []
    for item, (q, r) in zip(PAIRS, QA, strict=True):
        ids = prompt_ids(tok, template, q, r)
        assert model.encode(item).ids == ids
        p = hf_answer_logits(hf, ids)[digits].double().softmax(-1)
        refs.append(p @ torch.arange(1.0, 10.0, dtype=torch.float64))
    ref = torch.stack(refs).float()
    for side in ("right", "left"):
        res = model.rewards(PAIRS, padding_side=side)
        err = float((res.score - ref).abs().max())
        print(f"rating {side}: max |E - HF| = {err:.2e}")
        assert err < TOL
        torch.testing.assert_close(res.rewards[:, 0], res.score, atol=0, rtol=0)
    batch = model.build(PAIRS)  # the hooked forward (through hook_probs) reads the same
    seen = []
    model.reward_head.hook_probs.add_hook(lambda act, hook: seen.append(act))
    try:
        with torch.no_grad():
            hooked_score = model(batch.tokens, attention_mask=batch.attention_mask,
                                 return_type="score")
    finally:
        model.reset_hooks()
    assert seen and seen[0].shape[-1] == 9
    assert float((hooked_score - ref).abs().max()) < TOL


def _wrong_linearise(head: RatingHead, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The linearisation with ``p`` in place of ``p * (v - E)`` (value kept exact)."""
    w, bias = head.rows.weight.detach().to(x.dtype), head.rows.bias.detach().to(x.dtype)
    p = (x @ w.T + bias).softmax(-1)
    e = p @ head.values(p)
    w_eff = p @ w
    return w_eff[:, None], (e - (w_eff * x).sum(-1))[:, None]


def test_rating_linearisation_is_the_gradient() -> None:
    """float64: ``w_eff`` is autograd's gradient of the expected rating and the central finite
    difference's limit; ``w_eff . x + b_eff`` is the rating. The ``p`` direction fails both."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.nn.Linear(16, 5, dtype=torch.float64)
    with torch.no_grad():
        rows.weight.copy_(torch.randn(5, 16, generator=gen, dtype=torch.float64))
        rows.bias.copy_(torch.randn(5, generator=gen, dtype=torch.float64))
    head = RatingHead(rows, [1.0, 2.0, 3.5, 4.0, 7.0])
    x = torch.randn(4, 16, generator=gen, dtype=torch.float64).requires_grad_(True)
    value = head.outputs(x)[:, 0]
    (grad,) = torch.autograd.grad(value.sum(), x)
    with torch.no_grad():
        w, b = head.linearise(x.detach())
    assert w.dtype == torch.float64 and w.shape == (4, 1, 16)
    torch.testing.assert_close(w[:, 0], grad, atol=1e-12, rtol=0)
    torch.testing.assert_close((w[:, 0] * x).sum(-1) + b[:, 0], value.detach(), atol=1e-12,
                               rtol=0)
    d = torch.randn(4, 16, generator=gen, dtype=torch.float64)
    h = 1e-5
    with torch.no_grad():
        fd = (head.outputs(x + h * d) - head.outputs(x - h * d))[:, 0] / (2 * h)
    err = float((fd - (w[:, 0] * d).sum(-1)).abs().max())
    print(f"finite difference: max error {err:.1e}")
    assert err < 1e-8
    bad, _ = _wrong_linearise(head, x.detach())
    assert float((bad[:, 0] - grad).abs().max()) > 0.1


@needs_hooked_transformer
@pytest.mark.parametrize("kind", ["verdict", "rating"])
def test_dra_sums_to_the_judge_score(judge, hooked, kind: str, monkeypatch) -> None:
    """DRA's components plus its bias are the judge's score. For a rating judge the sum holds
    for any direction (``b_eff = E - w_eff . x`` absorbs the rest), so the direction is checked
    against the gradient of the score at the pooled input: the ``p`` direction fails it."""
    from tl_reward.analysis.attribution import direct_reward_attribution
    from tl_reward.model.readout import normalise, reward_readout

    path, _, _ = judge
    model = load(hooked, path, **({"ratings": DIGIT_RATINGS} if kind == "rating" else {}))
    score = model.rewards(PAIRS).score
    dra = direct_reward_attribution(model, PAIRS)
    total = dra.total()[:, 0]
    parts = dra.embed.sum(1) + dra.heads.sum((1, 2)) + dra.attn_bias.sum(1) + dra.mlp.sum(1)
    torch.testing.assert_close(total, (parts + dra.bias)[:, 0])
    err = float((total - score).abs().max())
    print(f"{kind}: max |DRA total - score| = {err:.2e}")
    assert err < TOL
    if kind == "verdict":
        return
    batch = model.build(PAIRS)
    with torch.no_grad():
        resid = model.final_residual(batch.tokens, batch.attention_mask)
    rows = torch.arange(len(PAIRS))
    x = normalise(model, resid[rows, batch.pooled]).requires_grad_(True)
    (grad,) = torch.autograd.grad(model.reward_head.outputs(x).sum(), x)

    def direction() -> torch.Tensor:
        ro = reward_readout(model, resid, batch.tokens, batch.attention_mask, "score",
                            batch.pooled)
        return ro.directions[:, 0]

    torch.testing.assert_close(direction(), grad, atol=TOL, rtol=0)
    monkeypatch.setattr(model.reward_head, "linearise",
                        lambda x: _wrong_linearise(model.reward_head, x))
    wrong = direct_reward_attribution(model, PAIRS)
    assert float((wrong.total()[:, 0] - score).abs().max()) < TOL  # the sum cannot tell
    assert float((direction() - grad).abs().max()) > 100 * TOL
    assert float((wrong.heads - dra.heads).abs().max()) > 100 * TOL


def test_input_errors(judge) -> None:
    path, tok, _ = judge
    plain = tiny_tokenizer()  # "Yes" is two tokens here
    with pytest.raises(TLRewardError, match=r"'Yes' -> \[62, 269\]") as err:
        verdict_token_id(plain, "Yes")
    assert "' Yes' -> [226, 62, 269]" in str(err.value)
    with pytest.raises(TLRewardError, match="not one token"):
        BridgeRewardModel.from_judge(str(path), tokenizer=plain)
    assert verdict_token_id(tok, "Yes") == tok.convert_tokens_to_ids("Yes")
    # after "Verdict:" the spaced form comes first; " No" splits into 'Ġ' 'No', so the bare one
    assert verdict_token_id(plain, "No", "Verdict:") == plain.convert_tokens_to_ids("No")
    assert verdict_token_id(plain, 7) == 7  # an id as given
    with pytest.raises(TLRewardError, match=r"lacks \{response\}"):
        JudgeFormat("Is this right? {question}")
    with pytest.raises(TLRewardError, match=r"lacks \{question\} and \{response\}"):
        JudgeFormat("Rate it.")
    fmt = JudgeFormat()
    with pytest.raises(EmptyResponseError):
        fmt.encode(tok, ("hi", "  "))
    with pytest.raises(TLRewardError, match="pairs or conversations"):
        fmt.encode(tok, "just text")
    with pytest.raises(TLRewardError, match="ends with a user turn"):
        fmt.encode(tok, [{"role": "user", "content": "hi"}])
    assert fmt.encode(tok, [5, 6, 7]).ids == [5, 6, 7]  # token ids as given
    no_template = tiny_tokenizer()
    no_template.chat_template = None
    with pytest.raises(TLRewardError, match="chat_template"):
        fmt.encode(no_template, ("hi", "there"))
    with pytest.raises(TLRewardError, match="chat_template"):
        BridgeRewardModel.from_judge(str(path), tokenizer=no_template)
    with pytest.raises(TLRewardError, match="HookedRewardModel"):
        BridgeRewardModel.from_judge(str(path), ratings=DIGIT_RATINGS)
    with pytest.raises(TLRewardError, match="not both"):
        BridgeRewardModel.from_judge(str(path), verdict=("No", "Yes"), ratings=DIGIT_RATINGS)
    # a placeholder's text inside the question is not substituted again
    assert fmt.prompt_text("say {response}", "ok").startswith("Question: say {response}")


@needs_hooked_transformer
def test_bf16_within_hf_bf16_error(judge, hooked) -> None:
    """bfloat16 on CPU: the score's distance to the float32 reference is at most twice HF's
    own bfloat16 distance plus 1e-2."""
    from transformers import AutoModelForCausalLM

    path, tok, hf = judge
    hf16 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                                attn_implementation="eager").eval()
    model = load(hooked, path, dtype=torch.bfloat16)
    yes, no = tok.convert_tokens_to_ids("Yes"), tok.convert_tokens_to_ids("No")
    ref, ref16 = [], []
    for item in PAIRS:
        ids = model.encode(item).ids
        for net, out in ((hf, ref), (hf16, ref16)):
            logits = hf_answer_logits(net, ids)
            out.append(logits[yes] - logits[no])
    ref_t, ref16_t = torch.stack(ref), torch.stack(ref16)
    got = model.rewards(PAIRS).score
    ours, theirs = float((got - ref_t).abs().max()), float((ref16_t - ref_t).abs().max())
    print(f"bf16: ours {ours:.2e}, HF bf16 {theirs:.2e}")
    assert ours <= 2 * theirs + 1e-2


@needs_hooked_transformer
def test_vocabulary_sweep_on_a_judge(judge, hooked) -> None:
    """A sweep puts each token as the reply inside the verdict prompt (the answer position
    last) and reads what scoring those sequences reads."""
    from tl_reward.sweep.vocab_sweep import candidate_ids, score_vocabulary

    path, tok, _ = judge
    model = load(hooked, path)
    template = model.response_template("What is love?")
    yes = tok.convert_tokens_to_ids("Yes")
    assert template.ids(yes) == model.encode(("What is love?", "Yes")).ids
    ids = candidate_ids(model)[::25]
    sweep = score_vocabulary(model, "What is love?", ids, cache="fast", progress=False)
    direct = model.rewards([template.ids(v) for v in ids]).score
    assert direct.std() > 100 * TOL
    assert float((sweep.values(sweep.labels[0]) - direct).abs().max()) < TOL
