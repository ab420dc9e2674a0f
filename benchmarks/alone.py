"""Run one benchmark row alone in a fresh spawned process, so its memory and time are its own."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from typing import Any


def _guarded(measure: Callable[[str, dict[str, Any], Any], None], row: str,
             args: dict[str, Any], out: Any) -> None:
    """Run ``measure`` and put its result, or the error's traceback, on ``out`` (so the parent
    never waits on a queue a failed child will not fill)."""
    try:
        measure(row, args, out)
    except BaseException:
        import traceback

        out.put({"error": traceback.format_exc()})
        raise


def run_alone(measure: Callable[[str, dict[str, Any], Any], None], row: str,
              args: dict[str, Any]) -> dict[str, Any]:
    """``measure(row, args, queue)`` in its own spawned process: what it put on the queue. A
    failed row stops the benchmark with the child's traceback."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_guarded, args=(measure, row, args, q))
    proc.start()
    got = q.get()
    proc.join()
    if "error" in got:
        raise SystemExit(f"{row!r} failed in its process:\n{got['error']}")
    return got
