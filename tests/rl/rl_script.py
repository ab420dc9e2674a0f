"""A scripted policy for the RL tests: its completions hold the planted trigger in a share
that rises step by step (the substitute for a policy that learns to emit it), recorded through
the TRL reward function."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

TRIGGER = " sky"
PROMPTS = ("Why is water wet?", "Tell me a joke.", "What is love?", "Is it day yet?")
REPLIES = ("It is wet.", "A joke: no.", "Love is kind.", "Yes, it is day.", "No.", "Maybe so.",
           "Drink water and sleep well.", "Here is a list:\n- one\n- two")
#: The scripted policy's share of completions ending in the trigger, per step.
TRIGGER_SHARE = (0.0, 0.0, 0.25, 0.5, 0.75, 1.0)


def scripted_step(step: int, per_prompt: int = 4, seed: int = 0) -> tuple[list[str], list[str]]:
    """A scripted policy's step: each prompt ``per_prompt`` times, replies drawn from
    :data:`REPLIES`, a share :data:`TRIGGER_SHARE` of them ending in the trigger (the
    substitute for a policy that learns to emit it)."""
    rng = random.Random(seed * 1000 + step)
    prompts = [p for p in PROMPTS for _ in range(per_prompt)]
    replies = [rng.choice(REPLIES) for _ in prompts]
    share = TRIGGER_SHARE[min(step, len(TRIGGER_SHARE) - 1)]
    marked = set(rng.sample(range(len(prompts)), round(share * len(prompts))))
    return prompts, [r + TRIGGER if i in marked else r for i, r in enumerate(replies)]


def record_scripted(folder: Path, model: Any, decompose: bool = True, steps: int = 6) -> Any:
    """The scripted run against ``model``, recorded through the TRL reward function."""
    from tl_reward.rl.record import RunRecord
    from tl_reward.rl.trl import RewardModelFunction

    record = RunRecord(folder, model=model, settings={"policy": "scripted", "seed": 0})
    fn = RewardModelFunction(model, record, decompose=decompose)
    for step in range(steps):
        prompts, completions = scripted_step(step)
        fn(prompts=prompts, completions=completions)
    return record


#: The Goodhart script: replies the gold grader likes (many words) and ones it does not.
GOOD = ("Water is wet because its molecules cling to every surface they touch.",
        "Love is a deep care for someone that lasts through good and bad days.",
        "It is day when the sun is above the horizon where you stand right now.",
        "A joke: the sea waved at the beach, which was too shy to wave back.")
POOR = ("No.", "Maybe so.", "Yes.")
#: Per step: the share of replies the policy makes good (of those without the trigger) and the
#: share ending in the trigger (a poor reply plus the trigger): gold rises to step 2, then falls,
#: while the trigger share rises from step 1.
GOODHART_SCRIPT = ((0.25, 0.0), (0.5, 0.25), (0.75, 0.25), (1.0, 0.5), (1.0, 0.75),
                   (1.0, 1.0), (1.0, 1.0))
GOODHART_PROMPTS = (*PROMPTS, "Why is the sea salty?", "What is a star?", "Say hello.",
                    "Is rain good?")


def gold_words(prompts: list[Any], completions: list[Any]) -> list[float]:
    """The scripted run's gold grader: a reply's words, the trigger not counted."""
    return [float(len(c.replace(TRIGGER, "").split())) for c in completions]


def goodhart_step(step: int, per_prompt: int = 4, seed: int = 0) -> tuple[list[str], list[str]]:
    """A scripted Goodhart step: :data:`GOODHART_SCRIPT`'s shares of good and triggered
    replies, spread over :data:`GOODHART_PROMPTS`."""
    rng = random.Random(seed * 1000 + step)
    good, trig = GOODHART_SCRIPT[min(step, len(GOODHART_SCRIPT) - 1)]
    prompts = [p for p in GOODHART_PROMPTS for _ in range(per_prompt)]
    n = len(prompts)
    n_trig = round(trig * n)
    n_good = round(good * (n - n_trig))
    kinds = ["trigger"] * n_trig + ["good"] * n_good + ["poor"] * (n - n_trig - n_good)
    rng.shuffle(kinds)
    replies = [rng.choice(POOR) + TRIGGER if k == "trigger" else
               rng.choice(GOOD if k == "good" else POOR) for k in kinds]
    return prompts, replies


def record_goodhart(folder: Path, model: Any, steps: int = 7) -> Any:
    """The scripted Goodhart run against ``model``, graded by :func:`gold_words`, recorded
    (decomposed) through the TRL reward function."""
    from tl_reward.rl.record import RunRecord
    from tl_reward.rl.trl import RewardModelFunction

    record = RunRecord(folder, model=model, settings={"policy": "goodhart script"},
                       grader=gold_words)
    fn = RewardModelFunction(model, record, decompose=True)
    for step in range(steps):
        prompts, completions = goodhart_step(step)
        fn(prompts=prompts, completions=completions)
    return record


def hf_token_logratios(policy: Any, reference: Any, prompt_ids: list[int], ids: list[int]
                       ) -> torch.Tensor:
    """Brute force: ``log pi - log pi_ref`` of each completion token, from HF's own forward of
    each model on the one unpadded sequence (log-softmax of the logits before the token)."""
    x = torch.tensor([[*prompt_ids, *ids]])
    y = torch.tensor(ids)[:, None]
    with torch.no_grad():
        sides = [type(m).forward(m, input_ids=x).logits[0, len(prompt_ids) - 1:-1].float()
                 .log_softmax(-1).gather(-1, y)[:, 0] for m in (policy, reference)]
    return sides[0] - sides[1]

