"""Layer Grams (and layer x layer maps) over many inputs and models on one process or Ray.

:func:`run_layer_grams` is :func:`~tl_reward.compare.layers.layer_grams` for one or more models
with the reading of activations spread over workers. A worker plans each model (hook names,
token lengths, the model's name and fingerprint; the driver never loads a model). The driver
sorts the inputs by length exactly as ``layer_grams`` does, cuts the sorted order into the same
batches, and makes units of ``batches_per_unit`` consecutive batches per model and group of
``layer_chunk`` hook points. A worker returns each unit's activation rows (float32, the
selected positions only); the driver puts the rows back in input order and forms each hook
point's centred float64 Gram as ``layer_grams`` does, so the Grams are identical to the
single-process call's (same batches, same threads). The driver holds one hook group's rows of
one model at a time (``layer_chunk`` bounds it, as in ``layer_grams``).

Resuming: with ``cache_dir``, every unit's rows are written there (one ``.npz`` per unit, in a
:class:`~tl_reward.store.ChunkStore` folder named by the model's name, the inputs and the run's
settings) and read back on a rerun instead of being recomputed; a folder made by another model
fingerprint, tokenizer or library version is refused, naming what differs.

Example:
    >>> grams = run_layer_grams(["org/rm-a", "org/rm-b"], corpus, executor=RayExecutor(),
    ...                         cache_dir="grams_cache")
    >>> res = run_compare_layers("org/rm-a", "org/rm-b", corpus, executor=RayExecutor())
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tl_reward.compare.layers import (
    DEFAULT_HOOK,
    LayerComparison,
    LayerGrams,
    Positions,
    compare_grams,
)
from tl_reward.errors import TLRewardError
from tl_reward.scale.executors import Executor, LocalExecutor, Spec, Worker, as_spec, batched
from tl_reward.scale.jobs import run_chunked
from tl_reward.store import ChunkStore, RunIdentity, digest


def plan_grams(worker: Worker, spec: Spec, inputs: Sequence[Any],
               hook: str | Sequence[str], layers: Sequence[int] | None, cached: bool
               ) -> dict[str, Any]:
    """The model's hook names, name and (when ``cached``) part of the run identity, and the
    inputs' token lengths, response rows and digest of their ids (run on a worker)."""
    from tl_reward.compare.layers import _encode_all, hook_names, model_label

    model = worker.model(spec)
    names = hook_names(model, hook, layers)
    enc = _encode_all(model, list(inputs))
    return {"hooks": names, "label": model_label(model),
            "identity": RunIdentity.of_model("grams", model) if cached else None,
            "lengths": [len(e.ids) for e in enc],
            "response_rows": sum(len(e.ids) - (e.response_start or 0) for e in enc),
            "inputs": digest([[list(e.ids), e.response_start] for e in enc])}


def read_unit(worker: Worker, spec: Spec, batches: Sequence[Sequence[Any]],
              hooks: Sequence[str], positions: Positions
              ) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """Rows of ``hooks`` for consecutive batches of inputs (each read as one forward batch):
    rows per hook in batch order and, per row, its input's place in the flattened batches
    (run on a worker; one result: the unit is one chunk of the job)."""
    from tl_reward.compare.layers import _encode_all, read_rows

    model = worker.model(spec)
    rows: dict[str, list[np.ndarray]] = {h: [] for h in hooks}
    items, offset = [], 0
    for j, batch in enumerate(batches):
        worker.checkpoint(j, len(batches))
        enc = _encode_all(model, list(batch))
        got, item = read_rows(model, enc, hooks, positions, batch_size=len(enc))
        for h in hooks:
            rows[h].append(got[h])
        items.append(item + offset)
        offset += len(batch)
    return [({h: np.concatenate(v) for h, v in rows.items()}, np.concatenate(items))]


@dataclass
class _Group:
    """The driver's side of one (model, hook group): its units' rows until all are in."""

    job: int
    local: int  # the group's index within its model (names the unit files)
    hooks: list[str]
    units: list[int]
    results: dict[int, tuple[dict[str, np.ndarray], np.ndarray]] = field(default_factory=dict)


def _unit(group: int, unit: int) -> str:
    return f"g{group:04d}-u{unit:06d}.npz"


def _read_unit(store: ChunkStore, group: int, unit: int, hooks: Sequence[str]
               ) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
    """A unit's rows and row items from ``store`` (``None`` when not there yet)."""
    if not store.has(_unit(group, unit)):
        return None
    with np.load(store.path(_unit(group, unit))) as z:
        return {h: z[f"h{k}"] for k, h in enumerate(hooks)}, z["item"]


def _write_unit(store: ChunkStore, group: int, unit: int, hooks: Sequence[str],
                rows: dict[str, np.ndarray], item: np.ndarray) -> None:
    def save(path: Path) -> None:
        with open(path, "wb") as f:
            np.savez(f, item=item, **{f"h{k}": rows[h] for k, h in enumerate(hooks)})

    store.save(_unit(group, unit), save)


def _grams(hooks: list[str], rows: dict[str, np.ndarray]) -> np.ndarray:
    """Centred float64 Grams, computed as :func:`~tl_reward.compare.layers.layer_grams` does."""
    n = len(next(iter(rows.values())))
    grams = np.zeros((len(hooks), n, n))
    for k, h in enumerate(hooks):
        x = rows.pop(h).astype(np.float64)
        x -= x.mean(0, keepdims=True)
        grams[k] = x @ x.T
    return grams


def _run(jobs: Sequence[tuple[Spec, Sequence[int] | None]], inputs: Sequence[Any],
         hook: str | Sequence[str], positions: Positions, batch_size: int,
         layer_chunk: int | None, executor: Executor | None,
         cache_dir: str | Path | None, batches_per_unit: int, max_gram_bytes: float,
         progress: bool | None, callback: Callable[[int, int, int], None] | None
         ) -> list[LayerGrams]:
    if positions not in ("pooled", "response"):
        raise TLRewardError(f"positions must be 'pooled' or 'response', got {positions!r}")
    inputs = list(inputs)
    if len(inputs) < 4:
        raise TLRewardError(f"need at least 4 inputs to compare representations, got "
                            f"{len(inputs)}")
    if batch_size < 1:
        raise TLRewardError(f"batch_size must be positive, got {batch_size}")
    out: list[LayerGrams | None] = [None] * len(jobs)
    with (executor or LocalExecutor()).session() as pool:
        plans = pool.gather(plan_grams, [(s, inputs, hook, layers, cache_dir is not None)
                                          for s, layers in jobs])
        groups: list[_Group] = []
        units: list[tuple[int, int, list[int]]] = []  # (group, unit index, input indices)
        stores: list[ChunkStore | None] = []
        state: list[dict[str, Any]] = []
        for j, plan in enumerate(plans):
            names = plan["hooks"]
            if positions == "response":
                need = len(names) * plan["response_rows"] ** 2 * 8
                if need > max_gram_bytes:
                    raise TLRewardError(
                        f"positions='response' gives {plan['response_rows']} rows, so "
                        f"{len(names)} float64 Grams need {need / 1e9:.1f} GB (more than "
                        f"max_gram_bytes = {max_gram_bytes / 1e9:.1f} GB); use fewer or "
                        "shorter inputs, fewer layers, positions='pooled', or raise "
                        "max_gram_bytes")
            # the batches layer_grams reads: inputs sorted by length (longest first, stable)
            order = sorted(range(len(inputs)), key=lambda i: -plan["lengths"][i])
            batches = batched(order, batch_size)
            chunk = len(names) if layer_chunk is None else max(1, int(layer_chunk))
            store = None
            if cache_dir is not None:
                ident = plan["identity"].with_job(plan["inputs"], settings={
                    "hooks": names, "positions": positions, "batch_size": batch_size,
                    "layer_chunk": chunk, "batches_per_unit": batches_per_unit})
                store = ChunkStore(Path(cache_dir) / ident.folder_name(), ident)
            stores.append(store)
            state.append({"grams": np.zeros(0), "row_item": None, "left": 0})
            for g0 in range(0, len(names), chunk):
                group = _Group(j, g0 // chunk, names[g0: g0 + chunk], [])
                gi = len(groups)
                groups.append(group)
                state[j]["left"] += 1
                for u, unit in enumerate(batched(batches, batches_per_unit)):
                    group.units.append(u)
                    units.append((gi, u, [i for b in unit for i in b]))

        def finish(gi: int) -> None:
            group = groups[gi]
            j, plan = group.job, plans[group.job]
            parts = [group.results.pop(u) for u in group.units]  # in unit (= batch) order
            items = np.concatenate([p[1] for p in parts])
            perm = np.argsort(items, kind="stable")  # rows in input order, as in read_rows
            rows = {h: np.concatenate([p[0][h] for p in parts])[perm] for h in group.hooks}
            row_item = items[perm]
            if positions == "pooled" and not np.array_equal(row_item, np.arange(len(inputs))):
                raise TLRewardError("internal error: layer rows do not cover every input once")
            st = state[j]
            if st["row_item"] is None:
                st["row_item"] = row_item
                st["grams"] = np.zeros((len(plan["hooks"]), len(row_item), len(row_item)))
            grams = _grams(group.hooks, rows)
            for k, h in enumerate(group.hooks):
                st["grams"][plan["hooks"].index(h)] = grams[k]
            st["left"] -= 1
            if st["left"] == 0:
                out[j] = LayerGrams(plan["label"], plan["hooks"], st.pop("grams"), positions,
                                    st["row_item"])

        def deliver(k: int, result: tuple[dict[str, np.ndarray], np.ndarray], new: bool
                    ) -> None:
            gi, u, idx = units[k]
            group = groups[gi]
            group.results[u] = (result[0], np.asarray(idx)[result[1]])
            if new and callback is not None:
                callback(group.job, group.local, u)
            if len(group.results) == len(group.units):
                finish(gi)

        def load(k: int) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
            group, store = groups[units[k][0]], stores[groups[units[k][0]].job]
            return None if store is None else _read_unit(store, group.local, units[k][1],
                                                         group.hooks)

        def save(k: int, result: tuple[dict[str, np.ndarray], np.ndarray]) -> None:
            group, store = groups[units[k][0]], stores[groups[units[k][0]].job]
            if store is not None:
                _write_unit(store, group.local, units[k][1], group.hooks, *result)

        def unit_args(ks: list[int]) -> tuple[Any, ...]:
            (gi, _, idx), = (units[k] for k in ks)
            return (jobs[groups[gi].job][0], [[inputs[i] for i in b]
                                               for b in batched(idx, batch_size)],
                    groups[gi].hooks, positions)

        run_chunked(pool, read_unit, range(len(units)), unit_args, deliver, load=load,
                    save=save, desc="reading activations", unit="unit",
                    progress=progress if progress is not None else len(units) >= 8)
    if any(g is None for g in out):
        raise TLRewardError("internal error: some layer Grams were not finished")
    return out  # type: ignore[return-value]


def run_layer_grams(
    models: str | Path | Spec | Sequence[str | Path | Spec],
    inputs: Sequence[Any],
    hook: str | Sequence[str] = DEFAULT_HOOK,
    layers: Sequence[int] | None = None,
    positions: Positions = "pooled",
    batch_size: int = 8,
    layer_chunk: int | None = None,
    executor: Executor | None = None,
    *,
    cache_dir: str | Path | None = None,
    batches_per_unit: int = 4,
    max_gram_bytes: float = 4e9,
    progress: bool | None = None,
    callback: Callable[[int, int, int], None] | None = None,
) -> list[LayerGrams]:
    """:func:`~tl_reward.compare.layers.layer_grams` of every model (hub name, local directory
    or :class:`ModelSpec`, loaded by the workers) on ``executor``, one :class:`LayerGrams` per
    model.

    Args:
        batches_per_unit: forward batches of ``batch_size`` inputs a worker reads per unit.
        cache_dir: write each unit's rows there and resume from them.
        callback: called as ``callback(model index, hook group, unit)`` after a unit arrives.
        The rest: as in :func:`~tl_reward.compare.layers.layer_grams`.
    """
    many = isinstance(models, Sequence) and not isinstance(models, str)
    specs = [as_spec(m) for m in (models if many else [models])]  # type: ignore[union-attr]
    if batches_per_unit < 1:
        raise TLRewardError(f"batches_per_unit must be positive, got {batches_per_unit}")
    return _run([(s, layers) for s in specs], inputs, hook, positions, batch_size, layer_chunk,
                executor, cache_dir, batches_per_unit, max_gram_bytes, progress, callback)


def run_compare_layers(
    model_a: str | Path | Spec,
    model_b: str | Path | Spec | None = None,
    inputs: Sequence[Any] = (),
    measure: str | Sequence[str] = ("debiased_cka", "rv2"),
    hook: str | Sequence[str] = DEFAULT_HOOK,
    layers_a: Sequence[int] | None = None,
    layers_b: Sequence[int] | None = None,
    positions: Positions = "pooled",
    n_permutations: int = 199,
    seed: int = 0,
    batch_size: int = 8,
    layer_chunk: int | None = None,
    executor: Executor | None = None,
    *,
    cache_dir: str | Path | None = None,
    batches_per_unit: int = 4,
    progress: bool | None = None,
    callback: Callable[[int, int, int], None] | None = None,
) -> LayerComparison:
    """:func:`~tl_reward.compare.layers.compare_layers` with the activations read on
    ``executor`` (see :func:`run_layer_grams`); the similarity maps are computed here."""
    jobs = [(as_spec(model_a), layers_a)]
    if model_b is not None:
        jobs.append((as_spec(model_b), layers_b))
    elif layers_b is not None:
        jobs.append((as_spec(model_a), layers_b))
    if batches_per_unit < 1:
        raise TLRewardError(f"batches_per_unit must be positive, got {batches_per_unit}")
    grams = _run(jobs, inputs, hook, positions, batch_size, layer_chunk, executor, cache_dir,
                 batches_per_unit, 4e9, progress, callback)
    return compare_grams(grams[0], grams[1] if len(grams) > 1 else None, measure,
                         n_permutations, seed)
