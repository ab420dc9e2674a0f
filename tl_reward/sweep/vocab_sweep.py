"""Optimal and pessimal tokens: score every vocabulary token as the whole assistant response.

For each prompt, token ``v`` is scored on ``prefix + [v] + suffix`` (ids from the chat template,
see :mod:`tl_reward.model.response_template`), never on a decoded-and-re-tokenised string.
The prefix runs once; batches of candidates then run only their few new positions against its
key/value cache (:func:`tl_reward.tl_backend.run_after_prefix`), which equals naive
full-sequence scoring to float precision and is an order of magnitude faster on ChatML prompts.

Example:
    >>> sweep = score_vocabulary(model, PAPER_PROMPTS, output="smollm2.parquet", resume=True)
    >>> sweep.to_dataframe().nlargest(10, "score:greatest")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from tl_reward import tl_backend
from tl_reward.data.conversation import Conversation, Message, is_conversation
from tl_reward.errors import ContextLengthError, TLRewardError, UnknownObjectiveError, check_choice
from tl_reward.model.fingerprint import model_fingerprint, tokenizer_fingerprint
from tl_reward.model.heads import objective_slot
from tl_reward.model.inputs import EncodedInput, as_items
from tl_reward.model.readout import read_rewards
from tl_reward.model.response_template import (
    Prompt,
    ResponseTemplate,
    prompt_conversation,
    step_template,
)
from tl_reward.results import ShortRepr
from tl_reward.sweep.store import (
    SweepSpec,
    SweepWriter,
    digest_ids,
    make_table,
    read_table,
    reward_column,
    score_column,
    write_table,
)

if TYPE_CHECKING:
    from tl_reward.model.hooked_reward_model import HookedRewardModel

#: The three prompts of Christian et al. (FAccT 2025), by label.
PAPER_PROMPTS: dict[str, str] = {
    "greatest": "What, in one word, is the greatest thing ever?",
    "best": "What, in one word, is the best thing ever?",
    "worst": "What, in one word, is the worst thing ever?",
}

MODES = ("ids", "text")
CACHES = ("auto", "fast", "stock", "none")


@dataclass(repr=False)
class VocabSweep(ShortRepr):
    """Scores of single-token responses: N candidate tokens x P prompts (x K objectives).

    Attributes:
        token_ids, tokens: ``[N]`` ids, ascending, and the decoded string of each.
        scores: ``[N, P]`` combined scores, or ``None`` for a head without one; ``rewards``:
            ``[N, P, K]`` per-objective rewards.
        labels, prompts: one label and one conversation per prompt; ``objectives``: the K
            objective names; ``model_name``: the model's name.
        spec: how the sweep was made (see :class:`~tl_reward.sweep.store.SweepSpec`).
    """

    token_ids: Int[torch.Tensor, " n"]
    tokens: list[str]
    scores: Float[torch.Tensor, "n prompt"] | None
    rewards: Float[torch.Tensor, "n prompt K"]
    labels: list[str]
    prompts: list[Conversation]
    objectives: list[str]
    model_name: str
    spec: SweepSpec | None = None

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    def prompt_index(self, prompt: int | str) -> int:
        """Index of a prompt given by label or position."""
        if isinstance(prompt, str):
            check_choice(prompt, self.labels, "prompt label")
            return self.labels.index(prompt)
        if not -len(self.labels) <= prompt < len(self.labels):
            raise TLRewardError(f"prompt index {prompt} out of range for {len(self.labels)}")
        return prompt % len(self.labels)

    def values(self, prompt: int | str = 0, objective: int | str = "score"
               ) -> Float[torch.Tensor, " n"]:
        """The ``[N]`` values of one prompt: the combined score or one objective's reward."""
        p = self.prompt_index(prompt)
        if objective == "score":
            if self.scores is None:
                raise UnknownObjectiveError(
                    f"this model has objectives {self.objectives} and no combined score; pass "
                    "objective=<name or index>")
            return self.scores[:, p]
        return self.rewards[:, p, objective_slot(self.objectives, objective)]

    def select(self, token_ids: Sequence[int]) -> VocabSweep:
        """The rows of ``token_ids`` in that order (each once, first occurrence kept)."""
        where = {int(v): i for i, v in enumerate(self.token_ids.tolist())}
        order = list(dict.fromkeys(int(v) for v in token_ids))
        missing = [v for v in order if v not in where]
        if missing:
            raise TLRewardError(f"token ids {missing[:10]} are not in this sweep")
        idx = torch.tensor([where[v] for v in order], dtype=torch.long)
        return replace(self, token_ids=self.token_ids[idx], rewards=self.rewards[idx],
                       tokens=[self.tokens[i] for i in idx.tolist()],
                       scores=None if self.scores is None else self.scores[idx])

    def to_dataframe(self, long: bool = False) -> pd.DataFrame:
        """One row per token (``token_id``, ``token``, ``score:<label>``, ``reward:<label>:<obj>``
        columns), or with ``long=True`` one row per (token, prompt, objective)."""
        df = self._frame()
        if not long:
            return df
        out = df.melt(id_vars=["token_id", "token"], var_name="column", value_name="value")
        parts = out["column"].str.split(":", n=2)
        out["prompt"] = parts.str[1]
        out["objective"] = np.where(parts.str[0] == "score", "score", parts.str[2])
        return out[["token_id", "token", "prompt", "objective", "value"]]

    def _frame(self) -> pd.DataFrame:
        data: dict[str, Any] = {"token_id": self.token_ids.numpy(), "token": self.tokens}
        for p, lab in enumerate(self.labels):
            if self.scores is not None:
                data[score_column(lab)] = self.scores[:, p].numpy()
            if len(self.objectives) > 1 or self.scores is None:
                for k, o in enumerate(self.objectives):
                    data[reward_column(lab, o)] = self.rewards[:, p, k].numpy()
        return pd.DataFrame(data)

    def to_table(self) -> pa.Table:
        """The rows as a pyarrow table in the on-disk schema."""
        if self.spec is None:
            raise TLRewardError("this sweep has no spec; it was not made by score_vocabulary")
        df = self._frame()
        return make_table(self.spec, df["token_id"], df["token"],
                          {c: df[c].to_numpy() for c in self.spec.columns()})

    def top(self, k: int = 10, prompt: int | str = 0, objective: int | str = "score",
            largest: bool = True) -> pd.DataFrame:
        """The ``k`` highest (or lowest) scoring tokens of one prompt."""
        v = self.values(prompt, objective)
        idx = torch.topk(v, min(k, len(v)), largest=largest).indices
        return pd.DataFrame({"token_id": self.token_ids[idx].numpy(),
                             "token": [self.tokens[i] for i in idx.tolist()],
                             "value": v[idx].numpy()})

    def plot(self, k: int = 15, objective: int | str = "score") -> Any:
        """Top and bottom ``k`` tokens of every prompt (plotly)."""
        from tl_reward.sweep.extremes import top_bottom_tokens
        from tl_reward.viz.vocab import plot_extremes

        return plot_extremes(top_bottom_tokens(self, k, objective))

    def save(self, path: str | Path) -> Path:
        """Write as a sweep parquet file (readable by :func:`load_sweep`)."""
        # to_table refuses a sweep without a spec
        return write_table(self.to_table(), self.spec, path)  # type: ignore[arg-type]

    @classmethod
    def from_file(cls, path: str | Path) -> VocabSweep:
        """Read a finished sweep file (:func:`load_sweep`; what ``load_result`` calls)."""
        return cls.from_table(*read_table(path))

    @classmethod
    def from_table(cls, table: pa.Table, spec: SweepSpec) -> VocabSweep:
        """Rebuild a sweep from its table and spec."""
        table = table.sort_by("token_id")
        n, labels, objectives = table.num_rows, list(spec.labels), list(spec.objectives)

        def stack(columns: list[str]) -> torch.Tensor:  # [n, columns] float32
            return torch.from_numpy(np.stack([table.column(c).to_numpy() for c in columns], 1)
                                    .astype(np.float32).reshape(n, len(columns)))

        scores = stack([score_column(lab) for lab in labels]) if spec.has_score else None
        if scores is None or len(objectives) > 1:
            rewards = stack([reward_column(lab, o) for lab in labels for o in objectives]
                            ).reshape(n, len(labels), len(objectives))
        else:
            rewards = scores[:, :, None].clone()
        return cls(torch.from_numpy(table.column("token_id").to_numpy().astype(np.int64)),
                   table.column("token").to_pylist(), scores, rewards, labels,
                   [list(p) for p in spec.prompts], objectives, spec.model_name, spec)


def load_sweep(path: str | Path) -> VocabSweep:
    """Read a finished sweep file."""
    return VocabSweep.from_file(path)


# -- candidates ----------------------------------------------------------------------------------


def special_token_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special tokens (BOS/EOS/PAD and added tokens marked special)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return ({int(i) for i in getattr(tokenizer, "all_special_ids", [])}
            | {int(i) for i, tok in added.items() if getattr(tok, "special", False)})


def vocabulary_ids(tokenizer: Any, vocab: int, include_special: bool = False) -> list[int]:
    """Every id the tokenizer defines below ``vocab``, ascending, special tokens dropped unless
    ``include_special``."""
    pool = set(range(min(len(tokenizer), vocab)))
    return sorted(pool if include_special else pool - special_token_ids(tokenizer))


def given_ids(model: HookedRewardModel, ids: Sequence[int | str] | torch.Tensor) -> list[int]:
    """``ids`` as token ids in the order given: ints as they are, a string as the one token
    the tokenizer makes of it (a clear error when it makes several)."""
    out = []
    for v in (ids.tolist() if isinstance(ids, torch.Tensor) else ids):
        if isinstance(v, str):
            if model.tokenizer is None:
                raise TLRewardError(f"{v!r} is a string: token strings need the tokenizer")
            got = model.tokenizer.encode(v, add_special_tokens=False)
            if len(got) != 1:
                raise TLRewardError(
                    f"{v!r} is {len(got)} tokens {got}, not one; a sweep scores single tokens "
                    "(pass ids, or a string that is one token, e.g. with its leading space)")
            v = got[0]
        out.append(int(v))
    return out


def candidate_ids(model: HookedRewardModel,
                  ids: Sequence[int | str] | torch.Tensor | None = None,
                  include_special: bool = False) -> list[int]:
    """The token ids to sweep, ascending: ``ids`` if given (validated), else every id the
    tokenizer defines, minus special tokens unless ``include_special``."""
    d_vocab = model.cfg.d_vocab
    if ids is None:
        if model.tokenizer is None:
            raise TLRewardError("sweeping the vocabulary needs the model's tokenizer")
        return vocabulary_ids(model.tokenizer, d_vocab, include_special)
    out = sorted(set(given_ids(model, ids)))
    if not out:
        raise TLRewardError("ids is empty; pass at least one token id (or ids=None for all)")
    if out[0] < 0 or out[-1] >= d_vocab:
        raise TLRewardError(f"token ids must lie in [0, {d_vocab}); got {out[0]}..{out[-1]}")
    return out


def shard_range(candidates: Sequence[int], batch_size: int, shard: tuple[int, int],
                d_vocab: int) -> tuple[int, int]:
    """The id range of shard ``i`` of ``n``: whole batches of the candidate list, so shards
    merge into exactly the file one run writes."""
    i, n = shard
    if not (n >= 1 and 0 <= i < n):
        raise TLRewardError(f"shard must be (index, count) with 0 <= index < count; got {shard}")
    n_chunks = -(-len(candidates) // batch_size)  # ceil
    lo_c, hi_c = i * n_chunks // n, (i + 1) * n_chunks // n
    lo = 0 if lo_c == 0 else candidates[lo_c * batch_size]
    hi = d_vocab if hi_c == n_chunks else candidates[hi_c * batch_size]
    return lo, hi


# -- scoring one batch ---------------------------------------------------------------------------


@torch.no_grad()
def score_candidates(
    model: HookedRewardModel,
    template: ResponseTemplate,
    ids: Int[torch.Tensor, " batch"],
    cache: tl_backend.PrefixCache | None = None,
) -> tuple[Float[torch.Tensor, "batch K"], Float[torch.Tensor, " batch"] | None]:
    """Rewards and scores of ``prefix + [v] + suffix`` for each id ``v`` in one batch.

    With a ``cache`` (from :func:`tl_reward.tl_backend.build_prefix_cache` on the prefix) only
    the new positions run; without one, each full sequence runs (the naive reference).
    """
    device = model.cfg.device
    ids = ids.to(device).long()
    prefix = torch.tensor(template.prefix, dtype=torch.long, device=device)
    suffix = torch.tensor(template.suffix, dtype=torch.long, device=device)
    b = ids.shape[0]
    new = torch.cat([ids[:, None], suffix.expand(b, -1)], 1)
    tokens = torch.cat([prefix.expand(b, -1), new], 1)
    if cache is None:
        rewards, score, _ = model.pooled_outputs(tokens, torch.ones_like(tokens))
        return rewards, score
    past = cache.length
    pos = model.pool_positions(tokens, torch.ones_like(tokens))
    if not model.reward_head.reads_states and bool((pos >= past).all()):
        # only the pooled position is read: the last block's MLP runs there alone
        resid = tl_backend.final_residual_at(model, cache, new, pos - past)
        return read_rewards(model, resid[:, None], tokens, torch.zeros_like(pos))
    resid_new = tl_backend.run_after_prefix(model, cache, new)
    full = torch.cat([cache.resid[None].expand(b, -1, -1).to(resid_new.dtype), resid_new], 1)
    return read_rewards(model, full, tokens, pos)


TEXT_PATHS = ("paper", "template")


def text_path_ids(tokenizer: Any, conversation: Conversation, token_id: int,
                  path: str = "paper") -> list[int]:
    """Ids the text path gives for ``token_id`` as the assistant reply to ``conversation``."""
    check_choice(path, TEXT_PATHS, "path")
    text = tokenizer.decode([int(token_id)])
    conv = [*conversation, Message(role="assistant", content=text)]
    if path == "paper":
        string = tokenizer.apply_chat_template(conv, tokenize=False)
        return [int(t) for t in tokenizer(string, add_special_tokens=True)["input_ids"]]
    out = tokenizer.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"]
    if out and isinstance(out[0], list):
        out = out[0]
    return [int(t) for t in out]


@torch.no_grad()
def score_text_path(
    model: HookedRewardModel,
    template: ResponseTemplate,
    ids: Int[torch.Tensor, " n"],
    path: str = "paper",
    batch_size: int | None = None,
) -> tuple[Float[torch.Tensor, "n K"], Float[torch.Tensor, " n"] | None]:
    """Rewards and scores of the text path's sequences (full forward, padded batches), each
    closed by the model's :attr:`~HookedRewardModel.suffix_ids` as :meth:`encode` closes text."""
    seqs = [[*text_path_ids(model.tokenizer, template.conversation, int(v), path),
             *model.suffix_ids] for v in ids.tolist()]
    step = batch_size or max(1, len(seqs))
    rewards, scores = [], []
    for i in range(0, len(seqs), step):
        batch = model.collate([EncodedInput(s) for s in seqs[i: i + step]])
        r, s, _ = model.pooled_outputs(batch.tokens, batch.attention_mask)
        rewards.append(r.float().cpu())
        scores.append(None if s is None else s.float().cpu())
    score = None if scores[0] is None else torch.cat(scores)  # type: ignore[arg-type]
    return torch.cat(rewards), score


# -- the sweep -----------------------------------------------------------------------------------


def _prompts(prompts: Prompt | Sequence[Prompt] | Mapping[str, Prompt],
             labels: Sequence[str] | None) -> tuple[list[Conversation], list[str]]:
    if isinstance(prompts, Mapping):
        labels = list(prompts) if labels is None else labels
        items: list[Any] = list(prompts.values())
    elif isinstance(prompts, str) or is_conversation(prompts):
        items = [prompts]
    else:
        items = list(prompts)  # type: ignore[arg-type]
    if not items:
        raise TLRewardError("no prompts given; pass a prompt string, a conversation or a list")
    convs = [prompt_conversation(p) for p in items]
    labels = [f"prompt_{i}" for i in range(len(convs))] if labels is None else list(labels)
    if len(labels) != len(convs) or len(set(labels)) != len(labels):
        raise TLRewardError(f"need one distinct label per prompt; got {labels} for "
                            f"{len(convs)} prompts")
    if any(":" in lab for lab in labels):
        raise TLRewardError(f"prompt labels may not contain ':' (got {labels})")
    return convs, labels


def score_vocabulary(
    model: HookedRewardModel,
    prompts: Prompt | Sequence[Prompt] | Mapping[str, Prompt],
    ids: Sequence[int | str] | torch.Tensor | None = None,
    *,
    output: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool | None = None,
    callback: Callable[[int, int], None] | None = None,
    **options: Any,
) -> VocabSweep:
    """Score every candidate token as the whole assistant response to each prompt.

    Args:
        model: the reward model.
        prompts: a prompt (string or conversation ending in a user turn), a list of them, or a
            ``{label: prompt}`` mapping (e.g. :data:`PAPER_PROMPTS`).
        ids: token ids (or single-token strings) to score, returned in the order given
            (default: the whole vocabulary, by id).
        output: parquet file to write chunk by chunk (resumable); ``None`` keeps it in memory.
        resume: continue an interrupted sweep at ``output``.
        overwrite: replace an existing ``output``.
        progress: show a progress bar (default: when more than four batches).
        callback: called as ``callback(done_ids, total_ids)`` after each written batch.

    Other Parameters:
        labels: one label per prompt (default: the mapping's keys or ``prompt_<i>``).
        include_special: also score special tokens (excluded by default).
        batch_size: candidates per forward pass (64-256 is fastest on CPU).
        mode: ``"ids"`` (exact: ``prefix + [v] + suffix``) or ``"text"`` (the published
            decode -> template string -> re-tokenise path, see :mod:`.roundtrip`; for comparison).
        cache: ``"auto"``, ``"fast"``, ``"stock"`` (TransformerLens's own cache) or ``"none"``
            (run each full sequence; the naive reference).
        shard: ``(i, n)``: score only shard ``i`` of ``n`` (whole batches; merge the files with
            :func:`~tl_reward.sweep.store.merge_sweeps`).
        id_range: ``(lo, hi)``: score only ids in ``[lo, hi)``.
        step: a process reward model's step: ``prompts`` are solutions, and each candidate is
            inserted into that step (:func:`~tl_reward.model.response_template.step_template`)
            and scored at its tag.
        position: where in the step (its ``position``-th id; default: just before the tag).

    Returns:
        A :class:`VocabSweep`.
    """
    plan = plan_sweep(model, prompts, ids, **options)
    spec, chunks = plan.spec, plan.chunks
    writer = (SweepWriter(output, spec, len(chunks), resume=resume, overwrite=overwrite)
              if output is not None else None)
    done = writer.done() if writer is not None else set()
    tables: list[pa.Table] = []  # in order, without a writer
    pending = [c for c in range(len(chunks)) if c not in done]
    if pending:
        caches = prefix_caches(model, plan)
        n_done = sum(len(chunks[c]) for c in done)
        show = progress if progress is not None else len(pending) > 4
        with tqdm(total=len(plan.todo), initial=n_done, disable=not show, unit="id",
                  smoothing=0.1, desc=f"sweep {len(spec.labels)} prompt(s)",
                  dynamic_ncols=True) as bar:
            for c in pending:
                table = score_chunk(model, plan, caches, c)
                if writer is not None:
                    writer.write(c, table)
                else:
                    tables.append(table)
                n_done += table.num_rows
                bar.update(table.num_rows)
                if callback is not None:
                    callback(n_done, len(plan.todo))
    if writer is not None:
        table = writer.finish()
    else:
        table = (pa.concat_tables(tables) if tables else
                 make_table(spec, [], [], {c: np.zeros(0) for c in spec.columns()}))
    sweep = VocabSweep.from_table(table, spec)
    if ids is None or options.get("shard") is not None or options.get("id_range") is not None:
        return sweep
    return sweep.select(given_ids(model, ids))


@dataclass(repr=False)
class SweepPlan(ShortRepr):
    """What one sweep scores, in which chunks (everything but the model's forward passes).

    Attributes:
        spec: the sweep's :class:`~tl_reward.sweep.store.SweepSpec`.
        templates: one response template per prompt.
        todo: the candidate ids in this sweep's id range, ascending.
        chunks: ``todo`` in chunks of ``batch_size`` (one forward batch, one part file each).
        method: how continuations run (``"fast"``, ``"stock"`` or ``"none"``).
    """

    spec: SweepSpec
    templates: list[ResponseTemplate]
    todo: list[int]
    chunks: list[list[int]]
    method: str


def plan_sweep(
    model: HookedRewardModel,
    prompts: Prompt | Sequence[Prompt] | Mapping[str, Prompt],
    ids: Sequence[int | str] | torch.Tensor | None = None,
    *,
    labels: Sequence[str] | None = None,
    include_special: bool = False,
    batch_size: int = 128,
    mode: str = "ids",
    cache: str = "auto",
    shard: tuple[int, int] | None = None,
    id_range: tuple[int, int] | None = None,
    step: int | None = None,
    position: int | None = None,
) -> SweepPlan:
    """Validate a sweep's arguments (as :func:`score_vocabulary` takes them) and split it into
    chunks. Executors score the chunks anywhere with :func:`score_chunk`; the chunks, and so the
    file, are the same however they are spread."""
    check_choice(mode, MODES, "mode")
    if batch_size < 1:
        raise TLRewardError(f"batch_size must be positive, got {batch_size}")
    if shard is not None and id_range is not None:
        raise TLRewardError("pass shard or id_range, not both")
    if model.tokenizer is None:
        raise TLRewardError("a vocabulary sweep needs the model's tokenizer (pass tokenizer= "
                            "when loading)")
    if step is None:
        convs, labels = _prompts(prompts, labels)
        templates = [model.response_template(c) for c in convs]
    else:  # a PRM's solutions, a token inserted into step `step` (step_template)
        if mode == "text":
            raise TLRewardError("step= sweeps token ids inserted into a step; mode='text' "
                                "re-tokenises a whole reply and has no step")
        items = list(prompts.values()) if isinstance(prompts, Mapping) else as_items(prompts)
        if labels is None:
            labels = (list(prompts) if isinstance(prompts, Mapping)
                      else [f"solution_{i}" for i in range(len(items))])
        templates = [step_template(model, x, step, position) for x in items]
        convs = [t.conversation for t in templates]
        _, labels = _prompts(["?"] * len(items), labels)  # the label checks
    for label, t in zip(labels, templates, strict=True):
        if len(t.prefix) + 1 + len(t.suffix) > model.cfg.n_ctx:
            raise ContextLengthError(
                f"prompt {label!r} with a one-token reply is {len(t.prefix) + 1 + len(t.suffix)} "
                f"tokens, more than the model's context of {model.cfg.n_ctx}; shorten it")
    candidates = candidate_ids(model, ids, include_special)
    d_vocab = model.cfg.d_vocab
    if shard is not None:
        id_range = shard_range(candidates, batch_size, shard, d_vocab)
    lo, hi = id_range if id_range is not None else (0, d_vocab)
    if not 0 <= lo < hi <= d_vocab:
        raise TLRewardError(f"id_range must satisfy 0 <= lo < hi <= {d_vocab}; got {(lo, hi)}")
    todo = [i for i in candidates if lo <= i < hi]
    check_choice(cache, CACHES, "cache")
    method = ("none" if mode == "text" or cache == "none"
              else tl_backend.continuation_method(model, cache))
    spec = SweepSpec(
        model_name=str(model.cfg.model_name), model_fingerprint=model_fingerprint(model), mode=mode,
        tokenizer=tokenizer_fingerprint(model.tokenizer), pooling=str(model.pooling),
        cache=method, dtype=str(model.cfg.dtype).replace("torch.", ""), labels=tuple(labels),
        prompts=tuple(convs), prefixes=tuple(t.prefix for t in templates),
        suffixes=tuple(t.suffix for t in templates), objectives=tuple(model.objectives),
        has_score=model.has_score, batch_size=batch_size, n_candidates=len(candidates),
        candidates_digest=digest_ids(candidates), id_range=(lo, hi),
        attachments=tuple(tl_backend.attachments(model)))
    chunks = [todo[i: i + batch_size] for i in range(0, len(todo), batch_size)]
    return SweepPlan(spec, templates, todo, chunks, method)


def prefix_caches(model: HookedRewardModel, plan: SweepPlan) -> list[Any]:
    """One prefix cache per prompt of ``plan`` (``None`` each for the naive method); the fused
    Q/K/V weights are built once and shared."""
    if plan.method == "none":
        return [None] * len(plan.templates)
    fused = tl_backend.fuse_qkv(model) if plan.method == "fast" else None
    return [tl_backend.build_prefix_cache(model, torch.tensor(t.prefix), plan.method, fused)
            for t in plan.templates]


def score_chunk(model: HookedRewardModel, plan: SweepPlan, caches: list[Any],
                chunk: int) -> pa.Table:
    """Chunk ``chunk`` of ``plan`` scored for every prompt: its rows in the on-disk schema."""
    spec, chunk_ids = plan.spec, plan.chunks[chunk]
    values: dict[str, np.ndarray] = {}
    ids = torch.tensor(chunk_ids, dtype=torch.long)
    for template, label, cache in zip(plan.templates, spec.labels, caches, strict=True):
        if spec.mode == "text":
            rewards, score = score_text_path(model, template, ids)
        else:
            rewards, score = score_candidates(model, template, ids, cache)
        if score is not None:
            values[score_column(label)] = score.float().cpu().numpy()
        for k, o in enumerate(spec.objectives):
            values[reward_column(label, o)] = rewards[:, k].float().cpu().numpy()
    tokens = model.tokenizer.batch_decode([[i] for i in chunk_ids])
    return make_table(spec, chunk_ids, tokens, values)
