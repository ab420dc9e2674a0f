"""Many vocabulary sweeps (models x prompts x vocabulary shards) on one process or a Ray cluster.

A :class:`SweepJob` is one sweep file: a model (hub name or local directory, loaded by each
worker), its prompts and candidate ids. :func:`run_sweeps` runs every job's chunks (a forward
batch and a part file of :mod:`tl_reward.sweep.store` each) through
:func:`~tl_reward.scale.jobs.run_chunked` and finishes a job's file when its last chunk is in,
byte-identical to :func:`~tl_reward.sweep.vocab_sweep.score_vocabulary`'s (same batch size and
threads). A rerun skips the chunks on disk. Plain actors, not Ray Data: its blocks and file
names cannot give numbered chunks, each written once by the driver.

Example:
    >>> jobs = [SweepJob(m, f"{m.split('/')[-1]}.parquet") for m in ["org/rm-a", "org/rm-b"]]
    >>> run_sweeps(jobs, RayExecutor(num_gpus=1))      # or LocalExecutor()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from tl_reward.errors import TLRewardError
from tl_reward.scale.executors import (
    Executor,
    LocalExecutor,
    ModelSpec,
    Pool,
    RayExecutor,
    RayNotInstalledError,
    Worker,
)
from tl_reward.scale.jobs import run_chunked
from tl_reward.store import digest
from tl_reward.sweep.store import SweepSpec, SweepWriter
from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, plan_sweep, prefix_caches, score_chunk

__all__ = ["LocalExecutor", "RayExecutor", "RayNotInstalledError", "SweepJob", "run_sweeps"]


@dataclass(frozen=True)
class SweepJob:
    """One sweep file: ``model`` (hub name or local directory) over ``prompts``.

    The remaining fields are :func:`~tl_reward.sweep.vocab_sweep.score_vocabulary`'s
    (``prompts=None`` means the paper's three prompts); ``dtype`` is the model's.
    """

    model: str
    output: str | Path
    prompts: Any = None
    labels: tuple[str, ...] | None = None
    ids: tuple[int, ...] | None = None
    include_special: bool = False
    batch_size: int = 128
    mode: str = "ids"
    cache: str = "auto"
    dtype: str = "float32"
    shard: tuple[int, int] | None = None
    id_range: tuple[int, int] | None = None
    trust_remote_code: bool = False


def _plan(worker: Worker, job: SweepJob) -> tuple[Any, Any, list[Any]]:
    """The worker's model, the job's plan and its prefix caches (kept on the worker)."""
    model = worker.model(ModelSpec(job.model, job.dtype, job.trust_remote_code))
    key = ("sweep", digest(asdict(job)))  # everything that determines its rows; a Path as text
    if key not in worker.state:
        worker.state[key] = (plan_sweep(
            model, PAPER_PROMPTS if job.prompts is None else job.prompts,
            None if job.ids is None else list(job.ids), labels=job.labels,
            include_special=job.include_special, batch_size=job.batch_size, mode=job.mode,
            cache=job.cache, shard=job.shard, id_range=job.id_range), [])
    return (model, *worker.state[key])


def plan_job(worker: Worker, job: SweepJob) -> tuple[SweepSpec, int]:
    """The job's spec and number of chunks (run on a worker)."""
    _, plan, _ = _plan(worker, job)
    return plan.spec, len(plan.chunks)


def score_unit(worker: Worker, job: SweepJob, chunks: Sequence[int]) -> list[pa.Table]:
    """Score ``chunks`` of ``job`` (run on a worker): their rows, in order."""
    model, plan, caches = _plan(worker, job)
    if not caches:
        caches.extend(prefix_caches(model, plan))
    out = []
    for i, c in enumerate(chunks):
        worker.checkpoint(i, len(chunks))
        out.append(score_chunk(model, plan, caches, c))
    return out


def _run(pool: Pool, group: Sequence[SweepJob], overwrite: bool, unit_chunks: int,
         progress: bool | None, callback: Callable[[SweepJob, int], None] | None) -> None:
    """Plan ``group`` on the workers, then score its missing chunks (units never mix jobs)."""
    writers, missing = [], []
    for job, (spec, n) in zip(group, pool.gather(plan_job, [(j,) for j in group]), strict=True):
        writers.append(SweepWriter(job.output, spec, n, resume=True, overwrite=overwrite))
        missing.append(set(range(n)) - writers[-1].done())
        if not missing[-1]:
            writers[-1].finish()

    def deliver(key: tuple[int, int], table: Any, new: bool) -> None:
        j, c = key
        if new:
            missing[j].discard(c)
            if callback is not None:
                callback(group[j], c)
            if not missing[j]:
                writers[j].finish()

    run_chunked(pool, score_unit, [(j, c) for j, w in enumerate(writers)
                                   for c in range(w.n_chunks)],
                lambda u: (group[u[0][0]], [c for _, c in u]), deliver,
                per_unit=unit_chunks, group=lambda k: k[0],
                load=lambda k: None if k[1] in missing[k[0]] else True,
                save=lambda k, table: writers[k[0]].write(k[1], table),
                desc="sweeps", progress=progress)


def run_sweeps(
    jobs: Sequence[SweepJob] | SweepJob, executor: Executor | None = None, *,
    unit_chunks: int = 4, overwrite: bool = False, progress: bool | None = None,
    callback: Callable[[SweepJob, int], None] | None = None,
) -> list[Path]:
    """Run every job to its finished sweep file and return the files' paths.

    Args:
        jobs: the sweeps (outputs must differ).
        executor: :class:`LocalExecutor` (default) or :class:`RayExecutor`.
        unit_chunks: chunks per unit of work (a unit is what one worker scores at a time).
        overwrite: discard earlier files and parts instead of resuming them.
        progress: one progress bar over all jobs (chunks written).
        callback: called as ``callback(job, chunk)`` after each chunk is written.
    """
    jobs = [jobs] if isinstance(jobs, SweepJob) else list(jobs)
    outputs = [str(Path(j.output).resolve()) for j in jobs]
    if len(set(outputs)) != len(outputs):
        raise TLRewardError("two jobs write the same output file; give each job its own")
    if unit_chunks < 1:
        raise TLRewardError(f"unit_chunks must be positive, got {unit_chunks}")
    with (executor or LocalExecutor()).session() as pool:
        for group in [[j] for j in jobs] if pool.n_workers == 1 else [jobs]:
            _run(pool, group, overwrite, unit_chunks, progress, callback)
    return [Path(j.output) for j in jobs]

