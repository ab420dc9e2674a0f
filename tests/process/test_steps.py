"""Process reward models: a reward at every step, read where HF's own modules read it.

References are HF's modules on ids the test tags itself (the published recipe: steps joined by
the tag, one more tag after the last, as the assistant message of the chat template).
"""

from __future__ import annotations

import copy

import pytest
import torch

from tl_reward import BridgeRewardModel, HookedRewardModel
from tl_reward.analysis.attribution import direct_reward_attribution
from tl_reward.analysis.lens import reward_lens
from tl_reward.analysis.patching import activation_patching
from tl_reward.errors import TLRewardError
from tl_reward.process import step_propagation, step_sources
from tl_reward.sweep.vocab_sweep import score_vocabulary
from tl_reward.testing import tiny_hf_reward_model, tiny_tokenizer

TAG = "<extra_0>"
STEPS_A = ["Yes, the sky is blue.", "Because of Rayleigh scattering.", "Love."]
SOLUTIONS = [
    ("Is the sky blue?", STEPS_A),
    ("What?", "No.\n\nThanks for asking."),
    [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "Sure!\n\nOne.\n\n\nTwo, three.\n\nMusic."}],
]
N_STEPS = [3, 2, 4]
# the same solution with step 1 changed by one token (same length: one token for another)
CORRUPT_A = ("Is the sky blue?", ["Yes, the sky is blue.", "Because of Rayleigh war.",
                                  "Love."])


def tokenizer():  # noqa: ANN201
    tok = tiny_tokenizer()
    tok.add_tokens([TAG], special_tokens=True)
    return tok


@pytest.fixture(scope="module")
def hf_prm():  # noqa: ANN201
    return tiny_hf_reward_model("llama", num_labels=2, tokenizer=tokenizer())


@pytest.fixture(scope="module", params=["hooked", "bridge"])
def prm(request, hf_prm):  # noqa: ANN001, ANN201
    cls = HookedRewardModel if request.param == "hooked" else BridgeRewardModel
    hf, tok = hf_prm
    hf = hf if cls is HookedRewardModel else copy.deepcopy(hf)  # the bridge wraps HF's modules
    return cls.from_pretrained(hf_model=hf, tokenizer=tok, step_tag=TAG, head_weights=[-1, 1])


def tagged_messages(solution):  # noqa: ANN001, ANN201
    """The published recipe, written independently of the library."""
    if isinstance(solution, tuple):
        q, reply = solution
        msgs = [{"role": "user", "content": q}]
    else:
        msgs, reply = solution[:-1], solution[-1]["content"]
    steps = reply if isinstance(reply, list) else [s.strip() for s in reply.split("\n\n")
                                                   if s.strip()]
    return [*msgs, {"role": "assistant", "content": TAG.join(steps) + TAG}]


@torch.no_grad()
def hf_step_logits(hf, tok, solution) -> torch.Tensor:  # noqa: ANN001
    """``[n_steps, 2]`` HF's score layer on HF's body at each tag, one sequence alone."""
    ids = tok.apply_chat_template(tagged_messages(solution), tokenize=True,
                                  return_dict=True)["input_ids"]
    tag = tok.convert_tokens_to_ids(TAG)
    pos = [i for i, t in enumerate(ids) if t == tag]
    hidden = hf.model(torch.tensor([ids])).last_hidden_state[0]
    return hf.score(hidden)[pos].double()


@pytest.mark.parametrize("side", ["right", "left"])
def test_step_rewards_equal_hf_at_every_tag(prm, hf_prm, side: str) -> None:
    hf, tok = hf_prm
    res = prm.rewards(SOLUTIONS, padding_side=side, batch_size=3)
    assert [(r.item, r.step) for r in res.rows] == [(i, k) for i, n in enumerate(N_STEPS)
                                                   for k in range(n)]
    ref = torch.cat([hf_step_logits(hf, tok, s) for s in SOLUTIONS])
    linear = ref[:, 1] - ref[:, 0]
    assert linear.abs().max() > 0.05  # rewards of order 0.1-1: a 1e-5 tolerance means something
    torch.testing.assert_close(res.score.double(), linear, atol=1e-5, rtol=0)
    torch.testing.assert_close(res.probability.double(), ref.softmax(-1)[:, 1], atol=1e-5,
                               rtol=0)
    torch.testing.assert_close(res.rewards.double(), ref, atol=1e-5, rtol=0)
    # the bugs this catches: averaging the classes, or reading one position late
    assert (ref.mean(-1) - linear).abs().max() > 1e-2
    df = res.to_dataframe()
    assert df["step_text"].tolist()[:3] == STEPS_A
    assert df["step_text"].tolist()[7] == "Two, three."  # a triple newline is one break


def test_one_forward_equals_each_step_prefix_alone(prm) -> None:
    """The shortcut (every tag of a solution read from one forward) equals the path every
    analysis runs (each step's prefix, pooled at its tag)."""
    whole = prm.rewards(SOLUTIONS).score
    prefixes, rows = prm.at_steps(SOLUTIONS, "all")
    alone = prm.rewards(prefixes, step="last").score
    assert [p.name for p in prefixes[:2]] == ["input 0 step 0", "input 0 step 1"]
    torch.testing.assert_close(alone, whole, atol=2e-6, rtol=0)
    late = prm.rewards([[*p.ids, p.ids[-1]] for p in prefixes], step="last").score
    assert (late - whole).abs().max() > 1e-2  # the tag repeated: a read one step late differs


def test_step_selection_and_formats(prm) -> None:
    e = prm.encode(SOLUTIONS[0])
    assert len(e.read_at) == 3 and e.steps == tuple(STEPS_A)
    # pre-tagged, ids and tagged text inputs are the same solution
    tagged = ("Is the sky blue?", TAG.join(STEPS_A) + TAG)
    assert prm.encode(tagged).ids == e.ids
    assert prm.encode(e.ids).read_at == e.read_at
    r = prm.rewards(SOLUTIONS, step=[0, -1])
    assert [(x.item, x.step) for x in r.rows] == [(0, 0), (0, 2), (1, 0), (1, 1), (2, 0),
                                                  (2, 3)]
    last = prm.rewards(SOLUTIONS, step="last")
    torch.testing.assert_close(last.score, r.score[1::2])


@pytest.mark.parametrize("bad, step, match", [
    (("q", ["one", "two"]), 2, "out of range"),
    (("q", ["one", "two"]), -3, "out of range"),
    (("q", ["one", "  "]), "all", "non-empty step"),
    ("no tag here", "all", "no step tag"),
    ([{"role": "user", "content": "q"}], "all", "ends with a user turn"),
    (("q", ["one"]), "first", "pass an index"),
])
def test_bad_step_inputs(prm, bad, step, match: str) -> None:  # noqa: ANN001
    with pytest.raises(TLRewardError, match=match):
        prm.rewards([bad], step=step)


def test_prm_refuses_a_silent_position_and_outcome_rm_refuses_steps(prm, hf_prm) -> None:
    with pytest.raises(TLRewardError, match="step="):
        direct_reward_attribution(prm, SOLUTIONS[:1])  # no step=: would read after the tag
    hf, tok = hf_prm
    orm = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok)
    with pytest.raises(TLRewardError, match="no step format"):
        orm.rewards(SOLUTIONS[:1], step=0)
    with pytest.raises(TLRewardError, match="step format"):
        orm.rewards([SOLUTIONS[0]])  # (question, [steps]) is a PRM's input
    with pytest.raises(TLRewardError, match=r"is \d tokens \["):
        orm.use_steps("Yes!")  # a tag of two tokens


def test_analyses_per_step_add_up_to_the_step_reward(prm) -> None:
    res = prm.rewards(SOLUTIONS[:2])
    dra = direct_reward_attribution(prm, SOLUTIONS[:2], step="all", objectives="score")
    assert [(r.item, r.step) for r in dra.steps] == [(r.item, r.step) for r in res.rows]
    torch.testing.assert_close(dra.total()[:, 0], res.score.float(), atol=2e-5, rtol=0)
    src = step_sources(prm, SOLUTIONS[:2], "all", objective="score")
    torch.testing.assert_close(src.total(), res.score.float(), atol=2e-5, rtol=0)
    # sources after a row's own step are NaN; every earlier one is a number
    assert torch.isnan(src.values[0, 2:4]).all() and not torch.isnan(src.values[2, :5]).any()
    # the heads' parts by source position add up to the heads' total (not by construction:
    # `local` is built from the embeddings, MLPs and attention biases alone)
    heads = dra.heads[..., 0].sum((1, 2))
    torch.testing.assert_close(src.values[:, :-2].nan_to_num(0).sum(1), heads, atol=2e-5,
                               rtol=0)
    if isinstance(prm, HookedRewardModel):
        lens = reward_lens(prm, SOLUTIONS[:2], objectives="score", step="all")
        torch.testing.assert_close(lens.values["frozen"][:, -1, 0], res.score.float(),
                                   atol=2e-5, rtol=0)


def test_patching_and_propagation_at_a_step(prm) -> None:
    res = prm.rewards([SOLUTIONS[0], CORRUPT_A]).score
    prop = step_propagation(prm, SOLUTIONS[0], CORRUPT_A)
    assert prop.changed == [1]
    torch.testing.assert_close(prop.effect, res[3:] - res[:3])
    assert float(prop.effect[0].abs()) < 1e-6  # causal: step 0 cannot see step 1
    assert float(prop.effect[1].abs()) > 1e-3
    if isinstance(prm, HookedRewardModel):
        p = activation_patching(prm, (SOLUTIONS[0], CORRUPT_A), step=2, site="resid",
                                layers=[0], objective="score")
        assert p.clean_chosen == pytest.approx(float(res[2]), abs=1e-5)
        assert p.clean_rejected == pytest.approx(float(res[5]), abs=1e-5)


@pytest.mark.parametrize("cache", ["auto", "none"])
def test_sweep_inserts_into_the_step(hf_prm, cache: str) -> None:
    hf, tok = hf_prm
    prm = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, step_tag=TAG,
                                            head_weights=[-1, 1])
    ids = [6, 7, 40, 41]
    sw = score_vocabulary(prm, [SOLUTIONS[0]], ids, step=1, position=2, cache=cache).to_dataframe()
    e = prm.encode(SOLUTIONS[0])
    at = e.read_at[0] + 1 + 2
    direct = prm.rewards([e.ids[:at] + [v] + e.ids[at:] for v in ids], step=1).score
    torch.testing.assert_close(torch.tensor(sw["score:solution_0"].to_numpy()), direct.float(),
                               atol=2e-5, rtol=0)
    with pytest.raises(TLRewardError, match="outside step 1"):
        score_vocabulary(prm, [SOLUTIONS[0]], ids, step=1, position=99)


def test_bf16_step_rewards_within_hf_bf16_error(hf_prm) -> None:
    hf, tok = hf_prm
    ref = torch.cat([hf_step_logits(hf, tok, s) for s in SOLUTIONS])
    ref = ref[:, 1] - ref[:, 0]
    bf = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, step_tag=TAG,
                                           head_weights=[-1, 1], dtype=torch.bfloat16)
    ours = (bf.rewards(SOLUTIONS).score.double() - ref).abs().max()
    hf16 = tiny_hf_reward_model("llama", num_labels=2, tokenizer=tok)[0].to(torch.bfloat16)
    theirs = torch.cat([hf_step_logits(hf16, tok, s) for s in SOLUTIONS])
    theirs = ((theirs[:, 1] - theirs[:, 0]) - ref).abs().max()
    assert bf.rewards(SOLUTIONS).score.dtype == torch.float32  # accumulated in float32
    assert ours <= 2 * theirs + 1e-2, (float(ours), float(theirs))


@torch.no_grad()
def test_token_readout_and_value_head_prms() -> None:
    """Math-Shepherd style (good minus bad token logit of a causal LM at each tag, steps joined
    by "tag\\n") and a value head (one output, probability its sigmoid)."""
    tok = tokenizer()
    lm, tok = tiny_hf_reward_model("nemotron", tokenizer=tok)
    good, bad = (tok.encode(t, add_special_tokens=False) for t in ("+", "-"))
    assert len(good) == len(bad) == 1
    m = HookedRewardModel.from_pretrained(hf_model=lm, tokenizer=tok,
                                          lm_head_rows=[bad[0], good[0]], head_weights=[-1, 1])
    m.use_steps(TAG, join="\n")
    msgs = [{"role": "user", "content": "Is the sky blue?"},
            {"role": "assistant", "content": (TAG + "\n").join(STEPS_A) + TAG}]
    ids = tok.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"]
    pos = [i for i, t in enumerate(ids) if t == tok.convert_tokens_to_ids(TAG)]
    logits = lm(torch.tensor([ids])).logits[0, pos].double()
    ref = logits[:, good[0]] - logits[:, bad[0]]
    res = m.rewards([SOLUTIONS[0]])
    torch.testing.assert_close(res.score.double(), ref, atol=1e-5, rtol=0)
    assert (ref - (logits[:, good[0]])).abs().max() > 1e-2  # good alone is another number
    hf1, _ = tiny_hf_reward_model("llama", num_labels=1, tokenizer=tok)
    v = HookedRewardModel.from_pretrained(hf_model=hf1, tokenizer=tok, step_tag=TAG)
    ids = tok.apply_chat_template(tagged_messages(SOLUTIONS[1]), tokenize=True,
                                  return_dict=True)["input_ids"]
    pos = [i for i, t in enumerate(ids) if t == tok.convert_tokens_to_ids(TAG)]
    ref = hf1.score(hf1.model(torch.tensor([ids])).last_hidden_state[0])[pos, 0].double()
    res = v.rewards([SOLUTIONS[1]])
    torch.testing.assert_close(res.score.double(), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(res.probability.double(), ref.sigmoid(), atol=1e-6, rtol=0)


def test_sae_attribution_and_fit_at_steps(hf_prm) -> None:
    """SAE features at the final residual split each step's reward exactly (the error node
    included), and sae_fit reads the steps' rewards."""
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

    from tl_reward.sae import sae_attribution, sae_fit

    hf, tok = hf_prm
    prm = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, step_tag=TAG,
                                            head_weights=[-1, 1])
    hook = f"blocks.{prm.cfg.n_layers - 1}.hook_resid_post"
    torch.manual_seed(0)
    cfg = TopKSAEConfig(d_in=prm.cfg.d_model, d_sae=48, k=4)
    cfg.metadata = SAEMetadata(hook_name=hook)
    sae = TopKSAE(cfg)
    res = prm.rewards(SOLUTIONS[:2])
    att = sae_attribution(prm, sae, SOLUTIONS[:2], objectives="score", step="all")
    assert [(r.item, r.step) for r in att.steps] == [(r.item, r.step) for r in res.rows]
    total = att.features.sum(1)[:, 0] + att.b_dec[:, 0] + att.error[:, 0] + att.bias[:, 0]
    torch.testing.assert_close(total, res.score.float(), atol=2e-5, rtol=0)
    torch.testing.assert_close(att.reward[:, 0], res.score.float(), atol=2e-5, rtol=0)
    fit = sae_fit(prm, sae, SOLUTIONS[:2], step="last")
    assert set(fit.recovered) and fit.to_dataframe().shape[0] > 0


def test_fingerprint_names_the_step_format(hf_prm) -> None:
    from tl_reward.model.fingerprint import model_fingerprint

    hf, tok = hf_prm
    prm = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, step_tag=TAG,
                                            head_weights=[-1, 1])
    before = model_fingerprint(prm)
    prm.use_steps(TAG, join="\n")  # another format: stored results must not be mixed
    assert model_fingerprint(prm) != before


def test_reasoning_probes_at_a_step(hf_prm) -> None:
    """The probe suite on a PRM: each reasoning edit keeps the steps, and the recorded delta is
    the step reward of the edited reply minus that of the neutral one."""
    from tl_reward.audit.perturbations import DIMENSIONS, REASONING_DIMENSIONS, make_item
    from tl_reward.audit.probes import ProbeError, run_probes

    hf, tok = hf_prm
    prm = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, step_tag=TAG,
                                            head_weights=[-1, 1])
    items = [make_item(f"i{k}", f"Compute {k} + 2 + 3.",
                       f"{k} + 2 = {k + 2}.\n\n{k + 2} + 3 = {k + 5}.\n\nThe answer is {k + 5}.")
             for k in range(3)]
    report = run_probes(prm, items, REASONING_DIMENSIONS, step="last", n_permutations=99)
    rows = report.rows
    for name in REASONING_DIMENSIONS:
        edit = DIMENSIONS[name].apply(items[0])
        assert len(edit.perturbed_reply.split("\n\n")) == 3  # the steps are kept
        conv = items[0].conversation
        r = prm.rewards([conv(edit.neutral_reply), conv(edit.perturbed_reply)], step="last")
        got = rows[(rows.dimension == name) & (rows.item_id == "i0")]["delta:score"].item()
        assert got == pytest.approx(float(r.score[1] - r.score[0]), abs=2e-5)
    with pytest.raises(ProbeError, match="step="):
        run_probes(prm, items, ["verify"], n_permutations=99)


def test_compare_a_prm_with_itself_and_with_a_judge(hf_prm) -> None:
    from tl_reward.process import compare_steps

    hf, tok = hf_prm
    prm = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, step_tag=TAG,
                                            head_weights=[-1, 1])
    sols = [SOLUTIONS[0], SOLUTIONS[1], CORRUPT_A, ("Why?", ["Because.", "Music.", "Love."])]
    same = compare_steps(prm, prm, sols, names=("prm", "prm2"))
    assert same.ranks.spearman_rho.value == pytest.approx(1.0)
    assert same.verdicts.value == 1.0 and same.first_error.value == 1.0
    jtok = tokenizer()
    jtok.add_tokens(["Yes"])
    lm, jtok = tiny_hf_reward_model("nemotron", tokenizer=jtok)
    judge = HookedRewardModel.from_judge(hf_model=lm, tokenizer=jtok)
    cmp = compare_steps(prm, judge, sols, names=("prm", "judge"))
    # the judge reads each solution cut after the step: checked against its own scoring
    cut = [("Is the sky blue?", "\n\n".join(STEPS_A[: k + 1])) for k in range(3)]
    torch.testing.assert_close(torch.tensor(cmp.b[:3]), judge.rewards(cut).score.double())
    torch.testing.assert_close(torch.tensor(cmp.a), prm.rewards(sols).score.double())
    n_same = int(((cmp.a > 0) == (cmp.b > 0)).sum())
    assert cmp.verdicts.value == n_same / len(cmp.a)
    assert cmp.verdicts.ci_low <= cmp.verdicts.value <= cmp.verdicts.ci_high
    assert cmp.to_dataframe().shape == (len(cmp.a), 6)


@torch.no_grad()
def test_knockout_equals_hf_with_the_edges_cut(hf_prm) -> None:
    """Attention knockout per source group against HF's own modules run with a 4D additive
    mask that cuts the same edges (independent of TransformerLens's hooks)."""
    from tl_reward.process import step_knockout

    hf, tok = hf_prm
    prm = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, step_tag=TAG,
                                            head_weights=[-1, 1])
    ko = step_knockout(prm, [SOLUTIONS[0]], step="all")
    e = prm.encode(SOLUTIONS[0])
    for i, k in enumerate(range(3)):
        n = e.read_at[k] + 1
        ids = torch.tensor([e.ids[:n]])
        bounds = [0, e.response_start, *(t + 1 for t in e.read_at[:k]), e.read_at[k]]
        pos = torch.arange(n)
        base = hf.score(hf.model(ids).last_hidden_state)[0, -1].double()
        for g in range(k + 2):  # the prompt, steps 0..k-1 with their tags, step k before its tag
            lo, hi = bounds[g], bounds[g + 1]
            keep = (pos[:, None] >= pos[None, :]) & ~(
                (pos[:, None] >= hi) & (pos[None, :] >= lo) & (pos[None, :] < hi))
            mask = torch.where(keep, 0.0, float("-inf"))[None, None]
            out = hf.score(hf.model(ids, attention_mask=mask).last_hidden_state)[0, -1].double()
            want = (out[1] - out[0]) - (base[1] - base[0])
            assert float(ko.effect[i, g]) == pytest.approx(float(want), abs=2e-5), (k, g)
    assert float(ko.effect[2, :4].abs().max()) > 0.05  # the cuts matter on this model
    assert torch.isnan(ko.effect[0, 2:]).all()
