"""Attribution patching for all heads against per-head activation patching, same pairs, same run.

For each pair (HH-RLHF harmless-base test pairs of at most ``--max-tokens`` tokens, file order;
built-in example pairs when ../shared is missing) and every attention head of the demo RM:

* naive: denoising one head at a time, a Python loop of single forward passes of the whole
  rejected sequence with one hook (how patching is usually written);
* batched: ``activation_patching(site="head", positions="all")`` (heads stacked along the batch,
  chunks started from the cached residual at their layer, shared prompt reused from a KV cache);
* attribution patching: ``attribution_patching`` (one forward and one backward for the pair,
  chosen and rejected batched, every head at once).

It prints seconds per pair for each, the time ratios, and how well the first-order estimates
rank the real effects (Spearman rho over heads), and writes
``benchmarks/results/attribution_patching_cpu.json``.

    python benchmarks/attribution_patching.py [--n-pairs 2] [--max-tokens 80] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from tl_reward import HookedRewardModel
from tl_reward.analysis.attribution_patching import attribution_patching
from tl_reward.analysis.patching import activation_patching
from tl_reward.data import load_hh_rlhf, short_pairs
from tl_reward.data.pairs import TokenizedPair
from tl_reward.stats.resampling import spearman

ROOT = Path(__file__).resolve().parents[1]
HH = ROOT.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"


def pick_pairs(model: HookedRewardModel, n: int, max_tokens: int) -> list[TokenizedPair]:
    from tl_reward.cli.demo import EXAMPLE_PAIRS

    source = load_hh_rlhf(HH, limit=50 * n) if HH.exists() else list(EXAMPLE_PAIRS)
    return short_pairs(model, source, n, max_tokens)


@torch.no_grad()
def naive_head_patching(model: HookedRewardModel, tp: TokenizedPair) -> torch.Tensor:
    """Denoising of every head, one forward pass per head (the reference way)."""
    chosen, rejected = tp.tokens("chosen"), tp.tokens("rejected")
    _, cache = model.run_with_cache(chosen, attention_mask=torch.ones_like(chosen))
    r_c = float(model(chosen, "reward", attention_mask=torch.ones_like(chosen))[0, 0])
    r_r = float(model(rejected, "reward", attention_mask=torch.ones_like(rejected))[0, 0])
    rows_c, rows_r = tp.aligned[:, 0], tp.aligned[:, 1]
    out = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
    for layer in range(model.cfg.n_layers):
        name = f"blocks.{layer}.attn.hook_z"
        for head in range(model.cfg.n_heads):
            def hook(z: torch.Tensor, hook: object, h: int = head, n: str = name) -> torch.Tensor:
                z = z.clone()
                z[0, rows_r, h] = cache[n][0, rows_c, h]
                return z

            r = model.run_with_hooks(rejected, "reward", attention_mask=torch.ones_like(rejected),
                                     fwd_hooks=[(name, hook)])
            out[layer, head] = (float(r[0, 0]) - r_r) / (r_c - r_r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n-pairs", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=80)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-hh", device="cpu")
    pairs = pick_pairs(model, args.n_pairs, args.max_tokens)
    rows = []
    for i, tp in enumerate(pairs):
        t0 = time.perf_counter()
        ap_res = attribution_patching(model, tp)
        t_ap = time.perf_counter() - t0
        t0 = time.perf_counter()
        batched = activation_patching(model, tp, "head", "denoising", positions="all",
                                      chunk_size=16)
        t_batched = time.perf_counter() - t0
        t0 = time.perf_counter()
        naive = naive_head_patching(model, tp)
        t_naive = time.perf_counter() - t0
        est = ap_res.head["denoising"].sum(-1)
        row = {"pair": i, "tokens": [tp.chosen_len, tp.rejected_len], "prompt_len": tp.prompt_len,
               "n_heads": naive.numel(), "seconds_naive": t_naive,
               "seconds_batched": t_batched, "seconds_attribution_patching": t_ap,
               "naive_over_attribution": t_naive / t_ap, "naive_over_batched": t_naive / t_batched,
               "max_abs_batched_minus_naive": float((batched.effect - naive).abs().max()),
               "spearman_estimate_vs_patching": float(spearman(est.flatten(),
                                                               naive.flatten()))}
        rows.append(row)
        print(f"pair {i} ({tp.chosen_len}/{tp.rejected_len} tokens, {naive.numel()} heads): "
              f"naive {t_naive:.1f}s, batched {t_batched:.1f}s, attribution patching "
              f"{t_ap:.2f}s -> naive/AP {t_naive / t_ap:.0f}x, naive/batched "
              f"{t_naive / t_batched:.1f}x; |batched - naive| <= "
              f"{row['max_abs_batched_minus_naive']:.1e}; rho(AP, patching) = "
              f"{row['spearman_estimate_vs_patching']:.3f}", flush=True)
    total = {k: sum(r[k] for r in rows) for k in ("seconds_naive", "seconds_batched",
                                                   "seconds_attribution_patching")}
    summary = {"model": "tl-reward/smollm2-135m-hh", "device": "cpu", "threads": args.threads,
               "machine": platform.processor() or platform.machine(), "pairs": rows,
               "total": total,
               "ratio_naive_over_attribution": total["seconds_naive"]
               / total["seconds_attribution_patching"],
               "ratio_naive_over_batched": total["seconds_naive"] / total["seconds_batched"]}
    print(f"total: naive {total['seconds_naive']:.1f}s, batched {total['seconds_batched']:.1f}s, "
          f"attribution patching {total['seconds_attribution_patching']:.2f}s; "
          f"ratio naive/AP = {summary['ratio_naive_over_attribution']:.0f}x, "
          f"naive/batched = {summary['ratio_naive_over_batched']:.1f}x")
    out = ROOT / "benchmarks" / "results" / "attribution_patching_cpu.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
