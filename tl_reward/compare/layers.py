"""Layer x layer similarity maps within one model or between two (RV, RV2, linear/debiased CKA).

For every hook point (default: the residual stream after each block, ``hook_resid_post``) the
activations of the n inputs are read at the pooled token (``positions="pooled"``: the shared
readout convention, ``model.pool_positions`` for a :class:`HookedRewardModel`, the last real
token for a plain ``HookedTransformer`` causal LM) or at every response token
(``positions="response"``: rows are tokens, inputs must end with an assistant reply). Hooks copy
only those rows (float32, CPU) and the forward stops after the last requested block. Each group
of ``layer_chunk`` hook points' rows becomes centred ``n x n`` float64 Grams and is dropped
(memory: ``layer_chunk x n x d_model`` activations plus ``n_hooks x n x n`` Grams). Every measure,
and the permutation null (one set of B row permutations for the whole map), uses the Grams alone.

Debiased CKA is the headline measure: RV, RV2 and linear CKA are biased upward when
``d_model >> n`` and must be read against their null (``excess = observed - null_mean``).
A similarity of representational geometry is not evidence of a shared mechanism.

:func:`run_layer_grams` and :func:`run_compare_layers` read the activations on an executor's
workers (Ray or this process); ``layer_grams`` and ``compare_layers`` are the same jobs on the
loaded models here, so the Grams are equal.

Example:
    >>> res = compare_layers(model_a, model_b, conversations, measure=("debiased_cka", "rv2"))
    >>> res.to_dataframe(); res.plot(kind="excess")
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from tl_reward.compare.similarity import MEASURES, permutations, transform_gram
from tl_reward.errors import TLRewardError, check_choice
from tl_reward.model.inputs import EncodedInput, collate, encode
from tl_reward.model.pooling import pool_positions as pool_by_rule
from tl_reward.results import ShortRepr, load_arrays
from tl_reward.scale.executors import Executor, LocalExecutor, Spec, Worker, as_spec, batched
from tl_reward.scale.jobs import run_chunked
from tl_reward.store import ChunkStore, RunIdentity, digest

Positions = Literal["pooled", "response"]
DEFAULT_HOOK = "blocks.{layer}.hook_resid_post"
_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def model_label(model: Any) -> str:
    """A short name for a model (its config's ``model_name``, else its class name)."""
    return str(getattr(getattr(model, "cfg", None), "model_name", None) or type(model).__name__)


def hook_names(model: Any, hook: str | Sequence[str] = DEFAULT_HOOK,
               layers: Sequence[int] | None = None) -> list[str]:
    """Hook point names: ``hook`` formatted with each layer (``"{layer}"``), or a list as is."""
    if not isinstance(hook, str):
        names = list(hook)
    elif "{layer}" in hook:
        idx = range(model.cfg.n_layers) if layers is None else layers
        names = [hook.format(layer=layer) for layer in idx]
    else:
        names = [hook]
    missing = [n for n in names if n not in model.hook_dict]
    if missing:
        raise TLRewardError(f"unknown hook point(s) {missing[:3]}; use names from "
                            "model.hook_dict, e.g. 'blocks.{layer}.hook_resid_post'")
    return names


def _encode_all(model: Any, inputs: Sequence[Any]) -> list[EncodedInput]:
    if hasattr(model, "encode"):
        return [model.encode(x) for x in inputs]
    if getattr(model, "tokenizer", None) is None:
        raise TLRewardError("the model has no tokenizer; pass token ids or attach one")
    return [encode(model.tokenizer, x) for x in inputs]


def _row_index(positions: Positions, batch_pos: torch.Tensor, lengths: torch.Tensor,
               starts: Sequence[int | None], offsets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if positions == "pooled":
        return torch.arange(len(batch_pos)), batch_pos.cpu()
    if None in starts:
        raise TLRewardError("positions='response' needs inputs that end with an assistant "
                            "reply (conversations or (prompt, response) tuples)")
    cols = [torch.arange(s + o, n + o)
            for n, s, o in zip(lengths.tolist(), starts, offsets.tolist(), strict=True)]
    return torch.cat([torch.full_like(c, i) for i, c in enumerate(cols)]), torch.cat(cols)


@dataclass
class LayerGrams:
    """Centred Gram matrices of one model's activations at several hook points.

    Attributes:
        model: the model's name.
        hooks: the hook point names (one Gram each).
        grams: ``[n_hooks, n, n]`` float64, ``X_c X_c'`` of the column-centred rows.
        positions: ``"pooled"`` or ``"response"``.
        row_item: ``[n]`` which input each row came from.
    """

    model: str
    hooks: list[str]
    grams: Float[np.ndarray, "hooks n n"] = field(repr=False)
    positions: str
    row_item: np.ndarray = field(repr=False)

    @property
    def n_rows(self) -> int:
        return int(self.grams.shape[1])

    def labels(self) -> list[str]:
        """Short labels: ``L`` for ``blocks.L.hook_resid_post``, ``embed`` for
        ``blocks.0.hook_resid_pre`` and ``hook_embed``, ``final_norm`` for
        ``ln_final.hook_normalized``, else the hook name."""
        short = {"blocks.0.hook_resid_pre": "embed", "ln_final.hook_normalized": "final_norm",
                 "hook_embed": "embed"}
        return [m.group(1) if (m := re.fullmatch(r"blocks\.(\d+)\.hook_resid_post", h))
                else short.get(h, h) for h in self.hooks]


@torch.no_grad()
def read_rows(
    model: Any, encoded: Sequence[EncodedInput], hooks: Sequence[str],
    positions: Positions = "pooled", batch_size: int = 8,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Rows of each hook point's activations (float32, CPU, input order) and the input of each
    row, in one pass over length-sorted, right-padded batches; the forward stops after the last
    requested block, and only the selected rows are copied out of each batch."""
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i].ids))
    pad, device = getattr(model, "pad_token_id", None), model.cfg.device
    if pad is None and getattr(model, "tokenizer", None) is not None:  # a causal LM's, or EOS
        pad = model.tokenizer.pad_token_id
        pad = model.tokenizer.eos_token_id if pad is None else pad
    rows: dict[str, list[torch.Tensor]] = {h: [] for h in hooks}
    items: list[np.ndarray] = []
    blocks = [int(m.group(1)) for h in hooks if (m := _BLOCK.match(h))]
    stop = (max(blocks) + 1) if len(blocks) == len(hooks) else None
    for start in range(0, len(order), batch_size):
        idx = order[start: start + batch_size]
        batch = collate([encoded[i] for i in idx], pad, "right", model.cfg.n_ctx,
                        model.cfg.d_vocab).to(device)
        # pooled position: the model's own rule for a reward model, the last real token else
        pos = (model.pool_positions(batch.tokens, batch.attention_mask)
               if hasattr(model, "pool_positions")
               else pool_by_rule(batch.tokens, batch.attention_mask, None, "mask"))
        r, c = _row_index(positions, pos, batch.lengths.cpu(), batch.response_starts,
                          batch.offsets().cpu())
        items.append(np.asarray(idx)[r.numpy()])
        r, c = r.to(device), c.to(device)

        def grab(act: torch.Tensor, hook: Any, name: str, r: torch.Tensor = r,
                 c: torch.Tensor = c) -> None:  # name as asked: a bridge names its aliases
            rows[name].append(act[r, c].float().cpu())

        early = stop is not None and stop < model.cfg.n_layers
        model.run_with_hooks(batch.tokens, fwd_hooks=[(h, partial(grab, name=h)) for h in hooks],
                             attention_mask=batch.attention_mask,
                             **({"stop_at_layer": stop} if early else {"return_type": None}))
    item_of_row = np.concatenate(items)
    # rows in input order (stable within an input, so response tokens keep their order)
    perm = np.argsort(item_of_row, kind="stable")
    return ({h: torch.cat(rows.pop(h)).numpy()[perm] for h in hooks}, item_of_row[perm])


def activations(
    model: Any, inputs: Sequence[Any], hook: str = "blocks.{layer}.hook_resid_post",
    layer: int = -1, positions: Positions = "pooled", batch_size: int = 8,
) -> Float[np.ndarray, "n d"]:
    """``[n, d]`` float32 activations at one hook point (``{layer}`` filled in, negative layers
    count from the end), read at the pooled token (or every response token)."""
    if "{layer}" in hook:
        hook = hook.format(layer=layer % model.cfg.n_layers)
    names = hook_names(model, hook)
    rows, _ = read_rows(model, _encode_all(model, list(inputs)), names, positions, batch_size)
    return rows[names[0]]


def layer_grams(
    model: Any, inputs: Sequence[Any], hook: str | Sequence[str] = DEFAULT_HOOK,
    layers: Sequence[int] | None = None, positions: Positions = "pooled", batch_size: int = 8,
    layer_chunk: int | None = None, progress: bool | None = None, max_gram_bytes: float = 4e9,
) -> LayerGrams:
    """Centred ``n x n`` Grams of ``model``'s activations at each hook point, read batch by batch.

    ``model`` is a :class:`HookedRewardModel` or any TransformerLens ``HookedTransformer`` with a
    tokenizer; ``inputs`` are strings, conversations, ``(prompt, response)`` tuples or token ids.
    ``layer_chunk``: how many hook points' rows are held at once (``None``: all, one pass).
    With ``positions="response"`` rows are tokens and the Grams grow as (tokens)^2: a request
    whose Grams would exceed ``max_gram_bytes`` is refused before any forward pass.
    """
    return run_layer_grams(model, inputs, hook, layers, positions, batch_size, layer_chunk,
                           batches_per_unit=1, max_gram_bytes=max_gram_bytes,
                           progress=progress)[0]


@dataclass(repr=False)
class LayerComparison(ShortRepr):
    """Layer x layer similarity of two models (or one model with itself), with permutation nulls.

    Attributes:
        model_a, model_b: model names (equal for a within-model map).
        layers_a, layers_b: row and column labels (layer indices or hook names).
        measures: the measures computed.
        observed: per measure, ``[layers_a, layers_b]`` similarities.
        null_mean: per measure, the mean over B row permutations (the chance level for this n
            and these dimensions).
        p_value: per measure, ``(1 + #{null >= observed}) / (1 + B)``, one-sided, per cell.
        n_rows: items (pooled) or tokens (response) compared.
        n_permutations: B (0: no null).
        positions: ``"pooled"`` or ``"response"``.
    """

    model_a: str
    model_b: str
    layers_a: list[str]
    layers_b: list[str]
    measures: list[str]
    observed: dict[str, np.ndarray] = field(repr=False)
    null_mean: dict[str, np.ndarray] = field(repr=False)
    p_value: dict[str, np.ndarray] = field(repr=False)
    n_rows: int
    n_permutations: int
    positions: str

    def excess(self, measure: str) -> np.ndarray:
        """``observed - null_mean``: similarity beyond chance for this n and these dimensions."""
        return self.observed[measure] - self.null_mean[measure]

    def matrix(self, measure: str, kind: str = "observed") -> np.ndarray:
        """``[layers_a, layers_b]`` of ``kind``: observed, null_mean, excess or p_value."""
        if measure not in self.measures:
            raise TLRewardError(f"measure {measure!r} was not computed; have {self.measures}")
        check_choice(kind, ("observed", "null_mean", "excess", "p_value"), "kind")
        if kind == "excess":
            return self.excess(measure)
        return getattr(self, kind)[measure]

    def to_dataframe(self) -> pd.DataFrame:
        """One row per measure and layer pair: observed, null mean, excess, p."""
        la = np.repeat(np.asarray(self.layers_a), len(self.layers_b))
        lb = np.tile(np.asarray(self.layers_b), len(self.layers_a))
        return pd.concat([pd.DataFrame({
            "measure": m, "layer_a": la, "layer_b": lb, "observed": self.observed[m].ravel(),
            "null_mean": self.null_mean[m].ravel(), "excess": self.excess(m).ravel(),
            "p_value": self.p_value[m].ravel()}) for m in self.measures], ignore_index=True)

    def diagonal(self, measure: str, kind: str = "observed") -> pd.Series:
        """Same-index cells (layer i of A against layer i of B), for equal-depth models."""
        mat = self.matrix(measure, kind)
        k = min(mat.shape)
        return pd.Series(np.diag(mat[:k, :k]), index=self.layers_a[:k], name=measure)

    def plot(self, kind: str = "observed") -> Any:
        """One heatmap per measure of ``kind`` (observed, excess, null_mean, p_value)."""
        from tl_reward.viz.compare import plot_layer_maps

        maps = {m: self.matrix(m, kind) for m in self.measures}
        zr = (0.0, 1.0) if kind == "p_value" else (-1.0, 1.0)
        return plot_layer_maps(maps, self.layers_a, self.layers_b,
                               row_title=self.model_a, col_title=self.model_b,
                               title=f"Layer x layer similarity ({kind}, {self.positions} "
                                     f"positions, n = {self.n_rows})", zmin=zr[0], zmax=zr[1])


def compare_grams(
    grams_a: LayerGrams, grams_b: LayerGrams | None = None,
    measure: str | Sequence[str] = ("debiased_cka", "rv2"), n_permutations: int = 199,
    seed: int = 0,
) -> LayerComparison:
    """Similarity maps from precomputed :class:`LayerGrams` (``grams_b=None``: A with itself)."""
    measures = [measure] if isinstance(measure, str) else list(measure)
    for m in measures:
        check_choice(m, MEASURES, "measure")
    b = grams_a if grams_b is None else grams_b
    if grams_a.n_rows != b.n_rows or not np.array_equal(grams_a.row_item, b.row_item):
        raise TLRewardError(
            f"the two models give different rows ({grams_a.n_rows} vs {b.n_rows}); with "
            "positions='response' both tokenizers must split every response alike: use "
            "positions='pooled' for models with different tokenizers")
    perms = permutations(grams_a.n_rows, n_permutations, seed)
    obs, null_mean, pval = {}, {}, {}
    for m in measures:
        ta, ok_a = _flat_unit(grams_a.grams, m)
        tb, ok_b = _flat_unit(b.grams, m)
        n = b.n_rows
        o = ta @ tb.T
        nan = ~(ok_a[:, None] & ok_b[None, :])
        count = np.zeros_like(o)
        total = np.zeros_like(o)
        tol = 1e-12 * np.maximum(1.0, np.abs(o))
        for p in perms:
            # P T(L) P' for every hook point at once: one gather of the flattened Grams
            null = ta @ np.take(tb, (p[:, None] * n + p[None, :]).ravel(), axis=1).T
            total += null
            count += null >= o - tol
        o[nan] = np.nan
        obs[m] = o
        nan |= n_permutations == 0  # no null
        null_mean[m] = np.where(nan, np.nan, total / max(n_permutations, 1))
        pval[m] = np.where(nan, np.nan, (1 + count) / (1 + n_permutations))
    return LayerComparison(grams_a.model, b.model, grams_a.labels(), b.labels(), measures, obs,
                           null_mean, pval, grams_a.n_rows, n_permutations, grams_a.positions)


def _flat_unit(grams: np.ndarray, measure: str) -> tuple[np.ndarray, np.ndarray]:
    """``[H, n*n]`` transformed Grams scaled to unit Frobenius norm, and which are non-zero."""
    t = np.stack([transform_gram(k, measure) for k in grams]).reshape(len(grams), -1)
    norm = np.sqrt((t * t).sum(1))
    ok = norm > 1e-12 * max(1.0, float(norm.max(initial=0.0)))
    return np.where(ok[:, None], t / np.where(ok, norm, 1.0)[:, None], 0.0), ok


def compare_layers(
    model_a: Any, model_b: Any | None = None, inputs: Sequence[Any] = (),
    measure: str | Sequence[str] = ("debiased_cka", "rv2"),
    hook: str | Sequence[str] = DEFAULT_HOOK, layers_a: Sequence[int] | None = None,
    layers_b: Sequence[int] | None = None, positions: Positions = "pooled",
    n_permutations: int = 199, seed: int = 0, batch_size: int = 8, layer_chunk: int | None = None,
    progress: bool | None = None,
) -> LayerComparison:
    """Layer x layer similarity of ``model_a`` with ``model_b`` (``None``: with itself).

    Args:
        model_a, model_b: :class:`HookedRewardModel` or TransformerLens ``HookedTransformer``
            causal LMs (pooled at the last real token), with tokenizers.
        inputs: the same n inputs for both (strings, conversations, (prompt, response), ids).
        measure: one or more of ``"debiased_cka"`` (headline), ``"rv2"``, ``"rv"``,
            ``"linear_cka"``.
        hook: a hook name with ``{layer}`` or a list of hook names; ``layers_a`` / ``layers_b``
            pick layers (default: all).
        positions: ``"pooled"`` (one row per input) or ``"response"`` (one per response token).
        n_permutations: B row permutations for the null (0: none).
        layer_chunk: hook points read per pass (bounds memory; see the module docstring).
    """
    return run_compare_layers(model_a, model_b, list(inputs), measure, hook, layers_a, layers_b,
                              positions, n_permutations, seed, batch_size, layer_chunk,
                              batches_per_unit=1, progress=progress)


def plan_grams(worker: Worker, spec: Spec, inputs: Sequence[Any],
               hook: str | Sequence[str], layers: Sequence[int] | None, cached: bool
               ) -> dict[str, Any]:
    """The model's hook names, name and (when ``cached``) part of the run identity, and the
    inputs' token lengths, response rows and digest of their ids (run on a worker)."""
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


def _run(jobs: Sequence[tuple[Spec, Sequence[int] | None]], inputs: Sequence[Any],
         hook: str | Sequence[str], positions: Positions, batch_size: int,
         layer_chunk: int | None, executor: Executor | None,
         cache_dir: str | Path | None, batches_per_unit: int, max_gram_bytes: float,
         progress: bool | None, callback: Callable[[int, int, int], None] | None
         ) -> list[LayerGrams]:
    check_choice(positions, ("pooled", "response"), "positions")
    inputs = list(inputs)
    if len(inputs) < 4:
        raise TLRewardError(f"need at least 4 inputs to compare representations, got "
                            f"{len(inputs)}")
    for arg, n in (("batch_size", batch_size), ("batches_per_unit", batches_per_unit)):
        if n < 1:
            raise TLRewardError(f"{arg} must be positive, got {n}")
    with (executor or LocalExecutor()).session() as pool:
        plans = pool.gather(plan_grams, [(s, inputs, hook, layers, cache_dir is not None)
                                         for s, layers in jobs])
        # per model: hook groups, each unit's inputs (the batches layer_grams reads), store
        groups: list[list[list[str]]] = []
        units: list[list[list[int]]] = []
        stores: list[ChunkStore | None] = []
        for plan in plans:
            names, rows = plan["hooks"], plan["response_rows"]
            if positions == "response" and len(names) * rows**2 * 8 > max_gram_bytes:
                raise TLRewardError(
                    f"positions='response' gives {rows} rows, so {len(names)} float64 Grams "
                    f"need {len(names) * rows**2 * 8 / 1e9:.1f} GB (more than max_gram_bytes = "
                    f"{max_gram_bytes / 1e9:.1f} GB); use fewer or shorter inputs, fewer "
                    "layers, positions='pooled', or raise max_gram_bytes")
            order = sorted(range(len(inputs)), key=lambda i: -plan["lengths"][i])  # stable
            chunk = len(names) if layer_chunk is None else max(1, int(layer_chunk))
            groups.append(batched(names, chunk))
            units.append(batched(order, batch_size * batches_per_unit))  # whole batches
            ident = plan["identity"] and plan["identity"].with_job(plan["inputs"], settings={
                "hooks": names, "positions": positions, "batch_size": batch_size,
                "layer_chunk": chunk, "batches_per_unit": batches_per_unit})
            stores.append(None if cache_dir is None else
                          ChunkStore(Path(cache_dir) / ident.folder_name(), ident))
        grams: list[np.ndarray | None] = [None] * len(jobs)
        row_item: list[np.ndarray | None] = [None] * len(jobs)
        parts: dict[tuple[int, int], dict[int, Any]] = {}

        def deliver(key: tuple[int, int, int], result: Any, new: bool) -> None:
            j, g, u = key
            got = parts.setdefault((j, g), {})
            got[u] = (result[0], np.asarray(units[j][u])[result[1]])
            if new and callback is not None:
                callback(j, g, u)
            if len(got) < len(units[j]):
                return
            del parts[(j, g)]  # a hook group's rows are held only until its Grams are formed
            items = np.concatenate([got[u][1] for u in range(len(got))])
            perm = np.argsort(items, kind="stable")  # rows in input order, as in read_rows
            row_item[j] = items[perm]
            if positions == "pooled" and not np.array_equal(items[perm], np.arange(len(inputs))):
                raise TLRewardError("internal error: layer rows do not cover every input once")
            if grams[j] is None:
                grams[j] = np.zeros((len(plans[j]["hooks"]), len(perm), len(perm)))
            for h in groups[j][g]:
                x = np.concatenate([got[u][0].pop(h) for u in range(len(got))])[perm]
                x = x.astype(np.float64)
                x -= x.mean(0, keepdims=True)
                grams[j][plans[j]["hooks"].index(h)] = x @ x.T  # type: ignore[index]

        def name(key: tuple[int, int, int]) -> str:
            return f"g{key[1]:04d}-u{key[2]:06d}.npz"

        def load(key: tuple[int, int, int]) -> Any:
            store, hooks = stores[key[0]], groups[key[0]][key[1]]
            if store is None or not store.has(name(key)):
                return None
            path = store.path(name(key))
            z = load_arrays(path, str(path), f"do not load it; delete {path} and rerun (the "
                                             "job recomputes that chunk)")
            return {h: z[f"h{k}"] for k, h in enumerate(hooks)}, z["item"]

        def save(key: tuple[int, int, int], result: Any) -> None:
            store, hooks = stores[key[0]], groups[key[0]][key[1]]

            def write(path: Path) -> None:
                with open(path, "wb") as f:
                    np.savez(f, item=result[1], **{f"h{k}": result[0][h]
                                                   for k, h in enumerate(hooks)})

            if store is not None:
                store.save(name(key), write)

        def unit_args(keys: list[tuple[int, int, int]]) -> tuple[Any, ...]:
            (j, g, u), = keys
            return (jobs[j][0], [[inputs[i] for i in b] for b in batched(units[j][u], batch_size)],
                    groups[j][g], positions)

        keys = [(j, g, u) for j in range(len(jobs)) for g in range(len(groups[j]))
                for u in range(len(units[j]))]
        run_chunked(pool, read_unit, keys, unit_args, deliver, load=load, save=save,
                    desc="reading activations", unit="unit",
                    progress=progress if progress is not None else len(keys) >= 8)
    return [LayerGrams(p["label"], p["hooks"], grams[j], positions, row_item[j])
            for j, p in enumerate(plans)]


def run_layer_grams(
    models: str | Path | Spec | Sequence[str | Path | Spec], inputs: Sequence[Any],
    hook: str | Sequence[str] = DEFAULT_HOOK, layers: Sequence[int] | None = None,
    positions: Positions = "pooled", batch_size: int = 8, layer_chunk: int | None = None,
    executor: Executor | None = None, *, cache_dir: str | Path | None = None,
    batches_per_unit: int = 4, max_gram_bytes: float = 4e9, progress: bool | None = None,
    callback: Callable[[int, int, int], None] | None = None,
) -> list[LayerGrams]:
    """:func:`layer_grams` of every model (loaded, or a hub name, local directory or
    :class:`~tl_reward.scale.executors.ModelSpec` loaded by the workers) on ``executor``, one
    :class:`LayerGrams` per model. Workers also plan each model (hook names, token lengths,
    name, fingerprint), so the driver never loads one; it cuts the inputs, sorted by length,
    into the batches ``layer_grams`` reads, sends ``batches_per_unit`` of them per unit and
    group of ``layer_chunk`` hook points, and forms each hook point's centred float64 Gram from
    the returned rows, holding one hook group's rows of one model at a time.

    Args:
        batches_per_unit: forward batches of ``batch_size`` inputs a worker reads per unit.
        cache_dir: write each unit's rows there (one ``.npz`` each in a
            :class:`~tl_reward.store.ChunkStore` folder named by model, inputs and settings)
            and resume from them; a folder of another fingerprint or tokenizer is refused.
        callback: called as ``callback(model index, hook group, unit)`` after a unit arrives.
        The rest: as in :func:`layer_grams`.
    """
    many = isinstance(models, Sequence) and not isinstance(models, str)
    specs = [as_spec(m) for m in (models if many else [models])]  # type: ignore[union-attr]
    return _run([(s, layers) for s in specs], inputs, hook, positions, batch_size, layer_chunk,
                executor, cache_dir, batches_per_unit, max_gram_bytes, progress, callback)


def run_compare_layers(
    model_a: str | Path | Spec, model_b: str | Path | Spec | None = None,
    inputs: Sequence[Any] = (), measure: str | Sequence[str] = ("debiased_cka", "rv2"),
    hook: str | Sequence[str] = DEFAULT_HOOK, layers_a: Sequence[int] | None = None,
    layers_b: Sequence[int] | None = None, positions: Positions = "pooled",
    n_permutations: int = 199, seed: int = 0, batch_size: int = 8,
    layer_chunk: int | None = None, executor: Executor | None = None, *,
    cache_dir: str | Path | None = None, batches_per_unit: int = 4,
    progress: bool | None = None, callback: Callable[[int, int, int], None] | None = None,
) -> LayerComparison:
    """:func:`compare_layers` with the activations read on
    ``executor`` (see :func:`run_layer_grams`); the similarity maps are computed here."""
    jobs = [(as_spec(model_a), layers_a)]
    if model_b is not None:
        jobs.append((as_spec(model_b), layers_b))
    elif layers_b is not None:
        jobs.append((as_spec(model_a), layers_b))
    grams = _run(jobs, inputs, hook, positions, batch_size, layer_chunk, executor, cache_dir,
                 batches_per_unit, 4e9, progress, callback)
    return compare_grams(grams[0], grams[1] if len(grams) > 1 else None, measure,
                         n_permutations, seed)
