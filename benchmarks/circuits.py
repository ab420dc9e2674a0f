"""Edge attribution on the demo RM: EAP-IG against EAP and one forward + backward, same run.

The demo RM (SmolLM2-135M, grouped key/value heads: about 70.6k edges), ``--n-pairs``
HH-RLHF harmless-base test pairs of at most ``--max-tokens`` tokens (file order; built-in
example pairs when ../shared is missing), the margin r(chosen) - r(rejected) with each reply
mean-ablated on its own. Each measurement runs in its own process (spawned after the model is
cached), so its peak resident memory is its own:

* ``forward+backward``: one forward and one backward of every pair's two replies, weight
  gradients included (the unit the EAP-IG target is stated in);
* ``fwd+bwd frozen``: the same with the weights frozen, gradients flowing from the embeddings
  only (what each of EAP-IG's passes must pay at least: it takes no weight gradients);
* ``eap``: ``edge_attribution(method="eap")``;
* ``eap-ig``: ``edge_attribution(method="eap-ig", ig_steps=5)``.

It prints seconds and peak memory of each, EAP-IG's ratio to EAP and to forward+backward, and
the size of the ``[rows, pos, sources, d_model]`` difference tensor that chunking over sources
never builds; and writes ``benchmarks/results/circuits_cpu.json``.

Where EAP's and EAP-IG's time goes (:func:`phases`, timers around ``edge_attribution``'s own
steps): the mean-ablation means (one forward over the reference rows), the clean run recorded
(one forward), the clean metric (one forward through the graph), the all-corrupted metric (one
forward with every edge patched), the gradient passes (EAP: one forward+backward; EAP-IG:
``m = ig_steps`` of them, at the points between corrupted and clean embeddings) and the
contraction of the summed gradients with the source differences. The analysis line gives
EAP-IG / (m x forward+backward): EAP-IG can be at most 5x forward+backward only if its
``m`` passes and the four forwards around them fit in that time.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attribution_patching import pick_pairs  # the same HH pairs (a script beside this one)

ROOT = Path(__file__).resolve().parents[1]


def setup(threads: int) -> Any:
    import torch

    from tl_reward import DEMO_MODEL_NAME, HookedRewardModel

    torch.set_num_threads(threads)
    return HookedRewardModel.from_pretrained(DEMO_MODEL_NAME, device="cpu")


RUNS = ("forward+backward", "fwd+bwd frozen", "eap", "eap-ig")


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


@contextmanager
def phases(device: str) -> Iterator[dict[str, float]]:
    """Seconds spent in each step of ``edge_attribution`` (EAP / EAP-IG) while inside, by
    timers put around the functions ``tl_reward.circuits.edges`` calls (put back on exit):
    ``means`` (``prepare_inputs``: the mean-ablation reference forward), ``clean record``,
    ``clean metric`` (the graph forward without gradients), ``corrupted metric``, ``gradient
    passes`` (``_gradient`` until its contraction starts: its forwards and backwards) and
    ``contraction`` (the rest of ``_gradient``: source differences times gradients). The
    device is synchronised at every boundary."""
    import torch

    from tl_reward.circuits import edges

    spent: dict[str, float] = dict.fromkeys(
        ("means", "clean record", "clean metric", "corrupted metric", "gradient passes",
         "contraction"), 0.0)
    contraction_start: list[float] = []

    def timed(name: str, fn: Callable[..., Any], when: Callable[[], bool] = lambda: True
              ) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not when():
                return fn(*args, **kwargs)
            _sync(device)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _sync(device)
                spent[name] += time.perf_counter() - t0
        return wrapper

    def chunks(*args: Any, **kwargs: Any) -> Any:
        _sync(device)  # the passes are over: the contraction starts
        contraction_start.append(time.perf_counter())
        return original["chunks"](*args, **kwargs)

    def gradient(*args: Any, **kwargs: Any) -> Any:
        _sync(device)
        t0 = time.perf_counter()
        contraction_start.clear()
        out = original["_gradient"](*args, **kwargs)
        _sync(device)
        t1 = time.perf_counter()
        mid = contraction_start[0] if contraction_start else t1
        spent["gradient passes"] += mid - t0
        spent["contraction"] += t1 - mid
        return out

    names = ("prepare_inputs", "record", "forward", "corrupted_metric", "_gradient", "chunks")
    original = {n: getattr(edges, n) for n in names}
    patched = {
        "prepare_inputs": timed("means", edges.prepare_inputs),
        "record": timed("clean record", edges.record),
        "forward": timed("clean metric", edges.forward, lambda: not torch.is_grad_enabled()),
        "corrupted_metric": timed("corrupted metric", edges.corrupted_metric),
        "_gradient": gradient, "chunks": chunks}
    for n, f in patched.items():
        setattr(edges, n, f)
    try:
        yield spent
    finally:
        for n, f in original.items():
            setattr(edges, n, f)


def run(model: Any, what: str, pairs: list[Any], ig_steps: int, batch_size: int,
        n_top: int) -> dict[str, Any]:
    """One forward and backward of every reply (``batch_size`` replies per forward; with
    ``what="fwd+bwd frozen"`` the weights frozen, gradients from the embeddings on), or
    ``edge_attribution(method=what)``: its edge count, ``n_top`` top edges and
    :func:`phases`."""
    import torch

    from tl_reward.circuits import edge_attribution
    from tl_reward.circuits.forward import frozen_params

    if what in ("forward+backward", "fwd+bwd frozen"):
        frozen = what == "fwd+bwd frozen"

        def leaf(x: torch.Tensor, hook: Any) -> torch.Tensor:  # the gradients' only source
            return x.detach().requires_grad_(True)

        hooks = [("hook_embed", leaf)] if frozen else []
        per = max(1, batch_size // 2)  # pairs per forward: batch_size rows
        with frozen_params(model) if frozen else torch.enable_grad():
            for i in range(0, len(pairs), per):
                ids = [x for tp in pairs[i:i + per] for x in (tp.chosen_ids, tp.rejected_ids)]
                batch = model.make_batch(ids)
                model.zero_grad(set_to_none=True)
                out = model.run_with_hooks(batch.tokens, return_type="reward",
                                           attention_mask=batch.attention_mask,
                                           fwd_hooks=hooks)
                out.float().sum().backward()
        model.zero_grad(set_to_none=True)
        return {}
    with phases(str(model.cfg.device)) as spent:
        res = edge_attribution(model, pairs, method=what, ablation="mean", ig_steps=ig_steps,
                               batch_size=batch_size)
    top = res.to_dataframe().head(n_top)
    return {"edges": res.graph.n_edges, "phases": dict(spent),
            "top": [f"{r.src}->{r.dst}{'<' + r.qkv + '>' if r.qkv else ''} {r.score:+.4f}"
                    for r in top.itertuples()]}


def analysis(results: dict[str, Any], ig_steps: int) -> list[str]:
    """Lines saying where EAP-IG's time goes against ``m = ig_steps`` forward+backward
    passes (``results``: the seconds and phases of :data:`RUNS`)."""
    fb, frozen = results["forward+backward"]["seconds"], results["fwd+bwd frozen"]["seconds"]
    ig, m = results["eap-ig"], ig_steps
    ph = ig.get("phases", {})
    total = ig["seconds"]
    other = total - sum(ph.values())
    lines = [f"EAP-IG ({m} steps) = {total:.1f} s = {total / fb:.2f} x forward+backward "
             f"({fb:.1f} s; weights frozen {frozen:.1f} s, {frozen / fb:.2f} of it); "
             f"EAP-IG / ({m} x forward+backward) = {total / (m * fb):.2f}",
             "where EAP-IG's time goes (s, and x forward+backward):"]
    for name, sec in [*ph.items(), ("other (batching, ablated inputs, readout)", other)]:
        lines.append(f"  {name:>42}: {sec:7.1f}  {sec / fb:5.2f}")
    passes = ph.get("gradient passes", float("nan"))
    lines.append(f"each of the {m} gradient passes = {passes / m / fb:.2f} x forward+backward "
                 f"= {passes / m / frozen:.2f} x forward+backward with frozen weights; "
                 f"the {m} passes alone are {passes / fb:.2f} x forward+backward, everything "
                 f"else {(total - passes) / fb:.2f} x")
    return lines


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
    for what in ("warm-up", *RUNS):
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
    lines = analysis(results, args.ig_steps)
    print(*lines, sep="\n")
    print("top EAP-IG edges:", *results["eap-ig"]["top"], sep="\n  ")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "settings": vars(args) | {"output": str(args.output)},
        "device": name, "dtype": args.dtype, "shape": args.shape, "torch": torch.__version__,
        "results": results, "analysis": lines}, indent=2))
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
    print(f"demo RM (SmolLM2-135M), float32, on cpu ({platform.processor() or platform.machine()}),"
          f" {args.threads} threads: {args.n_pairs} HH pairs of at most {args.max_tokens} tokens,"
          f" {args.batch_size} replies per forward, mean ablation, ig_steps {args.ig_steps}; "
          "each run in its own process")
    ctx = mp.get_context("spawn")
    results = {}
    for what in RUNS:
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
    lines = analysis(results, args.ig_steps)
    print(*lines, sep="\n")
    print("top EAP-IG edges:", *results["eap-ig"]["top"], sep="\n  ")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"settings": vars(args) | {"output": str(args.output)},
                                       "machine": platform.processor() or platform.machine(),
                                       "device": "cpu", "dtype": "float32",
                                       "model": "demo RM (SmolLM2-135M)",
                                       "results": results, "analysis": lines}, indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
