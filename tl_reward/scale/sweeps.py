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

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
from tqdm.auto import tqdm

from tl_reward.errors import TLRewardError
from tl_reward.sweep.store import SweepSpec, SweepWriter


class RayNotInstalledError(TLRewardError):
    """The Ray executor was asked for but ``ray`` is not installed."""


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

    def key(self) -> str:
        """A stable identifier of the job (everything that determines its rows)."""
        raw = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}
        return hashlib.sha1(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()


def load_model(job: SweepJob, device: str) -> Any:
    """``HookedRewardModel.from_pretrained(job.model)`` on ``device`` in the job's dtype."""
    from tl_reward import HookedRewardModel

    return HookedRewardModel.from_pretrained(job.model, device=device,
                                             dtype=getattr(torch, job.dtype),
                                             trust_remote_code=job.trust_remote_code)


class SweepWorker:
    """Scores units of sweep jobs; keeps one model and each job's plan and prefix caches.

    Used in-process by :class:`LocalExecutor` and as a Ray actor by :class:`RayExecutor`.

    Args:
        threads: torch CPU threads (``None``: leave as is).
        device: ``None`` picks CUDA when a GPU is visible (on Ray: assigned), else CPU.
        crash_after_units: test hook: the process exits (``os._exit``) in the middle of its
            n-th unit, once (a restarted Ray actor does not crash again), first creating a
            file in the folder ``crash_marker`` if given.
    """

    def __init__(self, threads: int | None = None, device: str | None = None,
                 crash_after_units: int | None = None, crash_marker: str | None = None) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.device = device or ("cuda" if torch.cuda.is_available() and _gpu_ids() else "cpu")
        self._model_key: tuple[str, str] | None = None
        self._model: Any = None
        self._jobs: dict[str, tuple[Any, list[Any]]] = {}
        self._crash_after = crash_after_units
        self._crash_marker = crash_marker
        self._units = 0

    def info(self) -> dict[str, Any]:
        """Where this worker runs: process id, device, Ray GPU ids, torch threads."""
        return {"pid": os.getpid(), "device": self.device, "gpu_ids": _gpu_ids(),
                "threads": torch.get_num_threads()}

    def _model_for(self, job: SweepJob) -> Any:
        key = (job.model, job.dtype)
        if key != self._model_key:
            self._model, self._jobs = None, {}  # one model in memory at a time
            self._model = load_model(job, self.device)
            self._model_key = key
        return self._model

    def _plan(self, job: SweepJob) -> tuple[Any, Any]:
        from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, plan_sweep

        model = self._model_for(job)
        if job.key() not in self._jobs:
            plan = plan_sweep(model, PAPER_PROMPTS if job.prompts is None else job.prompts,
                              None if job.ids is None else list(job.ids),
                              labels=job.labels, include_special=job.include_special,
                              batch_size=job.batch_size, mode=job.mode, cache=job.cache,
                              shard=job.shard, id_range=job.id_range)
            self._jobs[job.key()] = (plan, [])
        return model, self._jobs[job.key()]

    def plan(self, job: SweepJob) -> tuple[SweepSpec, int]:
        """The job's spec and number of chunks."""
        _, (plan, _) = self._plan(job)
        return plan.spec, len(plan.bounds)

    def score(self, job: SweepJob, chunks: Sequence[int]) -> list[tuple[int, pa.Table]]:
        """Score ``chunks`` of ``job``: ``(chunk index, rows)`` each."""
        from tl_reward.sweep.vocab_sweep import prefix_caches, score_chunk

        model, (plan, caches) = self._plan(job)
        if not caches:
            caches.extend(prefix_caches(model, plan))
        self._units += 1
        out = []
        for i, c in enumerate(chunks):
            if self._units == self._crash_after and i == len(chunks) // 2 and not _restarted():
                if self._crash_marker:
                    Path(self._crash_marker, f"crashed-{os.getpid()}").touch()
                os._exit(1)
            out.append((c, score_chunk(model, plan, caches, c)))
        return out


def _gpu_ids() -> list[Any]:
    try:
        import ray

        return list(ray.get_gpu_ids()) if ray.is_initialized() else []
    except ImportError:
        return []


def _restarted() -> bool:
    try:
        import ray

        return bool(ray.is_initialized()
                    and ray.get_runtime_context().was_current_actor_reconstructed)
    except ImportError:
        return False


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
    todo = sorted(chunks)
    return [todo[i : i + size] for i in range(0, len(todo), size)]


@dataclass
class LocalExecutor:
    """Runs every unit in this process (no Ray), job after job.

    Args:
        threads: torch CPU threads (``None``: leave as is).
        device: ``None``: CUDA if available, else CPU.
    """

    threads: int | None = None
    device: str | None = None

    def run(self, jobs: Sequence[SweepJob], driver: _Driver, unit_chunks: int) -> None:
        worker = SweepWorker(self.threads, self.device or (
            "cuda" if torch.cuda.is_available() else "cpu"))
        for job in jobs:
            spec, n = worker.plan(job)
            book = driver.open(job, spec, n)
            for unit in _units(book.missing, unit_chunks):
                for c, table in worker.score(job, unit):
                    driver.write(book, c, table)


@dataclass
class RayExecutor:
    """Runs units on a pool of Ray actors (``pip install "tl-reward[ray]"``).

    Args:
        address: the cluster (``"auto"``, ``"ray://host:10001"``); ``None`` connects to a
            running ``ray.init`` or starts a local one.
        num_workers: actors in the pool (default: as many as the cluster's GPUs, or CPUs, allow).
        num_gpus: GPUs per actor (1 puts one model on each GPU; 0 for CPU workers).
        num_cpus: CPUs per actor.
        threads: torch threads per actor (default: ``num_cpus``).
        max_unit_retries: resubmissions of a unit whose actor died for good.
        crash_after_units, crash_marker: test hooks, see :class:`SweepWorker`.
        init_kwargs: extra ``ray.init`` arguments when this executor starts Ray.
    """

    address: str | None = None
    num_workers: int | None = None
    num_gpus: float = 0
    num_cpus: float = 1
    threads: int | None = None
    max_unit_retries: int = 3
    crash_after_units: int | None = None
    crash_marker: str | None = None
    init_kwargs: dict[str, Any] = field(default_factory=dict)

    def _ray(self) -> Any:
        try:
            import ray
        except ImportError as exc:
            raise RayNotInstalledError(
                "the Ray executor needs Ray: pip install \"tl-reward[ray]\" (or pip install ray), "
                "or run with LocalExecutor / without --ray") from exc
        if not ray.is_initialized():
            kw = {"include_dashboard": False, "log_to_driver": False, **self.init_kwargs}
            ray.init(address=self.address, **kw)
        return ray

    def workers(self) -> list[Any]:
        """Start the actor pool (one model load per actor happens at its first unit)."""
        ray = self._ray()
        n = self.num_workers
        if n is None:
            res = ray.cluster_resources()
            n = (int(res.get("GPU", 0) // self.num_gpus) if self.num_gpus
                 else int(res.get("CPU", 1) // max(self.num_cpus, 1e-9)))
            n = max(1, n)
        actor = ray.remote(SweepWorker).options(
            num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_restarts=-1,
            max_task_retries=-1)
        threads = self.threads or max(1, int(self.num_cpus))
        return [actor.remote(threads, None, self.crash_after_units, self.crash_marker)
                for _ in range(n)]

    def run(self, jobs: Sequence[SweepJob], driver: _Driver, unit_chunks: int) -> None:
        ray = self._ray()
        actors = self.workers()
        try:
            self._run(ray, actors, jobs, driver, unit_chunks)
        finally:
            for a in actors:
                ray.kill(a)

    def _run(self, ray: Any, actors: list[Any], jobs: Sequence[SweepJob], driver: _Driver,
             unit_chunks: int) -> None:
        plans = ray.get([actors[i % len(actors)].plan.remote(job)
                         for i, job in enumerate(jobs)])
        queue: list[tuple[_Book, list[int], int]] = []
        for job, (spec, n) in zip(jobs, plans, strict=True):
            book = driver.open(job, spec, n)
            queue += [(book, unit, 0) for unit in _units(book.missing, unit_chunks)]
        queue.reverse()  # pop() from the end hands units out in job order (model locality)
        inflight: dict[Any, tuple[Any, _Book, list[int], int]] = {}
        idle = list(actors) * 2  # two units in flight per actor: the next one is queued
        while queue or inflight:
            while queue and idle:
                a = idle.pop(0)
                book, unit, tries = queue.pop()
                inflight[a.score.remote(book.job, unit)] = (a, book, unit, tries)
            done, _ = ray.wait(list(inflight), num_returns=1)
            a, book, unit, tries = inflight.pop(done[0])
            try:
                results = ray.get(done[0])
            except ray.exceptions.RayActorError:
                if tries >= self.max_unit_retries:
                    raise
                queue.append((book, unit, tries + 1))
                idle.append(a)  # Ray restarts it (max_restarts=-1)
                continue
            idle.append(a)
            for c, table in results:
                driver.write(book, c, table)


def run_sweeps(
    jobs: Sequence[SweepJob] | SweepJob,
    executor: LocalExecutor | RayExecutor | None = None,
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
        (executor or LocalExecutor()).run(jobs, driver, unit_chunks)
    finally:
        paths = driver.close()
    return paths


def jobs_from(models: Sequence[str], prompts: Mapping[str, Any] | None, output_dir: str | Path,
              **kwargs: Any) -> list[SweepJob]:
    """One job per model writing ``<output_dir>/<model name>.parquet``."""
    out = Path(output_dir)
    return [SweepJob(m, out / f"{Path(m).name or 'model'}.parquet", prompts, **kwargs)
            for m in models]
