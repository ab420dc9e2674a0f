"""A reinforcement-learning run's record: per training step, what the policy wrote and what the
reward model paid for it.

A :class:`RunRecord` is a folder: a ``manifest.json`` naming the reward model (its fingerprint
and its tokenizer's) and the run's settings, beside one parquet file per step
(``step-0000012.parquet``), written atomically (:func:`~tl_reward.store.atomic_write`): a
record interrupted mid-write has every finished step and no half step, and :meth:`~RunRecord.
steps` lists the complete ones. Reopening it with another reward model or other settings
raises :class:`RunRecordMismatchError` naming what differs. Steps are append-only and in order.

Each step's rows: ``step``, ``row``, ``prompt``, ``completion`` (a conversation is kept as its
JSON, with ``prompt_chat`` or ``completion_chat`` true), ``reward`` (the reward model's; NaN
only for an empty completion, which it cannot score), optionally ``gold`` (a grader's score)
``dra:<component>`` (the direct contribution of each component at the pooled token,
:func:`~tl_reward.analysis.attribution.direct_reward_attribution`) and ``logratio`` (the
completion's ``log pi_theta(y|x) - log pi_ref(y|x)``, :class:`~tl_reward.rl.trl.
PolicyLogRatio`), ``completion_ids`` (the token ids the policy generated, when TRL passes
them), then any extra columns.

Example:
    >>> record = RunRecord("runs/grpo-1", model=rm, settings={"lr": 1e-5, "seed": 0})
    >>> record.append(0, prompts, completions, rewards)
    >>> record.steps(), record.read().groupby("step").reward.mean()
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tl_reward.errors import StoreMismatchError, TLRewardError, TokenizerMismatchError
from tl_reward.store import ChunkStore, RunIdentity, atomic_write

__all__ = ["COMPLETION_IDS", "COMPONENT_PREFIX", "KIND", "LOGRATIO", "RunRecord",
           "RunRecordError", "RunRecordMismatchError", "read_table", "reward_input"]

#: The run identity's ``kind`` for a run record.
KIND = "rl-run"
#: Columns holding a component's direct contribution start with this.
COMPONENT_PREFIX = "dra:"
#: The column holding each completion's log-ratio of the policy to its reference policy
#: (:class:`~tl_reward.rl.trl.PolicyLogRatio`).
LOGRATIO = "logratio"
#: The column holding each completion's token ids as the policy generated them (TRL's
#: ``completion_ids``), so its log-ratio can be computed later from a saved checkpoint.
COMPLETION_IDS = "completion_ids"
_STEP_FILE = re.compile(r"^step-(\d{7})\.parquet$")
_CORE = ("step", "row", "prompt", "completion", "prompt_chat", "completion_chat", "reward",
         "gold")
_FIX = ("Open it with the same reward model (and tokenizer) and settings, pass overwrite=True "
        "to start again, or record to another folder")

Prompt = str | Sequence[Mapping[str, str]]
Grader = Callable[[list[Any], list[Any]], Sequence[float]]


class RunRecordError(TLRewardError):
    """Input a run record refuses: steps out of order or repeated, completions without
    prompts, non-finite rewards or grades."""


class RunRecordMismatchError(RunRecordError, StoreMismatchError):
    """A run record made with another reward model or other settings (named in the message)."""


def _step_file(step: int) -> str:
    return f"step-{step:07d}.parquet"


def _as_text(value: Any, what: str) -> tuple[str, bool]:
    """``(text, chat)``: a string as it is, a conversation (list of role/content mappings) as
    its JSON."""
    if isinstance(value, str):
        return value, False
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, Sequence) and all(
            isinstance(m, Mapping) and "role" in m and "content" in m for m in value):
        return json.dumps([{"role": str(m["role"]), "content": str(m["content"])}
                           for m in value]), True
    raise RunRecordError(f"{what} is a {type(value).__name__}; a prompt or completion is a "
                         "string or a conversation (a list of {'role', 'content'} messages)")


def _from_text(text: str, chat: bool) -> Any:
    return json.loads(text) if chat else text


def decoded(df: pd.DataFrame) -> list[tuple[Any, Any]]:
    """The ``(prompt, completion)`` pairs of a record's rows, conversations decoded from their
    JSON (rows without the ``*_chat`` columns are taken as they are)."""
    out = []
    for i in range(len(df)):
        row = df.iloc[i]
        out.append(tuple(_from_text(row[c], bool(row.get(f"{c}_chat", False)))
                         if isinstance(row[c], str) else row[c]
                         for c in ("prompt", "completion")))
    return out


def reward_input(prompt: Any, completion: Any) -> Any:
    """What the reward model reads for one completion: ``(prompt, completion)`` for text, one
    conversation when either side is a list of messages."""
    if isinstance(prompt, str) and isinstance(completion, str):
        return (prompt, completion)
    head = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    tail = ([{"role": "assistant", "content": completion}] if isinstance(completion, str)
            else list(completion))
    return [*head, *tail]


def model_grader(model: Any, objective: str = "score") -> Any:
    """``grader(prompts, completions)``: ``model``'s ``objective`` for each completion (read as
    :func:`reward_input` builds it), e.g. a gold reward model for ``RunRecord(grader=...)``.
    The model's fingerprint is a default of the grader, so the record's grader check (the
    function's digest: source, defaults, closure) tells two models apart."""
    from tl_reward.model.fingerprint import model_fingerprint

    def grader(prompts: list[Any], completions: list[Any],
               fingerprint: str = model_fingerprint(model)) -> list[float]:
        items = [reward_input(p, c) for p, c in zip(prompts, completions, strict=True)]
        return model.rewards(items, progress=False).values(objective).tolist()

    return grader


def _is_empty(completion: Any) -> bool:
    """Whether a completion has no text to score (empty or only whitespace, or messages whose
    contents all are: :func:`~tl_reward.model.inputs.is_blank`)."""
    from tl_reward.model.inputs import is_blank

    if isinstance(completion, str):
        return is_blank(completion)
    return all(is_blank(str(m.get("content", ""))) for m in completion)


def _rows(values: Sequence[float], bad: np.ndarray, limit: int = 8) -> str:
    idx = np.flatnonzero(bad)
    shown = ", ".join(str(int(i)) for i in idx[:limit])
    return f"{shown}{', ...' if len(idx) > limit else ''} ({len(idx)} of {len(values)})"


class RunRecord:
    """One training run's prompts, completions, rewards (and grades, and decompositions) per
    step, in ``folder``.

    Args:
        folder: the record's folder (created when missing).
        model: the reward model scoring the run (its fingerprint and its tokenizer's go into
            the manifest); ``None`` for a record of rewards from elsewhere (no model check).
        settings: the run's settings (JSON values: policy, learning rate, seed, ...).
        grader: ``grader(prompts, completions) -> scores``, a gold score of each completion;
            called by :meth:`append` when no ``gold`` is given (its code is in the manifest).
        overwrite: delete the folder's steps and start again.
        model_name: the run's model name when ``model`` is None (names nothing else).
    """

    def __init__(self, folder: str | Path, model: Any = None,
                 settings: Mapping[str, Any] | None = None, grader: Grader | None = None,
                 overwrite: bool = False, model_name: str = "external") -> None:
        self.folder = Path(folder)
        self.grader = grader
        self.writable = True
        if model is not None:
            base = RunIdentity.of_model(KIND, model)
        else:
            import tl_reward

            base = RunIdentity(KIND, model_name, "", "", "", "",
                               library=tl_reward.library_version())
        functions = {"grader": grader} if grader is not None else None
        self.identity = base.with_job(b"", functions, settings)
        self._store = ChunkStore(self.folder, self.identity, overwrite,
                                 error=RunRecordMismatchError,
                                 what=f"the run record in {self.folder}", fix=_FIX)
        for stale in self.folder.glob("step-*.parquet.tmp"):  # a write cut short
            stale.unlink()

    @classmethod
    def open(cls, folder: str | Path) -> RunRecord:
        """The record in ``folder``, read-only (no identity is checked; :meth:`append`
        refuses)."""
        folder = Path(folder)
        manifest = folder / "manifest.json"
        if not manifest.exists():
            raise RunRecordError(f"{folder} holds no run record (no manifest.json); record a run "
                                 "there with RunRecord(folder, model, settings)")
        out = cls.__new__(cls)
        out.folder, out.grader, out.writable = folder, None, False
        out.identity = RunIdentity.from_json(manifest.read_text())
        if out.identity.kind != KIND:
            raise RunRecordError(f"{folder} holds a {out.identity.kind!r} store, not a run "
                                 "record")
        return out

    # ---------------------------------------------------------------- steps

    def steps(self) -> list[int]:
        """The complete steps, in order (a step cut short mid-write is not one)."""
        found = (_STEP_FILE.match(p.name) for p in self.folder.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def check_model(self, model: Any) -> None:
        """Refuse ``model`` unless it is the reward model the record was made with (when the
        record names one): the same fingerprint and the same tokenizer."""
        if not self.identity.model_fingerprint:
            return
        from tl_reward.model.fingerprint import model_fingerprint, tokenizer_fingerprint

        tok = tokenizer_fingerprint(getattr(model, "tokenizer", None))
        if tok != self.identity.tokenizer:
            raise TokenizerMismatchError(
                f"the reward model's tokenizer (fingerprint {tok[:12]}) is not the one the run "
                f"record in {self.folder} was scored with ({self.identity.tokenizer[:12]}): the "
                "same text gives other token ids, so other rewards. Load the reward model with "
                "the tokenizer saved with it")
        if model_fingerprint(model) != self.identity.model_fingerprint:
            raise RunRecordMismatchError(
                f"the run record in {self.folder} was scored by another reward model "
                f"({self.identity.model_name}, fingerprint "
                f"{self.identity.model_fingerprint[:12]}); pass that model (same weights, "
                "head, pooling and library version)")

    def drop_from(self, step: int) -> list[int]:
        """Delete the steps ``>= step`` (to resume training from a checkpoint at ``step``);
        returns the steps deleted."""
        self._writable()
        gone = [s for s in self.steps() if s >= step]
        for s in gone:
            (self.folder / _step_file(s)).unlink()
        return gone

    def _writable(self) -> None:
        if not self.writable:
            raise RunRecordError(f"the run record in {self.folder} was opened read-only; open "
                                 "it with RunRecord(folder, model, settings) to write")

    # ---------------------------------------------------------------- writing

    def append(self, step: int, prompts: Sequence[Prompt], completions: Sequence[Prompt],
               rewards: Sequence[float | None] | None = None,
               gold: Sequence[float] | None = None,
               components: tuple[Any, Sequence[str]] | None = None,
               extra: Mapping[str, Sequence[Any]] | None = None) -> Path:
        """Write step ``step``: one row per completion (atomically; see the module doc).

        Args:
            step: the training step, above every recorded one.
            prompts, completions: one prompt per completion (repeat a prompt for each of its
                completions), each a string or a conversation.
            rewards: the reward model's reward of each; ``None`` (or NaN) only for an empty
                completion.
            gold: a grader's score of each (finite); default: the record's ``grader``, if any.
            components: ``(values [N, C], names)``: each component's direct contribution.
            extra: further columns (one value per row).
        """
        self._writable()
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
            raise RunRecordError(f"step must be a non-negative integer, got {step!r}")
        step = int(step)
        done = self.steps()
        if step in done:
            raise RunRecordError(f"step {step} is already recorded in {self.folder}; steps are "
                                 "append-only (drop_from(step) deletes it and those after, to "
                                 "resume from a checkpoint)")
        if done and step < done[-1]:
            raise RunRecordError(f"step {step} comes after step {done[-1]} in {self.folder}; "
                                 "append steps in order")
        df = self._frame(step, prompts, completions, rewards, gold, components, extra)
        return atomic_write(self.folder / _step_file(step), lambda p: df.to_parquet(p))

    def _frame(self, step: int, prompts: Sequence[Prompt], completions: Sequence[Prompt],
               rewards: Sequence[float | None] | None, gold: Sequence[float] | None,
               components: tuple[Any, Sequence[str]] | None,
               extra: Mapping[str, Sequence[Any]] | None) -> pd.DataFrame:
        prompts, completions = list(prompts or []), list(completions or [])
        n = len(completions)
        if n == 0:
            raise RunRecordError(f"step {step} has no completions; record a step with at least "
                                 "one")
        if len(prompts) != n:
            raise RunRecordError(
                f"step {step} has {n} completions but {len(prompts)} prompts: completions "
                "without prompts cannot be scored or grouped; pass one prompt per completion "
                "(repeat a prompt for each of its completions, as TRL does)")
        texts = [_as_text(p, f"prompt {i} of step {step}") for i, p in enumerate(prompts)]
        outs = [_as_text(c, f"completion {i} of step {step}") for i, c in enumerate(completions)]
        df = pd.DataFrame({"step": np.full(n, step, dtype=np.int64),
                           "row": np.arange(n, dtype=np.int64),
                           "prompt": [t for t, _ in texts], "completion": [t for t, _ in outs],
                           "prompt_chat": [c for _, c in texts],
                           "completion_chat": [c for _, c in outs]})
        if rewards is not None:
            r = self._values(rewards, n, "rewards", step)
            empty = np.array([_is_empty(c) for c in completions])
            bad = ~np.isfinite(r) & ~(np.isnan(r) & empty)
            if bad.any():
                raise RunRecordError(
                    f"step {step}: the reward is not finite in rows {_rows(r, bad)}, whose "
                    "completions are not empty; score them again (only an empty completion may "
                    "go unscored, as NaN)")
            df["reward"] = r
        if gold is None and self.grader is not None:
            gold = self.grader([_from_text(*t) for t in texts], [_from_text(*o) for o in outs])
        if gold is not None:
            g = self._values(gold, n, "gold scores", step)
            if (bad := ~np.isfinite(g)).any():
                raise RunRecordError(
                    f"step {step}: the grader returned NaN or inf for rows {_rows(g, bad)}; fix "
                    "the grader so it scores every completion (or drop those rows)")
            df["gold"] = g
        if components is not None:
            values, names = components
            arr = np.asarray(values.detach().cpu() if hasattr(values, "detach") else values,
                             dtype=np.float64)
            if arr.shape != (n, len(names)):
                raise RunRecordError(f"step {step}: components of shape {arr.shape} for {n} "
                                     f"rows and {len(names)} names; pass values [N, C], names")
            df = pd.concat([df, pd.DataFrame(arr, columns=[COMPONENT_PREFIX + c for c in names])],
                           axis=1)  # one block: hundreds of heads, not a column at a time
        for name, col in (extra or {}).items():
            if name in df or name in _CORE or name.startswith(COMPONENT_PREFIX):
                raise RunRecordError(f"extra column {name!r} clashes with a record column; "
                                     "rename it")
            if len(col) != n:
                raise RunRecordError(f"step {step}: extra column {name!r} has {len(col)} "
                                     f"values for {n} rows")
            df[name] = list(col)
        return df

    @staticmethod
    def _values(values: Sequence[float | None], n: int, what: str, step: int) -> np.ndarray:
        if len(values) != n:
            raise RunRecordError(f"step {step} has {n} completions but {len(values)} {what}")
        return np.array([math.nan if v is None else float(v) for v in values], dtype=np.float64)

    def extend(self, table: pd.DataFrame) -> list[int]:
        """Append every step of ``table`` (columns ``step``, ``prompt``, ``completion`` and
        optionally ``reward``, ``gold``, ``dra:*``; :func:`read_table` reads one), in step
        order; returns the steps written."""
        missing = {"step", "prompt", "completion"} - set(table.columns)
        if missing:
            raise RunRecordError(f"the table lacks the columns {sorted(missing)}; a run table "
                                 "has step, prompt, completion[, reward, gold]")
        out = []
        for step, rows in table.groupby("step", sort=True):
            pairs = decoded(rows)
            names = [c for c in rows.columns if c.startswith(COMPONENT_PREFIX)]
            other = [c for c in rows.columns
                     if c not in _CORE and not c.startswith(COMPONENT_PREFIX)]
            self.append(
                int(step), [p for p, _ in pairs], [c for _, c in pairs],
                list(rows["reward"]) if "reward" in rows else None,
                list(rows["gold"]) if "gold" in rows else None,
                (rows[names].to_numpy(), [c[len(COMPONENT_PREFIX):] for c in names])
                if names else None, {c: list(rows[c]) for c in other})
            out.append(int(step))
        return out

    # ---------------------------------------------------------------- reading

    def read(self, steps: int | Sequence[int] | None = None) -> pd.DataFrame:
        """The rows of ``steps`` (default every complete step) as stored (conversations as
        JSON; :meth:`inputs` decodes them)."""
        want = self.steps() if steps is None else [steps] if isinstance(steps, int) else steps
        have = set(self.steps())
        for s in want:
            if s not in have:
                raise RunRecordError(f"step {s} is not in the run record in {self.folder} "
                                     f"(steps: {self._span()})")
        if not want:
            return pd.DataFrame({c: [] for c in _CORE[:6]})
        return pd.concat([pd.read_parquet(self.folder / _step_file(s)) for s in want],
                         ignore_index=True)

    def _span(self) -> str:
        s = self.steps()
        return "none" if not s else f"{len(s)}, {s[0]} to {s[-1]}"

    def inputs(self, step: int) -> list[tuple[Any, Any]]:
        """Step ``step``'s ``(prompt, completion)`` pairs, conversations decoded."""
        df = self.read(step)
        return decoded(df)

    def scored(self, step: int) -> pd.DataFrame:
        """Step ``step``'s rows that hold a reward (an empty completion may hold NaN), the one
        place a measure reads a step's scored rows; refused when the step holds no rewards."""
        df = self.read(step)
        if "reward" not in df:
            raise RunRecordError(f"step {step} of the run record in {self.folder} holds no "
                                 "rewards")
        return df[np.isfinite(df["reward"].to_numpy(np.float64))].reset_index(drop=True)

    def components(self, step: int) -> tuple[np.ndarray, list[str]]:
        """``([N, C], names)``: step ``step``'s recorded direct contributions (float64)."""
        df = self.read(step)
        cols = [c for c in df.columns if c.startswith(COMPONENT_PREFIX)]
        if not cols:
            raise RunRecordError(f"step {step} of the run record in {self.folder} holds no "
                                 "decomposition; record with RewardModelFunction(..., "
                                 "decompose=True), or pass the reward model to compute it")
        return df[cols].to_numpy(np.float64), [c[len(COMPONENT_PREFIX):] for c in cols]

    def __repr__(self) -> str:
        return (f"RunRecord({str(self.folder)!r}, model={self.identity.model_name!r}, "
                f"steps: {self._span()})")


# -------------------------------------------------------------------- readers


def _plain(value: Any) -> Any:
    """A parquet cell as Python data (arrays of message structs become lists of dicts)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _trl_reward_column(df: pd.DataFrame, where: Path) -> str | None:
    """The one float column besides TRL's own (``advantage``): a reward function's."""
    skip = {"step", "prompt", "completion", "advantage", "gold", "image"}
    numeric = [c for c in df.columns if c not in skip and pd.api.types.is_float_dtype(df[c])]
    if len(numeric) > 1:
        raise RunRecordError(f"{where} has several reward columns {numeric}; pass "
                             "reward=<column> (TRL names each reward function's column by the "
                             "function's name)")
    return numeric[0] if numeric else None


def read_table(path: str | Path, reward: str | None = None, gold: str | None = None
               ) -> pd.DataFrame:
    """A run table from ``path``: a JSONL or parquet file with columns ``step``, ``prompt``,
    ``completion`` (``reward``, ``gold`` optional), or TRL's completions log (a
    ``completions_*.parquet`` file, or the folder of them GRPOTrainer writes under
    ``<output_dir>/completions`` with ``log_completions=True``; its ``step`` is the global step
    TRL logged the rows at, after the update they were generated for).

    Args:
        reward: the column holding the reward (default ``reward``, or TRL's one reward column).
        gold: the column holding a gold score (default ``gold`` when present).

    Returns:
        columns ``step``, ``prompt``, ``completion``[, ``reward``, ``gold``] and the rest,
        sorted by step (stably).
    """
    path = Path(path)
    if path.is_dir():
        inner = path / "completions"
        folder = inner if not list(path.glob("completions_*.parquet")) and inner.is_dir() \
            else path
        files = sorted(folder.glob("completions_*.parquet"))
        if not files:
            raise RunRecordError(f"{path} holds no completions_*.parquet (TRL writes them under "
                                 "<output_dir>/completions with log_completions=True)")
        df = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    elif path.suffix == ".parquet":
        df = pd.read_parquet(path)
    elif path.suffix in (".jsonl", ".json"):
        try:
            df = pd.read_json(path, lines=path.suffix == ".jsonl")
        except ValueError as e:
            raise RunRecordError(f"{path} is not valid JSON lines ({e})") from None
    else:
        raise RunRecordError(f"cannot read {path}: give a .jsonl or .parquet file, or TRL's "
                             "completions folder")
    missing = {"step", "prompt", "completion"} - set(df.columns)
    if missing:
        raise RunRecordError(f"{path} lacks the columns {sorted(missing)}; a run table has "
                             "step, prompt, completion[, reward, gold]")
    for col in ("prompt", "completion"):
        df[col] = [_plain(v) for v in df[col]]
    col = reward if reward is not None else "reward" if "reward" in df else \
        _trl_reward_column(df, path)
    if col is not None and col not in df:
        raise RunRecordError(f"{path} has no column {col!r}; its columns are {list(df.columns)}")
    if col is not None and col != "reward":
        df = df.rename(columns={col: "reward"})
    if gold is not None:
        if gold not in df:
            raise RunRecordError(f"{path} has no column {gold!r}")
        df = df.rename(columns={gold: "gold"})
    for c in ("reward", "gold"):
        if c in df:
            df[c] = pd.to_numeric(df[c], errors="coerce").astype(np.float64)
    return df.sort_values("step", kind="stable").reset_index(drop=True)
