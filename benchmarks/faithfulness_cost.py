"""Cost of the faithfulness report per pair at head level, and what makes it cheaper.

For each pair (HH-RLHF harmless-base test pairs with both sides at most ``--max-tokens``
tokens, file order, as ``experiments/faithfulness_hh.py`` picks them) it times every part of
``faithfulness.pair_scores(level="head")`` on the demo RM: DRA of both replies, attribution
patching, direct-path patching, and whole-head noising and denoising of all 270 heads (540
patched runs, which dominate). The patching runs are timed under several settings, in one run:

* ``no-prefix``: every patched run recomputes the whole sequence from its layer
  (``reuse_prefix=False``): what reusing the prompt's keys and values saves;
* ``chunk 8``: the settings ``experiments/faithfulness_hh.py`` used for the 12-pair figure
  (variants stacked 8 at a time, each chunk started at its lowest layer, prompt reused);
* ``chunk 32`` / ``chunk 64``: more variants per forward pass;
* ``by-layer 32``: chunks never mix layers (no variant recomputes a layer below its patch).

Every setting must give the same scores: the benchmark prints the largest difference from the
``chunk 8`` scores. Seconds per pair = the fixed parts + the patching of that setting.

    python benchmarks/faithfulness_cost.py [--n-pairs 1] [--max-tokens 96] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
HH = ROOT.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"

SETTINGS: dict[str, dict[str, Any]] = {
    "no-prefix": dict(chunk_size=8, reuse_prefix=False),
    "chunk 8": dict(chunk_size=8),
    "chunk 32": dict(chunk_size=32),
    "chunk 64": dict(chunk_size=64),
    "by-layer 32": dict(chunk_size=32, by_layer=True),
}
BEFORE = "chunk 8"


def pick_pairs(model: Any, n: int, max_tokens: int) -> list[Any]:
    from tl_reward.data import load_hh_rlhf, short_pairs

    return short_pairs(model, load_hh_rlhf(HH), n, max_tokens)


def timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-pairs", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS))
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" /
                                          "faithfulness_cost_cpu.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from tl_reward import HookedRewardModel
    from tl_reward.analysis.attribution import differential_attribution
    from tl_reward.analysis.attribution_patching import attribution_patching
    from tl_reward.analysis.direct_path import direct_path_patching
    from tl_reward.analysis.faithfulness import pair_scores
    from tl_reward.analysis.patching import patch_components
    from tl_reward.model.readout import resolve_objectives

    model = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-hh", device="cpu")
    pairs = pick_pairs(model, args.n_pairs, args.max_tokens)
    names = [f"L{layer}.H{h}" for layer in range(model.cfg.n_layers)
             for h in range(model.cfg.n_heads)]
    rows = []
    load0 = os.getloadavg()[0]
    obj = resolve_objectives(model, None)[0]
    for k, tp in enumerate(pairs):
        fixed = {
            "dra": timed(lambda tp=tp: differential_attribution(model, [tp], objectives=obj,
                                                                progress=False))[1],
            "attribution_patching": timed(lambda tp=tp: attribution_patching(
                model, tp, objective=obj))[1],
            "direct_path": timed(lambda tp=tp: direct_path_patching(
                model, tp, level="head", mode="denoising", scale="recompute",
                objective=obj))[1],
        }
        scores: dict[str, torch.Tensor] = {}
        patch_s: dict[str, float] = {}
        for name in args.settings:
            kw = SETTINGS[name]
            (noise, t1) = timed(lambda kw=kw, tp=tp: patch_components(
                model, tp, names, "noising", obj, **kw))
            (denoise, t2) = timed(lambda kw=kw, tp=tp: patch_components(
                model, tp, names, "denoising", obj, **kw))
            scores[name] = torch.cat([noise, denoise])
            patch_s[name] = t1 + t2
        # the report's own path (default settings) gives the same patching scores
        rec = pair_scores(model, tp, level="head", objective=obj)
        report_scores = torch.tensor(rec["scores"]["noising"] + rec["scores"]["denoising"])
        ref = scores.get(BEFORE, next(iter(scores.values())))
        row = {"pair": k, "tokens": [tp.chosen_len, tp.rejected_len],
               "prompt_len": tp.prompt_len, "fixed_seconds": fixed,
               "patching_seconds": patch_s,
               "seconds_per_pair": {n: sum(fixed.values()) + s for n, s in patch_s.items()},
               "max_abs_diff_vs_before": {n: float((v - ref).abs().max())
                                          for n, v in scores.items()},
               "report_max_abs_diff_vs_before": float((report_scores - ref).abs().max())}
        rows.append(row)
        print(json.dumps(row), flush=True)
    mean = {n: sum(r["seconds_per_pair"][n] for r in rows) / len(rows) for n in args.settings}
    best = min(mean, key=mean.get)
    summary = {"n_pairs": len(rows), "threads": args.threads, "max_tokens": args.max_tokens,
               "seconds_per_pair": mean, "before": BEFORE, "best": best,
               "speedup_best_vs_before": mean.get(BEFORE, mean[best]) / mean[best],
               "projected_hours_100_pairs_best": 100 * mean[best] / 3600,
               "projected_hours_100_pairs_before": 100 * mean.get(BEFORE, mean[best]) / 3600,
               "max_abs_diff_vs_before": max(max(r["max_abs_diff_vs_before"].values())
                                             for r in rows),
               "load_avg_before": load0, "load_avg_after": os.getloadavg()[0], "pairs": rows}
    print(f"{'setting':14}{'s/pair':>10}{'max|diff|':>12}")
    for n in args.settings:
        diff = max(r["max_abs_diff_vs_before"][n] for r in rows)
        print(f"{n:14}{mean[n]:10.1f}{diff:12.2e}")
    print(json.dumps({k: v for k, v in summary.items() if k != "pairs"}))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
