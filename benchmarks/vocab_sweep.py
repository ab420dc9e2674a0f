"""Vocabulary sweep speed: the prefix-cached sweep against naive full-sequence scoring.

Part 1 (``compare``): the same candidate ids, prompts and batch size scored three ways in one
run, each in its own subprocess so peak memory is measured cleanly (resident-set high-water
mark above the post-load baseline on CPU, ``max_memory_allocated`` on GPU):

* ``naive``: every ``prefix + [v] + suffix`` sequence through the full forward;
* ``stock``: TransformerLens's own key/value cache, frozen and expanded to each batch;
* ``fast``: tl_reward's cache of rotated prefix keys (no re-rotation, no GQA repeat).

Part 2 (``full``): the whole vocabulary of the demo RM for the paper's three prompts, written
to a resumable parquet file (run it under ``nohup``; run the same command again to resume).
Wall time is accumulated over sessions in ``<output>.timing.json``.

    python benchmarks/vocab_sweep.py compare [--n 256] [--batch-size 128] [--threads 2]
    python benchmarks/vocab_sweep.py full [--output FILE.parquet] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import time
from pathlib import Path
from typing import Any

import torch
from memory import peak_mb, start_peak

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _load(name: str, device: str) -> Any:
    from tl_reward import HookedRewardModel

    return HookedRewardModel.from_pretrained(name, device=device)


def _sample_ids(model: Any, n: int, seed: int) -> list[int]:
    from tl_reward.sweep.vocab_sweep import candidate_ids

    pool = candidate_ids(model)
    gen = torch.Generator().manual_seed(seed)
    return sorted(pool[i] for i in torch.randperm(len(pool), generator=gen)[:n].tolist())


def _worker(method: str, args: dict[str, Any], out: Any) -> None:
    torch.set_num_threads(args["threads"])
    from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, score_vocabulary

    device = args["device"]
    model = _load(args["model"], device)
    ids = _sample_ids(model, args["n"], args["seed"])
    kw = dict(batch_size=args["batch_size"], cache="none" if method == "naive" else method,
              progress=False)
    score_vocabulary(model, PAPER_PROMPTS["best"], ids[: min(8, len(ids))], **kw)  # warm-up
    base = start_peak(device)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    sweep = score_vocabulary(model, PAPER_PROMPTS, ids, **kw)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = peak_mb(device)
    out.put({"method": method, "seconds": seconds, "peak_mb": peak - base,
             "n_ids": len(ids), "n_prompts": len(sweep.labels),
             "load_before": load0, "load_after": os.getloadavg()[0],
             "scores": sweep.scores.tolist()})


def compare(args: argparse.Namespace) -> None:
    cfg = vars(args)
    ctx = mp.get_context("spawn")
    results = {}
    for method in args.methods:
        q = ctx.Queue()
        proc = ctx.Process(target=_worker, args=(method, cfg, q))
        proc.start()
        results[method] = q.get()
        proc.join()
    ref = torch.tensor(results["naive"]["scores"]) if "naive" in results else None
    print(f"model {args.model}  device {args.device}  threads {args.threads}  "
          f"{args.n} ids x 3 paper prompts, batch {args.batch_size}")
    print(f"{'':8}{'seconds':>10}{'seq/s':>10}{'speed-up':>10}{'peak MB':>10}"
          f"{'max|diff|':>12}{'load':>12}")
    base = results.get("naive", next(iter(results.values())))["seconds"]
    for method, r in results.items():
        rate = r["n_ids"] * r["n_prompts"] / r["seconds"]
        r["seq_per_s"] = rate
        r["speedup_vs_naive"] = base / r["seconds"]
        diff = (torch.tensor(r["scores"]) - ref).abs().max().item() if ref is not None else 0.0
        r["max_abs_diff_vs_naive"] = diff
        print(f"{method:8}{r['seconds']:10.2f}{rate:10.1f}{base / r['seconds']:10.2f}"
              f"{r['peak_mb']:10.1f}{diff:12.2e}"
              f"{r['load_before']:6.1f}->{r['load_after']:4.1f}")
    if args.json:
        summary = {k: {kk: vv for kk, vv in v.items() if kk != "scores"}
                   for k, v in results.items()}
        Path(args.json).write_text(json.dumps({"config": cfg, "results": summary}, indent=2,
                                              default=str))


def full(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    from tl_reward.sweep.extremes import top_bottom_tokens
    from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, score_vocabulary

    output = Path(args.output)
    timing_path = output.with_name(output.name + ".timing.json")
    timing = json.loads(timing_path.read_text()) if timing_path.exists() else {"sessions": []}
    model = _load(args.model, args.device)
    session: dict[str, Any] = {"start": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": 0.0,
                               "threads": args.threads, "load_start": os.getloadavg()[0]}
    timing["sessions"].append(session)
    t0 = time.perf_counter()

    def record(done: int, total: int) -> None:
        session.setdefault("ids_done_after_first_chunk", done)
        session["ids_done"] = done
        session["seconds"] = time.perf_counter() - t0
        session["load_now"] = os.getloadavg()[0]
        timing["total_ids"] = total
        timing_path.write_text(json.dumps(timing, indent=2))

    sweep = score_vocabulary(model, PAPER_PROMPTS, batch_size=args.batch_size, output=output,
                             resume=True, progress=True, callback=record)
    wall = sum(s["seconds"] for s in timing["sessions"])
    n = len(sweep)
    timing.update({"n_ids": n, "n_prompts": 3, "wall_seconds_total": wall,
                   "wall_seconds_per_prompt": wall / 3, "seq_per_s": 3 * n / wall if wall else 0,
                   "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
    timing_path.write_text(json.dumps(timing, indent=2))
    print(f"{n} ids x 3 prompts in {wall:.0f} s over {len(timing['sessions'])} session(s): "
          f"{wall / 3:.0f} s per prompt, {timing['seq_per_s']:.1f} sequences/s")
    ext = top_bottom_tokens(sweep, k=args.k)
    print("top:\n" + ext.side_by_side("top").to_string())
    print("bottom:\n" + ext.side_by_side("bottom").to_string())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="part", required=True)
    for name in ("compare", "full"):
        s = sub.add_parser(name)
        s.add_argument("--model", default="tl-reward/smollm2-135m-hh")
        s.add_argument("--batch-size", type=int, default=128)
        s.add_argument("--threads", type=int, default=2)
        s.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    c = sub.choices["compare"]
    c.add_argument("--n", type=int, default=256, help="candidate ids (random, seeded)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--methods", nargs="+", default=["naive", "stock", "fast"])
    c.add_argument("--json", default=str(RESULTS / "vocab_sweep_compare_cpu.json"))
    f = sub.choices["full"]
    f.add_argument("--output", default=str(RESULTS / "smollm2_paper_prompts.parquet"))
    f.add_argument("--k", type=int, default=15)
    args = p.parse_args()
    compare(args) if args.part == "compare" else full(args)


if __name__ == "__main__":
    main()
