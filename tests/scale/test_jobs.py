"""The one chunked-job driver (run_chunked) on toy pools: no model, no Ray."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tl_reward.errors import TLRewardError
from tl_reward.scale.executors import Pool, Worker
from tl_reward.scale.jobs import run_chunked


def square(worker: Worker, keys: Sequence[int]) -> list[int]:
    return [k * k for k in keys]


class ScriptedPool(Pool):
    """Runs units in a given order; may run some twice (a retried unit) or drop some."""

    def __init__(self, order: Callable[[int], list[int]]) -> None:
        self.worker, self.order, self.units = Worker(), order, []

    def stream(self, fn: Callable[..., Any], units: Sequence[tuple[Any, ...]],
               on_result: Callable[[int, Any], None]) -> None:
        self.units = list(units)
        for i in self.order(len(units)):
            on_result(i, self.worker.unit(fn, *units[i]))


def run(pool: Pool, keys: list[int], store: dict[int, int], **kw: Any
        ) -> list[tuple[int, int, bool]]:
    got: list[tuple[int, int, bool]] = []
    run_chunked(pool, square, keys, lambda u: (u,), lambda k, r, new: got.append((k, r, new)),
                load=store.get, save=store.__setitem__, progress=False, **kw)
    return got


def test_stored_first_then_computed_once_each_in_arrival_order() -> None:
    store = {2: 4, 5: 25}
    pool = ScriptedPool(lambda n: [*reversed(range(n)), 0])  # last unit first, unit 0 twice
    got = run(pool, list(range(7)), store, per_unit=2)
    assert got[:2] == [(2, 4, False), (5, 25, False)]  # read, not computed
    assert [u[0] for u in pool.units] == [[0, 1], [3, 4], [6]]  # only missing keys computed
    assert got[2:] == [(6, 36, True), (3, 9, True), (4, 16, True), (0, 0, True), (1, 1, True)]
    assert store == {k: k * k for k in range(7)}  # every computed result written


def test_units_never_mix_groups() -> None:
    pool = ScriptedPool(lambda n: list(range(n)))
    run(pool, [10, 11, 12, 20, 21, 30], {}, per_unit=2, group=lambda k: k // 10)
    assert [u[0] for u in pool.units] == [[10, 11], [12], [20, 21], [30]]
    pool = ScriptedPool(lambda n: list(range(n)))
    run(pool, [10, 11, 12, 20, 21, 30], {}, per_unit=2)  # without groups: they would mix
    assert [u[0] for u in pool.units] == [[10, 11], [12, 20], [21, 30]]


def test_a_lost_unit_raises_and_leaves_the_rest_written() -> None:
    store: dict[int, int] = {}
    with pytest.raises(TLRewardError, match="2 chunks of the chunks job got no result"):
        run(ScriptedPool(lambda n: list(range(1, n))), list(range(5)), store, per_unit=2)
    assert store == {2: 4, 3: 9, 4: 16}
    with pytest.raises(TLRewardError, match="at least one"):
        run(ScriptedPool(lambda n: []), [1], {}, per_unit=0)
