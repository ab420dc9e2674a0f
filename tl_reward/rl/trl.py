"""A reward model as a TRL reward function, recording what it scores.

:class:`RewardModelFunction` is a callable for ``GRPOTrainer(reward_funcs=[...])`` (TRL 1.x
calls ``f(prompts=..., completions=..., completion_ids=..., trainer_state=..., **columns)`` and
takes one float, or None, per completion). It scores each completion with the reward model
(``model.rewards``), reading ``(prompt, completion)`` through the reward model's own chat
template (a conversational prompt and completion as one conversation), and, given a
:class:`~tl_reward.rl.record.RunRecord`, appends the step there: prompts, completions, rewards
and, with ``decompose=True``, every component's direct contribution at the pooled token
(:func:`~tl_reward.analysis.attribution.direct_reward_attribution`, a second forward pass).
Nothing here imports TRL.

Example:
    >>> record = RunRecord("runs/grpo", model=rm, settings=vars(config))
    >>> trainer = GRPOTrainer(model=policy, args=config, train_dataset=ds,
    ...                       reward_funcs=[RewardModelFunction(rm, record, decompose=True)])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tl_reward.rl.gain import direct_parts
from tl_reward.rl.record import RunRecord, RunRecordError, _is_empty, reward_input

__all__ = ["RewardModelFunction"]


class RewardModelFunction:
    """A reward model as a TRL reward function (see the module doc).

    Args:
        model: a :class:`~tl_reward.HookedRewardModel` (or bridge) with its tokenizer.
        record: a run record to append each call's step to (its reward model must be
            ``model``), or None.
        decompose: also record the direct contribution of every component at ``level``.
        objective: the reward returned: ``"score"`` (the combined score) or an objective's
            name or index.
        level: the decomposition's level (``"head"`` or ``"sublayer"``).
        batch_size: completions per forward pass.
        name: the function's name (TRL's column and metric name for it).

    An empty completion cannot be scored: it gets ``None`` (TRL gives it advantage 0) and NaN
    in the record. The step recorded is ``trainer_state.global_step`` when TRL passes it, else
    the number of earlier calls.
    """

    def __init__(self, model: Any, record: RunRecord | None = None, decompose: bool = False,
                 objective: int | str = "score", level: str = "head", batch_size: int = 8,
                 name: str = "reward_model") -> None:
        if decompose and record is None:
            raise RunRecordError("decompose=True writes to a record: pass record=RunRecord(...)")
        if record is not None:
            record.check_model(model)
        self.model, self.record, self.decompose = model, record, decompose
        self.objective, self.level, self.batch_size = objective, level, batch_size
        self.__name__ = name
        self.calls = 0

    def __repr__(self) -> str:
        return (f"RewardModelFunction({self.model.cfg.model_name!r}, record="
                f"{None if self.record is None else str(self.record.folder)!r}, "
                f"decompose={self.decompose})")

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 completion_ids: Sequence[Sequence[int]] | None = None,
                 trainer_state: Any = None, **kwargs: Any) -> list[float | None]:
        """One reward per completion (``None`` for an empty one); see the class doc."""
        prompts, completions = list(prompts), list(completions)
        if len(prompts) != len(completions):
            raise RunRecordError(f"got {len(completions)} completions and {len(prompts)} "
                                 "prompts; pass one prompt per completion")
        keep = [i for i, c in enumerate(completions) if not _is_empty(c)]
        items = [reward_input(prompts[i], completions[i]) for i in keep]
        names = [f"completion {i}" for i in keep]
        out: list[float | None] = [None] * len(completions)
        if items:
            res = self.model.rewards(items, batch_size=self.batch_size, progress=False,
                                     names=names)
            for i, r in zip(keep, res.values(self.objective).tolist(), strict=True):
                out[i] = float(r)
        if self.record is not None:
            step = self._step(trainer_state)
            self.record.append(step, prompts, completions, out,
                               components=self._components(items, keep, len(completions))
                               if self.decompose else None)
        self.calls += 1
        return out

    def _step(self, trainer_state: Any) -> int:
        step = getattr(trainer_state, "global_step", None)
        step = self.calls if step is None else int(step)
        assert self.record is not None
        done = self.record.steps()
        if done and step <= done[-1]:
            raise RunRecordError(
                f"the reward function was called at step {step}, but the record in "
                f"{self.record.folder} already holds step {done[-1]}: TRL generated twice in "
                "one optimizer step (set steps_per_generation to gradient_accumulation_steps "
                "and num_iterations=1), or training resumed from a checkpoint (call "
                f"record.drop_from({step}) first)")
        return step

    def _components(self, items: list[Any], keep: list[int], n: int
                    ) -> tuple[np.ndarray, list[str]]:
        """``([n, C + 1], names)``: :func:`~tl_reward.rl.gain.direct_parts` of the scored
        completions; NaN rows for the unscored ones."""
        if not items:
            return np.full((n, 0), np.nan), []
        parts, names = direct_parts(self.model, items, self.objective, self.level,
                                    self.batch_size)
        full = np.full((n, parts.shape[1]), np.nan)
        full[keep] = parts
        return full, names
