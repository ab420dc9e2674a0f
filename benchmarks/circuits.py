"""Edge attribution on the demo RM: EAP-IG against EAP and one forward + backward, same run.

The demo RM (SmolLM2-135M, grouped key/value heads: about 70.6k edges), ``--n-pairs``
HH-RLHF harmless-base test pairs of at most ``--max-tokens`` tokens (file order; built-in
example pairs when ../shared is missing), the margin r(chosen) - r(rejected) with each reply
mean-ablated on its own. Each measurement runs in its own process (spawned after the model is
cached), so its peak resident memory is its own:

* ``forward+backward``: one forward and one backward of every pair's two replies (the floor
  any gradient method pays);
* ``eap``: ``edge_attribution(method="eap")``;
* ``eap-ig``: ``edge_attribution(method="eap-ig", ig_steps=5)``.

It prints seconds and peak memory of each, EAP-IG's ratio to EAP and to forward+backward, and
the size of the ``[rows, pos, sources, d_model]`` difference tensor that chunking over sources
never builds; and writes ``benchmarks/results/circuits_cpu.json``.

``--shape llama-3.1-8b --device cuda --dtype bfloat16`` runs the same three on a seeded
random-weight RM of that shape (``vocab_sweep.build_shape``: 1,569 destinations, about 0.83M
edges natively grouped) in one process, the device's peak memory above the weights measured
per run (``torch.cuda.max_memory_allocated``); the pairs are HH's, or the built-in example
pairs repeated where ../shared is missing, in the tiny tokenizer's ids. ``--check`` first runs
EAP-IG on a tiny RM on the device and on the CPU and prints the largest score difference.

    python benchmarks/circuits.py [--n-pairs 32] [--max-tokens 128] [--threads 2]
    python benchmarks/circuits.py --shape llama-3.1-8b --device cuda --dtype bfloat16 --check
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import resource
import time
from pathlib import Path
from typing import Any

from attribution_patching import pick_pairs  # the same HH pairs (a script beside this one)

ROOT = Path(__file__).resolve().parents[1]


def setup(threads: int) -> Any:
    import torch

    from tl_reward import DEMO_MODEL_NAME, HookedRewardModel

    torch.set_num_threads(threads)
    return HookedRewardModel.from_pretrained(DEMO_MODEL_NAME, device="cpu")


def run(model: Any, what: str, pairs: list[Any], ig_steps: int, batch_size: int,
        n_top: int) -> dict[str, Any]:
    """One forward and backward of every reply (``batch_size`` replies per forward), or
    ``edge_attribution(method=what)``: its edge count and ``n_top`` top edges."""
    from tl_reward.circuits import edge_attribution

    if what == "forward+backward":
        per = max(1, batch_size // 2)  # pairs per forward: batch_size rows
        for i in range(0, len(pairs), per):
            ids = [x for tp in pairs[i:i + per] for x in (tp.chosen_ids, tp.rejected_ids)]
            batch = model.make_batch(ids)
            model.zero_grad(set_to_none=True)
            out = model(batch.tokens, return_type="reward", attention_mask=batch.attention_mask)
            out.float().sum().backward()
        model.zero_grad(set_to_none=True)
        return {}
    res = edge_attribution(model, pairs, method=what, ablation="mean", ig_steps=ig_steps,
                           batch_size=batch_size)
    top = res.to_dataframe().head(n_top)
    return {"edges": res.graph.n_edges,
            "top": [f"{r.src}->{r.dst}{'<' + r.qkv + '>' if r.qkv else ''} {r.score:+.4f}"
                    for r in top.itertuples()]}


def measure(what: str, n_pairs: int, max_tokens: int, threads: int, ig_steps: int,
            batch_size: int) -> dict[str, Any]:
    """One measurement in this (fresh) process: seconds and peak RSS above the loaded model."""
    import torch

    model = setup(threads)
    pairs = pick_pairs(model, n_pairs, max_tokens)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    extra = run(model, what, pairs, ig_steps, batch_size, n_top=5)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rows = 2 * len(pairs)
    cfg = model.cfg
    n_sources = 1 + cfg.n_layers * (cfg.n_heads + 1)
    full = batch_size * max_tokens * n_sources * cfg.d_model * 4  # float32 bytes
    return {"what": what, "seconds": seconds, "pairs": len(pairs), "rows": rows,
            "peak_rss_mib_above_model": (peak - base) / 1024,
            "full_difference_tensor_mib": full / 2**20, **extra, "torch": torch.__version__}


def _sync_peak(device: str, reset: bool) -> float:
    """GiB allocated at the device's peak (after ``reset``, the current allocation)."""
    import torch

    if not device.startswith("cuda"):
        return float("nan")
    torch.cuda.synchronize(device)
    if reset:
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device) / 2**30
    return torch.cuda.max_memory_allocated(device) / 2**30


def check_device(device: str, ig_steps: int) -> dict[str, Any]:
    """EAP-IG of a tiny float32 RM on ``device`` against the CPU, same pairs and weights."""
    import torch

    from tl_reward import HookedRewardModel
    from tl_reward.circuits import edge_attribution
    from tl_reward.cli.demo import EXAMPLE_PAIRS
    from tl_reward.testing import tiny_hf_reward_model

    hf, tok = tiny_hf_reward_model("llama", seed=0)
    scores = {}
    for dev in ("cpu", device):
        model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device=dev,
                                                  dtype=torch.float32)
        res = edge_attribution(model, list(EXAMPLE_PAIRS), method="eap-ig", ablation="mean",
                               ig_steps=ig_steps, batch_size=4)
        scores[dev] = res.edge_scores().float().cpu()
    diff = float((scores[device] - scores["cpu"]).abs().max())
    scale = float(scores["cpu"].abs().max())
    print(f"tiny RM EAP-IG, {device} vs cpu (float32): max |diff| {diff:.2e} of max |score| "
          f"{scale:.3f}")
    return {"max_abs_diff": diff, "max_abs_score": scale}


def measure_device(args: argparse.Namespace) -> dict[str, Any]:
    """The three runs on a seeded ``--shape`` RM on ``--device``, in this process."""
    import torch
    from vocab_sweep import build_shape


    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    model = build_shape(args.shape, dtype, args.device)
    load_s = time.perf_counter() - t0
    pairs = pick_pairs(model, args.n_pairs, args.max_tokens)
    pairs = [pairs[i % len(pairs)] for i in range(args.n_pairs)]  # example pairs repeated
    tokens = [len(x) for tp in pairs for x in (tp.chosen_ids, tp.rejected_ids)]
    weights = _sync_peak(args.device, reset=True)
    out: dict[str, Any] = {"load_s": load_s, "weights_gib": weights, "pairs": len(pairs),
                           "tokens_mean": sum(tokens) / len(tokens), "tokens_max": max(tokens)}
    for what in ("warm-up", "forward+backward", "eap", "eap-ig"):
        base = _sync_peak(args.device, reset=True)
        t0 = time.perf_counter()
        some = pairs[: max(1, args.batch_size // 2)] if what == "warm-up" else pairs
        extra = run(model, "forward+backward" if what == "warm-up" else what, some,
                    args.ig_steps, args.batch_size, n_top=3)
        peak = _sync_peak(args.device, reset=False)
        out[what] = {"seconds": time.perf_counter() - t0, "peak_gib_above_weights": peak - base,
                     "peak_gib": peak, **extra}
        print(f"{what:>17}: {out[what]['seconds']:8.1f} s, peak {peak:6.1f} GiB "
              f"({peak - base:5.1f} above the weights) {extra.get('edges', '')}", flush=True)
    return out


def main_device(args: argparse.Namespace) -> None:
    import torch

    torch.manual_seed(0)
    results: dict[str, Any] = {}
    if args.check:
        results["check"] = check_device(args.device, args.ig_steps)
    results |= measure_device(args)
    fb, eap, ig = (results[k]["seconds"] for k in ("forward+backward", "eap", "eap-ig"))
    name = torch.cuda.get_device_name(args.device) if args.device != "cpu" else "cpu"
    print(f"{args.shape} {args.dtype} on {name}: "
          f"{results['eap-ig']['edges']} edges, {args.n_pairs} pairs, mean "
          f"{results['tokens_mean']:.0f} tokens per reply; EAP-IG / EAP = {ig / eap:.2f}; "
          f"EAP-IG / forward+backward = {ig / fb:.1f}; loaded in {results['load_s']:.0f} s, "
          f"weights {results['weights_gib']:.1f} GiB")
    print("top EAP-IG edges:", *results["eap-ig"]["top"], sep="\n  ")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "settings": vars(args) | {"output": str(args.output)},
        "device": name, "torch": torch.__version__,
        "results": results}, indent=2))
    print(f"wrote {args.output}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-pairs", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ig-steps", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=8, help="rows (replies) per forward")
    ap.add_argument("--shape", default=None, help="a seeded random-weight RM of this shape "
                    "(vocab_sweep.SHAPES), on --device, instead of the demo RM")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--check", action="store_true",
                    help="first compare a tiny RM's EAP-IG on --device with the CPU's")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args()
    if args.shape:
        args.output = args.output or ROOT / "benchmarks" / "results" / (
            f"circuits_{args.shape}_{args.device.split(':')[0]}.json")
        return main_device(args)
    args.output = args.output or ROOT / "benchmarks" / "results" / "circuits_cpu.json"
    ctx = mp.get_context("spawn")
    results = {}
    for what in ("forward+backward", "eap", "eap-ig"):
        with ctx.Pool(1) as pool:
            results[what] = pool.apply(measure, (what, args.n_pairs, args.max_tokens,
                                                 args.threads, args.ig_steps, args.batch_size))
        r = results[what]
        print(f"{what:>17}: {r['seconds']:8.1f} s, peak {r['peak_rss_mib_above_model']:7.0f} MiB "
              "above the loaded model")
    fb, eap, ig = (results[k]["seconds"] for k in ("forward+backward", "eap", "eap-ig"))
    print(f"EAP-IG / EAP = {ig / eap:.2f} (target <= 6); EAP-IG / forward+backward = "
          f"{ig / fb:.1f}; EAP / forward+backward = {eap / fb:.1f}")
    full = results["eap-ig"]["full_difference_tensor_mib"]
    print(f"{results['eap-ig']['edges']} edges; the whole [rows, pos, sources, d_model] "
          f"difference tensor of one batch would be {full:.0f} MiB")
    print("top EAP-IG edges:", *results["eap-ig"]["top"], sep="\n  ")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"settings": vars(args) | {"output": str(args.output)},
                                       "machine": platform.processor() or platform.machine(),
                                       "results": results}, indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
