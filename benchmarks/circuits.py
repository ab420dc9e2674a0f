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

    python benchmarks/circuits.py [--n-pairs 32] [--max-tokens 128] [--threads 2]
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


def measure(what: str, n_pairs: int, max_tokens: int, threads: int, ig_steps: int,
            batch_size: int) -> dict[str, Any]:
    """One measurement in this (fresh) process: seconds and peak RSS above the loaded model."""
    import torch

    from tl_reward.circuits import edge_attribution

    model = setup(threads)
    pairs = pick_pairs(model, n_pairs, max_tokens)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if what == "forward+backward":
        per = max(1, batch_size // 2)  # pairs per forward: batch_size rows
        for i in range(0, len(pairs), per):
            ids = [x for tp in pairs[i:i + per] for x in (tp.chosen_ids, tp.rejected_ids)]
            batch = model.make_batch(ids)
            model.zero_grad(set_to_none=True)
            out = model(batch.tokens, return_type="reward", attention_mask=batch.attention_mask)
            out.sum().backward()
        extra: dict[str, Any] = {}
    else:
        res = edge_attribution(model, pairs, method=what, ablation="mean",
                               ig_steps=ig_steps, batch_size=batch_size)
        top = res.to_dataframe().head(5)
        extra = {"edges": res.graph.n_edges,
                 "top": [f"{r.src}->{r.dst}{'<' + r.qkv + '>' if r.qkv else ''} {r.score:+.4f}"
                         for r in top.itertuples()]}
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rows = 2 * len(pairs)
    cfg = model.cfg
    n_sources = 1 + cfg.n_layers * (cfg.n_heads + 1)
    full = batch_size * max_tokens * n_sources * cfg.d_model * 4  # float32 bytes
    return {"what": what, "seconds": seconds, "pairs": len(pairs), "rows": rows,
            "peak_rss_mib_above_model": (peak - base) / 1024,
            "full_difference_tensor_mib": full / 2**20, **extra, "torch": torch.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-pairs", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ig-steps", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=8, help="rows (replies) per forward")
    ap.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" /
                    "circuits_cpu.json")
    args = ap.parse_args()
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
