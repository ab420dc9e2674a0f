"""``tl-reward sae-fit``: list the pretrained SAEs for a reward model's base, or measure how well
one SAE fits the RM's activations and how much reward survives it spliced in."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tl_reward.cli.common import add_model_options, load_model, read_pairs, require_objective
from tl_reward.errors import TLRewardError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sae-fit", help="find pretrained SAEs for a reward model, or measure one SAE's fit",
        description="With --list: the SAELens releases for the model's base (offline, from "
                    "SAELens's registry; --base names the base). Otherwise: explained variance, "
                    "relative MSE, L0, dead and dense features (all positions and the pooled "
                    "token) and the reward recovered with the SAE spliced in, on the preference "
                    "pairs of --input (JSONL: 'prompt', 'chosen', 'rejected', or HH-RLHF).")
    add_model_options(p)
    p.add_argument("--list", action="store_true", help="list the SAEs for the model's base")
    p.add_argument("--base", help="the base model to look up (default: from the RM's name)")
    p.add_argument("--sae", help="a local SAELens SAE directory, or a release with --sae-id")
    p.add_argument("--sae-id", help="the SAE id within the release --sae (needs the hub)")
    p.add_argument("--norm-scaling-factor", type=float,
                   help="for SAEs with normalize_activations='expected_average_only_in'")
    p.add_argument("--input", type=Path, help="JSONL file of preference pairs")
    p.add_argument("--objective", help="the objective to read (needed when the model has "
                                       "several and no combined score)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--output", type=Path, help="write the table as CSV here")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tl_reward.sae import load_sae, sae_fit, saes_for

    if args.list:
        res = saes_for(args.model, base=args.base)
    else:
        if not args.sae or not args.input:
            raise TLRewardError("pass --sae PATH (or a release with --sae-id) and --input "
                                "pairs.jsonl, or --list")
        pairs = read_pairs(args.input)
        model = load_model(args)
        require_objective(model, args.objective)
        sae = load_sae(model, args.sae, args.sae_id, args.norm_scaling_factor)
        res = sae_fit(model, sae, pairs, objective=args.objective or "score",
                      batch_size=args.batch_size)
    print(res)
    df = res.to_dataframe()
    print(df.to_string(index=False))
    if args.output:
        df.to_csv(args.output, index=False)
    return 0
