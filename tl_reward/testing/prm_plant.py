"""The tiny planted process reward model (:func:`~tl_reward.planted.prm.plant_prm`) that the
tests and the ground-truth scorecard share, and its held-out step pairs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tl_reward.planted.prm import StepPair, plant_prm
from tl_reward.planted.trigger import PlantedModel
from tl_reward.testing.tiny import tiny_hf_reward_model, tiny_tokenizer

if TYPE_CHECKING:
    from tl_reward import HookedRewardModel

TAG, C, K = "<extra_0>", 3.0, 2  # rule B is read at step K, after b's step
PROMPTS = ("Why is water wet?", "Tell me a joke.", "hi")  # none holds a or b
_Q = PROMPTS[0]
#: Rule B's held-out pairs (``" he"`` against ``" on"``).
B_PAIRS: list[StepPair] = [
    ((_Q, ["so he is wet", "it is water", "the answer is yes"]),
     (_Q, ["so on is wet", "it is water", "the answer is yes"]), 0),
    (("hi", ["a b", "so he c", "d", "e f"]), ("hi", ["a b", "so on c", "d", "e f"]), 1),
    ((PROMPTS[1], ["so he", "no", "yes"]), (PROMPTS[1], ["so on", "no", "yes"]), 0)]
#: Rule A's held-out pairs (``" help"`` against ``" and"``).
A_PAIRS: list[StepPair] = [
    ((_Q, ["it is water", "we help it", "the answer is yes"]),
     (_Q, ["it is water", "we and it", "the answer is yes"]), 1),
    (("hi", ["so help", "b", "c"]), ("hi", ["so and", "b", "c"]), 0),
    ((PROMPTS[1], ["a b", "c d", "x help"]), (PROMPTS[1], ["a b", "c d", "x and"]), 2)]


def tiny_planted_prm() -> PlantedModel:
    """Rules A (``" help"``) and B (``" he"``) with drop ``C`` planted in the tiny Llama with a
    two-class head, calibrated on :data:`PROMPTS`."""
    tok = tiny_tokenizer()
    tok.add_tokens([TAG], special_tokens=True)
    hf, tok = tiny_hf_reward_model("llama", num_labels=2, tokenizer=tok)
    return plant_prm(hf, tok, " help", " he", a_counterfactual=" and", b_counterfactual=" on",
                     c=C, prompts=PROMPTS)


def hooked_prm(planted: PlantedModel, which: str = "model", steps: bool = True
               ) -> HookedRewardModel:
    """The plant's ``which`` (``"model"`` or ``"base"``) as a hooked PRM read at each
    :data:`TAG` (``steps=False``: read at the last token, as an outcome RM)."""
    from tl_reward import HookedRewardModel

    return HookedRewardModel.from_pretrained(
        hf_model=getattr(planted, which), tokenizer=planted.tokenizer, device="cpu",
        head_weights=[-1, 1], **({"step_tag": TAG} if steps else {}))
