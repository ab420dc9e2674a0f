"""``tl-reward faithfulness``: does attribution predict patching on these pairs? HTML out.

For every pair and component (sublayers or heads) it scores direct reward attribution,
direct-path patching, noising, denoising and attribution patching, and reports Spearman's rho
of each observational score against each causal one (mean over pairs, sign-flip p and the
interval that inverts it), the published pairing marked. Finished pairs are cached in
``--cache-dir``: rerun the same command after an interruption to resume.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tl_reward.cli.common import (
    add_model_options,
    add_report_options,
    load_model,
    read_pairs,
    write_report,
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "faithfulness", help="attribution vs patching over preference pairs (HTML report)",
        description="Score every component of every pair with attribution and with patching "
                    "and report how well each observational score ranks the causal ones. "
                    "--input: JSONL pairs ('prompt', 'chosen', 'rejected', or HH-RLHF "
                    "dialogues).")
    add_model_options(p)
    p.add_argument("--input", type=Path, required=True, help="JSONL file of pairs")
    p.add_argument("--max-pairs", type=int, default=None, help="use the first N pairs only")
    p.add_argument("--level", choices=["sublayer", "head"], default="sublayer")
    p.add_argument("--objective", default=None, help="objective name or 'score'")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="one file per finished pair; rerun to resume (default: no cache)")
    p.add_argument("--permutations", type=int, default=9_999,
                   help="random sign patterns of the test and its interval beyond 20 pairs")
    add_report_options(p, "faithfulness.html")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tl_reward.analysis.faithfulness import faithfulness_report

    pairs = read_pairs(args.input, args.max_pairs)
    model = load_model(args)
    rep = faithfulness_report(model, pairs, level=args.level, objective=args.objective,
                              cache_dir=args.cache_dir, progress=True)
    table = rep.summary(n_permutations=args.permutations)
    skipped = rep.meta.get("skipped", [])
    parts = [f"<p>{args.model}: {len(rep)} pairs scored, {len(skipped)} skipped (zero margin), "
             f"{len(rep.names)} {args.level} components, objective {rep.objective}.</p>",
             "<h2>Mean Spearman rho per pairing</h2>", rep.plot(), table]
    path = write_report(args, parts, "Does attribution predict patching?")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {path}")
    return 0
