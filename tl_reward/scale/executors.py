"""Where the units of a long job run: this process, or a pool of Ray actors.

A job's driver (:func:`~tl_reward.scale.jobs.run_chunked`) hands out *units*, small independent
pieces whose results it alone writes (workers need no shared file system). Units run on
:class:`LocalExecutor` (one in-process :class:`Worker`) or :class:`RayExecutor` (a pool of
:class:`Worker` Ray actors with ``max_restarts=-1``, two units in flight per actor, a dead
actor's unit handed out again). Workers receive a :class:`ModelSpec`, never a loaded model, and
plan jobs too, so the driver never loads the model; a job given a loaded model wraps it in
:class:`Loaded` for an in-process worker (:func:`as_spec`). A unit is a module-level
``fn(worker, *args)`` that gets the model from :meth:`Worker.model`; :attr:`Worker.state` keeps
per-model state (plans, prefix caches) between units. A started pool is itself an executor::

    >>> with RayExecutor(num_gpus=1).session() as pool:
    ...     probes = run_probes("org/rm", items, executor=pool)
    ...     report = run_faithfulness("org/rm", pairs, executor=pool)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tl_reward.errors import TLRewardError


class RayNotInstalledError(TLRewardError):
    """The Ray executor was asked for but ``ray`` is not installed."""


@dataclass(frozen=True)
class ModelSpec:
    """What a worker loads: ``model`` (hub name or local directory) in ``dtype``."""

    model: str
    dtype: str = "float32"
    trust_remote_code: bool = False

    def load(self, device: str) -> Any:
        """``HookedRewardModel.from_pretrained(model)`` on ``device`` in ``dtype``."""
        from tl_reward import HookedRewardModel

        return HookedRewardModel.from_pretrained(self.model, device=device,
                                                 dtype=getattr(torch, self.dtype),
                                                 trust_remote_code=self.trust_remote_code)


@dataclass(frozen=True, eq=False)
class Loaded:
    """A model already loaded in this process, for an in-process worker (the single-process
    analyses run their jobs this way; it cannot be sent to Ray)."""

    model: Any

    def load(self, device: str) -> Any:
        """The model itself, wherever it is."""
        return self.model


Spec = ModelSpec | Loaded


def as_spec(model: Any) -> Spec:
    """``model`` as a spec: a spec as is, a hub name / local directory as a float32
    :class:`ModelSpec`, anything else (a loaded model) as :class:`Loaded`."""
    if isinstance(model, (ModelSpec, Loaded)):
        return model
    return ModelSpec(str(model)) if isinstance(model, (str, Path)) else Loaded(model)


class Worker:
    """Runs units; keeps one model (and that model's :attr:`state`) between units.

    Used in-process by :class:`LocalExecutor` and as a Ray actor by :class:`RayExecutor`.

    Args:
        threads: torch CPU threads while this worker runs a call, a unit or :meth:`info`
            (``None``: leave as is); the calling process's count is restored after each, so
            an in-process worker does not change it for the caller.
        device: ``None`` picks CUDA when a GPU is visible (on Ray: assigned), else CPU.
        crash_after_units: test hook: the process exits (``os._exit``) in the middle of its
            n-th unit (at the :meth:`checkpoint` halfway through it), once (a restarted Ray
            actor does not crash again), first creating a file in the folder ``crash_marker``;
            :meth:`arm_crash` arms a running worker the same way.
    """

    def __init__(self, threads: int | None = None, device: str | None = None,
                 crash_after_units: int | None = None, crash_marker: str | None = None) -> None:
        self.threads = threads
        self.device = device or ("cuda" if torch.cuda.is_available() and _gpu_ids() else "cpu")
        self._model_key: Any = None
        self._model: Any = None
        self.state: dict[Any, Any] = {}
        self._crash_after = crash_after_units
        self._crash_marker = crash_marker
        self._armed_here = False
        self._units = 0

    @contextmanager
    def _threads(self) -> Iterator[None]:
        """Torch at :attr:`threads` CPU threads inside, the caller's count restored after."""
        before = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            if torch.get_num_threads() != before:
                torch.set_num_threads(before)

    def info(self) -> dict[str, Any]:
        """Where this worker runs: process id, device, Ray GPU ids, torch threads in a unit."""
        with self._threads():
            return {"pid": os.getpid(), "device": self.device, "gpu_ids": _gpu_ids(),
                    "threads": torch.get_num_threads()}

    def model(self, spec: Spec) -> Any:
        """The model of ``spec``, loaded at most once while consecutive units use it (one model
        in memory at a time; :attr:`state` is cleared when the model changes)."""
        if spec != self._model_key:
            self._model, self.state = None, {}
            self._model = spec.load(self.device)
            self._model_key = spec
        return self._model

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(self, *args)``: a planning call (not counted as a unit)."""
        with self._threads():
            return fn(self, *args)

    def unit(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(self, *args)``: one unit of work."""
        self._units += 1
        return self.call(fn, *args)

    def arm_crash(self, after_units: int, marker: str | None = None) -> None:
        """Test hook: exit in the middle of the ``after_units``-th unit from now, as
        ``crash_after_units``; the actor Ray restarts comes back unarmed."""
        self._crash_after, self._crash_marker = self._units + after_units, marker
        self._armed_here = True

    def checkpoint(self, i: int, n: int) -> None:
        """Called by units at step ``i`` of ``n``: the crash hook fires halfway through."""
        if (self._units == self._crash_after and i == n // 2
                and (self._armed_here or not _restarted())):
            if self._crash_marker:
                Path(self._crash_marker, f"crashed-{os.getpid()}").touch()
            os._exit(1)


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


class Pool:
    """A started executor: runs planning calls and streams units (see :meth:`stream`)."""

    n_workers: int = 1

    @contextmanager
    def session(self) -> Iterator[Pool]:
        """This pool itself, so a started pool can be passed as the executor of several jobs
        (its workers, and the model each holds, are kept between them)."""
        yield self

    def gather(self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``fn(worker, *args)`` for every ``args`` in ``calls`` (spread over the workers),
        results in the order of ``calls``."""
        raise NotImplementedError

    def stream(self, fn: Callable[..., Any], units: Sequence[tuple[Any, ...]],
               on_result: Callable[[int, Any], None]) -> None:
        """Run ``fn(worker, *args)`` for every unit; ``on_result(index, result)`` on this
        process as each finishes (in any order; exactly once per unit). Units are handed out in
        order (keep a model's units together so each worker loads it once)."""
        raise NotImplementedError


class _LocalPool(Pool):
    """One in-process :class:`Worker`; units run in order."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def gather(self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        return [self.worker.call(fn, *args) for args in calls]

    def stream(self, fn: Callable[..., Any], units: Sequence[tuple[Any, ...]],
               on_result: Callable[[int, Any], None]) -> None:
        for i, args in enumerate(units):
            on_result(i, self.worker.unit(fn, *args))


class _RayPool(Pool):
    """Ray actors running :class:`Worker`; a unit whose actor died is handed out again."""

    def __init__(self, ray: Any, actors: list[Any], max_unit_retries: int) -> None:
        self.ray, self.actors, self.max_unit_retries = ray, actors, max_unit_retries
        self.n_workers = len(actors)
        self.resubmitted = 0  # units handed out again because their actor died
        self.restart_timeout_s = 600.0  # how long a dead actor may take to come back

    def arm_crash(self, after_units: int, marker: str | None = None) -> None:
        """Test hook: every actor exits in the middle of its ``after_units``-th unit from now
        (:meth:`Worker.arm_crash`), so a test kills a running pool's workers without starting
        a crashing pool of its own."""
        self.ray.get([a.arm_crash.remote(after_units, marker) for a in self.actors])

    def gather(self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        n = len(self.actors)
        return self.ray.get([self.actors[i % n].call.remote(fn, *args)
                             for i, args in enumerate(calls)])

    def stream(self, fn: Callable[..., Any], units: Sequence[tuple[Any, ...]],
               on_result: Callable[[int, Any], None]) -> None:
        ray = self.ray
        dead = tuple(getattr(ray.exceptions, n) for n in ("RayActorError", "ActorUnavailableError")
                     if hasattr(ray.exceptions, n))  # died, or restarting when handed the unit
        queue = [(i, 0) for i in reversed(range(len(units)))]  # pop() hands out in order
        # ref -> (actor, unit index or _PING, tries or the time the actor was first pinged)
        inflight: dict[Any, tuple[Any, int, float]] = {}
        idle = list(self.actors) * 2  # two units in flight per actor: the next one is queued
        while queue or any(i != _PING for _, i, _ in inflight.values()):
            while queue and idle:
                a = idle.pop(0)
                i, tries = queue.pop()
                inflight[a.unit.remote(fn, *units[i])] = (a, i, tries)
            done, _ = ray.wait(list(inflight), num_returns=1)
            a, i, tries = inflight.pop(done[0])
            if i == _PING:  # a restarting actor's slot comes back once it answers
                try:
                    ray.get(done[0])
                    idle.append(a)
                except dead:
                    if time.monotonic() - tries > self.restart_timeout_s:
                        raise
                    time.sleep(0.1)
                    inflight[a.info.remote()] = (a, _PING, tries)
                continue
            try:
                result = ray.get(done[0])
            except dead:
                if tries >= self.max_unit_retries:
                    raise
                self.resubmitted += 1
                queue.append((i, int(tries) + 1))
                # Ray restarts it (max_restarts=-1); hand it no unit until it answers
                inflight[a.info.remote()] = (a, _PING, time.monotonic())
                continue
            idle.append(a)
            on_result(i, result)


_PING = -1


@dataclass
class LocalExecutor:
    """Runs every unit in this process (no Ray), one after another.

    Args:
        threads: torch CPU threads while a unit runs (``None``: leave as is); this process's
            own count is restored after every unit and planning call.
        device: ``None``: CUDA if available, else CPU.
    """

    threads: int | None = None
    device: str | None = None

    @contextmanager
    def session(self) -> Iterator[Pool]:
        """One in-process worker for the duration of a job."""
        yield _LocalPool(Worker(self.threads, self.device or (
            "cuda" if torch.cuda.is_available() else "cpu")))


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
        max_unit_retries: resubmissions of a unit whose actor died (by this process).
        max_task_retries: Ray's own retries of a dead actor's queued units on its restarted
            process (-1: no limit, the default); with 0 every such unit comes back to this
            process as failed and is resubmitted here (``max_unit_retries``).
        crash_after_units, crash_marker: test hooks, see :class:`Worker`.
        init_kwargs: extra ``ray.init`` arguments when this executor starts Ray.
    """

    address: str | None = None
    num_workers: int | None = None
    num_gpus: float = 0
    num_cpus: float = 1
    threads: int | None = None
    max_unit_retries: int = 3
    max_task_retries: int = -1
    crash_after_units: int | None = None
    crash_marker: str | None = None
    init_kwargs: dict[str, Any] = field(default_factory=dict)

    @contextmanager
    def session(self) -> Iterator[Pool]:
        """A fresh actor pool for the duration of a job (killed at the end); each actor loads
        the model at its first unit."""
        try:
            import ray
        except ImportError as exc:
            raise RayNotInstalledError(
                "the Ray executor needs Ray: pip install \"tl-reward[ray]\" (or pip install ray), "
                "or run with LocalExecutor / without --ray") from exc
        if not ray.is_initialized():
            kw = {"include_dashboard": False, "log_to_driver": False, **self.init_kwargs}
            ray.init(address=self.address, **kw)
        n = self.num_workers
        if n is None:
            res = ray.cluster_resources()
            n = max(1, int(res.get("GPU", 0) // self.num_gpus) if self.num_gpus
                    else int(res.get("CPU", 1) // max(self.num_cpus, 1e-9)))
        actor = ray.remote(Worker).options(
            num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_restarts=-1,
            max_task_retries=self.max_task_retries)
        threads = self.threads or max(1, int(self.num_cpus))
        actors = [actor.remote(threads, None, self.crash_after_units, self.crash_marker)
                  for _ in range(n)]
        try:
            yield _RayPool(ray, actors, self.max_unit_retries)
        finally:
            for a in actors:
                ray.kill(a)


Executor = LocalExecutor | RayExecutor | Pool


def batched(items: Sequence[Any], size: int) -> list[list[Any]]:
    """``items`` in consecutive groups of ``size`` (the last may be shorter)."""
    return [list(items[i: i + size]) for i in range(0, len(items), size)]
