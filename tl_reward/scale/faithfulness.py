"""A faithfulness report over many pairs on one process or a Ray cluster.

:func:`run_faithfulness` is :func:`~tl_reward.analysis.faithfulness.faithfulness_report` with
the pairs spread over workers: a worker plans the run (resolves the objective and computes each
pair's cache key, which covers the run identity, so the driver never loads the model), then
units of ``pairs_per_unit`` pairs are scored where the executor puts them. The driver writes
each finished pair's cache file in ``cache_dir`` (the files ``faithfulness_report`` reads, so
either can resume the other's run) and returns the same :class:`FaithfulnessReport`: the same
tensors, pair ids and skipped pairs.

Resuming: run the same call again; pairs whose file is in ``cache_dir`` are read, not scored.
A worker that dies is restarted by Ray and its unit retried; a driver that dies leaves only
finished pairs' files.

Example:
    >>> rep = run_faithfulness("org/rm-8b", pairs, level="head", cache_dir="faith_cache",
    ...                        executor=RayExecutor(num_gpus=1))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from tl_reward.analysis.faithfulness import (
    FaithfulnessReport,
    ZeroMarginError,
    _key,
    assemble_report,
    pair_identity,
    pair_scores,
)
from tl_reward.errors import TLRewardError
from tl_reward.scale.executors import (
    Executor,
    LocalExecutor,
    ModelSpec,
    Worker,
    as_spec,
    batched,
)
from tl_reward.store import EntryCache


def plan_pairs(worker: Worker, spec: ModelSpec, pairs: Sequence[Any], level: str,
               objective: int | str | None) -> tuple[str, list[str]]:
    """The resolved objective and every pair's cache key (run on a worker)."""
    from tl_reward.analysis.readout import resolve_objectives
    from tl_reward.data.pairs import as_pair_batch

    model = worker.model(spec)
    obj = resolve_objectives(model, objective)[0]
    ident = pair_identity(model, level, obj)
    return obj, [_key(ident, tp) for tp in as_pair_batch(model, list(pairs))]


def score_pairs(worker: Worker, spec: ModelSpec, pairs: Sequence[Any], level: str, obj: str,
                chunk_size: int) -> list[tuple[dict[str, Any] | None, str | None]]:
    """Per pair ``(record, None)``, or ``(None, reason)`` for a zero-margin pair (run on a
    worker)."""
    from tl_reward.data.pairs import as_pair_batch

    model = worker.model(spec)
    batch = as_pair_batch(model, list(pairs))
    out: list[tuple[dict[str, Any] | None, str | None]] = []
    for j, tp in enumerate(batch):
        worker.checkpoint(j, len(batch))
        try:
            out.append((pair_scores(model, tp, level, obj, chunk_size), None))
        except ZeroMarginError as err:
            out.append((None, str(err)))
    return out


def run_faithfulness(
    model: str | Path | ModelSpec,
    pairs: Sequence[Any],
    level: str = "sublayer",
    objective: int | str | None = None,
    cache_dir: str | Path | None = None,
    executor: Executor | None = None,
    *,
    pairs_per_unit: int = 4,
    chunk_size: int = 32,
    progress: bool | None = None,
    callback: Callable[[int], None] | None = None,
) -> FaithfulnessReport:
    """:func:`~tl_reward.analysis.faithfulness.faithfulness_report` of ``model`` (a hub name,
    local directory or :class:`ModelSpec`, loaded by the workers) on ``executor``.

    Args:
        pairs: preference pairs in any form ``faithfulness_report`` accepts (picklable).
        cache_dir: one file per finished pair, written by this process; resumed from.
        executor: :class:`LocalExecutor` (default) or :class:`RayExecutor`.
        pairs_per_unit: pairs a worker scores per unit.
        callback: called with a pair's index after its record has arrived (and been written).
    """
    if level not in ("sublayer", "head"):
        raise TLRewardError(f"level must be 'sublayer' or 'head', got {level!r}")
    spec, pairs = as_spec(model), list(pairs)
    cache = EntryCache(cache_dir) if cache_dir is not None else None
    records: dict[int, dict[str, Any]] = {}
    reasons: dict[int, str] = {}
    with (executor or LocalExecutor()).session() as pool:
        obj, keys = pool.gather(plan_pairs, [(spec, pairs, level, objective)])[0]
        todo = []
        for i, key in enumerate(keys):
            rec = cache.get(key) if cache is not None else None
            if rec is None:
                todo.append(i)
            else:
                records[i] = rec
        units = batched(todo, pairs_per_unit)
        bar = tqdm(total=len(todo), disable=progress is False, unit="pair",
                   desc=f"faithfulness ({level})")

        def write(u: int, results: list[tuple[dict[str, Any] | None, str | None]]) -> None:
            for i, (rec, reason) in zip(units[u], results, strict=True):
                if rec is None:
                    reasons[i] = str(reason)
                else:
                    if cache is not None:
                        cache.put(keys[i], rec)
                    records[i] = rec
                bar.update(1)
                if callback is not None:
                    callback(i)

        try:
            pool.stream(score_pairs, [(spec, [pairs[i] for i in u], level, obj, chunk_size)
                                      for u in units], write)
        finally:
            bar.close()
    done = [records[i] for i in range(len(pairs)) if i in records]
    ids = [keys[i] for i in range(len(pairs)) if i in records]
    skipped = [{"pair": i, "id": keys[i], "reason": reasons[i]} for i in sorted(reasons)]
    if len(done) + len(skipped) != len(pairs):  # every pair is scored, read or skipped once
        raise TLRewardError("internal error: some pairs were neither scored nor skipped")
    return assemble_report(level, obj, done, ids, skipped)
