"""A scripted policy for the RL tests: its completions hold the planted trigger in a share
that rises step by step (the substitute for a policy that learns to emit it), recorded through
the TRL reward function."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

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
