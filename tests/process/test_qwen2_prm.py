"""Qwen2.5-Math-PRM (``Qwen2ForProcessRewardModel``, custom code): per-step parity on both
backends, loaded from disk as the real checkpoint is (``auto_map`` with ``AutoConfig`` and
``AutoModel`` only, ``trust_remote_code=True``).

Reference: the reference module's own forward (:mod:`tl_reward.testing.qwen2_prm_reference`)
run once on each whole, unpadded solution built by the published recipe (steps joined with
``<extra_0>``, one more after the last, as the assistant message of the chat template), its
logits read at the tag positions this test finds in the ids itself. A step's linear reward is
``logit_1 - logit_0``, its probability ``softmax(logits)[1]``.

Tolerances: float32, 1e-5 absolute on linear rewards up to 1.9 (measured at most 1.3e-6 on the
linear reward, 7e-7 on the logits, 2e-7 on the probability; both backends, right and left
padding). bfloat16 (CPU): our distance to the float32 reference is at most twice HF's own bf16
forward's plus 1e-2 (measured on the linear reward: HF's bf16 forward 1.40e-2,
HookedRewardModel 1.55e-2, the bridge, which runs HF's forward, 1.45e-2; bound 3.8e-2). The
plausible bugs miss by far more: the reward one token after each tag by 1.6, the two classes
averaged instead of subtracted by 2.2, class 0's probability for class 1's by 0.74.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tl_reward import BridgeRewardModel, HookedRewardModel
from tl_reward.errors import TLRewardError
from tl_reward.testing import save_tiny_reward_model

TAG = "<extra_0>"
TOL = 1e-5
BF16_FLOOR = 1e-2
SYSTEM = "Please reason step by step."
#: (question, steps): solutions of 1, 3 and 4 steps; the 3-step one is given as a conversation
#: whose reply is cut at blank lines, the others as (question, [steps])
SOLUTIONS = [
    ("What is 2+2?", ["2+2 = 4."]),
    ("Compute 3*5.", ["3*5 means three fives.", "Three fives are 15.", "So the answer is 15."]),
    ("Is 7 prime?", ["Check 2: no.", "Check 3: no.", "No divisor up to sqrt(7).", "Yes, prime."]),
]


def _inputs() -> list[Any]:
    q, steps = SOLUTIONS[1]
    conv = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q},
            {"role": "assistant", "content": "\n\n".join(steps)}]
    return [SOLUTIONS[0], conv, SOLUTIONS[2]]


def _published_ids(tok: Any, i: int) -> list[int]:
    """The published recipe: the tagged reply as the assistant message, templated to ids."""
    q, steps = SOLUTIONS[i]
    msgs = [{"role": "system", "content": SYSTEM}] if i == 1 else []
    msgs += [{"role": "user", "content": q},
             {"role": "assistant", "content": TAG.join(steps) + TAG}]
    ids = tok.apply_chat_template(msgs, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _hf_logits(hf: Any, ids: list[int], tag_id: int, shift: int = 0) -> torch.Tensor:
    """``[n_steps, 2]``: HF's logits at each tag of one unpadded row (``shift``: that many
    tokens after it, for the checks that can fail), in float32."""
    t = torch.tensor([ids])
    pos = (t[0] == tag_id).nonzero()[:, 0] + shift
    with torch.no_grad():
        return hf(input_ids=t, attention_mask=torch.ones_like(t)).logits[0, pos].float()


@pytest.fixture(scope="module")
def prm(tmp_path_factory) -> dict[str, Any]:
    from transformers import AutoModel

    path = save_tiny_reward_model(tmp_path_factory.mktemp("prm") / "qwen2_prm", "qwen2_prm",
                                  seed=3)
    hf = AutoModel.from_pretrained(path, trust_remote_code=True).eval()
    assert type(hf).__name__ == "Qwen2ForProcessRewardModel"
    models = {
        (backend.__name__, dtype): backend.from_pretrained(
            str(path), trust_remote_code=True, dtype=dtype,
            **({"device": "cpu"} if backend is HookedRewardModel else {}))
        for backend in (HookedRewardModel, BridgeRewardModel)
        for dtype in (torch.float32, torch.bfloat16)}
    tok = models["HookedRewardModel", torch.float32].tokenizer
    tag_id = tok.convert_tokens_to_ids(TAG)
    ids = [_published_ids(tok, i) for i in range(len(SOLUTIONS))]
    ref = torch.cat([_hf_logits(hf, x, tag_id) for x in ids])
    hf16 = copy.deepcopy(hf).to(torch.bfloat16)
    ref16 = torch.cat([_hf_logits(hf16, x, tag_id) for x in ids])
    after = torch.cat([_hf_logits(hf, x, tag_id, shift=1) for x in ids])
    return {"path": path, "models": models, "ids": ids, "tag_id": tag_id, "ref": ref,
            "ref16": ref16, "after": after}


def _linear(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, 1] - logits[:, 0]


BACKENDS = ["HookedRewardModel", "BridgeRewardModel"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_steps_equal_the_reference_in_float32(prm: dict[str, Any], backend: str) -> None:
    """Each step's linear reward, both logits and the probability equal the reference's at its
    tag, on solutions of 1, 3 and 4 steps, right and left padded."""
    model = prm["models"][backend, torch.float32]
    assert model.step_format is not None and model.step_format.tag == TAG
    assert model.step_format.tag_id == prm["tag_id"]
    assert model.objectives == ["class_0", "class_1"] and model.pooling == "mask"
    for i, item in enumerate(_inputs()):  # the published ids, the tags where they stand
        e = model.encode(item)
        assert e.ids == prm["ids"][i]
        assert list(e.read_at) == [p for p, t in enumerate(e.ids) if t == prm["tag_id"]]
    prefixes, rows = model.at_steps(_inputs(), "all")
    assert [(r.item, r.step) for r in rows] == [(i, k) for i, (_, s) in enumerate(SOLUTIONS)
                                                for k in range(len(s))]
    ref = prm["ref"]
    ref_linear, ref_prob = _linear(ref), ref.softmax(-1)[:, 1]
    for side in ("right", "left"):
        res = model.rewards(prefixes, padding_side=side, step="last")
        torch.testing.assert_close(res.rewards, ref, atol=TOL, rtol=0)
        torch.testing.assert_close(res.score, ref_linear, atol=TOL, rtol=0)
        torch.testing.assert_close(torch.sigmoid(res.score), ref_prob, atol=TOL, rtol=0)
        whole = model.rewards(_inputs(), padding_side=side)  # every tag from one forward
        torch.testing.assert_close(whole.score, ref_linear, atol=TOL, rtol=0)
        torch.testing.assert_close(whole.probability, ref_prob, atol=TOL, rtol=0)
    # the checks can fail: reading one token after each tag, averaging the two classes
    # instead of taking their difference, or class 0's probability each miss by far more
    assert float((_linear(prm["after"]) - ref_linear).abs().max()) > 100 * TOL
    assert float((ref.mean(-1) - ref_linear).abs().max()) > 100 * TOL
    assert float((ref.softmax(-1)[:, 0] - ref_prob).abs().max()) > 100 * TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_is_as_close_as_hf_own(prm: dict[str, Any], backend: str) -> None:
    """Loaded in bfloat16 on the CPU, each step's linear reward is at most twice as far from
    the float32 reference as HF's own bf16 forward is, plus :data:`BF16_FLOOR` (module
    docstring for the numbers)."""
    model = prm["models"][backend, torch.bfloat16]
    prefixes, _ = model.at_steps(_inputs(), "all")
    ref_linear = _linear(prm["ref"])
    hf_err = float((_linear(prm["ref16"]) - ref_linear).abs().max())
    assert hf_err > 1e-3  # bf16 rounding shows: the bound is not float32's
    for side in ("right", "left"):
        ours = model.rewards(prefixes, padding_side=side, step="last").score
        err = float((ours - ref_linear).abs().max())
        assert err <= 2 * hf_err + BF16_FLOOR, (side, err, hf_err)
    # the check can fail: a step read one token after its tag is far outside the bound
    wrong = float((_linear(prm["after"]) - ref_linear).abs().max())
    assert wrong > 2 * hf_err + BF16_FLOOR


def test_a_whole_solution_needs_step_selection(prm: dict[str, Any]) -> None:
    """A PRM's whole solution does not end at a tag: building it for an analysis refuses,
    naming ``step=``; its steps are read through ``at_steps``."""
    for backend in BACKENDS:
        model = prm["models"][backend, torch.float32]
        with pytest.raises(TLRewardError, match="step="):
            model.build(SOLUTIONS[1])
        with pytest.raises(TLRewardError, match="step="):
            model.build(_inputs())
        prefixes, _ = model.at_steps(SOLUTIONS[1], "last")
        assert prefixes[0].ids[-1] == prm["tag_id"]
        assert model.build(prefixes).tokens.shape[0] == 1


def test_custom_code_needs_trust(prm: dict[str, Any]) -> None:
    """The checkpoint ships its modeling code (``AutoModel`` only): both loaders refuse it
    without ``trust_remote_code=True`` rather than build transformers' own ``Qwen2Model``."""
    with pytest.raises(TLRewardError, match="trust_remote_code"):
        HookedRewardModel.from_pretrained(str(prm["path"]), device="cpu")
    with pytest.raises(TLRewardError, match="trust_remote_code"):
        BridgeRewardModel.from_pretrained(str(prm["path"]))
