"""How far observational scores predict causal ones: a faithfulness report over preference pairs.

For every pair and every component (``level="sublayer"``: the embeddings and each layer's
attention and MLP; ``level="head"``: every attention head), two kinds of score, all divided by
the pair's clean margin ``Delta``:

* observational: ``dra_diff`` (DRA of chosen minus rejected), ``dra_chosen`` (DRA of the chosen
  reply alone, the published peer's quantity), ``attr_patch_denoising`` and
  ``attr_patch_noising`` (first-order estimates);
* causal: ``direct_path`` (direct-path denoising with the final norm recomputed), ``noising``
  and ``denoising`` (whole-component patching on the aligned positions: total effects).

Per pair, Spearman's rho across components for every (observational, causal) pairing, on signed
scores and on absolute values; then the mean over pairs with a two-sided sign-flip p-value and
the interval that inverts the same test (so it excludes 0 exactly when p < 0.05; none below 6
pairs). The published reward-lens anchor (mean rho -0.256 on
Skywork-Reward-Llama-3.1-8B-v0.2, -0.027 on ArmoRM) compares ``|DRA|`` with ``|whole-sublayer
noising|``: a direct effect against a total effect. Here that is the ``abs`` pairing of
``dra_chosen`` (or ``dra_diff``) with ``noising`` at ``level="sublayer"``; ``direct_path`` is
the like-for-like partner of DRA.

Finished pairs are written to ``cache_dir`` (one small file each, a
:class:`~tl_reward.store.EntryCache` keyed by the pair's ids and the run identity: the model's
exact fingerprint, its tokenizer, level and objective) and reused, so an interrupted run resumes
without losing work and a changed model never reads another's pairs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from tl_reward.analysis.attribution import differential_attribution
from tl_reward.analysis.attribution_patching import attribution_patching
from tl_reward.analysis.components import merge_embed
from tl_reward.analysis.direct_path import direct_path_patching
from tl_reward.analysis.patching import patch_components
from tl_reward.data.pairs import TokenizedPair, as_pair_batch
from tl_reward.errors import TLRewardError, check_choice
from tl_reward.model.readout import resolve_objectives
from tl_reward.results import ShortRepr
from tl_reward.scale.executors import Executor, LocalExecutor, Spec, Worker, as_spec
from tl_reward.scale.jobs import run_chunked
from tl_reward.stats.paired import summarise_mean
from tl_reward.stats.resampling import spearman
from tl_reward.store import EntryCache, RunIdentity, entry_key

OBSERVATIONAL = ("dra_diff", "dra_chosen", "attr_patch_denoising", "attr_patch_noising")
CAUSAL = ("direct_path", "noising", "denoising")
ANCHOR = ("dra_chosen", "noising", "abs")
_HEAD = re.compile(r"^L\d+\.H\d+$")


class ZeroMarginError(TLRewardError):
    """A pair whose clean margin is exactly 0: its effects cannot be normalised (the only pairs
    the report skips)."""


def pair_scores(
    model: Any, pair: TokenizedPair, level: str = "sublayer", objective: str | None = None,
    chunk_size: int = 32,
) -> dict[str, Any]:
    """Every observational and causal score of one pair's components (normalised by Delta)."""
    obj = resolve_objectives(model, objective)[0]
    pa = differential_attribution(model, [pair], objectives=obj, progress=False)
    n_embed = len(pa.chosen.embed_names)
    full_level = "sublayer" if level == "sublayer" else "head"
    diff, names = pa.difference(full_level)
    chosen, _ = pa.chosen.components(full_level)
    diff, all_names = merge_embed(diff[0, :, 0], names, n_embed)
    chosen, _ = merge_embed(chosen[0, :, 0], names, n_embed)
    keep = [i for i, n in enumerate(all_names) if level == "sublayer" or _HEAD.match(n)]
    names = [all_names[i] for i in keep]
    delta = float(pa.margin[0, 0])
    if delta == 0:
        raise ZeroMarginError("the pair's reward margin is exactly 0, so its effects cannot be "
                              "normalised by it")
    ap = attribution_patching(model, pair, objective=obj)
    dp = direct_path_patching(model, pair, level=full_level, mode="denoising",
                              scale="recompute", objective=obj)
    scores = {
        "dra_diff": diff[keep] / delta,
        "dra_chosen": chosen[keep] / delta,
        "attr_patch_denoising": ap.components(full_level, "denoising")[0][keep],
        "attr_patch_noising": ap.components(full_level, "noising")[0][keep],
        "direct_path": dp.effect[keep],
        "noising": patch_components(model, pair, names, "noising", obj, chunk_size),
        "denoising": patch_components(model, pair, names, "denoising", obj, chunk_size),
    }
    return {"names": names, "delta": delta, "chosen": pa.chosen.reward[0, 0].item(),
            "rejected": pa.rejected.reward[0, 0].item(),
            "scores": {k: v.float().cpu().tolist() for k, v in scores.items()}}


@dataclass(repr=False)
class FaithfulnessReport(ShortRepr):
    """Per-pair component scores and their rank agreement.

    Attributes:
        names: the C components; ``scores``: name -> ``[n_pairs, C]``; ``deltas``: ``[n_pairs]``
        clean margins; ``pair_ids``: identifiers of the pairs (cache keys).
    """

    level: str
    objective: str
    names: list[str]
    scores: dict[str, torch.Tensor]
    deltas: torch.Tensor
    pair_ids: list[str]
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.pair_ids)

    @classmethod
    def from_file(cls, path: str | Path) -> FaithfulnessReport:
        """A report written as JSON by the save of earlier versions (``load_result`` calls it)."""
        d = json.loads(Path(path).read_text())
        return cls(d["level"], d["objective"], d["names"],
                   {k: torch.tensor(v) for k, v in d["scores"].items()},
                   torch.tensor(d["deltas"]), d["pair_ids"], d.get("meta", {}))

    def rho(self) -> pd.DataFrame:
        """Per pair, Spearman rho of every pairing (columns ``obs|causal|signed/abs``)."""
        cols = {}
        for obs in OBSERVATIONAL:
            for cau in CAUSAL:
                a, b = self.scores[obs], self.scores[cau]
                cols[f"{obs}|{cau}|signed"] = spearman(a, b).tolist()
                cols[f"{obs}|{cau}|abs"] = spearman(a.abs(), b.abs()).tolist()
        return pd.DataFrame(cols, index=self.pair_ids)

    def summary(self, n_permutations: int = 9_999, confidence: float = 0.95, seed: int = 0
                ) -> pd.DataFrame:
        """Mean rho per pairing with its two-sided sign-flip p over pairs and the interval that
        inverts it (:func:`~tl_reward.stats.paired.summarise_mean`; ``n_permutations`` random
        sign patterns beyond 20 pairs), and the number of pairs."""
        return pd.DataFrame([
            {"observational": obs, "causal": cau, "kind": kind, "mean_rho": s.value,
             "ci_low": s.ci_low, "ci_high": s.ci_high, "p_value": s.p_value, "n_pairs": s.n,
             "published_anchor": (obs, cau, kind) == ANCHOR}
            for col, vals in self.rho().items() for obs, cau, kind in [col.split("|")]
            for s in [summarise_mean(vals.to_numpy(), confidence, seed, n_permutations)]])

    def to_dataframe(self) -> pd.DataFrame:
        """The summary table (see :meth:`summary`)."""
        return self.summary()

    def plot(self) -> Any:
        """Mean rho per pairing with CI bars, signed and absolute side by side."""
        from tl_reward.viz.patching import faithfulness_figure

        return faithfulness_figure(self.summary(), title=(
            f"Faithfulness over {len(self)} pairs ({self.level} components)"))


def faithfulness_report(
    model: Any, pairs: Sequence[Any], level: str = "sublayer", objective: int | str | None = None,
    cache_dir: str | Path | None = None, chunk_size: int = 32, progress: bool | None = None,
) -> FaithfulnessReport:
    """Score every component of every pair and return the :class:`FaithfulnessReport`.

    Pairs whose margin is exactly 0 are skipped, and only those: ``meta["skipped"]`` lists
    them as ``{"pair": index, "id": cache key, "reason": ...}``. Any other error (context
    length, missing pad token, unknown objective, ...) is raised.
    """
    return run_faithfulness(model, pairs, level, objective, cache_dir, pairs_per_unit=1,
                            chunk_size=chunk_size, progress=progress)


def plan_pairs(worker: Worker, spec: Spec, pairs: Sequence[Any], level: str,
               objective: int | str | None) -> tuple[str, list[str]]:
    """The resolved objective and every pair's cache key (run on a worker): its ids under the
    run identity (the model's exact fingerprint: weights, dtype, pooling rule, head, library
    version; its tokenizer, the level and the objective), never the model's name."""
    model = worker.model(spec)
    obj = resolve_objectives(model, objective)[0]
    ident = RunIdentity.of_model("faithfulness", model).with_job(
        None, settings={"level": level, "objective": obj})
    return obj, [entry_key(ident, [tp.chosen_ids, tp.rejected_ids])
                 for tp in as_pair_batch(model, list(pairs))]


def score_pairs(worker: Worker, spec: Spec, pairs: Sequence[Any], level: str, obj: str,
                chunk_size: int) -> list[tuple[dict[str, Any] | None, str | None]]:
    """Per pair ``(record, None)``, or ``(None, reason)`` for a zero-margin pair (run on a
    worker)."""
    model = worker.model(spec)
    batch = as_pair_batch(model, list(pairs))
    out: list[tuple[dict[str, Any] | None, str | None]] = []
    for j, tp in enumerate(batch):
        worker.checkpoint(j, len(batch))
        try:
            out.append((pair_scores(model, tp, level, obj, chunk_size), None))
        except ZeroMarginError as err:
            out.append((None, str(err)))
    return out


def run_faithfulness(
    model: Any,
    pairs: Sequence[Any],
    level: str = "sublayer",
    objective: int | str | None = None,
    cache_dir: str | Path | None = None,
    executor: Executor | None = None,
    *,
    pairs_per_unit: int = 4,
    chunk_size: int = 32,
    progress: bool | None = None,
    callback: Callable[[int], None] | None = None,
) -> FaithfulnessReport:
    """:func:`faithfulness_report` on ``executor``'s workers, in units of ``pairs_per_unit``
    pairs. ``model``: loaded (run in this process), or a hub name, local directory or
    :class:`~tl_reward.scale.executors.ModelSpec` loaded by the workers, which also plan the
    run (objective, cache keys), so the driver never loads it. This process writes each
    finished pair's file in ``cache_dir`` (the files ``faithfulness_report`` reads: either
    resumes the other's run); a dead worker's unit is retried.

    Args:
        pairs: preference pairs in any form ``faithfulness_report`` accepts (picklable).
        executor: :class:`~tl_reward.scale.executors.LocalExecutor` (default) or
            :class:`~tl_reward.scale.executors.RayExecutor`.
        callback: called with a pair's index after its record has arrived (and been written).
    """
    check_choice(level, ("sublayer", "head"), "level")
    spec, pairs = as_spec(model), list(pairs)
    cache = EntryCache(cache_dir) if cache_dir is not None else None
    results: dict[int, tuple[dict[str, Any] | None, str | None]] = {}

    def load(i: int) -> tuple[dict[str, Any], None] | None:
        rec = cache.get(keys[i]) if cache is not None else None
        return None if rec is None else (rec, None)

    def save(i: int, result: tuple[dict[str, Any] | None, str | None]) -> None:
        if cache is not None and result[0] is not None:  # zero-margin pairs are not cached
            cache.put(keys[i], result[0])

    def deliver(i: int, result: tuple[dict[str, Any] | None, str | None], new: bool) -> None:
        results[i] = result
        if new and callback is not None:
            callback(i)

    with (executor or LocalExecutor()).session() as pool:
        obj, keys = pool.gather(plan_pairs, [(spec, pairs, level, objective)])[0]
        run_chunked(pool, score_pairs, range(len(pairs)),
                    lambda u: (spec, [pairs[i] for i in u], level, obj, chunk_size), deliver,
                    per_unit=pairs_per_unit, load=load, save=save, progress=progress,
                    desc=f"faithfulness ({level})", unit="pair")
    done = [i for i in range(len(pairs)) if results[i][0] is not None]
    skipped = [{"pair": i, "id": keys[i], "reason": results[i][1]}
               for i in range(len(pairs)) if results[i][0] is None]
    if not done:
        why = (f"all {len(skipped)} pairs have a reward margin of exactly 0" if skipped
               else "no pairs were given")
        raise TLRewardError(f"no pair could be scored: {why}; pass pairs the model tells apart")
    recs = [results[i][0] for i in done]
    scores = {k: torch.tensor([r["scores"][k] for r in recs]) for k in (*OBSERVATIONAL, *CAUSAL)}
    return FaithfulnessReport(level, obj, recs[0]["names"], scores,
                              torch.tensor([r["delta"] for r in recs]), [keys[i] for i in done],
                              {"skipped": skipped})
