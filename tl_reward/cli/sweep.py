"""``tl-reward sweep``: score every vocabulary token as the response to one or more prompts.

Writes a resumable parquet file; ``--shard i/n`` splits the vocabulary across processes or
machines and ``--merge`` joins the finished shards into the file one run would have written.

    tl-reward sweep --output best.parquet                      # the paper's three prompts
    tl-reward sweep --prompt "Name one good thing." --output good.parquet --shard 0/4
    tl-reward sweep --merge good.0.parquet good.1.parquet ... --output good.parquet
    tl-reward sweep --output best.parquet --ray                # on a local Ray cluster
    tl-reward sweep --output best.parquet --ray --address auto --gpus-per-worker 1

With ``--ray`` (``pip install "tl-reward[ray]"``) the sweep's chunks are spread over a pool of
Ray actors (one model load each); this process writes the same resumable file.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tl_reward.cli.common import (
    add_model_options,
    add_ray_options,
    apply_threads,
    item_from_record,
    load_model,
    ray_executor,
    read_jsonl,
)
from tl_reward.errors import TLRewardError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sweep", help="score every vocabulary token as the response to prompts",
        description="Score every vocabulary token v as the whole assistant response "
                    "(prefix + [v] + suffix from the chat template, special tokens excluded) "
                    "and write a resumable parquet file. Default prompts: the paper's "
                    "'greatest', 'best' and 'worst' questions.")
    add_model_options(p)
    p.add_argument("--prompt", action="append", default=[], help="a user prompt (repeatable)")
    p.add_argument("--label", action="append", default=[],
                   help="a label per --prompt (column names; default prompt_<i>)")
    p.add_argument("--prompts-file", type=Path,
                   help="JSONL with 'prompt' (string) or 'messages' (conversation) and an "
                        "optional 'label' per line")
    p.add_argument("--output", type=Path, required=True, help="parquet file to write")
    p.add_argument("--shard", help="i/n: score shard i of n (0-based), e.g. 0/4")
    p.add_argument("--id-range", help="lo:hi: score token ids in [lo, hi)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--include-special", action="store_true", help="also score special tokens")
    p.add_argument("--mode", choices=["ids", "text"], default="ids",
                   help="ids: exact id path (default); text: the published decode/re-tokenise "
                        "path, for comparison")
    p.add_argument("--cache", choices=["auto", "fast", "stock", "none"], default="auto")
    p.add_argument("--top", type=int, default=10, help="print the top and bottom K (0: none)")
    p.add_argument("--merge", nargs="+", type=Path, metavar="SHARD",
                   help="merge finished shard files into --output instead of sweeping")
    ray = add_ray_options(p, "the sweep's chunks (units of --unit-chunks batches)",
                          "rerun with --resume after an interruption")
    ray.add_argument("--unit-chunks", type=int, default=4, help="batches per unit of work")
    p.add_argument("--step", type=int, help="a process reward model: insert each token into this "
                   "step of each solution of --prompts-file (lines with 'prompt' and 'steps' "
                   "or 'response') and read that step's reward")
    p.add_argument("--position", type=int, help="with --step: before the step's POSITION-th "
                   "token (default: just before its tag)")
    p.set_defaults(run=run)


def _span(text: str, sep: str, what: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(sep))
    except ValueError as exc:
        raise TLRewardError(f"--{what} must look like N{sep}M, got {text!r}") from exc
    return a, b


def _prompts(args: argparse.Namespace) -> Any:
    from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS

    if args.step is not None:
        if not args.prompts_file:
            raise TLRewardError("--step sweeps the solutions of --prompts-file (lines with "
                                "'prompt' and 'steps' or 'response')")
        records = read_jsonl(args.prompts_file)
        return ([item_from_record(rec, where) for where, rec in records],
                [str(rec.get("label", f"solution_{i}")) for i, (_, rec) in enumerate(records)])
    if args.position is not None:
        raise TLRewardError("--position places the token within --step's step; pass --step")
    if args.prompts_file:
        items, labels = [], []
        for where, rec in read_jsonl(args.prompts_file):
            if "messages" not in rec and "prompt" not in rec:
                raise TLRewardError(f"{where}: need 'prompt' or 'messages'")
            items.append(rec.get("messages", rec.get("prompt")))
            labels.append(str(rec.get("label", f"prompt_{len(labels)}")))
        return items, labels
    if args.prompt:
        if args.label and len(args.label) != len(args.prompt):
            raise TLRewardError("give one --label per --prompt (or none)")
        return list(args.prompt), list(args.label) or None
    if args.label:
        raise TLRewardError("--label needs --prompt")
    return dict(PAPER_PROMPTS), None


def run(args: argparse.Namespace) -> int:
    from tl_reward.sweep.extremes import top_bottom_tokens
    from tl_reward.sweep.store import merge_sweeps
    from tl_reward.sweep.vocab_sweep import load_sweep, score_vocabulary

    if args.merge:
        path = merge_sweeps(args.merge, args.output)
        print(f"merged {len(args.merge)} shards into {path} ({len(load_sweep(path))} tokens)")
        return 0
    apply_threads(args)
    shard = _span(args.shard, "/", "shard") if args.shard else None
    id_range = _span(args.id_range, ":", "id-range") if args.id_range else None
    prompts, labels = _prompts(args)
    if args.ray:
        if args.step is not None:
            raise TLRewardError("--step runs in this process; drop --ray")
        sweep = _run_ray(args, prompts, labels, shard, id_range)
    else:
        steps = {} if args.step is None else {"step": args.step, "position": args.position}
        sweep = score_vocabulary(
            load_model(args), prompts, labels=labels, include_special=args.include_special,
            batch_size=args.batch_size, mode=args.mode, cache=args.cache, output=args.output,
            resume=args.resume, overwrite=args.overwrite, shard=shard, id_range=id_range,
            progress=True, **steps)
    print(f"{len(sweep)} tokens x {len(sweep.labels)} prompts -> {args.output}"
          + (" (Ray)" if args.ray else ""))
    if args.top and len(sweep) and sweep.scores is not None:
        ext = top_bottom_tokens(sweep, k=args.top)
        for side in ("top", "bottom"):
            print(f"\n{side} {args.top}:\n{ext.side_by_side(side).map(repr).to_string()}")
    return 0


def _run_ray(args: argparse.Namespace, prompts: Any, labels: Any,
             shard: tuple[int, int] | None, id_range: tuple[int, int] | None) -> Any:
    """The sweep of the options on Ray actors (the file is written by this process)."""
    from tl_reward.scale.sweeps import SweepJob, run_sweeps
    from tl_reward.sweep.store import parts_dir
    from tl_reward.sweep.vocab_sweep import load_sweep

    executor = ray_executor(args, args.threads)
    exists = args.output.exists() or parts_dir(args.output).exists()
    if exists and not (args.resume or args.overwrite):
        raise TLRewardError(f"{args.output} (or its parts) already exists; pass --resume to "
                            "continue it or --overwrite to start again")
    job = SweepJob(args.model, args.output, prompts,
                   labels=None if labels is None else tuple(labels),
                   include_special=args.include_special, batch_size=args.batch_size,
                   mode=args.mode, cache=args.cache, shard=shard, id_range=id_range,
                   trust_remote_code=args.trust_remote_code)
    run_sweeps([job], executor, unit_chunks=args.unit_chunks, overwrite=args.overwrite,
               progress=True)
    return load_sweep(args.output)
