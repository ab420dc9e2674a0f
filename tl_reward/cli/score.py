"""``tl-reward score``: rewards of (prompt, response) pairs or a JSONL file of conversations."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tl_reward.cli.common import (
    add_model_options,
    add_step_option,
    item_from_record,
    load_model,
    read_jsonl,
)
from tl_reward.errors import TLRewardError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("score", help="score responses with a reward model",
                       description="Score responses. Either --prompt with one or more "
                                   "--response, or --input FILE.jsonl whose lines hold "
                                   "'messages' (a conversation), 'prompt'+'response', "
                                   "'prompt'+'steps' (a solution) or 'text'. A process reward "
                                   "model gives one row per step.")
    add_model_options(p)
    add_step_option(p, "scores (default: all)")
    p.add_argument("--prompt", help="user prompt")
    p.add_argument("--response", action="append", default=[], help="a response (repeatable)")
    p.add_argument("--input", type=Path, help="JSONL file of inputs")
    p.add_argument("--output", type=Path, help="write the table as CSV here")
    p.add_argument("--batch-size", type=int, default=8)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.input:
        records = read_jsonl(args.input)
        items = [item_from_record(rec, where) for where, rec in records]
        labels = [str(rec.get("id", i)) for i, (_, rec) in enumerate(records)]
        names = [where for where, _ in records]  # errors name the file's line
    elif args.prompt and args.response:
        items = [(args.prompt, r) for r in args.response]
        labels = [r[:40] for r in args.response]
        names = [f"--response {k}" for k in range(1, len(items) + 1)]
    else:
        raise TLRewardError("pass --prompt with at least one --response, or --input FILE.jsonl")
    model = load_model(args)
    step = {"step": args.step} if args.step is not None else {}
    df = model.rewards(items, batch_size=args.batch_size, labels=labels, names=names,
                       **step).to_dataframe()
    print(df.to_string(index=False, max_colwidth=40))  # the CSV keeps the whole texts
    if args.output:
        df.to_csv(args.output, index=False)
    return 0
