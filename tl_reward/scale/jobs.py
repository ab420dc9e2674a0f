"""The one chunked-job driver: every job in :mod:`tl_reward.scale` runs through :func:`run_chunked`.

A job is a list of chunk keys. Each chunk's result is read from the job's store when it is
there, else computed on the executor's workers, a few chunks per unit, written to the store as
it arrives and handed on, exactly once per chunk, in any order. A driver that dies leaves only
finished chunks behind; rerunning the job computes the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from itertools import groupby
from typing import Any, TypeVar

from tqdm.auto import tqdm

from tl_reward.errors import TLRewardError
from tl_reward.scale.executors import Pool, batched

K = TypeVar("K", bound=Hashable)


def run_chunked(
    pool: Pool, fn: Callable[..., Sequence[Any]], keys: Sequence[K],
    unit_args: Callable[[list[K]], tuple[Any, ...]], deliver: Callable[[K, Any, bool], None], *,
    per_unit: int = 1, group: Callable[[K], Hashable] | None = None,
    load: Callable[[K], Any | None] | None = None, save: Callable[[K, Any], None] | None = None,
    desc: str = "chunks", unit: str = "chunk", progress: bool | None = None,
) -> None:
    """Give every key in ``keys`` its result, exactly once.

    Args:
        pool: a started executor (:meth:`~tl_reward.scale.executors.LocalExecutor.session`).
        fn: ``fn(worker, *unit_args(unit_keys))`` runs on a worker and returns one result per
            key of the unit, in the unit's order.
        deliver: ``deliver(key, result, computed)`` on this process, for stored results first
            (``computed=False``), then for each computed one after ``save``.
        per_unit: keys a worker computes per unit.
        group: units never mix keys of different groups (e.g. of different models).
        load: a stored result, or ``None`` when the key must be computed.
        save: writes a computed result to the store (before ``deliver``).
        progress: a bar over the computed keys (``None``: when there are two or more).
    """
    if per_unit < 1:
        raise TLRewardError(f"units must hold at least one chunk, got {per_unit}")
    done: set[K] = set()
    todo: list[K] = []
    for k in keys:
        stored = load(k) if load is not None else None
        if stored is None:
            todo.append(k)
        elif k not in done:
            done.add(k)
            deliver(k, stored, False)
    runs = groupby(todo, key=group or (lambda k: None))  # consecutive keys of one group
    units = [u for _, run in runs for u in batched(list(run), per_unit)]
    with tqdm(total=len(todo), desc=desc, unit=unit,
              disable=not progress if progress is not None else len(todo) < 2) as bar:

        def arrive(i: int, results: Sequence[Any]) -> None:
            for k, result in zip(units[i], results, strict=True):
                if k in done:  # a retried unit's chunk that had already arrived
                    continue
                if save is not None:
                    save(k, result)
                done.add(k)
                bar.update(1)
                deliver(k, result, True)

        if units:
            pool.stream(fn, [unit_args(u) for u in units], arrive)
    if len(done) != len(set(keys)):  # every chunk read or computed, once
        raise TLRewardError(f"internal error: {len(set(keys)) - len(done)} {unit}s of the "
                            f"{desc} job got no result")
