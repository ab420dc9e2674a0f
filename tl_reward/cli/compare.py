"""``tl-reward compare``: do two or more reward models agree? One offline HTML report.

With ``--ray`` every forward pass runs on Ray actors (each loads a model once): the
behavioural part's rewards, readability activations and pair margins, one model per actor, and
with ``--layers`` the activations behind the layer x layer maps (every model's Grams in one
pass). This process loads no model and computes the statistics.
"""

from __future__ import annotations

import argparse
import html
from pathlib import Path
from typing import Any

from tl_reward.cli.common import (
    add_device_options,
    add_ray_options,
    add_report_options,
    item_from_record,
    load_model,
    pair_from_record,
    ray_executor,
    read_jsonl,
    write_report,
)
from tl_reward.errors import TLRewardError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "compare", help="compare reward models on a corpus (behaviour and representations)",
        description="Compare two or more reward models on a JSONL corpus whose lines hold "
                    "'messages', 'prompt'+'response' or 'text' (corpus items), or 'prompt', "
                    "'chosen' and 'rejected' (preference pairs; their chosen conversations join "
                    "the corpus). Writes rank agreement with CIs, pairwise-preference agreement, "
                    "reward readability and (with --layers) layer x layer similarity maps with "
                    "permutation nulls to one HTML file that opens offline.")
    p.add_argument("--model", action="append", required=True,
                   help="a reward model (hub name, local directory or built-in name); give at "
                        "least two")
    p.add_argument("--input", type=Path, required=True, help="JSONL corpus and/or pairs")
    add_report_options(p, "compare.html")
    add_device_options(p)
    p.add_argument("--max-items", type=int, default=None, help="use the first N lines only")
    p.add_argument("--layers", action="store_true",
                   help="add layer x layer similarity maps between the first model and each other")
    p.add_argument("--measure", action="append", default=None,
                   choices=["debiased_cka", "rv2", "rv", "linear_cka"],
                   help="similarity measure(s) for --layers (default: debiased_cka and rv2)")
    p.add_argument("--permutations", type=int, default=199, help="permutations for the nulls")
    p.add_argument("--readability-layer", type=int, default=-1,
                   help="block whose residual stream (pooled token) predicts the other reward")
    p.add_argument("--objective", action="append", default=None,
                   help="'score' or an objective name: once for every model, or once per "
                        "--model in the same order (default: score)")
    p.add_argument("--batch-size", type=int, default=8)
    add_ray_options(p, "every forward pass: one unit per model for the behavioural part, "
                       "units of 4 batches for the --layers activations",
                    resume="a dead actor is restarted and its unit retried (nothing is kept on "
                           "disk between runs)")
    p.set_defaults(run=run)


def _objectives(given: list[str] | None, names: list[str]) -> str | dict[str, str]:
    """``--objective`` as ``compare_models`` takes it: one for all, or one per model."""
    if not given:
        return "score"
    if len(given) == 1:
        return given[0]
    if len(given) != len(names):
        raise TLRewardError(f"give --objective once, or once per --model ({len(names)}); got "
                            f"{len(given)}")
    return dict(zip(names, given, strict=True))


def read_compare_input(path: Path, limit: int | None = None) -> tuple[list[Any], list[Any]]:
    """``(corpus items, preference pairs)`` from a JSONL file (see the command's help)."""
    corpus: list[Any] = []
    pairs: list[Any] = []
    for where, rec in read_jsonl(path, limit):
        if {"prompt", "chosen", "rejected"} <= rec.keys():
            pairs.append(pair_from_record(rec, where))
            corpus.append(pairs[-1].chosen_conversation())
        else:
            corpus.append(item_from_record(rec, where, ", or 'prompt'+'chosen'+'rejected'"))
    if len(corpus) < 10:
        raise TLRewardError(f"{path} gives {len(corpus)} items; comparing models needs at "
                            "least 10 (readability uses 5-fold cross-validation)")
    return corpus, pairs


def build_report(models: dict[str, Any], corpus: list[Any], pairs: list[Any],
                 args: argparse.Namespace, pool: Any = None) -> list[Any]:
    """The report's parts: tables, figures and headings. ``models``: ``{name: loaded model}``,
    or with a started Ray ``pool`` ``{name: ModelSpec}`` that its actors load."""
    from tl_reward.compare.behaviour import run_compare_models
    from tl_reward.compare.layers import compare_grams, run_layer_grams

    kw = {"pairs": pairs or None, "readability_layer": args.readability_layer,
          "batch_size": args.batch_size,
          "objective": _objectives(args.objective, list(models))}
    rep = run_compare_models(models, corpus, executor=pool,
                             progress=None if pool is not None else False, **kw)
    table = rep.to_dataframe()
    parts: list[Any] = [
        f"<p>{len(models)} models ({html.escape(', '.join(models))}), {len(corpus)} corpus "
        f"items, {len(pairs)} preference pairs. Intervals are 95%: Kendall's tau-b (U-statistic "
        "variance; none for rho and RBO), exact binomial (Clopper-Pearson) for shares of pairs. "
        "Agreement of rewards is behavioural; readability (held-out R^2 of a ridge from one "
        "model's pooled activations to the other's reward) says a reward is linearly "
        "available in a representation, not that the model computes it.</p>",
        "<h2>Behavioural agreement</h2>", table, rep.plot()]
    if args.layers:
        names = list(models)
        measures = args.measure or ["debiased_cka", "rv2"]
        parts.append("<h2>Layer x layer similarity</h2><p>Residual stream after each block at "
                     "the pooled token. Debiased CKA is the headline (about 0 for unrelated "
                     "representations); RV2 and the others are biased upward when d_model "
                     "exceeds the number of items, so read them as observed minus the mean of "
                     f"their permutation null ({args.permutations} row permutations). A "
                     "similar geometry is not the same mechanism.</p>")
        # every model's Grams in one pass (on Ray actors with a pool), each read once
        grams = run_layer_grams(list(models.values()), corpus, batch_size=args.batch_size,
                                executor=pool)
        for k, other in enumerate(names[1:], 1):
            lc = compare_grams(grams[0], grams[k], measures, args.permutations)
            lc.model_a, lc.model_b = names[0], other
            parts += [f"<h3>{html.escape(names[0])} vs {html.escape(other)}</h3>",
                      lc.plot(kind="observed"), lc.plot(kind="excess")]
    return parts


def run(args: argparse.Namespace) -> int:
    if len(args.model) < 2:
        raise TLRewardError("give at least two --model options to compare")
    executor = ray_executor(args) if args.ray else None  # checks --device first
    corpus, pairs = read_compare_input(args.input, args.max_items)
    from tl_reward.scale.executors import ModelSpec

    names: list[str] = []  # folder or hub names; a repeat gets _2, _3, ...
    for base in (Path(m).name or m for m in args.model):
        names.append(next(n for k in range(1, len(names) + 2)
                          if (n := base if k == 1 else f"{base}_{k}") not in names))
    if executor is not None:  # the actors load the models; this process loads none
        specs = {n: ModelSpec(m, trust_remote_code=args.trust_remote_code)
                 for n, m in zip(names, args.model, strict=True)}
        with executor.session() as pool:
            parts = build_report(specs, corpus, pairs, args, pool)
    else:
        models = {n: load_model(args, m) for n, m in zip(names, args.model, strict=True)}
        parts = build_report(models, corpus, pairs, args)
    path = write_report(args, parts, "Do these reward models agree?")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0
