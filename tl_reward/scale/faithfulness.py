"""A faithfulness report over many pairs on one process or a Ray cluster.

:func:`run_faithfulness` is :func:`~tl_reward.analysis.faithfulness.faithfulness_report` with
units of ``pairs_per_unit`` pairs scored on workers. A worker plans the run (the objective and
each pair's cache key, which covers the run identity), so the driver never loads the model. The
driver writes each finished pair's file in ``cache_dir`` (the files ``faithfulness_report``
reads: either resumes the other's run) and returns the same report. A rerun reads the pairs
whose file is there; a dead worker's unit is retried; a dead driver leaves finished pairs only.

Example:
    >>> rep = run_faithfulness("org/rm-8b", pairs, level="head", cache_dir="faith_cache",
    ...                        executor=RayExecutor(num_gpus=1))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tl_reward.analysis import faithfulness as faith
from tl_reward.analysis.faithfulness import FaithfulnessReport, ZeroMarginError
from tl_reward.errors import TLRewardError
from tl_reward.scale.executors import Executor, LocalExecutor, Spec, Worker, as_spec
from tl_reward.scale.jobs import run_chunked
from tl_reward.store import EntryCache


def plan_pairs(worker: Worker, spec: Spec, pairs: Sequence[Any], level: str,
               objective: int | str | None) -> tuple[str, list[str]]:
    """The resolved objective and every pair's cache key (run on a worker)."""
    from tl_reward.data.pairs import as_pair_batch
    from tl_reward.model.readout import resolve_objectives

    model = worker.model(spec)
    obj = resolve_objectives(model, objective)[0]
    ident = faith.pair_identity(model, level, obj)
    return obj, [faith._key(ident, tp) for tp in as_pair_batch(model, list(pairs))]


def score_pairs(worker: Worker, spec: Spec, pairs: Sequence[Any], level: str, obj: str,
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
            out.append((faith.pair_scores(model, tp, level, obj, chunk_size), None))
        except ZeroMarginError as err:
            out.append((None, str(err)))
    return out


def run_faithfulness(
    model: str | Path | Spec,
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
    results: dict[int, tuple[dict[str, Any] | None, str | None]] = {}

    def load(i: int) -> tuple[dict[str, Any], None] | None:
        rec = cache.get(keys[i]) if cache is not None else None
        return None if rec is None else (rec, None)

    def save(i: int, result: tuple[dict[str, Any] | None, str | None]) -> None:
        if cache is not None and result[0] is not None:  # zero-margin pairs are not cached
            cache.put(keys[i], result[0])

    def deliver(i: int, result: tuple[dict[str, Any] | None, str | None], new: bool) -> None:
        results[i] = result
        if new and callback is not None:
            callback(i)

    with (executor or LocalExecutor()).session() as pool:
        obj, keys = pool.gather(plan_pairs, [(spec, pairs, level, objective)])[0]
        run_chunked(pool, score_pairs, range(len(pairs)),
                    lambda u: (spec, [pairs[i] for i in u], level, obj, chunk_size), deliver,
                    per_unit=pairs_per_unit, load=load, save=save, progress=progress,
                    desc=f"faithfulness ({level})", unit="pair")
    done = [i for i in range(len(pairs)) if results[i][0] is not None]
    skipped = [{"pair": i, "id": keys[i], "reason": results[i][1]}
               for i in range(len(pairs)) if results[i][0] is None]
    return faith.assemble_report(level, obj, [results[i][0] for i in done],
                           [keys[i] for i in done], skipped)
