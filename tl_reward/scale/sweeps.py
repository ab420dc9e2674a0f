"""Many vocabulary sweeps (models x prompts x vocabulary shards) on one process or a Ray cluster.

A :class:`SweepJob` is one sweep file: a model (hub name or local directory, loaded by each
worker), its prompts and its candidate ids. :func:`run_sweeps` splits every job into units of a
few chunks (one chunk = one forward batch = one part file of the resumable parquet store,
:mod:`tl_reward.sweep.store`), scores the units where the executor puts them and writes each
chunk as it arrives; a job's file is finished (sorted, spec in its metadata) when its last chunk
is in. The executor decides where units run:

* :class:`LocalExecutor`: this process, one model at a time (no Ray needed);
* :class:`RayExecutor`: a pool of Ray actors, one model load per actor (and per GPU with
  ``num_gpus=1``), on a local or remote cluster (``address``).

(Both live in :mod:`tl_reward.scale.executors`, shared with the other long jobs.)

Both write the same bytes as :func:`~tl_reward.sweep.vocab_sweep.score_vocabulary` with the
same arguments (same batch size, same torch threads). Resuming: run the same call again;
chunks already on disk are skipped, so after a killed worker (Ray restarts the actor and retries
its unit) or a killed driver (nothing but finished chunks is on disk) no row is lost or written
twice.

Why Ray actors and not Ray Data's ``map_batches`` with an ``ActorPoolStrategy``: an actor pool
would also load the model once per actor, but the sink here is the sweep store's numbered
chunks, written exactly once each and skipped on resume. Ray Data writes its own blocks to its
own file names, with no notion of which chunks a previous run finished, and its block
boundaries are not the sweep's batches, so neither resumption by chunk nor byte-identity with a
single-process run would hold. Plain actors give that control in a few lines: the driver hands
out (job, chunks) units, actors keep each prompt's prefix cache between units, a dead actor is
restarted by Ray (``max_restarts=-1``) and its unit retried (``max_task_retries=-1``), and the
driver is the only writer, so the store needs no shared file system.

Example:
    >>> jobs = [SweepJob(m, f"{m.split('/')[-1]}.parquet") for m in ["org/rm-a", "org/rm-b"]]
    >>> run_sweeps(jobs, RayExecutor(num_gpus=1))      # or LocalExecutor()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from tqdm.auto import tqdm

from tl_reward.errors import TLRewardError
from tl_reward.scale.executors import (
    Executor,
    LocalExecutor,
    ModelSpec,
    Pool,
    RayExecutor,
    RayNotInstalledError,
    Worker,
    batched,
)
from tl_reward.store import digest
from tl_reward.sweep.store import SweepSpec, SweepWriter

__all__ = ["LocalExecutor", "RayExecutor", "RayNotInstalledError", "SweepJob", "jobs_from",
           "run_sweeps"]


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

    def spec(self) -> ModelSpec:
        """What a worker loads."""
        return ModelSpec(self.model, self.dtype, self.trust_remote_code)

    def key(self) -> str:
        """A stable identifier of the job (everything that determines its rows)."""
        raw = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}
        return digest(raw)


def load_model(job: SweepJob, device: str) -> Any:
    """``HookedRewardModel.from_pretrained(job.model)`` on ``device`` in the job's dtype."""
    return job.spec().load(device)


def _plan(worker: Worker, job: SweepJob) -> tuple[Any, Any, list[Any]]:
    """The worker's model, the job's plan and its prefix caches (kept on the worker)."""
    from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, plan_sweep

    model = worker.model(job.spec())
    if ("sweep", job.key()) not in worker.state:
        plan = plan_sweep(model, PAPER_PROMPTS if job.prompts is None else job.prompts,
                          None if job.ids is None else list(job.ids),
                          labels=job.labels, include_special=job.include_special,
                          batch_size=job.batch_size, mode=job.mode, cache=job.cache,
                          shard=job.shard, id_range=job.id_range)
        worker.state[("sweep", job.key())] = (plan, [])
    plan, caches = worker.state[("sweep", job.key())]
    return model, plan, caches


def plan_job(worker: Worker, job: SweepJob) -> tuple[SweepSpec, int]:
    """The job's spec and number of chunks (run on a worker)."""
    _, plan, _ = _plan(worker, job)
    return plan.spec, len(plan.bounds)


def score_unit(worker: Worker, job: SweepJob, chunks: Sequence[int]
               ) -> list[tuple[int, pa.Table]]:
    """Score ``chunks`` of ``job`` (run on a worker): ``(chunk index, rows)`` each."""
    from tl_reward.sweep.vocab_sweep import prefix_caches, score_chunk

    model, plan, caches = _plan(worker, job)
    if not caches:
        caches.extend(prefix_caches(model, plan))
    out = []
    for i, c in enumerate(chunks):
        worker.checkpoint(i, len(chunks))
        out.append((c, score_chunk(model, plan, caches, c)))
    return out


@dataclass
class _Book:
    """The driver's side of one job: its writer and which chunks are still missing."""

    job: SweepJob
    spec: SweepSpec
    writer: SweepWriter
    missing: set[int]
    rows: int = 0


class _Driver:
    """Opens each job's store, writes chunks as they arrive, finishes files, shows progress."""

    def __init__(self, overwrite: bool, progress: bool | None, callback: Any) -> None:
        self.overwrite = overwrite
        self.books: list[_Book] = []
        self.bar = tqdm(total=0, unit="id", disable=progress is False, smoothing=0.1,
                        desc="sweeps", dynamic_ncols=True)
        self.callback = callback

    def open(self, job: SweepJob, spec: SweepSpec, n_chunks: int) -> _Book:
        writer = SweepWriter(job.output, spec, n_chunks, resume=True, overwrite=self.overwrite)
        lo, hi = spec.id_range
        book = _Book(job, spec, writer, set(range(n_chunks)) - writer.done())
        self.books.append(book)
        self.bar.total += len(book.missing)
        self.bar.refresh()
        if not book.missing:
            writer.finish()
        return book

    def write(self, book: _Book, chunk: int, table: pa.Table) -> None:
        if chunk not in book.missing:  # a retried unit that had already been written
            return
        book.writer.write(chunk, table)
        book.missing.discard(chunk)
        self.bar.update(1)
        if self.callback is not None:
            self.callback(book.job, chunk)
        if not book.missing:
            book.writer.finish()

    def close(self) -> list[Path]:
        self.bar.close()
        return [b.writer.path for b in self.books]


def _units(chunks: set[int], size: int) -> list[list[int]]:
    return batched(sorted(chunks), size)


def _run(pool: Pool, jobs: Sequence[SweepJob], driver: _Driver, unit_chunks: int) -> None:
    """Plan the jobs on the workers, then stream their units; one worker: job after job."""
    groups = [[j] for j in jobs] if pool.n_workers == 1 else [list(jobs)]
    for group in groups:
        units: list[tuple[_Book, list[int]]] = []
        for job, (spec, n) in zip(group, pool.gather(plan_job, [(j,) for j in group]),
                                  strict=True):
            book = driver.open(job, spec, n)
            units += [(book, u) for u in _units(book.missing, unit_chunks)]

        def write(i: int, results: list[tuple[int, pa.Table]],
                  units: list[tuple[_Book, list[int]]] = units) -> None:
            for c, table in results:
                driver.write(units[i][0], c, table)

        pool.stream(score_unit, [(book.job, u) for book, u in units], write)


def run_sweeps(
    jobs: Sequence[SweepJob] | SweepJob,
    executor: Executor | None = None,
    *,
    unit_chunks: int = 4,
    overwrite: bool = False,
    progress: bool | None = None,
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
    driver = _Driver(overwrite, progress, callback)
    try:
        with (executor or LocalExecutor()).session() as pool:
            _run(pool, jobs, driver, unit_chunks)
    finally:
        paths = driver.close()
    return paths


def jobs_from(models: Sequence[str], prompts: Mapping[str, Any] | None, output_dir: str | Path,
              **kwargs: Any) -> list[SweepJob]:
    """One job per model writing ``<output_dir>/<model name>.parquet``."""
    out = Path(output_dir)
    return [SweepJob(m, out / f"{Path(m).name or 'model'}.parquet", prompts, **kwargs)
            for m in models]
