"""``tl-reward run-report RECORD``: an RL run record as one offline HTML report.

The reward and where its gain comes from (from the record's ``dra:*`` columns; the reward model
the record names is loaded only when a step lacks them), what the policy's text changed, and,
when the record holds gold scores, the Goodhart curve (against the KL from TRL's
``trainer_state.json`` with ``--trainer-state``, else the step; with ``--min-gold-gain``, whether
gold's gain after its peak is shown below that gain).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tl_reward.cli.common import add_device_options, add_report_options, write_report


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run-report", help="an RL run record as one HTML report",
        description="The reward gain split over the reward model's components, the policy's "
                    "text drift and (with gold scores) the Goodhart curve of a run record "
                    "(tl_reward.rl.record.RunRecord) as one offline HTML file.")
    p.add_argument("record", type=Path, help="the run record's folder")
    p.add_argument("--model", default=None,
                   help="the reward model, to decompose steps recorded without decompose=True "
                        "(default: the one the record names; loaded only when needed)")
    p.add_argument("--backend", choices=["auto", "hooked", "bridge"], default="auto",
                   help="how to load --model (see tl-reward score --help)")
    p.add_argument("--trainer-state", type=Path, default=None,
                   help="TRL's trainer_state.json: its logged KL from the reference policy is "
                        "the Goodhart curve's x-axis (default: the record's kl column, else "
                        "the step)")
    p.add_argument("--component", default=None,
                   help="the component whose lead time over the gold peak to report (default: "
                        "the one carrying the most of the gain)")
    p.add_argument("--min-gold-gain", type=float, default=None,
                   help="the smallest gold gain that matters, in gold's units: the report then "
                        "says whether gold's gain after its peak is shown below it")
    p.add_argument("--tokenizer", default=None,
                   help="the policy's tokenizer (hub name or folder), for the length in tokens")
    add_device_options(p)
    add_report_options(p, "run_report.html")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tl_reward.cli.common import apply_threads, load_model
    from tl_reward.rl.record import RunRecord, RunRecordError
    from tl_reward.rl.report import has_decomposition, run_report

    apply_threads(args)
    record = RunRecord.open(args.record)
    if not record.steps():
        raise RunRecordError(f"the run record in {args.record} holds no step yet")
    model = None
    if not has_decomposition(record):
        name = args.model or record.identity.model_name
        print(f"the record holds no decomposition for some steps: loading {name}")
        model = load_model(args, name)
    tokenizer = None
    if args.tokenizer is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    report = run_report(record, model=model, kl=args.trainer_state, component=args.component,
                        tokenizer=tokenizer, min_gold_gain=args.min_gold_gain)
    path = write_report(args, report.parts(), f"RL run: {record.folder.name}")
    for r in (report.gain, report.drift, report.curve):
        if r is not None:
            print(r.sentence())
    print(f"wrote {path}")
    return 0
