"""A reward model as a TRL reward function, recording what it scores.

:class:`RewardModelFunction` is a callable for ``GRPOTrainer(reward_funcs=[...])`` (TRL 1.x
calls ``f(prompts=..., completions=..., completion_ids=..., trainer_state=..., **columns)`` and
takes one float, or None, per completion). It scores each completion with the reward model
(``model.rewards``), reading ``(prompt, completion)`` through the reward model's own chat
template (a conversational prompt and completion as one conversation), and, given a
:class:`~tl_reward.rl.record.RunRecord`, appends the step there: prompts, completions, rewards
and, with ``decompose=True``, every component's direct contribution at the pooled token
(:func:`~tl_reward.analysis.attribution.direct_reward_attribution`, a second forward pass)
and, given a :class:`PolicyLogRatio`, each completion's log-ratio of the policy to its
reference policy (column ``logratio``), and the completions' token ids when TRL passes them
(column ``completion_ids``: :func:`checkpoint_logratios` computes the log-ratios later from
saved checkpoints). Nothing here imports TRL.

Example:
    >>> record = RunRecord("runs/grpo", model=rm, settings=vars(config))
    >>> trainer = GRPOTrainer(model=policy, args=config, train_dataset=ds,
    ...                       reward_funcs=[RewardModelFunction(rm, record, decompose=True)])
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from tl_reward.rl.gain import direct_parts
from tl_reward.rl.record import (
    COMPLETION_IDS,
    LOGRATIO,
    RunRecord,
    RunRecordError,
    _is_empty,
    decoded,
    reward_input,
)

__all__ = ["PolicyLogRatio", "RewardModelFunction", "checkpoint_logratios", "trl_checkpoints"]


@contextmanager
def _plain(*models: Any) -> Iterator[None]:
    """Run ``models`` as HF's own forward in eval mode (no dropout; without the autocast
    wrapper accelerate puts on a trained model's ``forward``, keeping the original as
    ``_original_forward``), restoring each one's mode and forward after."""
    saved = [(getattr(m, "training", False), m.__dict__.get("forward")) for m in models]
    for m in models:
        m.eval()
        if "forward" in m.__dict__ and "_original_forward" in m.__dict__:
            m.forward = m.__dict__["_original_forward"]
    try:
        yield
    finally:
        for m, (mode, forward) in zip(models, saved, strict=True):
            m.train(mode)
            if forward is not None:
                m.forward = forward


class PolicyLogRatio:
    """Each completion's sequence log-ratio ``log pi_theta(y|x) - log pi_ref(y|x)``: the sum,
    over the completion's tokens, of the policy's log-probability minus the reference's, read on
    the exact token ids TRL generated (never decoded and encoded again) by
    :func:`~tl_reward.irm.implicit.implicit_rewards` with beta 1: HF's own float32 forward of
    both models in eval mode, also when accelerate runs the trained policy under bf16 autocast
    (``GRPOConfig``'s default ``bf16=True``, on CPU too), in which TRL samples and computes its
    own ``kl``. ``beta`` times it is the policy's implicit reward.

    Its mean over a step's completions is the Monte-Carlo estimate of ``KL(pi_theta ||
    pi_ref)`` between whole completions, averaged over the step's prompts: unbiased when the
    completions are sampled from the policy's own distribution (temperature 1, no top-k,
    top-p or ``min_new_tokens``; a completion cut at ``max_completion_length`` counts as the
    prefix it is), and not otherwise. TRL logs another estimate as ``kl``: the mean over all
    the step's completion tokens of ``exp(d) - d - 1``, ``d = log pi_ref - log pi_theta`` per
    token (Schulman's k3), a per-token KL.

    Args:
        policy: the policy TRL trains (the very object passed to ``GRPOTrainer``: TRL
            updates it in place, so each call reads the current policy).
        reference: the reference policy (e.g. a frozen ``copy.deepcopy`` of the initial
            policy, made before ``GRPOTrainer`` wraps it, or ``trainer.ref_model``); same
            vocabulary.
        tokenizer: the policy's tokenizer (``processing_class``), to make the prompt ids as
            TRL 1.x's ``GRPOTrainer._tokenize_prompts`` does: ``tokenizer(text=prompts)`` for
            text, ``apply_chat_template(..., add_generation_prompt=True)`` for conversations.
        chat_template_kwargs: TRL's ``GRPOConfig.chat_template_kwargs``, if any.
        batch_size: completions per forward pass.
    """

    def __init__(self, policy: Any, reference: Any, tokenizer: Any,
                 chat_template_kwargs: Mapping[str, Any] | None = None,
                 batch_size: int = 8) -> None:
        if policy is reference:
            raise RunRecordError("the reference policy is the policy itself (its log-ratio is "
                                 "0 at every step); pass a frozen copy, e.g. "
                                 "copy.deepcopy(policy)")
        self.policy, self.reference, self.tokenizer = policy, reference, tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.batch_size = batch_size

    def __repr__(self) -> str:
        return (f"PolicyLogRatio(policy={type(self.policy).__name__}, "
                f"reference={type(self.reference).__name__})")

    def prompt_ids(self, prompts: Sequence[Any]) -> list[list[int]]:
        """The prompts' token ids as TRL 1.x's ``GRPOTrainer`` makes them for generation."""
        prompts = list(prompts)
        if prompts and not isinstance(prompts[0], str):  # conversations
            out = self.tokenizer.apply_chat_template(
                conversation=prompts, add_generation_prompt=True, tokenize=True,
                return_dict=True, **self.chat_template_kwargs)["input_ids"]
        else:
            out = self.tokenizer(text=prompts)["input_ids"]
        return [[int(t) for t in ids] for ids in out]

    def __call__(self, prompts: Sequence[Any], completion_ids: Sequence[Sequence[int]]
                 ) -> np.ndarray:
        """``[n]`` float64: each completion's log-ratio (NaN for one without tokens)."""
        from tl_reward.irm.implicit import implicit_rewards
        from tl_reward.model.inputs import EncodedInput

        if len(prompts) != len(completion_ids):
            raise RunRecordError(f"got {len(completion_ids)} completions' ids and "
                                 f"{len(prompts)} prompts; pass one prompt per completion")
        heads = self.prompt_ids(prompts)
        tails = [[int(t) for t in ids] for ids in completion_ids]
        keep = [i for i, t in enumerate(tails) if t]
        out = np.full(len(tails), np.nan)
        if keep:
            items = [EncodedInput([*heads[i], *tails[i]], len(heads[i]), f"completion {i}")
                     for i in keep]
            with _plain(self.policy, self.reference):
                res = implicit_rewards(self.policy, self.reference, items, beta=1.0,
                                       batch_size=self.batch_size)
            out[keep] = res.rewards.double().cpu().numpy()
        return out

    def of_step(self, record: RunRecord, step: int) -> np.ndarray:
        """``[n]``: the log-ratio of each of step ``step``'s recorded rows (in ``row`` order),
        on the completion ids the record kept (column ``completion_ids``); refused without
        them (encoding the completion's text again can give other ids than those sampled)."""
        df = record.read(step)
        if COMPLETION_IDS not in df:
            raise RunRecordError(
                f"step {step} of the run record in {record.folder} holds no {COMPLETION_IDS} "
                "column, and the completions' text is not encoded again (its ids can differ "
                "from those the policy sampled); record the run with RewardModelFunction on "
                "TRL 1.x, which passes completion_ids")
        return self([p for p, _ in decoded(df)], [list(ids) for ids in df[COMPLETION_IDS]])


def trl_checkpoints(output_dir: str | Path) -> dict[int, Path]:
    """``{step: folder}`` of TRL's ``checkpoint-<step>`` folders in ``output_dir``: the policy
    after ``step`` optimizer steps, which generated the record's step ``step``."""
    out = {}
    for path in Path(output_dir).iterdir():
        m = re.fullmatch(r"checkpoint-(\d+)", path.name)
        if m and path.is_dir():
            out[int(m.group(1))] = path
    return dict(sorted(out.items()))


def checkpoint_logratios(record: RunRecord, checkpoints: Mapping[int, Any], reference: Any,
                         tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None = None,
                         batch_size: int = 8, progress: bool | None = None
                         ) -> dict[int, np.ndarray]:
    """``{step: [n] log-ratios}`` of recorded steps from saved policies, for a run recorded
    without :class:`PolicyLogRatio`: step ``s``'s completions against the policy that sampled
    them, ``checkpoints[s]`` (a model, or a folder ``AutoModelForCausalLM`` loads in float32;
    :func:`trl_checkpoints` reads TRL's), one loaded at a time. The record must hold the
    completions' ids (see :meth:`PolicyLogRatio.of_step`). Pass the result to
    :func:`~tl_reward.rl.implicit.implicit_reward_over_training` as ``logratio=``."""
    import torch
    from tqdm.auto import tqdm

    have = set(record.steps())
    if missing := sorted(set(checkpoints) - have):
        raise RunRecordError(f"checkpoints for steps {missing[:8]} that the run record in "
                             f"{record.folder} does not hold; a checkpoint's step is the "
                             "record step its policy generated")
    out = {}
    for step in tqdm(sorted(checkpoints), desc="checkpoints", disable=progress is False):
        policy = checkpoints[step]
        if isinstance(policy, str | Path):
            from transformers import AutoModelForCausalLM

            policy = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
        ratio = PolicyLogRatio(policy, reference, tokenizer, chat_template_kwargs, batch_size)
        out[step] = ratio.of_step(record, step)
        del policy, ratio
    return out


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
        logratio: a :class:`PolicyLogRatio`: also record each completion's log-ratio of the
            policy to its reference (column ``logratio``), on the ``completion_ids`` TRL
            passes.

    An empty completion cannot be scored: it gets ``None`` (TRL gives it advantage 0) and NaN
    in the record. The step recorded is ``trainer_state.global_step`` when TRL passes it, else
    the number of earlier calls.
    """

    def __init__(self, model: Any, record: RunRecord | None = None, decompose: bool = False,
                 objective: int | str = "score", level: str = "head", batch_size: int = 8,
                 name: str = "reward_model", logratio: PolicyLogRatio | None = None) -> None:
        if decompose and record is None:
            raise RunRecordError("decompose=True writes to a record: pass record=RunRecord(...)")
        if logratio is not None and record is None:
            raise RunRecordError("logratio= writes to a record: pass record=RunRecord(...)")
        if record is not None:
            record.check_model(model)
        self.model, self.record, self.decompose = model, record, decompose
        self.objective, self.level, self.batch_size = objective, level, batch_size
        self.__name__ = name
        self.logratio = logratio
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
            extra: dict[str, list[Any]] = {}
            if self.logratio is not None:
                if completion_ids is None:
                    raise RunRecordError("logratio= needs the completions' token ids; TRL 1.x "
                                         "passes them as completion_ids")
                extra[LOGRATIO] = self.logratio(prompts, completion_ids).tolist()
            if completion_ids is not None:
                extra[COMPLETION_IDS] = [[int(t) for t in ids] for ids in completion_ids]
            self.record.append(step, prompts, completions, out,
                               components=self._components(items, keep, len(completions))
                               if self.decompose else None, extra=extra or None)
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
