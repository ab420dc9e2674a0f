"""The demo process reward model (``tl-reward/smollm2-135m-prm``) by name on both backends: step
rewards equal to its HF module at every tag, its held-out step accuracy on fresh solutions, and
``tl-reward demo --prm``.

The references are the HF module's own body and score on ids this file builds (the chat template
with the steps joined by the tag and one more after the last), independently of the library.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import smollm2_unavailable

from tl_reward import BridgeRewardModel, HookedRewardModel
from tl_reward.cli import demo as demo_cli
from tl_reward.cli import main
from tl_reward.data.arithmetic import generate_solutions
from tl_reward.model.demo import (
    PRM_MODEL_NAME,
    PRM_TAG,
    demo_prm_hf_model,
    load_prm_head,
)
from tl_reward.model.loading import builtin_options

pytestmark = pytest.mark.slow

#: A fresh sample: the head was fitted on seed 0 and evaluated on seed 1.
SAMPLE_SEED, N_SAMPLE = 2024, 30
SAMPLE = generate_solutions(N_SAMPLE, SAMPLE_SEED)
PARITY = [s.as_input() for s in SAMPLE[:4]]


@pytest.fixture(scope="module")
def models():  # noqa: ANN201
    """The HF module, and the demo PRM by name as HookedRewardModel and BridgeRewardModel."""
    if (reason := smollm2_unavailable()) is not None:
        pytest.skip(reason)
    hf, tok = demo_prm_hf_model()
    hooked = HookedRewardModel.from_pretrained(PRM_MODEL_NAME, device="cpu")
    bridge = BridgeRewardModel.from_pretrained(PRM_MODEL_NAME, device="cpu")
    return hf, tok, hooked, bridge


@pytest.fixture(scope="module")
def sample_rewards(models):  # noqa: ANN001, ANN201
    return models[2].rewards([s.as_input() for s in SAMPLE], batch_size=10)


@torch.no_grad()
def hf_step_logits(hf, tok, solution: tuple[str, list[str]],  # noqa: ANN001
                   shift: int = 0) -> torch.Tensor:
    """``[n_steps, 2]`` the HF module's score on its body at each tag (``shift`` tokens after
    it), one sequence alone."""
    question, steps = solution
    msgs = [{"role": "user", "content": question},
            {"role": "assistant", "content": PRM_TAG.join(steps) + PRM_TAG}]
    ids = tok.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"]
    tag = tok.convert_tokens_to_ids(PRM_TAG)
    pos = [i for i, t in enumerate(ids) if t == tag]
    assert len(pos) == len(steps)
    pos = [i + shift for i in pos]
    return hf.score(hf.model(torch.tensor([ids])).last_hidden_state[0])[pos].double()


def test_builtin_options_fill_only_what_the_caller_leaves_out() -> None:
    assert builtin_options(PRM_MODEL_NAME, step_tag=None, head_weights=None) == {
        "step_tag": PRM_TAG, "head_weights": (-1.0, 1.0)}
    assert builtin_options(PRM_MODEL_NAME, step_tag="<x>", head_weights=[1, -1]) == {
        "step_tag": "<x>", "head_weights": [1, -1]}
    assert builtin_options("tl-reward/smollm2-135m-hh", step_tag=None) == {"step_tag": None}


def test_step_rewards_equal_the_hf_module_at_every_tag(models, sample_rewards) -> None:
    hf, tok, hooked, bridge = models
    ref = torch.cat([hf_step_logits(hf, tok, s) for s in PARITY])
    linear = ref[:, 1] - ref[:, 0]
    assert linear.abs().max() > 0.5  # rewards of order 1: a 1e-4 tolerance means something
    n = len(ref)
    for model, res in ((hooked, sample_rewards), (bridge, bridge.rewards(PARITY))):
        assert model.step_format.tag == PRM_TAG and model.pooling == "mask"
        assert model.objectives == ["wrong", "correct"]
        assert [(r.item, r.step) for r in res.rows[:n]] == [
            (i, k) for i, (_, steps) in enumerate(PARITY) for k in range(len(steps))]
        torch.testing.assert_close(res.score[:n].double(), linear, atol=1e-4, rtol=0)
        torch.testing.assert_close(res.rewards[:n].double(), ref, atol=1e-4, rtol=0)
        torch.testing.assert_close(res.probability[:n].double(), ref.softmax(-1)[:, 1],
                                   atol=1e-5, rtol=0)
    # what the tolerance catches: the score read one token after each tag
    late = hf_step_logits(hf, tok, PARITY[0], shift=1)
    assert (late - ref[: len(late)]).abs().max() > 1e-2


def test_heldout_step_accuracy_on_a_fresh_sample(sample_rewards) -> None:
    """Step accuracy (class 1 when its logit is larger) on 30 fresh solutions (about 120 steps).

    Bound: the packaged held-out accuracy ``p`` (400 solutions) minus three standard errors of
    a 30-solution sample, ``sqrt(deff * p (1 - p) / n)`` over its ``n`` steps: the binomial
    error inflated by the design effect ``deff`` measured on the held-out set (steps of one
    solution share their errors; about 1.8). The packaged accuracy is well above always
    answering the majority class (its 95% interval by solution excludes it); a sample this
    small (a standard error of about 0.05 against an edge of about 0.08) can only be asked to
    beat it."""
    meta = load_prm_head()[1]
    held = meta["heldout"]
    labels = torch.tensor([lab for s in SAMPLE for lab in s.labels])
    acc = float(((sample_rewards.score > 0).long() == labels).float().mean())
    p, n = meta["heldout_step_accuracy"], len(labels)
    se = math.sqrt(held["design_effect"] * p * (1 - p) / n)
    share = float(labels.float().mean())
    assert acc >= p - 3 * se, (acc, p, se)
    assert acc > max(share, 1 - share), (acc, share)
    assert held["step_accuracy_ci95_bootstrap_by_solution"][0] > meta["heldout_majority_rate"]
    assert p >= meta["heldout_majority_rate"] + 0.05


@pytest.fixture(scope="module")
def judge(models):  # noqa: ANN001, ANN201
    from tl_reward.model.demo import JUDGE_MODEL_NAME

    return HookedRewardModel.from_judge(JUDGE_MODEL_NAME, device="cpu")


def test_demo_prm_command(models, judge, monkeypatch, capsys) -> None:  # noqa: ANN001
    monkeypatch.setattr(demo_cli, "load_model", lambda args, name=None: models[2])
    monkeypatch.setattr(HookedRewardModel, "from_judge", classmethod(lambda cls, *a, **k: judge))
    assert main(["demo", "--prm", "--judge", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert PRM_MODEL_NAME in out and "Held-out step accuracy" in out
    assert out.count("The answer is") == 3 and "wrong step 2" in out
    assert "judge (Yes-No)" in out and "Steps both call right or both wrong" in out


@torch.no_grad()
def test_smollm2_judge_by_name_reads_yes_minus_no(judge) -> None:  # noqa: ANN001
    """The SmolLM2 chat model as a yes/no judge by its built-in name: the score is HF's own
    logit("Yes") - logit("No") at the answer position (the judge's prompt built by the test)."""
    from tl_reward.model.demo import JUDGE_MODEL_NAME, load_smollm2
    from tl_reward.model.judge import VERDICT_TEMPLATE, verdict_token_id

    assert judge.cfg.model_name == JUDGE_MODEL_NAME
    lm, tok = load_smollm2()
    item = ("Compute 8 + 7.", "8 + 7 = 15")
    msgs = [{"role": "user", "content": VERDICT_TEMPLATE.format(question=item[0],
                                                                response=item[1])}]
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True,
                                  return_dict=True)["input_ids"]
    assert judge.encode(item).ids == ids
    logits = lm(torch.tensor([ids])).logits[0, -1].double()
    yes, no = (verdict_token_id(tok, w) for w in ("Yes", "No"))
    want = float(logits[yes] - logits[no])
    assert float(judge.rewards([item]).score[0]) == pytest.approx(want, abs=1e-4)
