"""Vocabulary sweep speed: the prefix-cached sweep against naive full-sequence scoring.

Part 1 (``compare``): the same candidate ids, prompts and batch size scored three ways in one
run, each in its own subprocess so peak memory is measured cleanly (resident-set high-water
mark above the post-load baseline on CPU, ``max_memory_allocated`` on GPU):

* ``naive``: every ``prefix + [v] + suffix`` sequence through the full forward;
* ``stock``: TransformerLens's own key/value cache, frozen and expanded to each batch;
* ``fast``: tl_reward's cache of rotated prefix keys (no re-rotation, no GQA repeat).

Part 2 (``roofline``): how close the cached sweep runs to the machine's matmul speed. In one
run and interleaved (so load on a shared machine hits both alike), it times (a) the float32 (or
``--dtype``) matmuls of one forward of the model's own shapes at the sweep's rows (batch x new
positions; per layer the Q, K, V and O projections and the MLP, using the model's weights in
``nn.Linear`` layout) and (b) one sweep batch through the fast path, with and without a hook
attached (the hooked path is the one before the hook-free fast path existed). The fraction is
(a) / (b): 1.0 means the sweep spends all its time in the projections' matmuls. It also checks
the cached scores against naive full-sequence scoring, and with ``--n-tokens`` scores that many
candidates end to end for candidates/s. ``--shape llama-3.1-8b`` builds a seeded random-weight
Llama-3.1-8B-shaped RM directly on the device (no hub, nothing saved) instead of loading
``--model``. ``--profile FILE`` then runs a few hook-free sweep batches under
``torch.profiler`` and writes where the time goes (operators by total and by self time) to
FILE:

    python benchmarks/vocab_sweep.py roofline [--threads 2]                # demo RM, CPU
    python benchmarks/vocab_sweep.py roofline --shape llama-3.1-8b --dtype bfloat16 \
        --device cuda --n-tokens 128256 --batch-size 512 --peak-tflops 989

Part 3 (``full``): the whole vocabulary of the demo RM for the paper's three prompts, written
to a resumable parquet file (run it under ``nohup``; run the same command again to resume).
Wall time is accumulated over sessions in ``<output>.timing.json``.

    python benchmarks/vocab_sweep.py compare [--n 256] [--batch-size 128] [--threads 2]
    python benchmarks/vocab_sweep.py full [--output FILE.parquet] [--threads 2]

Prints one JSON line per run (and writes ``--json``).
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


# -- roofline ------------------------------------------------------------------------------------

#: HF config fields of the shapes ``--shape`` can build (seeded random weights).
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                         rope_theta=500000.0, rms_norm_eps=1e-5),
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                         rope_theta=500000.0, rms_norm_eps=1e-5),
    "tiny": dict(hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=2048,
                 rope_theta=10000.0, rms_norm_eps=1e-5),
}


def build_shape(shape: str, dtype: torch.dtype, device: str, seed: int = 0) -> Any:
    """A seeded random-weight Llama RM of ``shape``, built on ``device`` in ``dtype`` and
    converted by tl_reward's loader (no hub, nothing written to disk)."""
    import transformers as tf

    from tl_reward import HookedRewardModel
    from tl_reward.testing.tiny import tiny_tokenizer

    cfg = tf.LlamaConfig(**SHAPES[shape], num_labels=1, max_position_embeddings=2048,
                         pad_token_id=0, tie_word_embeddings=False)
    with torch.device(device):
        hf = tf.LlamaForSequenceClassification._from_config(cfg, torch_dtype=dtype,
                                                            attn_implementation="eager")
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim == 1:  # norm gains
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    model = HookedRewardModel.from_pretrained(hf_model=hf.eval(), tokenizer=tiny_tokenizer(),
                                              device=device, dtype=dtype)
    del hf
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return model


def projection_weights(model: Any) -> list[list[torch.Tensor]]:
    """Per layer the weights of every projection as ``[out, in]`` (``nn.Linear`` layout, the
    layout HF uses): Q, K, V, O, then the MLP's."""
    from tl_reward import tl_backend

    fused = tl_backend.fuse_qkv(model)
    out = []
    for block, f in zip(model.blocks, fused, strict=True):
        q, k, v = f.weight.split([f.n_heads * model.cfg.d_head, f.n_kv * model.cfg.d_head,
                                  f.n_kv * model.cfg.d_head])
        o = block.attn.W_O.detach().reshape(-1, model.cfg.d_model).T
        mlp = block.mlp
        ws = [q, k, v, o]
        if hasattr(mlp, "W_gate"):
            ws.append(mlp.W_gate.detach().T)
        ws += [mlp.W_in.detach().T, mlp.W_out.detach().T]
        out.append(ws)
    return out


def flops_per_row(weights: list[list[torch.Tensor]]) -> int:
    """Multiply-adds x 2 of every projection, per token position."""
    return 2 * sum(w.shape[0] * w.shape[1] for layer in weights for w in layer)


def time_projections(weights: list[list[torch.Tensor]], rows: int, dtype: torch.dtype,
                     device: str) -> float:
    """Seconds for one pass of every projection's matmul at ``rows`` rows (inputs drawn once)."""
    widths = sorted({w.shape[1] for layer in weights for w in layer})
    xs = {n: torch.randn(rows, n, dtype=dtype, device=device) for n in widths}
    _sync(device)
    t0 = time.perf_counter()
    for layer in weights:
        for w in layer:
            torch.nn.functional.linear(xs[w.shape[1]], w)
    _sync(device)
    return time.perf_counter() - t0


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def roofline(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    from tl_reward import tl_backend
    from tl_reward.model.response_template import ResponseTemplate
    from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, candidate_ids, score_candidates

    dtype = getattr(torch, args.dtype)
    t_load = time.perf_counter()
    if args.shape:
        model = build_shape(args.shape, dtype, args.device, args.seed)
        gen = torch.Generator().manual_seed(args.seed)
        v = model.cfg.d_vocab
        prefix = torch.randint(0, v, (args.prefix_len,), generator=gen).tolist()
        suffix = torch.randint(0, v, (args.suffix_len,), generator=gen).tolist()
        template = ResponseTemplate([], tuple(prefix), tuple(suffix))
        pool = list(range(v))
        name = f"{args.shape} (seeded random weights)"
    else:
        from tl_reward import HookedRewardModel
        from tl_reward.model.response_template import response_template

        model = HookedRewardModel.from_pretrained(args.model, device=args.device, dtype=dtype)
        template = response_template(model.tokenizer, PAPER_PROMPTS["best"])
        pool = candidate_ids(model)
        name = args.model
    load_s = time.perf_counter() - t_load
    n_new = 1 + len(template.suffix)
    rows = args.batch_size * n_new
    weights = projection_weights(model)
    flops = flops_per_row(weights) * n_new  # per candidate
    cache = tl_backend.build_prefix_cache(model, torch.tensor(template.prefix), "fast")
    gen = torch.Generator().manual_seed(args.seed + 1)
    batch = torch.tensor(sorted(pool[i] for i in torch.randperm(len(pool), generator=gen)
                                [: args.batch_size].tolist()))
    hook_name = "blocks.0.hook_resid_pre"

    def sweep_batch(hooked: bool) -> float:
        _sync(args.device)
        t0 = time.perf_counter()
        if hooked:
            with model.hooks(fwd_hooks=[(hook_name, lambda act, hook: act)]):
                score_candidates(model, template, batch, cache)
        else:
            score_candidates(model, template, batch, cache)
        _sync(args.device)
        return time.perf_counter() - t0

    for _ in range(2):  # warm-up
        time_projections(weights, rows, dtype, args.device)
        sweep_batch(False)
        sweep_batch(True)
    load0 = os.getloadavg()[0]
    t_proj, t_fast, t_hooked = [], [], []
    for _ in range(args.rounds):
        t_proj.append(time_projections(weights, rows, dtype, args.device))
        t_fast.append(sweep_batch(False))
        t_hooked.append(sweep_batch(True))
    med = {k: float(torch.tensor(v).median()) for k, v in
           (("proj", t_proj), ("fast", t_fast), ("hooked", t_hooked))}
    # exactness: cached (hook-free fast path) against naive full-sequence scoring
    few = batch[: min(len(batch), args.check)]
    cached = score_candidates(model, template, few, cache)
    naive = score_candidates(model, template, few, None)
    key = 1 if cached[1] is not None else 0
    diff = float((cached[key].float() - naive[key].float()).abs().max())
    # the same check for TransformerLens's own cache: bf16 rounding differs by kernel path, so
    # the stock cache's distance from naive scoring is the yardstick for the fast path's
    stock = tl_backend.build_prefix_cache(model, torch.tensor(template.prefix), "stock")
    stock_diff = float((score_candidates(model, template, few, stock)[key].float()
                        - naive[key].float()).abs().max())
    del stock
    result: dict[str, Any] = {
        "model": name, "device": args.device, "dtype": args.dtype, "threads": args.threads,
        "batch_size": args.batch_size, "new_positions": n_new, "prefix_len": cache.length,
        "load_seconds": round(load_s, 1), "gflop_per_candidate": flops / 1e9,
        "roofline_seconds_per_batch": med["proj"],
        "roofline_tflops": flops * args.batch_size / med["proj"] / 1e12,
        "sweep_seconds_per_batch": med["fast"],
        "sweep_candidates_per_s": args.batch_size / med["fast"],
        "fraction_of_roofline": med["proj"] / med["fast"],
        "hooked_seconds_per_batch": med["hooked"],
        "hooked_fraction_of_roofline": med["proj"] / med["hooked"],
        "max_abs_diff_vs_naive": diff, "stock_max_abs_diff_vs_naive": stock_diff,
        "naive_max_abs": float(naive[key].float().abs().max()), "naive_checked": len(few),
        "load_avg_before": load0, "load_avg_after": os.getloadavg()[0]}
    if args.n_tokens:
        ids = pool[: args.n_tokens]
        _sync(args.device)
        t0 = time.perf_counter()
        for s in range(0, len(ids), args.batch_size):
            score_candidates(model, template, torch.tensor(ids[s : s + args.batch_size]), cache)
        _sync(args.device)
        wall = time.perf_counter() - t0
        result.update({"n_tokens": len(ids), "end_to_end_seconds": wall,
                       "end_to_end_candidates_per_s": len(ids) / wall})
    rate = result.get("end_to_end_candidates_per_s", result["sweep_candidates_per_s"])
    result["achieved_tflops"] = flops * rate / 1e12
    if args.peak_tflops:
        result["peak_tflops"] = args.peak_tflops
        result["fraction_of_peak"] = result["achieved_tflops"] / args.peak_tflops
    if args.profile:
        result["profile"] = profile_sweep(args, lambda: score_candidates(model, template, batch,
                                                                        cache))
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


def profile_sweep(args: argparse.Namespace, sweep: Any) -> str:
    """Run ``--profile-batches`` hook-free sweep batches under ``torch.profiler`` and write
    where the time goes to ``--profile``: the operators by total device time (CPU time on a
    CPU), then by self time (each kernel counted once, not again in its callers)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = args.device.startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sweep()  # warm (the timed rounds above already were; one more keeps the trace clean)
    _sync(args.device)
    with profile(activities=acts) as prof:
        for _ in range(args.profile_batches):
            sweep()
        _sync(args.device)
    dev = "cuda" if cuda else "cpu"
    avg = prof.key_averages()
    text = (f"{args.profile_batches} sweep batches of {args.batch_size} candidates, "
            f"{args.dtype} on {args.device}\n\nby {dev}_time_total:\n"
            + avg.table(sort_by=f"{dev}_time_total", row_limit=25)
            + f"\n\nby self_{dev}_time_total:\n"
            + avg.table(sort_by=f"self_{dev}_time_total", row_limit=25) + "\n")
    Path(args.profile).parent.mkdir(parents=True, exist_ok=True)
    Path(args.profile).write_text(text)
    print(text)
    return str(args.profile)


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
    for name in ("compare", "roofline", "full"):
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
    r = sub.choices["roofline"]
    r.add_argument("--shape", choices=sorted(SHAPES),
                   help="build a seeded random-weight RM of this shape instead of --model")
    r.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    r.add_argument("--n-tokens", type=int, default=0,
                   help="also score this many candidates end to end (candidates/s)")
    r.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (median)")
    r.add_argument("--check", type=int, default=16, help="candidates checked against naive")
    r.add_argument("--prefix-len", type=int, default=40, help="--shape: prompt prefix length")
    r.add_argument("--suffix-len", type=int, default=2, help="--shape: suffix length")
    r.add_argument("--peak-tflops", type=float, default=0.0,
                   help="the device's stated peak (e.g. 989 for H100 SXM bf16 dense)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--json", default="")
    r.add_argument("--profile", default="",
                   help="also profile hook-free sweep batches (torch.profiler) and write the "
                        "operator tables to this file")
    r.add_argument("--profile-batches", type=int, default=3)
    f = sub.choices["full"]
    f.add_argument("--output", default=str(RESULTS / "smollm2_paper_prompts.parquet"))
    f.add_argument("--k", type=int, default=15)
    args = p.parse_args()
    {"compare": compare, "roofline": roofline, "full": full}[args.part](args)


if __name__ == "__main__":
    main()
